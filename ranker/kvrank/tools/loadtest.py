"""Cache-enabled vs cache-disabled serving under the same workload, side by side.

One run starts a local stack (redis-server when installed, two cache-enabled rankers
sharing L2, one ranker without a K/V cache), replays the same Zipf/Poisson workload, and
reports hit ratios, p50/p99 for both, QPS, how many user encodes the cache saved, and the
error count. Used by ``kvrank loadtest`` (JSON) and ``kvrank demo`` (table and plots).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from kvrank.model.artifact import load_model, save_model
from kvrank.model.config import QUICK
from kvrank.model.ranker import RankerModel
from kvrank.tools.processes import ProcessStack, scrape
from kvrank.tools.replay import Result, replay, summarize
from kvrank.tools.workload import Workload, WorkloadSettings


@dataclass(frozen=True)
class LoadProfile:
    cache_requests: int
    nocache_requests: int
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


def model_dir_for(model: Path | None, workdir: Path) -> tuple[Path, str]:
    """The artifact to serve: ``model`` if given, else a seed-fixed quick-size model."""
    if model is not None:
        return model, f"artifact {model}"
    torch.manual_seed(0)
    path = workdir / "model"
    save_model(RankerModel(QUICK, "v1").eval(), path)
    return path, "random init (seed 0), quick config"


def run_load(
    profile: str,
    model: Path | None = None,
    workdir: Path | None = None,
    on_result: Callable[[str, Result], None] | None = None,
) -> LoadRun:
    prof = PROFILES[profile]
    tmp = Path(tempfile.mkdtemp(prefix="kvrank-load-")) if workdir is None else workdir
    model_dir, origin = model_dir_for(model, tmp)
    cfg = load_model(model_dir).cfg
    with ProcessStack(tmp / "stack") as stack:
        redis_url = stack.start_redis()
        l2 = ["--redis", redis_url] if redis_url else []
        cache_urls = [stack.start_ranker(model_dir, *l2, "--namespace", "load") for _ in range(2)]
        nocache_url = stack.start_ranker(model_dir, "--no-cache")
        wl = Workload(cfg, prof.workload)
        requests = list(wl.requests(prof.cache_requests))

        def tag(name: str) -> Callable[[Result], None] | None:
            return (lambda r: on_result(name, r)) if on_result else None

        cache_results = asyncio.run(replay(requests, cache_urls, 16, tag("cache")))
        baseline = [replace(r, at_s=0.0) for r in requests[: prof.nocache_requests]]
        nocache_results = asyncio.run(replay(baseline, [nocache_url], 1, tag("nocache")))
        full = sum(scrape(u, "kvrank_user_encodes_total", kind="full") for u in cache_urls)
        incr = sum(scrape(u, "kvrank_user_encodes_total", kind="incremental") for u in cache_urls)
        l1_bytes = sum(scrape(u, "kvrank_l1_bytes") for u in cache_urls)
    cache, nocache = summarize(cache_results), summarize(nocache_results)
    summary = {
        "profile": profile,
        "model": origin,
        "redis": "redis-server (local)" if redis_url else "none installed: L1 only",
        "nocache_mode": "C separate full forwards per request (no K/V cache)",
        "workload": prof.workload.__dict__,
        "hit_ratio": cache["hit_ratio"],
        "l1_hit_ratio": cache["l1_hit_ratio"],
        "l2_hit_ratio": cache["l2_hit_ratio"],
        "incremental_ratio": cache["incremental_ratio"],
        "cache": cache,
        "nocache": nocache,
        "p99_speedup": nocache["p99_ms"] / max(cache["p99_ms"], 1e-9),
        "p50_speedup": nocache["p50_ms"] / max(cache["p50_ms"], 1e-9),
        "qps": {"cache": cache["qps"], "nocache": nocache["qps"]},
        "user_encodes": {
            "full": full,
            "incremental": incr,
            "saved": cache["requests"] - cache["errors"] - full,
        },
        "l1_bytes": l1_bytes,
        "errors": cache["errors"] + nocache["errors"],
    }
    return LoadRun(summary, cache_results, nocache_results)
