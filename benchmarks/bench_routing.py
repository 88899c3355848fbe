"""What cache-affinity routing and the host tier save, side by side in one run.

**Routing.** Four cache-enabled rankers share one Redis, each with L1 room for 1.3× its fair
share of the workload's users (one full-window entry each). The same requests, at the same
moments, go once straight to the pods, spread over them whatever the user
(``unrouted``: what a plain Service does — kube-proxy picks a pod per connection, which for
a user is as good as chance), and once through the bundled router (``routed``: the stock
Envoy binary running the configuration the operator renders, hashing the routing header).
Each side has its own four fresh pods and cache namespace, and the machine to itself. The
routed side pays the proxy's hop; the unrouted side pays none (kube-proxy's NAT is in the
kernel), so the comparison favours no routing.

**Host tier.** One ranker whose L1 holds half the users' entries, measured with and without
a host-memory tier holding 0.7× more: the working set exceeds the device budget but fits
device + host. The same requests, users equally popular (nothing is hot enough to stay in a
small L1 by itself).

Each side reports p50/p99, the share of answers by tier (``l1``, ``host``, ``l2``,
``incremental``, ``miss``: a first sight or a history that slid the window), the L1 share
of the answers a cache could serve (all but the misses), Redis bytes read per request
(``kvrank_redis_read_bytes``, summed over the side's pods), full user encodes per pod and
failed requests. Prints a table and writes JSON. Run by ``make bench-routing``
(``--profile quick``); the tests run ``smoke``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from envoy_router import EnvoyRouter
from rich.console import Console
from rich.table import Table

from kvrank.model.artifact import load_ranker
from kvrank.model.config import QUICK
from kvrank.model.features import example_user
from kvrank.server.config import ROUTING_HEADER
from kvrank.tools.loadtest import model_dir_for
from kvrank.tools.processes import RankerProcess, RedisServer, free_port_pair
from kvrank.tools.replay import replay, summarize, warm_up
from kvrank.tools.workload import Request, Workload, WorkloadSettings
from kvrank_operator.manifests.router import RouterConfig, Upstream

PODS = 4
L1_SHARE = 1.3
"""Each routing pod's L1, in entries, against its fair share of the users."""
HOST_L1, HOST_EXTRA = 0.5, 0.7
"""The host-tier pod's L1 and host tier, in entries, against the users."""


@dataclass(frozen=True)
class Profile:
    routing: WorkloadSettings
    routing_requests: int
    host: WorkloadSettings
    host_requests: int


PROFILES = {
    "smoke": Profile(
        WorkloadSettings(users=40, rate_qps=20.0, candidates=50, history_fill=1.0),
        200,
        WorkloadSettings(users=20, zipf_s=0.0, rate_qps=20.0, candidates=50, history_fill=1.0),
        120,
    ),
    "quick": Profile(
        WorkloadSettings(users=160, rate_qps=30.0, candidates=100, history_fill=1.0),
        1200,
        WorkloadSettings(users=60, zipf_s=0.0, rate_qps=30.0, candidates=100, history_fill=1.0),
        600,
    ),
}


def entry_bytes(model: Path) -> int:
    """One user's entry at a full window (the workload's histories fill it)."""
    m = load_ranker(model)
    user = example_user(m.features, QUICK.max_events, torch.Generator().manual_seed(0))
    return int(m.encode_user(user).nbytes)


def start_pods(
    model: Path, workdir: Path, n: int, *args: str, env: dict[str, str]
) -> list[RankerProcess]:
    """``n`` rankers started at once (each waits for its own readiness)."""
    with ThreadPoolExecutor(n) as pool:
        futures = [
            pool.submit(RankerProcess.start, model, workdir, *args, env=env) for _ in range(n)
        ]
        return [f.result() for f in futures]


def _counts(pods: list[RankerProcess]) -> list[tuple[float, float]]:
    return [
        (
            p.metric("kvrank_redis_read_bytes_total"),
            p.metric("kvrank_user_encodes_total", kind="full"),
        )
        for p in pods
    ]


def measure(
    name: str,
    pods: list[RankerProcess],
    requests: list[Request],
    urls: list[str],
    routing_header: str | None = None,
) -> dict[str, Any]:
    """Warm each pod's process on users outside the workload, replay, and count."""
    asyncio.run(warm_up(requests, [p.url for p in pods]))
    before = _counts(pods)
    results = asyncio.run(replay(requests, urls, 16, routing_header=routing_header))
    after = _counts(pods)
    summary = summarize(results)
    read = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    return {
        "side": name,
        **summary,
        # of the answers a cache could serve (not first sights, not slid windows): from L1
        "l1_share_of_cached": summary["l1_hit_ratio"] / max(1e-9, 1 - summary["miss_ratio"]),
        "redis_bytes_per_request": read / max(1, summary["requests"]),
        "full_encodes_per_pod": [a[1] - b[1] for a, b in zip(after, before, strict=True)],
    }


