"""Three rankers sharing one redis-server on a bad day: killed, started again empty, then
half of its entries overwritten by something other than a kvrank pod. Is every request still
answered?

The quick profile's synthetic workload (Zipf users, growing histories, C = 100; the callers
send no deadline, so each pod's default one applies) replayed open loop, round-robin over
``--pods`` cache-enabled rankers that share one real redis-server (no affinity: a user's
next request usually lands on another pod, so L2 carries the hits). While it runs:

- at 25 % of the schedule the redis-server is killed (SIGKILL: connections reset, then
  refused);
- at 37.5 % a new one starts on the same port, empty;
- at 62.5 % half of the entries written since are overwritten, keeping their TTL, with a
  forgery in turn: random bytes of the same length, the entry cut in half, or another key's
  genuine entry (another user's or another history's).

The same schedule runs once per ``--fronts`` value on fresh servers (``0``: each ranker one
process; ``N``: an engine and N request fronts), side by side in one run. Reported per phase
of the schedule: requests, answered, refused by status, p50 / p99 / max latency and where the
answers came from; and per run the corrupt entries the pods counted (by reason) and the
Redis errors they met. The claim it checks: 0 requests refused. Prints a table and writes
JSON; ``make bench-redis-fault`` runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import redis
from rich.console import Console
from rich.table import Table

from kvrank.cache.entry import Reason
from kvrank.tools.loadtest import model_dir_for
from kvrank.tools.processes import ProcessStack, RedisServer, free_port_pair, scrape
from kvrank.tools.replay import Result, replay, warm_up
from kvrank.tools.workload import Request, Workload, WorkloadSettings, workload_model
from kvrank_common import KEY_PREFIX

KILL, RESTART, FORGE = 0.25, 0.375, 0.625
"""When each fault happens, as a share of the schedule's length."""
PHASES = ("before", "redis down", "empty", "half forged")
FORGERIES = ("random bytes", "cut in half", "another key's entry")


