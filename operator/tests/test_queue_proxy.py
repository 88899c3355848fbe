"""The queue proxy the operator puts beside each ranker (``admission.queueProxy``), run by the
stock Envoy binary from the operator's own bootstrap in front of a real ``kvrank serve``:
scoring beyond the bound is refused by Envoy at once, with the headers the bundled router
retries on; what gets through is answered; metrics and health are never bounded."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import httpx
import pytest
from bench_overload_front import Front
from queue_proxy_front import proxied_ranker

from kvrank.model.config import QUICK
from kvrank.tools.processes import RankerProcess, samples
from kvrank.tools.workload import Workload, WorkloadSettings
from kvrank_common import SHED_HEADER

pytestmark = pytest.mark.slow
BURST = 40
RANKER = {"envoy_cluster_name": "ranker"}


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[RankerProcess, Front]]:
    with proxied_ranker(tmp_path, QUICK, env={"KVRANK_ADMISSION_MODE": "shed"}) as both:
        yield both


def bodies(n: int) -> list[bytes]:
    """Distinct users with full windows: each request a miss of some milliseconds."""
    settings = WorkloadSettings(users=n, zipf_s=0.0, candidates=100, history_fill=1.0)
    pool = [r.body for r in Workload(QUICK, settings).requests(n)]
    return [json.dumps({**b, "user_id": f"burst-{i}"}).encode() for i, b in enumerate(pool)]


def refused_by_envoy(front: Front) -> float:
    """What the proxy refused itself, as the PodMonitor reads it: over the bound (active), or
    waiting for a connection (pending: none, there is room in connections)."""
    stats = httpx.get(f"http://127.0.0.1:{front.stats_port}/stats/prometheus", timeout=5).text
    # (prometheus_client's parser gives a counter's sample the _total suffix)
    return sum(
        sum(samples(stats, f"envoy_cluster_upstream_rq_{kind}_overflow_total", **RANKER))
        for kind in ("active", "pending")
    )


async def held_burst(
    ranker: RankerProcess, front: Front, requests: list[bytes]
) -> tuple[list[tuple[int, dict[str, str]]], int]:
    """Every request at once while the ranker is held (stopped, as a ranker busy with a long
    batch answers nothing): the one Envoy lets through waits, all the others must be refused
    by Envoy. Then ``/metrics`` is asked (it must be forwarded, not refused) and the ranker
    let go; the answers, and the scrape's status."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def score(body: bytes) -> tuple[int, dict[str, str]]:
            headers = {"content-type": "application/json"}
            async with session.post(f"{front.url}/v1/score", data=body, headers=headers) as resp:
                await resp.read()
                return resp.status, {k.lower(): v for k, v in resp.headers.items()}

        async def scrape() -> int:
            async with session.get(f"{front.url}/metrics") as resp:
                await resp.read()
                return resp.status

        ranker.proc.send_signal(signal.SIGSTOP)
        try:
            scored = asyncio.gather(*(score(b) for b in requests))
            deadline = time.monotonic() + 120  # a bound for a failure, not a speed
            while await asyncio.to_thread(refused_by_envoy, front) < len(requests) - 1:
                assert time.monotonic() < deadline, "Envoy did not refuse the overflow"
                await asyncio.sleep(0.05)
            scraped = asyncio.create_task(scrape())
            await asyncio.sleep(0.2)  # the scrape reaches the stopped ranker, or is refused
        finally:
            ranker.proc.send_signal(signal.SIGCONT)
        return list(await scored), await scraped


def test_the_overflow_is_refused_by_the_proxy_and_metrics_are_not_bounded(proxied) -> None:
    """With one request in flight to a ranker that does not answer, every other scoring
    request is refused by Envoy at once with the headers the router retries on; the one let
    through is answered once the ranker moves; metrics and health are forwarded all along."""
    ranker, front = proxied
    shed_before = ranker.metric("kvrank_shed_requests_total")
    answers, metrics_status = asyncio.run(held_burst(ranker, front, bodies(BURST)))
    statuses = Counter(status for status, _ in answers)
    assert statuses == {200: 1, 503: BURST - 1}, statuses
    for status, headers in answers:
        if status == 503:  # what the bundled router retries on another pod
            assert headers.get(SHED_HEADER) == "queue" and headers.get("retry-after") == "1"
    assert ranker.metric("kvrank_shed_requests_total") == shed_before  # none reached it
    assert metrics_status == 200  # forwarded while scoring was full
    assert httpx.get(f"{front.url}/healthz", timeout=5).status_code == 200
    assert httpx.get(f"{front.url}/readyz", timeout=5).status_code == 200
    assert refused_by_envoy(front) == BURST - 1  # what the PodMonitor reads of the proxy
