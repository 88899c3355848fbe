"""The highest request rate one ranker pod answers within a client p99 bound, open loop.

What ``make bench-cuda`` measures on a GPU; the seed's figure to beat is 6,000 L1 hits a
second per GPU with p99 ≤ 14 ms. One real ``kvrank serve`` of a seed-fixed artifact
(``--size``, ``--compute-dtype``) on ``--device``, its engine with ``--fronts`` request
fronts beside it. Every user (``--users``, histories filling the model's window) is encoded
first, then two searches run:

- **hits**: every request an L1 hit, sent by reference (``json-ref``: the candidates and
  ``If-Match`` with the ETag of the user's answer — what a caller that keeps its users'
  last ETag sends; ``--hit-protocol json`` sends the whole history instead);
- **misses**: every request a user the pod has not seen, its whole history as JSON.

Each search is an open loop: requests sent on a fixed schedule whatever the answers do, from
``--clients`` processes, for ``--step-s`` seconds at a rate that climbs by ``--factor`` from
its start until the client p99 passes the largest bound, an answer is not a 200 of the
expected kind (``l1`` / ``miss``), or the load generator falls behind its own schedule; then
each bound's edge is bisected ``--refine`` times. Per step: offered and achieved rate, client
p50/p99/max, the answers, how late the generator sent, and the device's utilisation while it
ran (a GPU's from ``nvidia-smi``, sampled; on a CPU the cores the pod's processes kept busy).
Per bound: the highest rate whose step kept p99 within it with every answer right. Prints a
table and writes JSON. A GPU's figures need a load generator with cores to spare: a step the
generator fell behind on says so and ends the climb.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
from bench_serving_device import SIZES, artifact
from bench_wire import cpu_s
from rich.console import Console
from rich.table import Table

from kvrank.tools.callers import JSON_HEADERS, Caller, encode
from kvrank.tools.processes import RankerProcess
from kvrank.tools.served import request_bodies

USER_PREFIX = b'{"user_id": "'
"""How every request body begins: the user id first, so a miss's body is a user's body with
another id spliced in (no JSON encoding of a production-size body per request)."""
LATE_MS = 5.0
"""A step whose requests left more than this late (p99, against their schedule) measured
the load generator, not the pod: it ends the climb."""


@dataclass(frozen=True)
class Calls:
    """What one search sends: the target, the protocol, and per user a body's bytes and
    headers (a miss's user id replaced per request: ``fresh``)."""

    url: str
    protocol: str
    bodies: list[bytes]
    headers: list[dict[str, str]]
    expect: str
    fresh: bool = False


def whole(body: dict[str, Any]) -> bytes:
    """``body`` as JSON with its user id first (see :data:`USER_PREFIX`)."""
    return json.dumps({"user_id": body["user_id"], **body}).encode()


def warm(url: str, bodies: list[dict[str, Any]]) -> list[str]:
    """Every user encoded (a miss), then asked again (an L1 hit); the ETag each hit named."""
    etags = []
    with httpx.Client(timeout=300.0, headers=JSON_HEADERS) as client:
        for body in bodies:
            client.post(f"{url}/v1/score", content=whole(body)).raise_for_status()
        for body in bodies:
            resp = client.post(f"{url}/v1/score", content=whole(body))
            resp.raise_for_status()
            if resp.json()["cache"] != "l1":
                raise SystemExit(f"{body['user_id']}: asked again, answered {resp.json()['cache']}")
            etags.append(resp.headers["etag"])
    return etags


def hit_calls(url: str, bodies: list[dict[str, Any]], etags: list[str], protocol: str) -> Calls:
    if protocol == "json":
        return Calls(url, "json", [whole(b) for b in bodies], [{} for _ in bodies], "l1")
    refs = [encode(b, "json-ref").by_reference for b in bodies]
    return Calls(url, "json", refs, [{"If-Match": etag} for etag in etags], "l1")


def miss_calls(url: str, bodies: list[dict[str, Any]]) -> Calls:
    return Calls(url, "json", [whole(b) for b in bodies], [{} for _ in bodies], "miss", True)


def ready(seconds: float) -> None:
    """A load-generator process started and this module imported: what the pool runs
    first, so that no step waits for a process to start."""
    time.sleep(seconds)


def client(job: tuple[Calls, float, float, float, int, int, str]) -> dict[str, Any]:
    """One load-generator process's share of a step (see :func:`schedule`)."""
    return asyncio.run(schedule(*job))


async def schedule(
    calls: Calls, rate: float, seconds: float, start_at: float, k: int, of: int, tag: str
) -> dict[str, Any]:
    """Requests ``k``, ``k + of``, … of a step at ``rate`` in all, each sent at its time
    on the host's monotonic clock (every process shares it) whatever the answers do: their
    latencies, answers and how late each left."""
    n = int(rate * seconds)
    mine = range(k, n, of)
    latencies: list[float] = []
    late: list[float] = []
    answers: Counter[str] = Counter()
    async with Caller(calls.protocol, concurrency=0) as caller:

        async def one(i: int) -> None:
            due = start_at + i / rate
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            sent = time.monotonic()
            late.append((sent - due) * 1e3)
            user = i % len(calls.bodies)
            body = calls.bodies[user]
            if calls.fresh:  # a user this pod has not seen: another id, the same history
                rest = body[len(USER_PREFIX) :].split(b'"', 1)[1]
                body = USER_PREFIX + f"{tag}-{i}".encode() + b'"' + rest
            try:
                status, outcome, _ = await caller.send(calls.url, body, calls.headers[user])
            except Exception as exc:  # the step reports it; it does not end the run
                status, outcome = 0, type(exc).__name__
            latencies.append((time.monotonic() - sent) * 1e3)
            answers[f"{status} {outcome}"] += 1

        await asyncio.gather(*[one(i) for i in mine])
    return {"latencies": latencies, "late": late, "answers": dict(answers)}


class Utilisation:
    """The device's utilisation over a step: a GPU's as ``nvidia-smi`` samples it, else
    the cores the pod's processes (``pid`` and its children) kept busy."""

    def __init__(self, device: str, pid: int) -> None:
        self.gpu = device.startswith("cuda") and shutil.which("nvidia-smi") is not None
        self.pid = pid
        self._smi: subprocess.Popen[str] | None = None
        self._cpu = 0.0
        self._at = 0.0

    def __enter__(self) -> Utilisation:
        if self.gpu:
            query = ["--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
            self._smi = subprocess.Popen(
                ["nvidia-smi", *query, "-lms", "200"], stdout=subprocess.PIPE, text=True
            )
        self._cpu, self._at = pod_cpu_s(self.pid), time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cores = (pod_cpu_s(self.pid) - self._cpu) / (time.monotonic() - self._at)
        self.gpu_percent: float | None = None
        if self._smi is not None:
            self._smi.terminate()
            out, _ = self._smi.communicate(timeout=10)
            samples = [float(x) for x in out.split() if x.replace(".", "", 1).isdigit()]
            self.gpu_percent = statistics.mean(samples) if samples else None


def pod_cpu_s(pid: int) -> float:
    """CPU seconds ``pid`` and its child processes (the fronts) have used."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:  # a process may end between the listing and the reading
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            if int(entry) == pid or int(fields[1]) == pid:
                total += cpu_s(int(entry))
        except OSError:
            continue
    return total


def step(
    pool: ProcessPoolExecutor, clients: int, calls: Calls, rate: float, args: argparse.Namespace,
    pid: int, tag: str,
) -> dict[str, Any]:  # fmt: skip
    """One rate for ``args.step_s`` seconds: what the callers saw."""
    start_at = time.monotonic() + 1.0  # every process has its share before the first is due
    jobs = [(calls, rate, args.step_s, start_at, k, clients, tag) for k in range(clients)]
    with Utilisation(args.device, pid) as used:
        parts = list(pool.map(client, jobs))
    latencies = [x for p in parts for x in p["latencies"]]
    late = [x for p in parts for x in p["late"]]
    answers: Counter[str] = Counter()
    for p in parts:
        answers.update(p["answers"])
    right = answers.get(f"200 {calls.expect}", 0) == len(latencies) > 0
    late_p99 = float(np.percentile(late, 99)) if late else 0.0
    return {
        "rate": rate,
        "requests": len(latencies),
        "achieved_per_s": len(latencies) / args.step_s,
        "p50_ms": statistics.median(latencies) if latencies else None,
        "p99_ms": float(np.percentile(latencies, 99)) if latencies else None,
        "max_ms": max(latencies, default=None),
        "answers": dict(answers),
        "all_right": right,
        "late_p99_ms": late_p99,
        "generator_behind": late_p99 > LATE_MS,
        "gpu_util_percent": used.gpu_percent,
        "pod_busy_cores": used.cores,
    }


def within(s: dict[str, Any], bound: float) -> bool:
    return bool(s["all_right"] and not s["generator_behind"] and s["p99_ms"] <= bound)


def search(
    run_step: Callable[[float], dict[str, Any]],
    bounds: list[float],
    start: float,
    factor: float,
    refine: int,
    ceiling: float,
) -> dict[str, Any]:
    """Climb from ``start`` by ``factor`` until a step is outside the largest bound (or
    ``ceiling``), then bisect each bound's edge (geometric midpoints) ``refine`` times."""
    steps = []
    rate = start
    while rate <= ceiling:
        steps.append(run_step(rate))
        if not within(steps[-1], max(bounds)):
            break
        rate *= factor
    for bound in bounds:
        for _ in range(refine):
            good = max((s["rate"] for s in steps if within(s, bound)), default=None)
            bad = min(
                (s["rate"] for s in steps if not within(s, bound) and s["rate"] > (good or 0)),
                default=None,
            )
            if good is None or bad is None or bad / good < 1.05:
                break
            steps.append(run_step(math.sqrt(good * bad)))
    best = {
        f"p99_le_{bound:g}_ms": max((s["rate"] for s in steps if within(s, bound)), default=None)
        for bound in bounds
    }
    return {"steps": sorted(steps, key=lambda s: s["rate"]), "best_rate_per_s": best}


def run(args: argparse.Namespace) -> dict[str, Any]:
    bounds = sorted(float(b) for b in args.bounds.split(","))
    work = Path(tempfile.mkdtemp(prefix="kvrank-rate-"))
    model_dir = artifact(args.size, args.compute_dtype, work / "model")
    bodies = request_bodies(model_dir, args.users, args.candidates)
    flags = ["--device", args.device, "--fronts", str(args.fronts)]
    if args.l1_bytes:
        flags += ["--l1-bytes", str(args.l1_bytes)]
    env = {"KVRANK_TTL_FIXED_SECONDS": "3600"}  # no user expires during the run
    if args.cuda_graphs:
        env["KVRANK_CUDA_GRAPHS"] = "true"
    (work / "ranker").mkdir()
    ranker = RankerProcess.start(model_dir, work / "ranker", *flags, env=env, timeout_s=600.0)
    spawn = multiprocessing.get_context("spawn")
    try:
        etags = warm(ranker.url, bodies)
        with ProcessPoolExecutor(args.clients, mp_context=spawn) as pool:
            list(pool.map(ready, [2.0] * args.clients))
            hits = hit_calls(ranker.url, bodies, etags, args.hit_protocol)
            misses = miss_calls(ranker.url, bodies)
            pid = ranker.proc.pid
            found = {
                "hits": search(
                    lambda r: step(pool, args.clients, hits, r, args, pid, "hit"),
                    bounds, args.start_rate, args.factor, args.refine, args.ceiling,
                ),
                "misses": search(
                    lambda r: step(pool, args.clients, misses, r, args, pid, f"miss{r:.0f}"),
                    bounds, args.miss_start_rate, args.factor, args.refine, args.ceiling,
                ),
            }  # fmt: skip
    finally:
        ranker.stop()
    return {
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "machine": {"cpus": os.cpu_count(), "torch": torch.__version__},
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "bounds_ms": bounds,
        **found,
    }


def show(report: dict[str, Any]) -> None:
    s = report["settings"]
    console = Console()
    for kind in ("hits", "misses"):
        table = Table(
            title=f"{kind}: {s['size']} ({s['compute_dtype']}) on {s['device']}"
            f"{' with CUDA graphs' if s['cuda_graphs'] else ''},"
            f" C={s['candidates']}, {s['fronts']} fronts, {s['clients']} client processes"
        )
        for col in ("rate/s", "achieved/s", "p50 ms", "p99 ms", "answers", "late p99", "util"):
            table.add_column(col, justify="right")
        for st in report[kind]["steps"]:
            util = (
                f"{st['gpu_util_percent']:.0f} % GPU"
                if st["gpu_util_percent"] is not None
                else f"{st['pod_busy_cores']:.2f} cores"
            )
            table.add_row(
                f"{st['rate']:.0f}", f"{st['achieved_per_s']:.0f}", f"{st['p50_ms']:.2f}",
                f"{st['p99_ms']:.2f}", ", ".join(f"{k} ×{v}" for k, v in st["answers"].items()),
                f"{st['late_p99_ms']:.1f}" + (" (behind)" if st["generator_behind"] else ""),
                util,
            )  # fmt: skip
        console.print(table)
        for bound, rate in report[kind]["best_rate_per_s"].items():
            console.print(f"  {kind}, {bound}: {'none' if rate is None else f'{rate:.0f}/s'}")


def main() -> None:
    cpus = os.cpu_count() or 2
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=sorted(SIZES), default="production")
    p.add_argument("--compute-dtype", choices=("fp32", "bf16", "fp16"), default="bf16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--users", type=int, default=256)
    p.add_argument("--candidates", type=int, default=100)
    p.add_argument("--fronts", type=int, default=max(1, cpus // 3))
    p.add_argument("--clients", type=int, default=max(1, cpus // 4), help="load processes")
    p.add_argument("--l1-bytes", type=int, default=None, help="default: the server's")
    p.add_argument("--hit-protocol", choices=("json-ref", "json"), default="json-ref")
    p.add_argument("--cuda-graphs", action="store_true", help="the server's cuda_graphs")
    p.add_argument("--bounds", default="14,5", help="client p99 bounds, ms")
    p.add_argument("--start-rate", type=float, default=250.0, help="hits per second")
    p.add_argument("--miss-start-rate", type=float, default=25.0)
    p.add_argument("--factor", type=float, default=2.0)
    p.add_argument("--refine", type=int, default=2)
    p.add_argument("--ceiling", type=float, default=50_000.0)
    p.add_argument("--step-s", type=float, default=5.0)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    report = run(args)
    show(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
