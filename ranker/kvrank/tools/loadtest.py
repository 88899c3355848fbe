"""Cache-enabled vs cache-disabled serving under the same workload, side by side.

One run starts a local stack (redis-server when installed; ``pods`` cache-enabled rankers
sharing L2; the same number of rankers without a K/V cache, each batching a request's C full
sequences at the user's own length — the strongest no-cache server — on the same threads;
and one more no-cache ranker with every core), warms every server's process up on users
outside the workload, and replays the same requests at the same moments to the cached pods,
then to the no-cache pods: both sides face the same load on the same cores. The no-cache
ranker with every core then answers the first requests one at a time, with nothing queued:
the best a no-cache request can do. Reports hit ratios (and the oracle's: what an unbounded,
never-expiring cache would serve of the same requests), p50/p99 and QPS of each side, how
many user encodes the cache saved, and the error count. The profile sets the workload; any
knob of it, and the number of pods, can be overridden to measure one's own traffic shape.
Used by ``kvrank loadtest`` (JSON) and ``kvrank demo`` (table and plots).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from kvrank.data.movielens_features import MOVIELENS
from kvrank.errors import WorkloadError
from kvrank.model.artifact import load_ranker, save_model
from kvrank.model.config import QUICK, ModelConfig
from kvrank.model.ranker import RankerModel
from kvrank.tools.callers import GRPC_PROTOCOLS
from kvrank.tools.processes import ProcessStack, free_port, scrape
from kvrank.tools.replay import Result, replay, summarize, warm_up
from kvrank.tools.timeline import NAME as TIMELINE
from kvrank.tools.timeline import timeline_requests
from kvrank.tools.workload import Request, Workload, WorkloadSettings, workload_model


@dataclass(frozen=True)
class LoadProfile:
    cache_requests: int
    """Requests replayed to each side, at their scheduled times."""
    alone_requests: int
    """The first requests again, one at a time, to the no-cache ranker with every core."""
    workload: WorkloadSettings


PROFILES = {
    "smoke": LoadProfile(80, 4, WorkloadSettings(users=10, rate_qps=20.0, candidates=50)),
    "quick": LoadProfile(500, 30, WorkloadSettings(users=30, rate_qps=10.0, candidates=100)),
    "full": LoadProfile(5000, 100, WorkloadSettings(users=1000, rate_qps=60.0, candidates=100)),
}


@dataclass
class LoadRun:
    summary: dict[str, Any]
    cache_results: list[Result]
    nocache_results: list[Result]
    alone_results: list[Result]


def model_dir_for(
    model: Path | None, workdir: Path, cfg: ModelConfig = QUICK, name: str = "quick"
) -> tuple[Path, str]:
    """The artifact to serve: ``model`` if given, else a seed-fixed model of ``cfg``."""
    if model is not None:
        return model, f"artifact {model}"
    torch.manual_seed(0)
    path = workdir / "model"
    save_model(RankerModel(cfg, "v1").eval(), path)
    return path, f"random init (seed 0), {name} config"


SOURCES = ("synthetic", TIMELINE)
"""Where requests come from: the synthetic workload's users, or MovieLens' real timeline."""


def _requests(
    source: str, model: Path | None, workdir: Path, prof: LoadProfile, settings: WorkloadSettings
) -> tuple[Path, str, list[Request], dict[str, Any]]:
    """The artifact to serve, its origin, the requests and how the report describes them."""
    if source == "synthetic":
        model_dir, origin = model_dir_for(model, workdir)
        work = Workload(workload_model(model_dir), settings)
        return model_dir, origin, list(work.requests(prof.cache_requests)), settings.__dict__
    model_dir, origin = model_dir_for(model, workdir, MOVIELENS, TIMELINE)
    cfg = workload_model(model_dir)
    if not isinstance(cfg, ModelConfig):
        raise WorkloadError(f"the {TIMELINE} workload replays to the built-in model only")
    rate, c = settings.rate_qps, settings.candidates
    timeline = timeline_requests(cfg, prof.cache_requests, rate, c, settings.seed)
    return model_dir, origin, timeline.requests, timeline.workload


def _encodes(urls: list[str]) -> tuple[float, float]:
    """Full and incremental user encodes so far, summed over ``urls``."""
    return (
        sum(scrape(u, "kvrank_user_encodes_total", kind="full") for u in urls),
        sum(scrape(u, "kvrank_user_encodes_total", kind="incremental") for u in urls),
    )


def run_load(
    profile: str,
    model: Path | None = None,
    workdir: Path | None = None,
    on_result: Callable[[str, Result], None] | None = None,
    workload: WorkloadSettings | None = None,
    pods: int = 2,
    source: str = "synthetic",
    protocol: str = "json",
) -> LoadRun:
    """``workload`` replaces the profile's (request counts stay the profile's); ``pods``
    cache-enabled rankers share one Redis. ``source`` is one of :data:`SOURCES` (the
    timeline takes its rate, candidates and seed from the workload settings). ``protocol``
    (:data:`~kvrank.tools.callers.PROTOCOLS`) is how every side sends its requests, but the
    no-cache side sends ``json-ref``'s whole (it holds none to refer to)."""
    prof = PROFILES[profile]
    settings = workload or prof.workload
    tmp = Path(tempfile.mkdtemp(prefix="kvrank-load-")) if workdir is None else workdir
    model_dir, origin, requests, described = _requests(source, model, tmp, prof, settings)
    with ProcessStack(tmp / "stack") as stack:
        m = _measure(stack, model_dir, requests, prof.alone_requests, pods, on_result, protocol)
    summary = _summary(profile, origin, described, pods, m) | {"protocol": protocol}
    return LoadRun(summary, m.cache, m.nocache, m.alone)


