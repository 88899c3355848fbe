"""Shadow scoring: a sampled share of this pod's requests, once answered, is sent to another
model version's Service (a canary) and the two score vectors are compared.

The canary scores the mirrored requests into its own cache namespace, which is what warms
it before it takes real traffic; this pod measures how far the canary's scores are from its
own: ``kvrank_shadow_abs_delta`` (every candidate's \\|Δscore\\|), ``kvrank_shadow_rank_
correlation`` (Spearman's ρ of the two candidate orderings) and
``kvrank_shadow_topk_changed_total`` (requests whose top-k set changed). Nothing here is on
the request path: once the answer has been sent, :meth:`ShadowMirror.offer` puts the
request's body as received on a bounded queue (a full queue drops it and counts the drop),
and one background task sends what is queued, one at a time. A canary that is down or slow
costs this pod nothing but counted errors.
Settings (target, sample rate, k) are read at every offer, so a reloaded config file
applies at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable

import httpx
import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram
from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger("kvrank.shadow")
SHADOW_HEADER = "x-kvrank-shadow"
"""Marks a mirrored request: the receiving pod scores it but never mirrors it again."""
DELTA_BUCKETS = (1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.03, 0.1, 0.3, 1.0)
CORRELATION_BUCKETS = (-0.5, 0.0, 0.5, 0.8, 0.9, 0.95, 0.99, 0.999, 1.0)


class ShadowConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str | None = Field(None, description="The canary Service's base URL; None: off.")
    version: str | None = Field(
        None,
        description="The model version behind url: pods serving it never mirror (one config"
        " file serves every version of a RankerDeployment).",
    )
    sample: float = Field(0.0, ge=0.0, le=1.0, description="Share of requests mirrored.")
    top_k: int = Field(10, ge=1, le=1000, description="k of the top-k comparison.")
    queue: int = Field(64, ge=1, le=10_000, description="Mirrored requests waiting at most.")
    timeout_ms: float = Field(2000.0, gt=0, le=60_000)


def compare(stable: np.ndarray, canary: np.ndarray, k: int) -> tuple[np.ndarray, float, bool]:
    """Per-candidate \\|Δscore\\|, Spearman's ρ of the orderings (1.0 for fewer than two
    candidates or constant scores) and whether the top-k sets differ."""
    delta = np.abs(stable - canary)
    rho = 1.0
    if len(stable) > 1:
        ra, rb = np.argsort(np.argsort(-stable)), np.argsort(np.argsort(-canary))
        if ra.std() > 0 and rb.std() > 0:
            rho = float(np.corrcoef(ra, rb)[0, 1])
    k = min(k, len(stable))
    changed = set(np.argsort(-stable)[:k].tolist()) != set(np.argsort(-canary)[:k].tolist())
    return delta, rho, changed


class ShadowMirror:
    def __init__(
        self,
        settings: Callable[[], ShadowConfig],
        registry: CollectorRegistry,
        labels: dict[str, str],
        own_version: str,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.settings = settings
        self.own_version = own_version
        self.rng = rng
        names, values = list(labels), list(labels.values())
        self._queue: asyncio.Queue[tuple[bytes, list[float]]] = asyncio.Queue(settings().queue)
        requests = Counter(
            "kvrank_shadow_requests",
            "Mirrored requests by result (sent: compared; error: the canary failed; dropped:"
            " the queue was full)",
            [*names, "result"],
            registry=registry,
        )
        self.results = {r: requests.labels(*values, r) for r in ("sent", "error", "dropped")}
        histograms = {
            "kvrank_shadow_abs_delta": (
                "|stable score - canary score| per candidate of a mirrored request",
                DELTA_BUCKETS,
            ),
            "kvrank_shadow_rank_correlation": (
                "Spearman rank correlation of the stable and canary orderings per request (no"
                " _sum: buckets below 0; use histogram_quantile)",
                CORRELATION_BUCKETS,
            ),
        }
        self.delta, self.rank = (
            Histogram(name, doc, names, buckets=buckets, registry=registry).labels(*values)
            for name, (doc, buckets) in histograms.items()
        )
        self.topk_changed = Counter(
            "kvrank_shadow_topk_changed",
            "Mirrored requests whose top-k candidates differ between stable and canary",
            names,
            registry=registry,
        ).labels(*values)
        self._task: asyncio.Task[None] | None = None

    def offer(self, body: bytes, scores: list[float]) -> None:
        """Mirror this answered request (its body as received: nothing is serialized again)
        if it is sampled; never waits."""
        s = self.settings()
        if not s.url or s.sample <= 0 or s.version == self.own_version:
            return
        if self.rng() >= s.sample:
            return
        if self._queue.full():
            self.results["dropped"].inc()
            return
        self._queue.put_nowait((body, scores))

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        async with httpx.AsyncClient() as client:
            while True:
                body, scores = await self._queue.get()
                s = self.settings()
                if not s.url:
                    continue
                try:
                    resp = await client.post(
                        f"{s.url.rstrip('/')}/v1/score",
                        content=body,
                        headers={"content-type": "application/json", SHADOW_HEADER: "1"},
                        timeout=s.timeout_ms / 1e3,
                    )
                    resp.raise_for_status()
                    canary = np.asarray(resp.json()["scores"], dtype=np.float64)
                except (httpx.HTTPError, ValueError, KeyError) as exc:
                    self.results["error"].inc()
                    log.debug("shadow request to %s failed: %s", s.url, exc)
                    continue
                stable = np.asarray(scores, dtype=np.float64)
                if canary.shape != stable.shape:
                    self.results["error"].inc()
                    continue
                delta, rho, changed = compare(stable, canary, s.top_k)
                for d in delta:
                    self.delta.observe(float(d))
                self.rank.observe(rho)
                if changed:
                    self.topk_changed.inc()
                self.results["sent"].inc()
