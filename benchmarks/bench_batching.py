"""What continuous batching gives one ranker under many callers, side by side in one run.

For each model size (``--sizes``: ``tiny``, overhead-bound as a GPU pod is, and ``quick``)
one seed-fixed artifact is served by real ``kvrank serve`` processes (one torch thread each,
an hour's TTL, 1 GiB of L1) that differ only in how they score concurrent requests:

- ``alone``: one request per model pass (``microbatch_max=1``: the ranker before continuous
  batching, and any server that runs one request at a time);
- ``window``: micro-batching with a 2 ms window (``microbatch_ms=2``: what a user tuned
  before; queued scores share passes too);
- ``continuous``: the default — the scores queued while the model is busy share one pass;
- ``fronts``: the same with ``--fronts`` (2) front processes parsing requests for an engine
  process that owns the model (``fronts: N``; 0 leaves it out);
- with ``--baseline REV``, ``baseline``: that commit's ``ranker/`` tree with its defaults.

Every user's entry is made first (its miss), so every measured answer is an L1 hit. Each
round, each server in turn (each first in turn from round to round) gets ``--callers``
closed-loop callers for ``--seconds``: answered hits per second, client p50/p99, and the
server's own count of scoring passes (``kvrank_batch_requests``) per request. Then, per
server, the idle hit (one caller, p50) and an open loop at 80 % of that server's median
capacity for ``--seconds`` (client p99 against the idle p50). Every answer must be an L1
hit with status 200 and each user's scores must equal the ``alone`` server's within the
model contract's 1e-5 on logits (the run fails otherwise). Prints a table and writes JSON;
``make bench-batching`` runs it (``BATCH_BASELINE=REV`` passes the baseline).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import torch
from bench_wire import baseline_tree, start
from rich.console import Console
from rich.table import Table

from kvrank.model.artifact import save_model
from kvrank.model.config import QUICK, TINY, ModelConfig
from kvrank.model.ranker import RankerModel
from kvrank.tools.overload import request_pool
from kvrank.tools.processes import RankerProcess

SIZES: dict[str, ModelConfig] = {"tiny": TINY, "quick": QUICK}
MODES: dict[str, dict[str, str]] = {
    "alone": {"KVRANK_MICROBATCH_MAX": "1"},
    "window": {"KVRANK_MICROBATCH_MS": "2"},
    "continuous": {},
}
FRONTS = "fronts"
"""The continuous server as an engine and ``--fronts`` front processes."""
BASELINE = "baseline"
"""The server of ``--baseline``'s tree (its defaults)."""
SCORE_TOLERANCE = 1e-5
"""How far a hit's scores may be from the ``alone`` server's (the contract's fp32 bound on
logits; probabilities move less)."""
OPEN_LOAD = 0.8
"""The open loop's rate, as a share of the server's median closed-loop capacity."""


class Overloaded(RuntimeError):
    """The server shed the request (503)."""


async def post(
    session: aiohttp.ClientSession, url: str, body: bytes, hit: bool = True
) -> tuple[float, dict[str, Any]]:
    """One request's latency (ms) and answer; it must be answered, and (``hit``) from L1."""
    t0 = time.perf_counter()
    async with session.post(
        f"{url}/v1/score", data=body, headers={"content-type": "application/json"}
    ) as resp:
        answer = await resp.json()
        if resp.status == 503:
            raise Overloaded(f"{url}: {str(answer)[:200]}")
        if resp.status != 200 or (hit and answer.get("cache") != "l1"):
            raise RuntimeError(f"{url}: {resp.status} {str(answer)[:200]}")
    return (time.perf_counter() - t0) * 1e3, answer


async def closed_loop(
    url: str, bodies: list[bytes], callers: int, seconds: float
) -> dict[str, Any]:
    """``callers`` callers, each sending its next request as its last is answered."""
    latencies: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=callers)) as s:
        start = time.perf_counter()

        async def caller(k: int) -> None:
            i = k
            while time.perf_counter() - start < seconds:
                latencies.append((await post(s, url, bodies[i % len(bodies)]))[0])
                i += callers

        await asyncio.gather(*[caller(k) for k in range(callers)])
        elapsed = time.perf_counter() - start
    return {"hits_per_s": len(latencies) / elapsed, **percentiles(latencies)}


async def open_loop(url: str, bodies: list[bytes], rate: float, seconds: float) -> dict[str, Any]:
    """Requests sent at ``rate`` per second on a fixed schedule, whatever the answers do.
    A server that cannot keep up sheds (503): counted (``shed``), not a failed run — on a
    slow moment of a shared machine 80 % of a closed loop's capacity may be more than the
    server sustains; any other answer than an L1 hit fails the run."""
    latencies: list[float] = []
    shed = 0
    n = max(1, int(rate * seconds))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        start = time.perf_counter()

        async def one(i: int) -> None:
            nonlocal shed
            await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
            try:
                latencies.append((await post(s, url, bodies[i % len(bodies)]))[0])
            except Overloaded:
                shed += 1

        await asyncio.gather(*[one(i) for i in range(n)])
    answered = percentiles(latencies) if latencies else {"requests": 0}
    return {"rate": rate, **answered, "shed": shed}


async def idle(url: str, bodies: list[bytes], n: int = 50) -> float:
    async with aiohttp.ClientSession() as s:
        return statistics.median(
            [(await post(s, url, bodies[i % len(bodies)]))[0] for i in range(n)]
        )


async def answers(url: str, bodies: list[bytes], hit: bool = True) -> list[list[float]]:
    """Each body's scores, asked one at a time."""
    async with aiohttp.ClientSession() as s:
        return [(await post(s, url, b, hit))[1]["scores"] for b in bodies]


