"""The queue proxy's gRPC port (``admission.queueProxy``): the Open Inference Protocol's
``ModelInfer`` goes through the stock Envoy binary, run from the operator's own bootstrap in
front of a real ``kvrank serve``, to the ranker's gRPC server; calls beyond the bound are
refused by Envoy at once, with the status and the header a shed call carries when the
ranker refuses it itself (what the bundled router retries on another pod)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from bench_overload_front import Front
from queue_proxy_front import proxied_ranker
from tritonclient.grpc import service_pb2 as pb

from kvrank.metrics import INFER_METHOD
from kvrank.model.config import TINY
from kvrank.model.onetrans import feature_spec
from kvrank.server.oip import tensors
from kvrank.tools.callers import grpc_request
from kvrank.tools.processes import RankerProcess, samples
from kvrank.tools.workload import Workload, WorkloadSettings
from kvrank_common import SHED_HEADER

pytestmark = pytest.mark.slow
BURST = 12
GRPC_RANKER = {"envoy_cluster_name": "ranker-grpc"}
Answer = tuple[str, str, dict[str, str]]
"""(status code name, cache outcome or details, trailing metadata)."""


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[RankerProcess, Front]]:
    with proxied_ranker(tmp_path, TINY, grpc=True) as both:
        yield both


def calls(n: int) -> list[bytes]:
    """``ModelInfer`` requests of distinct users (each a miss), encoded as tritonclient does."""
    settings = WorkloadSettings(users=n, zipf_s=0.0, candidates=10, history_fill=1.0)
    pool = [r.body for r in Workload(TINY, settings).requests(n)]
    spec = feature_spec(TINY)
    return [grpc_request(tensors(spec, {**b, "user_id": f"grpc-{i}"})) for i, b in enumerate(pool)]


def refused_by_envoy(front: Front) -> float:
    """What the proxy refused of the gRPC calls, as the PodMonitor reads it: over the bound
    (active), or waiting for a connection (pending)."""
    stats = httpx.get(f"http://127.0.0.1:{front.stats_port}/stats/prometheus", timeout=5).text
    return sum(
        sum(samples(stats, f"envoy_cluster_upstream_rq_{kind}_overflow_total", **GRPC_RANKER))
        for kind in ("active", "pending")
    )


async def held_burst(ranker: RankerProcess, front: Front, requests: list[bytes]) -> list[Answer]:
    """Every call at once while the ranker is held (stopped): the one Envoy lets through
    waits, all the others must be refused by Envoy; then the ranker is let go."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{front.grpc_port}") as channel:
        infer = channel.unary_unary(INFER_METHOD)

        async def call(payload: bytes) -> Answer:
            try:
                raw = await infer(payload, timeout=60)
            except grpc.aio.AioRpcError as exc:
                trailing = {k: str(v) for k, v in (exc.trailing_metadata() or ())}
                return exc.code().name, exc.details() or "", trailing
            cache = pb.ModelInferResponse.FromString(raw).parameters["cache"].string_param
            return "OK", cache, {}

        assert (await call(requests[0]))[0] == "OK"  # through the proxy, unheld
        ranker.proc.send_signal(signal.SIGSTOP)
        try:
            answers = asyncio.gather(*(call(r) for r in requests[1:]))
            deadline = time.monotonic() + 120  # a bound for a failure, not a speed
            while await asyncio.to_thread(refused_by_envoy, front) < len(requests) - 2:
                assert time.monotonic() < deadline, "Envoy did not refuse the overflow"
                await asyncio.sleep(0.05)
        finally:
            ranker.proc.send_signal(signal.SIGCONT)
        return list(await answers)


def test_grpc_calls_over_the_bound_are_refused_by_the_proxy_as_the_ranker_sheds(proxied) -> None:
    ranker, front = proxied
    shed_before = ranker.metric("kvrank_shed_requests_total")
    answers = asyncio.run(held_burst(ranker, front, calls(BURST + 1)))
    assert Counter(code for code, _, _ in answers) == {"OK": 1, "RESOURCE_EXHAUSTED": BURST - 1}
    for code, said, trailing in answers:
        if code == "RESOURCE_EXHAUSTED":  # what the bundled router retries on another pod
            assert trailing.get(SHED_HEADER) == "queue" and trailing.get("retry-after") == "1"
            assert said == "overloaded: the pod's queue proxy holds 1 calls in flight", said
        else:
            assert said == "miss"  # the one let through was scored once the ranker moved
    assert ranker.metric("kvrank_shed_requests_total") == shed_before  # none reached it
    assert refused_by_envoy(front) == BURST - 1  # what the PodMonitor reads of the proxy
