"""The scoring service: request features in, scores and cache outcome out.

Order of business for one request: hash the user side (chained), look in L1, then — once
per key in this process (singleflight) — in L2, then for a cached prefix to extend, then
take a cross-process lock and encode (or, losing the lock, wait a bounded time for the
winner's entry). Results are written through to both tiers. Model work runs on one
dedicated thread so the event loop keeps serving I/O. Cache trouble only ever costs time:
every failure path ends in a computed, correct score.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from torch import Tensor

from kvrank.cache.keys import CacheKey, sequence_chain
from kvrank.cache.redis_tier import HELD
from kvrank.cache.singleflight import SingleFlight, wait_for_peer
from kvrank.cache.tiered import TieredCache
from kvrank.cache.ttl import IntervalTracker, TTLSettings, current_ttl
from kvrank.metrics import Metrics
from kvrank.model.config import KVDType
from kvrank.model.inputs import Candidates, UserFeatures
from kvrank.model.kv import UserKV
from kvrank.model.ranker import DEFAULT_REFRESH_EVERY, RankerModel

Outcome = Literal["l1", "l2", "incremental", "miss", "none"]
"""``none``: the server runs without a K/V cache (the no-cache baseline)."""
R = TypeVar("R")


@dataclass
class ServiceSettings:
    namespace: str = "default"
    kv_dtype: KVDType | None = None
    lock_wait_s: float = 0.010
    """Bound on waiting for another pod's encode before computing ourselves."""
    lock_ttl_s: float = 2.0
    """A crashed lock holder blocks others for at most this long."""
    refresh_every: int = DEFAULT_REFRESH_EVERY
    ttl: TTLSettings = field(default_factory=TTLSettings)
    microbatch_ms: float = 0.0
    """> 0: collect concurrent requests for up to this long and score them in one pass
    (pays off on GPUs; off by default)."""
    microbatch_max: int = 32
    cache_mode: Literal["kv", "full"] = "kv"
    """``full`` serves without any K/V cache: C full forwards per request (the baseline)."""


@dataclass(frozen=True)
class ScoreResult:
    scores: Tensor  # CTR probabilities [C], input order
    logits: Tensor
    outcome: Outcome
    timings_ms: dict[str, float]


@dataclass
class _Resolved:
    kv: UserKV
    outcome: Outcome