def percentiles(latencies: list[float]) -> dict[str, float]:
    return {
        "requests": len(latencies),
        "p50_ms": float(np.percentile(latencies, 50)),
        "p99_ms": float(np.percentile(latencies, 99)),
    }


def passes(ranker: RankerProcess) -> tuple[float, float]:
    """The server's scoring passes so far and the requests they scored (0, 0 where the
    tree has no such metric)."""
    return ranker.metric("kvrank_batch_requests_count"), ranker.metric("kvrank_batch_requests_sum")


def size_run(size: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    torch.manual_seed(0)
    save_model(RankerModel(SIZES[size], f"{size}-v1").eval(), work / "model")
    pool = request_pool(work / "model", args.candidates)
    bodies = [
        json.dumps({**pool[i % len(pool)], "user_id": f"user-{i}"}).encode()
        for i in range(args.users)
    ]
    modes = dict(MODES)
    if args.fronts:
        modes[FRONTS] = {"KVRANK_FRONTS": str(args.fronts)}
    with contextlib.ExitStack() as running:
        tree = baseline_tree(args.baseline, work) if args.baseline else None
        rankers: dict[str, RankerProcess] = {}
        for name, env in modes.items():
            rankers[name] = start(work, name, settings=env)
            running.callback(rankers[name].stop)
        if tree is not None:
            rankers[BASELINE] = start(work, "baseline-ranker", tree)
            running.callback(rankers[BASELINE].stop)
        for r in rankers.values():  # every user's entry made: what follows are hits
            asyncio.run(answers(r.url, bodies, hit=False))
        reference = asyncio.run(answers(rankers["alone"].url, bodies))
        names = list(rankers)
        rounds: list[dict[str, Any]] = []
        for k in range(args.rounds):
            order = names[k % len(names) :] + names[: k % len(names)]
            one: dict[str, Any] = {}
            for name in order:
                before = passes(rankers[name])
                one[name] = asyncio.run(
                    closed_loop(rankers[name].url, bodies, args.callers, args.seconds)
                )
                after = passes(rankers[name])
                if after[0] > before[0]:
                    one[name]["requests_per_pass"] = (after[1] - before[1]) / (after[0] - before[0])
            rounds.append(one)
        result: dict[str, Any] = {}
        for name in names:
            capacity = statistics.median(r[name]["hits_per_s"] for r in rounds)
            url = rankers[name].url
            scores = asyncio.run(answers(url, bodies))
            worst = max(
                float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                for a, b in zip(scores, reference, strict=True)
            )
            if worst > SCORE_TOLERANCE:
                raise SystemExit(f"{size}/{name}: scores {worst:.3g} from alone's")
            result[name] = {
                "hits_per_s": capacity,
                "hits_per_s_rounds": [r[name]["hits_per_s"] for r in rounds],
                "p50_ms": statistics.median(r[name]["p50_ms"] for r in rounds),
                "p99_ms": statistics.median(r[name]["p99_ms"] for r in rounds),
                "requests_per_pass": statistics.median(
                    r[name].get("requests_per_pass", 1.0) for r in rounds
                ),
                "idle_p50_ms": asyncio.run(idle(url, bodies)),
                "open_loop": asyncio.run(
                    open_loop(url, bodies, OPEN_LOAD * capacity, args.seconds)
                ),
                "max_abs_dscore_vs_alone": worst,
            }
    return {"rounds": rounds, "servers": result}


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = {}
    for size in args.sizes.split(","):
        sizes[size] = size_run(size, args, Path(tempfile.mkdtemp(prefix=f"kvrank-batch-{size}-")))
    return {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "sizes": sizes,
    }


def show(report: dict[str, Any]) -> None:
    table = Table(title="One ranker, L1 hits, closed loop (medians of rounds)")
    for col in (
        "size",
        "server",
        "hits/s",
        "vs alone",
        "p50 ms",
        "p99 ms",
        "req/pass",
        "idle p50",
        "p99 @80%",
    ):
        table.add_column(col, justify="right")
    for size, run_ in report["sizes"].items():
        servers = run_["servers"]
        for name, s in servers.items():
            table.add_row(
                size,
                name,
                f"{s['hits_per_s']:.0f}",
                f"{s['hits_per_s'] / servers['alone']['hits_per_s']:.2f}×",
                f"{s['p50_ms']:.1f}",
                f"{s['p99_ms']:.1f}",
                f"{s['requests_per_pass']:.1f}",
                f"{s['idle_p50_ms']:.1f}",
                _open_p99(s["open_loop"]),
            )
    Console(width=120).print(table)


def _open_p99(loop: dict[str, Any]) -> str:
    """The open loop's p99, and how many it shed when it did."""
    p99 = f"{loop['p99_ms']:.1f}" if loop["requests"] else "—"
    return p99 + (f" ({loop['shed']} shed)" if loop.get("shed") else "")


def load_arguments(p: argparse.ArgumentParser) -> None:
    """The load both one-pod benchmarks put on their servers: model sizes, closed-loop
    callers, seconds and rounds of it, users warmed into L1, candidates per request."""
    p.add_argument("--sizes", default="tiny,quick")
    p.add_argument("--callers", type=int, default=32)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--users", type=int, default=64)
    p.add_argument("--candidates", type=int, default=100)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    load_arguments(p)
    p.add_argument("--fronts", type=int, default=2, help="front processes of the fronts server")
    p.add_argument("--baseline", help="a commit whose ranker/ tree is served beside")
    p.add_argument("--json", type=Path, default=Path("reports/bench-batching.json"))
    args = p.parse_args()
    report = run(args)
    show(report)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
