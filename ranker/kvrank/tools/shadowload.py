"""What shadow scoring costs the stable pod's answers, side by side in one run.

Four cache-enabled rankers serve the same workload at the same moments — every request is
sent to each of them at once — sharing one machine and one Redis:

- ``off`` and ``off_again``: no shadowing. Two identical pods: the gap between them is the
  run's noise floor, which any cost of shadowing must be read against;
- ``shadow``: mirrors ``sample`` of its answered requests to a fifth ranker (the canary,
  its own cache namespace);
- ``canary_down``: mirrors as much to a port nothing listens on.

It reports p50/p99 per pod, the p99 ratios against ``off`` (``shadow`` and, as the noise,
``off_again``), every failed request, and the mirrored requests sent, failed and dropped.
Used by ``kvrank shadowtest``.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvrank.tools.loadtest import PROFILES, model_dir_for
from kvrank.tools.processes import ProcessStack, free_port, scrape
from kvrank.tools.replay import Result, replay, summarize
from kvrank.tools.workload import Workload, workload_model

PODS = ("off", "off_again", "shadow", "canary_down")


def _mirrored(urls: dict[str, str]) -> dict[str, dict[str, float]]:
    return {
        pod: {
            result: scrape(urls[pod], "kvrank_shadow_requests_total", result=result)
            for result in ("sent", "error", "dropped")
        }
        for pod in ("shadow", "canary_down")
    }


def _drained(
    urls: dict[str, str], canary: str, timeout_s: float = 15.0
) -> tuple[dict[str, dict[str, float]], float]:
    """The mirrors' counts once the last answers' mirrored requests have been compared (they
    go out after the answers, so the load ends before they do)."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        now = (_mirrored(urls), scrape(canary, "kvrank_requests_total"))
        if now == last and now[0]["shadow"]["sent"] == now[1]:
            return now
        if time.monotonic() > deadline:
            return now
        last = now
        time.sleep(0.5)


def run_shadow_load(
    profile: str = "quick",
    sample: float = 0.2,
    model: Path | None = None,
    workdir: Path | None = None,
    on_result: Callable[[Result], None] | None = None,
) -> dict[str, Any]:
    """``on_result``: called with each answer as it comes (a progress bar)."""
    prof = PROFILES[profile]
    tmp = Path(tempfile.mkdtemp(prefix="kvrank-shadow-")) if workdir is None else workdir
    model_dir, origin = model_dir_for(model, tmp)
    cfg = workload_model(model_dir)
    with ProcessStack(tmp / "stack") as stack:
        redis_url = stack.start_redis()
        l2 = ["--redis", redis_url] if redis_url else []

        def ranker(namespace: str, target: str | None = None) -> str:
            env = {}
            if target is not None:
                env = {"KVRANK_SHADOW_URL": target, "KVRANK_SHADOW_SAMPLE": str(sample)}
            args = ("--namespace", namespace, "--torch-threads", "1")
            return stack.start_ranker(model_dir, *l2, *args, env=env)

        canary = ranker("canary")
        down = f"http://127.0.0.1:{free_port()}"  # nothing listens: a canary that is down
        urls = {
            "off": ranker("off"),
            "off_again": ranker("off-again"),
            "shadow": ranker("shadow", canary),
            "canary_down": ranker("canary-down", down),
        }
        requests = list(Workload(cfg, prof.workload).requests(prof.cache_requests))
        fanned = [r for r in requests for _ in PODS]  # request i goes to PODS[i % 4]
        results = asyncio.run(replay(fanned, [urls[p] for p in PODS], 16 * len(PODS), on_result))
        mirrored, canary_requests = _drained(urls, canary)
    per_pod = {pod: summarize([r for r in results if r.target == i]) for i, pod in enumerate(PODS)}
    off = per_pod["off"]
    return {
        "profile": profile,
        "model": origin,
        "sample": sample,
        "workload": prof.workload.__dict__,
        "condition": "one machine, the same requests sent to every pod at the same moments,"
        " 1 torch thread per pod, one Redis",
        **per_pod,
        "p99_ratio_shadow_vs_off": per_pod["shadow"]["p99_ms"] / off["p99_ms"],
        "p99_ratio_canary_down_vs_off": per_pod["canary_down"]["p99_ms"] / off["p99_ms"],
        "p99_ratio_noise_off_again_vs_off": per_pod["off_again"]["p99_ms"] / off["p99_ms"],
        "p50_ratio_shadow_vs_off": per_pod["shadow"]["p50_ms"] / off["p50_ms"],
        "mirrored": mirrored,
        "canary_requests": canary_requests,
        "errors": sum(p["errors"] for p in per_pod.values()),
    }