class RankingService:
    def __init__(
        self, model: RankerModel, cache: TieredCache, settings: ServiceSettings, metrics: Metrics
    ) -> None:
        self.model = model
        self.cache = cache
        self.settings = settings
        self.metrics = metrics
        self.tracker = IntervalTracker()
        self.flight: SingleFlight[_Resolved] = SingleFlight()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvrank-model")
        self.fingerprint = model.cfg.fingerprint()
        self.batcher = (
            MicroBatcher(self, settings.microbatch_ms / 1e3, settings.microbatch_max)
            if settings.microbatch_ms > 0
            else None
        )

    async def close(self) -> None:
        self._executor.shutdown(wait=True)

    @property
    def ttl_s(self) -> float:
        return current_ttl(self.tracker, self.settings.ttl)

    async def run_model(self, fn: Callable[..., R], *args: Any) -> R:
        """Run model work on the dedicated model thread (keeps the event loop free)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def score(self, user_id: str, user: UserFeatures, cands: Candidates) -> ScoreResult:
        start = time.perf_counter()
        timings: dict[str, float] = {}
        user.validate(self.model.cfg)
        cands.validate(self.model.cfg)
        interval = self.tracker.observe(user_id)
        if interval is not None:
            self.metrics.intervals.labels(**self.metrics.lbl()).observe(interval)
        if self.settings.cache_mode == "full":
            return await self._score_without_cache(user, cands, start)
        t = time.perf_counter()
        chain = sequence_chain(user, self.fingerprint)
        key = CacheKey(self.settings.namespace, self.model.version, user_id, chain[-1])
        timings["hash"] = _ms(t)
        t = time.perf_counter()
        kv, _ = await self.cache.get_l1(key)
        timings["l1"] = _ms(t)
        if kv is not None:
            resolved = _Resolved(kv, "l1")
            self._lookup("l1", "hit")
        else:
            self._lookup("l1", "miss")
            resolved = await self.flight.do(
                key.to_string(), lambda: self._resolve(key, user, chain, timings)
            )
        t = time.perf_counter()
        if self.batcher is not None:
            logits = await self.batcher.score(resolved.kv, cands)
        else:
            logits = await self.run_model(self.model.score, resolved.kv, cands)
        timings["score"] = _ms(t)
        timings["total"] = _ms(start)
        for stage, ms in timings.items():
            self.metrics.time_stage(stage, ms / 1e3)
        self.metrics.observe_request(resolved.outcome)
        return ScoreResult(logits.sigmoid(), logits, resolved.outcome, timings)

    async def _score_without_cache(
        self, user: UserFeatures, cands: Candidates, start: float
    ) -> ScoreResult:
        logits: Tensor = await self.run_model(self.model.forward_full, user, cands, False)
        total = _ms(start)
        self.metrics.time_stage("total", total / 1e3)
        self.metrics.observe_request("none")
        return ScoreResult(logits.sigmoid(), logits, "none", {"total": total})

    async def _resolve(
        self, key: CacheKey, user: UserFeatures, chain: list[str], timings: dict[str, float]
    ) -> _Resolved:
        ttl = self.ttl_s
        t = time.perf_counter()
        kv = await self.cache.get_l2(key)
        timings["l2"] = _ms(t)
        if kv is not None:
            if self.cache.l2 is not None:
                timings["serde"] = self.cache.l2.last_decode_s * 1e3
            self._lookup("l2", "hit")
            self.cache.l1.put(key.to_string(), kv, ttl)
            return _Resolved(kv, "l2")
        self._lookup("l2", "miss")
        extended = await self._try_extend(key, user, chain, timings)
        if extended is not None:
            await self.cache.put(key, extended, len(user.events), ttl, self.settings.ttl.jitter)
            return _Resolved(extended, "incremental")
        return await self._encode_once(key, user, timings, ttl)

    async def _try_extend(
        self, key: CacheKey, user: UserFeatures, chain: list[str], timings: dict[str, float]
    ) -> UserKV | None:
        head = await self.cache.head(key.namespace, key.user_id)
        n = len(user.events)
        if head is None or not 0 < head.length < n or chain[head.length] != head.seq_hash:
            return None
        prefix_key = CacheKey(key.namespace, key.model_version, key.user_id, head.seq_hash)
        prefix, _ = await self.cache.get(prefix_key, self.ttl_s)
        if prefix is None or self.model.refresh_due(prefix, self.settings.refresh_every):
            return None
        t = time.perf_counter()
        new_events = user.events.slice(head.length)
        kv: UserKV = await self.run_model(self.model.extend_user, prefix, new_events)
        timings["extend"] = _ms(t)
        self.metrics.encodes.labels(**self.metrics.lbl(), kind="incremental").inc()
        return kv

    async def _encode_once(
        self, key: CacheKey, user: UserFeatures, timings: dict[str, float], ttl: float
    ) -> _Resolved:
        l2 = self.cache.l2
        token = None
        if l2 is not None:
            token = await l2.acquire(key.lock_key(), self.settings.lock_ttl_s)
            if token == HELD:  # another pod is encoding this user right now
                self.metrics.flight.labels(**self.metrics.lbl(), event="remote_wait").inc()
                peer = await wait_for_peer(
                    lambda: self.cache.get_l2(key), self.settings.lock_wait_s
                )
                if peer is not None:
                    return self._peer_entry(key, peer, ttl)
                self.metrics.flight.labels(**self.metrics.lbl(), event="remote_timeout").inc()
            if token == HELD:
                token = None
            elif token is not None:
                # double-checked: a peer may have encoded, stored and unlocked between our
                # L2 miss and our lock; its entry is then there and nothing is recomputed
                stored = await self.cache.get_l2(key)
                if stored is not None:
                    await l2.release(key.lock_key(), token)
                    return self._peer_entry(key, stored, ttl)
        try:
            t = time.perf_counter()
            kv: UserKV = await self.run_model(self.model.encode_user, user, self.settings.kv_dtype)
            timings["encode"] = _ms(t)
            self.metrics.encodes.labels(**self.metrics.lbl(), kind="full").inc()
            await self.cache.put(key, kv, len(user.events), ttl, self.settings.ttl.jitter)
        finally:
            if token is not None and l2 is not None:
                await l2.release(key.lock_key(), token)
        return _Resolved(kv, "miss")

    def _peer_entry(self, key: CacheKey, kv: UserKV, ttl: float) -> _Resolved:
        """Another pod's encode, found in L2: counted, kept in L1, served."""
        self.metrics.flight.labels(**self.metrics.lbl(), event="remote_hit").inc()
        self.cache.l1.put(key.to_string(), kv, ttl)
        return _Resolved(kv, "l2")

    def _lookup(self, tier: str, result: str) -> None:
        self.metrics.lookups.labels(**self.metrics.lbl(), tier=tier, result=result).inc()

    def refresh_gauges(self) -> None:
        m, lbl = self.metrics, self.metrics.lbl()
        m.ttl.labels(**lbl).set(self.ttl_s)
        m.interval_mean.labels(**lbl).set(self.tracker.mean() or 0.0)
        m.l1_bytes.labels(**lbl).set(self.cache.l1.nbytes)
        m.l1_entries.labels(**lbl).set(len(self.cache.l1))
        m.flight.labels(**lbl, event="shared").inc(self.flight.stats.shared)
        self.flight.stats.shared = 0
        ev = self.cache.l1.stats.evictions
        m.l1_evictions.labels(**lbl).inc(ev)
        self.cache.l1.stats.evictions = 0
        if self.cache.l2 is not None:
            m.redis_errors.labels(**lbl).inc(self.cache.l2.stats.errors)
            self.cache.l2.stats.errors = 0
            m.circuit.labels(**lbl).set(1.0 if self.cache.l2.breaker.state == "open" else 0.0)


class MicroBatcher:
    """Collects concurrent ``score`` calls for a short window and runs them as one batch."""

    def __init__(self, service: RankingService, window_s: float, max_batch: int) -> None:
        self.service = service
        self.window_s = window_s
        self.max_batch = max_batch
        self._pending: list[tuple[UserKV, Candidates, asyncio.Future[Tensor]]] = []
        self._flush: asyncio.Task[None] | None = None
        self.batches = 0

    async def score(self, kv: UserKV, cands: Candidates) -> Tensor:
        fut: asyncio.Future[Tensor] = asyncio.get_running_loop().create_future()
        self._pending.append((kv, cands, fut))
        if len(self._pending) >= self.max_batch:
            await self._run()
        elif self._flush is None:
            self._flush = asyncio.create_task(self._after_window())
        return await fut

    async def _after_window(self) -> None:
        await asyncio.sleep(self.window_s)
        self._flush = None
        await self._run()

    async def _run(self) -> None:
        batch, self._pending = self._pending, []
        if not batch:
            return
        self.batches += 1
        try:
            results = await self.service.run_model(
                self.service.model.score_many, [(kv, c) for kv, c, _ in batch]
            )
        except Exception as exc:
            for *_, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        for (_, _, fut), logits in zip(batch, results, strict=True):
            if not fut.done():
                fut.set_result(logits)


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1e3
