"""A traffic spike against one ranker, with and without admission control, side by side.

One run measures a ranker's miss capacity (distinct users, the model thread kept busy:
before the first spike and after its recovery, the mean of the two) and its idle latency,
then, for each admission mode, starts a fresh ``kvrank serve`` (no Redis:
every request is a miss, the hardest case) and offers it ``factor`` × that capacity for
``duration_s``, open loop, each caller sending its deadline (``x-kvrank-timeout-ms``) and
giving up when it passes (or, ``sends_deadline=False``, giving up without having said
so). Meanwhile ``/healthz`` is probed and the server's memory sampled;
after the spike, a fresh request is sent every 50 ms until one is answered within 3× the
idle latency (the recovery time). Reports goodput (answered within the deadline) against
capacity × duration, shed answers and their latency, p99 of the admitted, what the server
itself counted (scored, shed, dropped) against what the callers saw, and writes JSON.
Used by ``kvrank loadtest --scenario overload``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import numpy as np

from kvrank.admission import TIMEOUT_HEADER
from kvrank.tools.processes import ProcessStack, RankerProcess, samples
from kvrank.tools.replay import collector_off
from kvrank.tools.workload import Workload, WorkloadSettings, workload_model

MODES = ("shed", "off")
"""Admission control on (the default), and off: a server that queues and computes all."""
RECOVERED_WITHIN = 3.0
"""A fresh request answered within this many times the idle latency: recovered."""


@dataclass(frozen=True)
class OverloadSettings:
    factor: float = 4.0
    """The offered rate, in multiples of the measured miss capacity."""
    duration_s: float = 15.0
    deadline_ms: int = 1_000
    """Each caller's deadline: when it gives up, and sent in the header (``sends_deadline``)."""
    candidates: int = 100
    capacity_s: float = 5.0
    """How long the miss capacity is measured for."""
    modes: tuple[str, ...] = MODES
    sends_deadline: bool = True
    """False: the callers give up at their deadline without saying so (the server's
    default deadline applies, and what it learns from the callers that leave)."""
    fronts: int = 0
    """The rankers' ``fronts`` (0: one process each)."""


@dataclass
class Outcome:
    """What one caller saw."""

    sent_s: float
    latency_ms: float
    status: int  # 0: gave up at its deadline, or the connection failed
    error: str = ""


@dataclass
class ModeRun:
    outcomes: list[Outcome] = field(default_factory=list)
    probes_ms: list[float] = field(default_factory=list)
    probe_failures: int = 0
    rss_mb: list[float] = field(default_factory=list)
    recovery_s: float | None = None
    recovery_answered: int = 0
    """Fresh requests answered while waiting for recovery: scored, but not the spike's."""


POOL = 200
"""Distinct histories and candidate sets the requests are drawn from (each request's user
id is its own, so every one is a miss)."""


def request_bodies(pool: list[dict[str, Any]], n: int, prefix: str) -> list[bytes]:
    """``n`` request bodies of distinct users, encoded before the clock starts."""
    return [
        json.dumps({**pool[i % len(pool)], "user_id": f"{prefix}-{i}"}).encode() for i in range(n)
    ]


def request_pool(model_dir: Path, candidates: int) -> list[dict[str, Any]]:
    settings = WorkloadSettings(users=POOL, zipf_s=0.0, candidates=candidates, seed=7)
    return [r.body for r in Workload(workload_model(model_dir), settings).requests(POOL)]


async def _post(
    session: aiohttp.ClientSession, url: str, body: bytes, deadline_ms: int, send: bool = True
) -> tuple[int, float]:
    """One request, given up at ``deadline_ms`` (sent in its header when ``send``)."""
    t0 = time.monotonic()
    headers = {"content-type": "application/json"}
    if send:
        headers[TIMEOUT_HEADER] = str(deadline_ms)
    try:
        async with session.post(
            f"{url}/v1/score",
            data=body,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=deadline_ms / 1e3),
        ) as resp:
            await resp.read()
            status = resp.status
    except (aiohttp.ClientError, TimeoutError):
        status = 0
    return status, (time.monotonic() - t0) * 1e3


