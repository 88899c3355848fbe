"""The scoring service: request features in, scores and cache outcome out.

One request: validate → look up the user's K/V (the cache finds it in L1 or L2, or has it
made once across pods) → when it must be made, extend a cached prefix or encode from
scratch → score the candidates against it. How many tiers there are, the locks and the
waits are the cache's business (:mod:`kvrank.cache`); model work runs on the runner's
thread (:mod:`kvrank.runner`). Cache trouble only ever costs time: every failure path
ends in a computed, correct score.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from kvrank.cache import Created, Outcome, Prefix, TieredCache, TTLSettings, sequence_chain
from kvrank.metrics import Metrics
from kvrank.model.config import KVDType
from kvrank.model.contract import CacheableRanker, CandidateInput, Extendable, UserInput
from kvrank.model.features import (
    check_candidates,
    check_user,
    example_candidates,
    example_user,
)
from kvrank.model.kv import UserKV
from kvrank.model.ranker import DEFAULT_REFRESH_EVERY
from kvrank.runner import ModelRunner

log = logging.getLogger("kvrank.service")


@dataclass
class ServiceSettings:
    kv_dtype: KVDType | None = None
    incremental: Literal["exact", "approximate", "off"] = "exact"
    """``exact``: extend a cached prefix only when the result equals a full encode
    (the model's ``extend_is_exact``), else encode in full; ``approximate``: extend also
    once a window slides (bounded drift, re-encoded every ``refresh_every``); ``off``: never
    extend. A model that cannot extend (no ``extend_user``) always encodes in full."""
    refresh_every: int = DEFAULT_REFRESH_EVERY
    """``approximate``: encode from scratch once a cached prefix has been extended this many
    times."""
    microbatch_ms: float = 0.0
    """> 0: collect concurrent requests for up to this long and score them in one pass
    (pays off on GPUs; off by default)."""
    microbatch_max: int = 32
    cache_mode: Literal["kv", "full"] = "kv"
    """``full`` serves without any K/V cache: each request's C full sequences batched (the
    strongest no-cache server, the baseline)."""


@dataclass(frozen=True)
class ScoreResult:
    scores: Tensor  # CTR probabilities [C], input order
    logits: Tensor
    outcome: Outcome
    timings_ms: dict[str, float]


class RankingService:
    def __init__(
        self,
        model: CacheableRanker,
        cache: TieredCache,
        settings: ServiceSettings,
        metrics: Metrics,
    ) -> None:
        self.model = model
        self.cache = cache
        self.settings = settings
        self.metrics = metrics
        self.runner = ModelRunner(model, settings.microbatch_ms / 1e3, settings.microbatch_max)
        self.fingerprint = model.fingerprint()
        self.features = model.features
        self._extends = isinstance(model, Extendable) and settings.incremental != "off"
        """Whether a cached prefix is worth looking up for this model and these settings."""

    async def close(self) -> None:
        await self.cache.close()
        self.runner.close()

    async def warm_up(self) -> None:
        """One encode and one score, and the L2 connection (a Redis Cluster client discovers
        its slots on first use), so the first real request does not pay for lazy init and
        does not miss L2 because discovery overran the per-operation timeout."""
        gen = torch.Generator().manual_seed(0)
        user = example_user(self.features, 1, gen)
        cands = example_candidates(self.features, 2, gen)
        kv = await self.runner.run(self.model.encode_user, user)
        await self.runner.run(self.model.score, kv, cands)
        if not await self.cache.ping():
            log.warning("L2 not reachable at startup; serving from L1 until it is")

    def set_ttl(self, settings: TTLSettings) -> None:
        """The TTL policy from now on (a reloaded config file); entries keep theirs."""
        self.cache.ttl.settings = settings

    @property
    def ttl_settings(self) -> TTLSettings:
        return self.cache.ttl.settings

    def current_ttl(self) -> float:
        """The TTL a new entry gets now (measured or fixed), before jitter."""
        return self.cache.ttl.current()

    async def invalidate_user(self, user_id: str) -> int:
        """Drop every cached entry of ``user_id`` (both tiers); how many were removed."""
        return await self.cache.invalidate_user(user_id)

    async def score(self, user_id: str, user: UserInput, cands: CandidateInput) -> ScoreResult:
        start = time.perf_counter()
        check_user(self.features, user)
        check_candidates(self.features, cands)
        interval = self.cache.ttl.observe(user_id)
        if interval is not None:
            self.metrics.intervals.observe(interval)
        if self.settings.cache_mode == "full":
            logits = await self.runner.run(self.model.forward_full, user, cands)
            return self._result(logits, Outcome.NONE, {"total": _ms(start)})
        t = time.perf_counter()
        chain = sequence_chain(user, self.fingerprint, self.features)
        key = self.cache.key(user_id, chain[-1])
        timings = {"hash": _ms(t)}
        found = await self.cache.get_or_create(
            key,
            len(user),
            lambda prefix: self._create(user, prefix),
            chain if self._extends else None,
        )
        timings.update(found.timings_ms)
        t = time.perf_counter()
        logits = await self.runner.score(found.kv, cands)
        timings["score"] = _ms(t)
        timings["total"] = _ms(start)
        return self._result(logits, found.outcome, timings)

    async def _create(self, user: UserInput, prefix: Prefix | None) -> Created:
        """Extend the cached prefix the cache found (when it may be), else encode it all."""
        t = time.perf_counter()
        model = self.model
        if (
            prefix is not None
            and isinstance(model, Extendable)
            and self._may_extend(model, prefix.kv, len(user) - prefix.events)
        ):
            new_events = user.slice(prefix.events)
            kv = await self.runner.run(model.extend_user, prefix.kv, new_events)
            self.metrics.encodes["incremental"].inc()
            return Created(kv, Outcome.INCREMENTAL, "extend", _ms(t))
        kv = await self.runner.run(self.model.encode_user, user, self.settings.kv_dtype)
        self.metrics.encodes["full"].inc()
        return Created(kv, Outcome.MISS, "encode", _ms(t))

    def _may_extend(self, model: Extendable, kv: UserKV, n_new: int) -> bool:
        mode = self.settings.incremental
        if mode == "exact":
            return model.extend_is_exact(kv, n_new)
        # approximate: extend until the drift bound asks for a full re-encode
        return mode == "approximate" and kv.increments < self.settings.refresh_every

    def _result(self, logits: Tensor, outcome: Outcome, timings: dict[str, float]) -> ScoreResult:
        self.metrics.observe_request(outcome.value, timings)
        return ScoreResult(logits.sigmoid(), logits, outcome, timings)


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1e3