def forge_half(url: str) -> dict[str, int]:
    """Every second entry key on the redis-server at ``url`` overwritten (TTL kept) with a
    forgery in turn; how many of each."""
    client = redis.Redis.from_url(url, socket_timeout=10)
    try:
        keys = sorted(client.scan_iter(match=f"{KEY_PREFIX}:*", count=1000))
        made: Counter[str] = Counter()
        for i, key in enumerate(keys[::2]):
            value = cast(bytes | None, client.get(key))
            if value is None:
                continue
            kind = FORGERIES[i % len(FORGERIES)]
            if kind == "random bytes":
                forged = os.urandom(len(value))
            elif kind == "cut in half":
                forged = value[: len(value) // 2]
            else:  # the next key's entry: another user's, or another history's of one user
                forged = cast(bytes | None, client.get(keys[(2 * i + 1) % len(keys)])) or b""
            client.set(key, forged, keepttl=True)
            made[kind] += 1
        return dict(made)
    finally:
        client.close()


async def faults(server: RedisServer, span_s: float, log: dict[str, Any]) -> None:
    """The schedule's faults at their times (from when the replay starts), each logged with
    the second it happened at."""
    start = time.monotonic()

    async def at(share: float, what: str, act: Callable[[], Any]) -> None:
        await asyncio.sleep(max(0.0, share * span_s - (time.monotonic() - start)))
        result = await asyncio.to_thread(act)
        log[what] = {"at_s": round(time.monotonic() - start, 2), "result": result}

    await at(KILL, "killed", server.stop)
    await at(RESTART, "started empty", lambda: bool(server.start()))
    await at(FORGE, "forged", lambda: forge_half(server.url))


async def scenario(
    server: RedisServer, requests: list[Request], urls: list[str]
) -> tuple[list[Result], dict[str, Any]]:
    """The replay, with the faults on their schedule beside it."""
    log: dict[str, Any] = {}
    span_s = requests[-1].at_s
    faulting = asyncio.create_task(faults(server, span_s, log))
    # as the callers of a ranking service often are: they send no deadline, so each pod's
    # default one applies
    results = await replay(requests, urls, concurrency=16, send_deadline=False)
    await faulting
    return results, log


def phase_of(sent_s: float, span_s: float) -> str:
    bounds = (KILL * span_s, RESTART * span_s, FORGE * span_s)
    return PHASES[sum(sent_s >= b for b in bounds)]


def summarize_phase(results: list[Result]) -> dict[str, Any]:
    ok = [r for r in results if r.status == 200]
    latencies = sorted(r.latency_ms for r in results) or [0.0]
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return {
        "requests": len(results),
        "answered": len(ok),
        "refused": dict(Counter(str(r.status or r.outcome) for r in results if r.status != 200)),
        "p50_ms": q[49],
        "p99_ms": q[98],
        "max_ms": latencies[-1],
        "outcomes": dict(Counter(r.outcome for r in ok)),
    }


def one_run(
    fronts: int, model_dir: Path, requests: list[Request], pods: int, workdir: Path
) -> dict[str, Any]:
    """Fresh rankers (``fronts`` each) and a fresh redis-server through the schedule."""
    server = RedisServer(free_port_pair(), workdir / "redis").start()
    try:
        with ProcessStack(workdir / "rankers") as stack:
            args = ("--redis", server.url, "--namespace", "fault", "--torch-threads", "1")
            urls = [
                stack.start_ranker(model_dir, *args, "--fronts", str(fronts)) for _ in range(pods)
            ]
            asyncio.run(warm_up(requests, urls))
            results, log = asyncio.run(scenario(server, requests, urls))
            corrupt = {
                reason.value: sum(
                    scrape(u, "kvrank_cache_corrupt_entries_total", reason=reason.value)
                    for u in urls
                )
                for reason in Reason
            }
            redis_errors = sum(scrape(u, "kvrank_redis_errors_total") for u in urls)
    finally:
        server.stop()
    span_s = requests[-1].at_s
    by_phase = {p: [r for r in results if phase_of(r.sent_s, span_s) == p] for p in PHASES}
    return {
        "fronts": fronts,
        "faults": log,
        "total": summarize_phase(results),
        "phases": {p: summarize_phase(rs) for p, rs in by_phase.items()},
        "corrupt_entries": {k: v for k, v in corrupt.items() if v},
        "redis_errors": redis_errors,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = WorkloadSettings(users=args.users, rate_qps=args.rate, candidates=args.candidates)
    with tempfile.TemporaryDirectory(prefix="kvrank-fault-") as tmp:
        work = Path(tmp)
        model_dir, origin = model_dir_for(None, work)
        requests = list(Workload(workload_model(model_dir), settings).requests(args.requests))
        runs = []
        for i, fronts in enumerate(args.fronts):
            runs.append(one_run(fronts, model_dir, requests, args.pods, work / f"run{i}"))
    return {
        "model": origin,
        "workload": {**settings.__dict__, "requests": args.requests, "pods": args.pods},
        "schedule": {"kill": KILL, "restart": RESTART, "forge": FORGE},
        "runs": runs,
        "refused": {
            str(r["fronts"]): r["total"]["requests"] - r["total"]["answered"] for r in runs
        },
    }


def show(report: dict[str, Any]) -> None:
    w = report["workload"]
    table = Table(
        title=f"{w['pods']} rankers sharing one redis-server, {w['requests']} requests at"
        f" {w['rate_qps']:g}/s: killed, started empty, half its entries forged"
    )
    for col in ("fronts", "phase", "requests", "answered", "refused", "p50 ms", "p99 ms",
                "max ms", "answers from"):  # fmt: skip
        table.add_column(col, justify="right")
    for r in report["runs"]:
        for name, p in (*r["phases"].items(), ("all", r["total"])):
            table.add_row(
                str(r["fronts"]),
                name,
                str(p["requests"]),
                str(p["answered"]),
                ", ".join(f"{k}: {v}" for k, v in p["refused"].items()) or "0",
                f"{p['p50_ms']:.1f}",
                f"{p['p99_ms']:.1f}",
                f"{p['max_ms']:.1f}",
                ", ".join(f"{k} {v}" for k, v in sorted(p["outcomes"].items())),
            )
    Console(width=200).print(table)
    for r in report["runs"]:
        print(
            f"fronts {r['fronts']}: faults {r['faults']}; corrupt entries counted"
            f" {r['corrupt_entries']}; Redis errors {r['redis_errors']:g}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=3)
    parser.add_argument("--fronts", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--requests", type=int, default=480)
    parser.add_argument("--rate", type=float, default=12.0, help="requests/s over all pods")
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--candidates", type=int, default=100)
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args()
    report = run(args)
    show(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