@dataclass(frozen=True)
class _Measured:
    """What one side-by-side run measured."""

    cache: list[Result]
    nocache: list[Result]
    alone: list[Result]
    oracle: float
    """Share of requests an ideal cache could serve (their user's K/V was made before)."""
    encodes: tuple[float, float]
    """Full and incremental user encodes the cached side made during the run."""
    l1_bytes: float
    threads: int
    """torch threads per pod."""
    redis: bool


def _measure(
    stack: ProcessStack,
    model_dir: Path,
    requests: list[Request],
    alone_requests: int,
    pods: int,
    on_result: Callable[[str, Result], None] | None,
    protocol: str = "json",
) -> _Measured:
    """The same requests at the same moments on ``pods`` cached and ``pods`` no-cache
    rankers (one Redis shared by the cached ones), then a no-cache ranker alone."""
    redis_url = stack.start_redis()
    l2 = ["--redis", redis_url] if redis_url else []
    # the pods of one side serve at once: the cores are split between them (more
    # threads than cores only makes them wait on each other)
    threads = max(1, len(os.sched_getaffinity(0)) // pods)
    per_pod = ["--torch-threads", str(threads)]

    def ranker(*args: str) -> tuple[str, str]:
        return _start_ranker(stack, model_dir, protocol in GRPC_PROTOCOLS, *args)

    cached = [ranker(*l2, "--namespace", "load", *per_pod) for _ in range(pods)]
    nocached = [ranker("--no-cache", *per_pod) for _ in range(pods)]
    alone_url, alone_target = ranker("--no-cache")
    cache_urls = [url for url, _ in cached]

    def tag(name: str) -> Callable[[Result], None] | None:
        return (lambda r: on_result(name, r)) if on_result else None

    asyncio.run(warm_up(requests, [*cache_urls, *(url for url, _ in nocached), alone_url]))
    spec = load_ranker(model_dir).features if protocol.startswith("v2") else None
    whole = "json" if protocol == "json-ref" else protocol  # no-cache pods hold no reference
    encodes_before = _encodes(cache_urls)
    cache = asyncio.run(
        replay(requests, [t for _, t in cached], 16, tag("cache"), protocol=protocol, spec=spec)
    )
    nocache = asyncio.run(
        replay(requests, [t for _, t in nocached], 16, tag("nocache"), protocol=whole, spec=spec)
    )
    one_by_one = [replace(r, at_s=0.0) for r in requests[:alone_requests]]
    alone = asyncio.run(
        replay(one_by_one, [alone_target], 1, tag("alone"), protocol=whole, spec=spec)
    )
    full, incr = (
        after - before for after, before in zip(_encodes(cache_urls), encodes_before, strict=True)
    )
    return _Measured(
        cache,
        nocache,
        alone,
        oracle=sum(r.returning for r in requests) / len(requests),
        encodes=(full, incr),
        l1_bytes=sum(scrape(u, "kvrank_l1_bytes") for u in cache_urls),
        threads=threads,
        redis=bool(redis_url),
    )


def _start_ranker(
    stack: ProcessStack, model_dir: Path, by_grpc: bool, *args: str
) -> tuple[str, str]:
    """A ranker's URL, and where requests go to it (its gRPC port when ``by_grpc``)."""
    if not by_grpc:
        url = stack.start_ranker(model_dir, *args)
        return url, url
    port = free_port()
    return stack.start_ranker(model_dir, *args, "--grpc-port", str(port)), f"127.0.0.1:{port}"


def _summary(
    profile: str, origin: str, workload: dict[str, Any], pods: int, m: _Measured
) -> dict[str, Any]:
    cache, nocache, alone = summarize(m.cache), summarize(m.nocache), summarize(m.alone)
    full, incr = m.encodes
    return {
        "profile": profile,
        "model": origin,
        "redis": "redis-server (local)" if m.redis else "none installed: L1 only",
        "nocache_mode": (
            "the C full sequences per request batched in chunks, at the user's own length"
            " (no K/V cache); as many pods on the same threads, the same requests at the"
            " same moments"
        ),
        "workload": workload,
        "cache_pods": pods,
        "torch_threads_per_pod": m.threads,
        "hit_ratio": cache["hit_ratio"],
        "oracle_hit_ratio": m.oracle,
        "hit_ratio_vs_oracle": cache["hit_ratio"] / m.oracle if m.oracle else 0.0,
        "l1_hit_ratio": cache["l1_hit_ratio"],
        "l2_hit_ratio": cache["l2_hit_ratio"],
        "incremental_ratio": cache["incremental_ratio"],
        "cache": cache,
        "nocache_batched": nocache,
        "nocache_batched_alone": alone,
        "p99_speedup_vs_batched": _ratio(nocache["p99_ms"], cache["p99_ms"]),
        "p50_speedup_vs_batched": _ratio(nocache["p50_ms"], cache["p50_ms"]),
        "p99_speedup_vs_batched_alone": _ratio(alone["p99_ms"], cache["p99_ms"]),
        "p50_speedup_vs_batched_alone": _ratio(alone["p50_ms"], cache["p50_ms"]),
        "qps": {"cache": cache["qps"], "nocache_batched": nocache["qps"]},
        "user_encodes": {
            "full": full,
            "incremental": incr,
            "saved": cache["requests"] - cache["errors"] - full,
        },
        "l1_bytes": m.l1_bytes,
        "errors": cache["errors"] + nocache["errors"] + alone["errors"],
    }


def _ratio(baseline_ms: float, cached_ms: float) -> float:
    return baseline_ms / max(cached_ms, 1e-9)