async def measure_capacity(url: str, bodies: list[bytes], seconds: float) -> dict[str, float]:
    """Misses answered per second with two callers keeping the model thread busy, and the
    idle latency of one miss (median of sequential ones)."""
    async with aiohttp.ClientSession() as session:
        idle = [(await _post(session, url, b, 30_000))[1] for b in bodies[:15]]
        it = iter(bodies[15:])
        done = 0
        start = time.monotonic()

        async def caller() -> None:
            nonlocal done
            for body in it:
                if time.monotonic() - start >= seconds:
                    return
                status, _ = await _post(session, url, body, 30_000)
                done += status == 200

        await asyncio.gather(caller(), caller())
        elapsed = time.monotonic() - start
    return {"capacity_qps": done / elapsed, "idle_ms": float(np.median(idle))}


async def spike(
    ranker: RankerProcess,
    bodies: list[bytes],
    rate_qps: float,
    settings: OverloadSettings,
    idle_ms: float,
) -> ModeRun:
    """The spike, the probes, the memory samples, then the recovery."""
    run = ModeRun()
    url, stop = ranker.url, asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(at: float, body: bytes) -> None:
            status, ms = await _post(
                session, url, body, settings.deadline_ms, settings.sends_deadline
            )
            run.outcomes.append(Outcome(at, ms, status))

        async def probe() -> None:
            async with aiohttp.ClientSession() as own:  # its own connection, as a kubelet's
                while not stop.is_set():
                    t0 = time.monotonic()
                    try:
                        timeout = aiohttp.ClientTimeout(total=1.0)
                        async with own.get(f"{url}/healthz", timeout=timeout) as resp:
                            await resp.read()
                            run.probes_ms.append((time.monotonic() - t0) * 1e3)
                    except (aiohttp.ClientError, TimeoutError):
                        run.probe_failures += 1
                    run.rss_mb.append(_rss_mb(ranker.proc.pid))
                    await asyncio.sleep(0.1)

        prober = asyncio.create_task(probe())
        with collector_off():
            start, tasks = time.monotonic(), []
            n = int(rate_qps * settings.duration_s)
            for i, body in enumerate(bodies[:n]):
                delay = i / rate_qps - (time.monotonic() - start)
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(time.monotonic() - start, body)))
            ended = time.monotonic()
            run.recovery_s, run.recovery_answered = await _recovery(
                session, url, bodies[n:], idle_ms, ended
            )
            await asyncio.gather(*tasks)
        stop.set()
        await prober
    return run


async def _recovery(
    session: aiohttp.ClientSession, url: str, fresh: list[bytes], idle_ms: float, ended: float
) -> tuple[float | None, int]:
    """Seconds from the spike's end to the first fresh request answered within
    :data:`RECOVERED_WITHIN` × the idle latency (``None``: not within 60 s), and how many
    fresh requests were answered until then."""
    answered = 0
    for body in fresh:
        sent = time.monotonic()
        if sent - ended > 60:
            break
        status, ms = await _post(session, url, body, 30_000)
        answered += status == 200
        if status == 200 and ms <= RECOVERED_WITHIN * idle_ms:
            return sent - ended, answered
        await asyncio.sleep(0.05)
    return None, answered


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarize(
    run: ModeRun, server: dict[str, float], settings: OverloadSettings, capacity_qps: float
) -> dict[str, Any]:
    deadline = settings.deadline_ms
    answered = [o for o in run.outcomes if o.status == 200]
    in_time = [o for o in answered if o.latency_ms <= deadline]
    shed = [o for o in run.outcomes if o.status in (429, 503)]
    possible = capacity_qps * settings.duration_s
    return {
        "offered": len(run.outcomes),
        "answered": len(answered),
        "answered_in_time": len(in_time),
        "goodput_qps": len(in_time) / settings.duration_s,
        "goodput_vs_capacity": len(in_time) / possible if possible else 0.0,
        "shed": len(shed),
        "shed_p50_ms": _pct([o.latency_ms for o in shed], 50),
        "shed_p99_ms": _pct([o.latency_ms for o in shed], 99),
        "admitted_p50_ms": _pct([o.latency_ms for o in answered], 50),
        "admitted_p99_ms": _pct([o.latency_ms for o in answered], 99),
        "gave_up": sum(o.status == 0 for o in run.outcomes),
        "statuses": dict(Counter(str(o.status) for o in run.outcomes)),
        "server": server,
        # the server's scores of the spike's requests (the recovery's own are answered)
        "scored_but_not_received": server["scored"] - run.recovery_answered - len(answered),
        "healthz_max_ms": max(run.probes_ms, default=None),
        "healthz_failures": run.probe_failures,
        "rss_mb_start": run.rss_mb[0] if run.rss_mb else None,
        "rss_mb_max": max(run.rss_mb, default=None),
        "recovery_s": run.recovery_s,
    }