def routing_sides(
    model: Path, entry: int, workdir: Path, redis_url: str, prof: Profile
) -> dict[str, dict[str, Any]]:
    fair = -(-prof.routing.users // PODS)
    l1 = int(L1_SHARE * fair * entry) + 1
    requests = list(Workload(QUICK, prof.routing).requests(prof.routing_requests))
    args = ("--redis", redis_url, "--l1-bytes", str(l1), "--torch-threads", "1")
    out: dict[str, dict[str, Any]] = {}
    for side in ("unrouted", "routed"):
        pods = start_pods(model, workdir, PODS, *args, "--namespace", side, env={})
        router = None
        try:
            if side == "unrouted":  # request i to pod i mod 4: not by user
                out[side] = measure(side, pods, requests, [p.url for p in pods])
            else:
                router = EnvoyRouter(workdir / side)
                endpoints = tuple(("127.0.0.1", p.port) for p in pods)
                upstream = Upstream("v1", 100, True, endpoints)
                router.write(RouterConfig([upstream], port=router.port))
                router.start()
                router.wait_routable()
                out[side] = measure(side, pods, requests, [router.url], ROUTING_HEADER)
                stats = router.stats()
                out[side]["router_retries"] = stats.get("cluster.v1.upstream_rq_retry", 0)
        finally:
            if router is not None:
                router.stop()
            for p in pods:
                p.stop()
    return out


def host_sides(
    model: Path, entry: int, workdir: Path, redis_url: str, prof: Profile
) -> dict[str, dict[str, Any]]:
    l1 = int(HOST_L1 * prof.host.users * entry) + 1
    host = int(HOST_EXTRA * prof.host.users * entry) + 1
    requests = list(Workload(QUICK, prof.host).requests(prof.host_requests))
    args = ("--redis", redis_url, "--l1-bytes", str(l1), "--torch-threads", "1")
    out: dict[str, dict[str, Any]] = {}
    for side, host_bytes in (("device_only", 0), ("device_and_host", host)):
        env = {"KVRANK_HOST_BYTES": str(host_bytes)}
        pods = start_pods(model, workdir, 1, *args, "--namespace", side, env=env)
        try:
            out[side] = measure(side, pods, requests, [pods[0].url])
        finally:
            pods[0].stop()
    return out


def run(profile: str, model: Path | None, workdir: Path) -> dict[str, Any]:
    prof = PROFILES[profile]
    model, origin = model_dir_for(model, workdir)
    entry = entry_bytes(model)
    t0 = time.monotonic()
    redis = RedisServer(free_port_pair(), workdir / "redis").start()
    try:
        routing = routing_sides(model, entry, workdir, redis.url, prof)
        host = host_sides(model, entry, workdir, redis.url, prof)
    finally:
        redis.stop()
    un, ro = routing["unrouted"], routing["routed"]
    return {
        "profile": profile,
        "model": origin,
        "entry_bytes": entry,
        "condition": "one machine; each side its own fresh pods (1 torch thread each) and cache"
        " namespace in one redis-server, the same requests at the same moments, one side at"
        " a time; routing: 4 pods, L1 1.3x each pod's fair share of users; host tier: 1 pod,"
        " L1 0.5x the users, host tier 0.7x",
        "routing_workload": prof.routing.__dict__,
        "host_workload": prof.host.__dict__,
        "routing": routing,
        "host_tier": host,
        "l1_share_routed_vs_unrouted": ro["l1_share_of_cached"]
        / max(un["l1_share_of_cached"], 1e-9),
        "redis_bytes_ratio_routed_vs_unrouted": ro["redis_bytes_per_request"]
        / max(un["redis_bytes_per_request"], 1e-9),
        "p99_ratio_routed_vs_unrouted": ro["p99_ms"] / max(un["p99_ms"], 1e-9),
        "errors": sum(s["errors"] for s in (*routing.values(), *host.values())),
        "run_s": time.monotonic() - t0,
    }


def print_report(report: dict[str, Any], console: Console) -> None:
    table = Table(title=f"routing and host tier ({report['profile']}; {report['model']})")
    cols = (
        "side",
        "p50 ms",
        "p99 ms",
        "l1",
        "host",
        "l2",
        "incr.",
        "miss",
        "L1/cached",
        "Redis KB/req",
    )
    for col in cols:
        table.add_column(col, justify="left" if col == "side" else "right")
    for side in (*report["routing"].values(), *report["host_tier"].values()):
        table.add_row(
            side["side"],
            f"{side['p50_ms']:.1f}",
            f"{side['p99_ms']:.1f}",
            *(
                f"{side[k]:.2f}"
                for k in (
                    "l1_hit_ratio",
                    "host_hit_ratio",
                    "l2_hit_ratio",
                    "incremental_ratio",
                    "miss_ratio",
                )
            ),
            f"{side['l1_share_of_cached']:.2f}",
            f"{side['redis_bytes_per_request'] / 1e3:.1f}",
        )
    console.print(table)
    console.print(
        f"routed vs unrouted: L1 share x{report['l1_share_routed_vs_unrouted']:.2f}, Redis bytes"
        f" x{report['redis_bytes_ratio_routed_vs_unrouted']:.2f}, p99"
        f" x{report['p99_ratio_routed_vs_unrouted']:.2f}; failed requests {report['errors']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    parser.add_argument("--model", type=Path, help="artifact directory (default: random quick)")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvrank-routing-") as tmp:
        report = run(args.profile, args.model, Path(tmp))
    print_report(report, Console())
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
