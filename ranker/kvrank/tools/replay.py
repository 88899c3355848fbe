"""Sends a workload to running servers and records what every request experienced.

Requests go out at their scheduled times (open loop, bounded concurrency), round-robin
over the given servers, by one protocol (:mod:`kvrank.tools.callers`); each result keeps
latency, (HTTP) status and cache outcome.
:func:`summarize` turns results into the figures reports print (hit ratios, p50/p99, QPS).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import numpy as np

from kvrank.model.contract import FeatureSpec
from kvrank.tools.callers import JSON_HEADERS, WAIT_S, Caller, Encoded, encode
from kvrank.tools.workload import Request


@dataclass(frozen=True)
class Result:
    sent_s: float
    latency_ms: float
    status: int
    outcome: str  # l1 | l2 | incremental | miss | error
    target: int = 0
    """Index of the server URL the request went to."""
    by_reference: str = ""
    """``json-ref``: ``served`` (scored by reference), ``history_required`` (412, then sent
    whole: its latency counts both), ``failed`` (another error answered the reference), or
    empty (sent whole)."""


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """The load generator's garbage collector off while its clock runs, as in ``timeit``: a
    full collection of its heap (torch, the workload's bodies) stops it for 40-130 ms on a
    small CPU, and every request in flight would be charged for the generator's pause."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def replay(
    requests: Iterable[Request],
    targets: list[str],
    concurrency: int = 16,
    on_result: Callable[[Result], None] | None = None,
    speed: float = 1.0,
    routing_header: str | None = None,
    protocol: str = "json",
    spec: FeatureSpec | None = None,
    send_deadline: bool = True,
) -> list[Result]:
    """Open-loop replay; ``speed`` > 1 compresses the schedule. With ``routing_header``
    each request carries its user id there, as callers behind a hashing router do.
    ``protocol``: one of :data:`~kvrank.tools.callers.PROTOCOLS` (``targets``: the rankers'
    URLs, or their gRPC ``host:port`` for ``v2-grpc``; v2 needs the model's ``spec``).
    ``send_deadline=False``: the callers wait as long but do not say so (see
    :class:`~kvrank.tools.callers.Caller`)."""
    sem = asyncio.Semaphore(concurrency)
    results: list[Result] = []
    etags: dict[str, tuple[bytes, str]] = {}
    """user → (history digest, ETag) of its last answer sent whole (``json-ref``)."""

    async def one(caller: Caller, i: int, req: Request, body: Encoded) -> None:
        routed = {} if routing_header is None else {routing_header: req.user_id}
        target = targets[i % len(targets)]
        async with sem:
            t0 = time.monotonic()
            known, by_ref = etags.get(req.user_id), ""
            try:
                if protocol == "json-ref" and known is not None and known[0] == body.history:
                    tagged = {**routed, "If-Match": known[1]}
                    status, outcome, _ = await caller.send(target, body.by_reference, tagged)
                    by_ref = {200: "served", 412: "history_required"}.get(status, "failed")
                if by_ref in ("", "history_required"):
                    sent = {**routed, **body.headers}
                    status, outcome, etag = await caller.send(target, body.whole, sent)
                    if etag is not None:
                        etags[req.user_id] = (body.history, etag)
            except (aiohttp.ClientError, TimeoutError) as exc:  # named, not hidden in a count
                outcome, status = f"error: {type(exc).__name__}", 0
            t1 = time.monotonic()
            r = Result(t0 - start, (t1 - t0) * 1e3, status, outcome, i % len(targets), by_ref)
            results.append(r)
            if on_result:
                on_result(r)

    # bodies encoded before the clock starts: latency is the server's, not the generator's
    requests = list(requests)
    bodies = [encode(req.body, protocol, spec) for req in requests]
    with collector_off():
        start = time.monotonic()
        async with Caller(protocol, concurrency, send_deadline) as caller:
            tasks = []
            for i, (req, body) in enumerate(zip(requests, bodies, strict=True)):
                delay = req.at_s / speed - (time.monotonic() - start)
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(caller, i, req, body)))
            await asyncio.gather(*tasks)
    return sorted(results, key=lambda r: r.sent_s)


WARMUP_USERS = 4


async def warm_up(requests: list[Request], urls: list[str], users: int = WARMUP_USERS) -> None:
    """Before measuring: each server answers the first ``users`` requests' bodies once
    each, under user ids the workload never uses.

    A process's first calls pay one-off costs — kernels picked, allocator pools grown, code
    paths loaded — that a server in service paid long ago; measured, they would be the
    run's slowest requests whatever the design. The workload's own users stay cold, so hit
    ratios and misses are the workload's; each warm-up user comes once, so no request
    interval is observed and the adaptive TTL starts where it would have.
    """
    async with httpx.AsyncClient(timeout=WAIT_S, headers=JSON_HEADERS) as client:
        for url in urls:
            for i, req in enumerate(requests[:users]):
                body = {**req.body, "user_id": f"warmup-{i}"}
                (await client.post(f"{url}/v1/score", json=body)).raise_for_status()


def _kind(r: Result) -> str:
    return r.outcome if r.status == 0 else f"HTTP {r.status}"


def summarize(results: list[Result]) -> dict[str, Any]:
    ok = [r for r in results if r.status == 200]
    lat = np.array([r.latency_ms for r in ok]) if ok else np.array([0.0])
    outcomes = [r.outcome for r in ok]
    n = max(1, len(ok))
    span = (
        max(r.sent_s + r.latency_ms / 1e3 for r in results) - min(r.sent_s for r in results)
        if results
        else 1.0
    )
    return {
        "requests": len(results),
        "errors": len(results) - len(ok),
        "error_kinds": dict(Counter(_kind(r) for r in results if r.status != 200)),
        "hit_ratio": sum(o in ("l1", "host", "l2", "incremental") for o in outcomes) / n,
        "l1_hit_ratio": outcomes.count("l1") / n,
        "host_hit_ratio": outcomes.count("host") / n,
        "l2_hit_ratio": outcomes.count("l2") / n,
        "incremental_ratio": outcomes.count("incremental") / n,
        "miss_ratio": outcomes.count("miss") / n,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "mean_ms": float(lat.mean()),
        "qps": len(ok) / max(span, 1e-9),
        "by_reference": dict(Counter(r.by_reference for r in results if r.by_reference)),
    }