SERVER_COUNTS = {
    "scored": "kvrank_requests_total",
    "encodes": "kvrank_user_encodes_total",
    "shed": "kvrank_shed_requests_total",
    "dropped": "kvrank_abandoned_requests_total",
}


def server_counts(url: str) -> dict[str, float]:
    """The server's own counts, from one scrape of its ``/metrics``."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {key: sum(samples(text, name)) for key, name in SERVER_COUNTS.items()}


def run_overload(model_dir: Path, settings: OverloadSettings, workdir: Path) -> dict[str, Any]:
    """Capacity, then the same spike against each admission mode; the summary.

    The capacity is measured on the first mode's server twice — before its spike and after
    its recovery — and the yardstick is their mean: on a shared machine the speed of the
    same server drifts by a fifth from one minute to the next, and one reading taken in a
    quick or a slow moment would move every ratio with it."""
    runs: dict[str, tuple[ModeRun, dict[str, float]]] = {}
    readings: list[dict[str, float]] = []
    pool = request_pool(model_dir, settings.candidates)
    with ProcessStack(workdir) as stack:
        for mode in settings.modes:
            env = {"KVRANK_ADMISSION_MODE": mode, "KVRANK_FRONTS": str(settings.fronts)}
            ranker = RankerProcess.start(model_dir, workdir, env=env, timeout_s=120)
            stack.rankers.append(ranker)
            if not readings:  # on the first fresh server: the same for every mode
                readings.append(capacity_of(ranker.url, pool, "before", settings))
            rate = settings.factor * readings[0]["capacity_qps"]
            n = int(rate * settings.duration_s) + 2000  # the spike's, then the recovery's
            bodies = request_bodies(pool, n, f"spike-{mode}")
            before = server_counts(ranker.url)  # the capacity run's scores are not the spike's
            run = asyncio.run(spike(ranker, bodies, rate, settings, readings[0]["idle_ms"]))
            after = server_counts(ranker.url)
            runs[mode] = run, {k: after[k] - before[k] for k in after}
            if len(readings) == 1:
                readings.append(capacity_of(ranker.url, pool, "after", settings))
            ranker.stop()
    capacity = sum(r["capacity_qps"] for r in readings) / len(readings)
    return {
        "settings": asdict(settings),
        "capacity_qps": capacity,
        "capacity_readings_qps": [r["capacity_qps"] for r in readings],
        "idle_ms": readings[0]["idle_ms"],
        "offered_qps": settings.factor * readings[0]["capacity_qps"],
        "modes": {
            mode: summarize(run, server, settings, capacity) for mode, (run, server) in runs.items()
        },
    }


def capacity_of(
    url: str, pool: list[dict[str, Any]], label: str, settings: OverloadSettings
) -> dict[str, float]:
    """:func:`measure_capacity` of the server at ``url`` with fresh users (``label`` names them)."""
    bodies = request_bodies(pool, 4000, f"capacity-{label}")
    return asyncio.run(measure_capacity(url, bodies, settings.capacity_s))
