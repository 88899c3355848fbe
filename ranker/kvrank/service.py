"""The scoring service: request features in, scores and cache outcome out.

One request: validate → look up the user's K/V (the cache finds it in L1 or L2, or has it
made once across pods) → when it must be made, extend a cached prefix or encode from
scratch → score the candidates against it. How many tiers there are, the locks and the
waits are the cache's business (:mod:`kvrank.cache`); model work runs on the runner's
thread (:mod:`kvrank.runner`). Cache trouble only ever costs time: every failure path
ends in a computed, correct score.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol, overload

import numpy as np
import torch
from prometheus_client import generate_latest
from torch import Tensor

from kvrank.admission import Admission, AdmissionSettings, Deadline, Ticket
from kvrank.cache import (
    TAG_WAIT,
    ChainState,
    Created,
    Lookup,
    Outcome,
    Prefix,
    Reason,
    SequenceChain,
    TieredCache,
    TTLSettings,
    extend_chain,
    sequence_chain,
    user_columns,
)
from kvrank.errors import Abandoned, HistoryRequired, NonFiniteScores
from kvrank.metrics import Metrics
from kvrank.model.config import KVDType
from kvrank.model.contract import (
    CacheableRanker,
    CandidateInput,
    Extendable,
    FeatureSpec,
    UserInput,
)
from kvrank.model.features import (
    check_candidates,
    check_user,
    example_candidates,
    example_user,
)
from kvrank.model.kv import UserKV
from kvrank.runner import ModelRunner

log = logging.getLogger("kvrank.service")


class ServiceSettings(Protocol):
    """What the service reads of its settings: the server's config is one
    (:class:`~kvrank.server.config.ServerConfig`, whose fields document them and their
    limits), passed as it is."""

    @property
    def kv_dtype(self) -> KVDType | None: ...
    @property
    def incremental(self) -> Literal["exact", "approximate", "off"]:
        """``exact``: extend a cached prefix only when the result equals a full encode
        (the model's ``extend_is_exact``), else encode in full; ``approximate``: extend also
        once a window slides (bounded drift, re-encoded every ``refresh_every``); ``off``:
        never extend. A model that cannot extend (no ``extend_user``) always encodes in
        full."""

    @property
    def refresh_every(self) -> int: ...
    @property
    def microbatch_ms(self) -> float:
        """> 0: hold each score back this long for others to join its pass."""

    @property
    def microbatch_max(self) -> int:
        """Requests one scoring pass takes at most: the scores queued while the model is
        busy share a pass (continuous batching; 1: each alone)."""

    @property
    def microbatch_rows(self) -> int:
        """Padded candidate rows one pass takes at most (0: the device's default)."""

    @property
    def admission(self) -> AdmissionSettings: ...
    @property
    def cache_mode(self) -> Literal["kv", "full"]:
        """``full`` serves without any K/V cache: each request's C full sequences batched
        (the strongest no-cache server, the baseline)."""


@dataclass(frozen=True)
class ScoreResult:
    scores: Tensor  # CTR probabilities [C], input order
    logits: Tensor
    outcome: Outcome
    timings_ms: dict[str, float]
    seq_hash: str | None = None
    """The sequence hash the user side was found or made under: a later request of this user
    with the same history may send it instead of its events (``None``: no cache)."""
    events: int | None = None
    """How many events that history had (``None``: sent by reference)."""


@dataclass(frozen=True)
class ModelInputs:
    """One scoring request's inputs, whatever protocol brought them: the history whole
    (``user``), by reference (``seq_hash``) or as the events since a hash (``since`` and
    ``events``), and the candidates."""

    user_id: str
    seq_hash: str | None
    """The history by reference (``None``: sent whole, in ``user``)."""
    seq_hash_from: str
    """Where the hash (``seq_hash`` or ``since``) came from: the input or field that named
    it, or the ``If-Match`` header (what a 412 names)."""
    user: UserInput | None
    candidates: CandidateInput
    since: str | None = None
    """The history as the events after this hash (``events``; ``None``: not so)."""
    events: Mapping[str, Tensor] | None = None
    hashed: str | None = None
    """``user``'s sequence hash as a front computed it after checking every input
    (:mod:`kvrank.engine`): neither is done again, and a hit hashes nothing."""


class ServedModel(Protocol):
    """What the serving process reads of the model it serves."""

    @property
    def version(self) -> str: ...
    @property
    def device(self) -> torch.device: ...


class CacheControl(Protocol):
    """What the serving process reads and sets of the cache."""

    @property
    def l1_budget_bytes(self) -> int: ...
    def set_secrets(self, secrets: Sequence[bytes]) -> None: ...


class Service(Protocol):
    """What the routes call: a :class:`RankingService` in the serving process, or a front's
    :class:`~kvrank.engine.remote.RemoteService` handing the work to the engine."""

    @property
    def model(self) -> ServedModel: ...
    @property
    def features(self) -> FeatureSpec: ...
    @property
    def cache(self) -> CacheControl: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def admission(self) -> Admission: ...
    def deadline(self, timeout_ms: float | None = None) -> Deadline: ...
    async def score(
        self, inputs: ModelInputs, deadline: Deadline | None = None, protocol: str = "json"
    ) -> ScoreResult: ...
    def prefetch(self, user_id: str, user: UserInput) -> Coroutine[None, None, Outcome]: ...
    async def invalidate_user(self, user_id: str) -> int: ...
    def set_ttl(self, settings: TTLSettings) -> None: ...
    async def ttl_in_force(self) -> tuple[TTLSettings, float]: ...
    async def exposition(self) -> bytes: ...
    async def warm_up(self) -> None: ...
    async def close(self) -> None: ...


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
        self.runner = ModelRunner(
            model,
            settings.microbatch_ms / 1e3,
            settings.microbatch_max,
            on_wait=metrics.queue_wait.observe,
            batch_rows=settings.microbatch_rows or None,
            on_pass=metrics.batch_requests.observe,
        )
        self.admission = Admission(settings.admission, self.runner.queued_work_s)
        metrics.watch_admission(self.admission, lambda: self.runner.queue_depth)
        self.fingerprint = model.fingerprint()
        self.features = model.features
        self._extender: Extendable | None = (
            model if isinstance(model, Extendable) and settings.incremental != "off" else None
        )
        """The model when a cached prefix is worth looking up (it extends, and these settings
        let it); decided once, not per miss."""

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

    async def ttl_in_force(self) -> tuple[TTLSettings, float]:
        """The TTL policy and the TTL a new entry gets now."""
        return self.ttl_settings, self.current_ttl()

    async def exposition(self) -> bytes:
        """The service's metrics in Prometheus' text format."""
        return generate_latest(self.metrics.registry)

    async def invalidate_user(self, user_id: str) -> int:
        """Drop every cached entry of ``user_id`` (both tiers); how many were removed."""
        return await self.cache.invalidate_user(user_id)

    def deadline(self, timeout_ms: float | None = None) -> Deadline:
        """A request's deadline: ``timeout_ms`` after it was sent, else the pod's (see
        :meth:`~kvrank.admission.Admission.deadline`)."""
        return self.admission.deadline(timeout_ms)

    async def score(
        self, inputs: ModelInputs, deadline: Deadline | None = None, protocol: str = "json"
    ) -> ScoreResult:
        """Scores of the candidates for the user, by the form its history came in; raises
        :class:`~kvrank.errors.Overloaded` when the pod cannot serve it before ``deadline``
        (default: the configured one), :class:`~kvrank.errors.Abandoned` when nobody waits
        for it any more, :class:`~kvrank.errors.HistoryRequired` when a history named by a
        hash is held nowhere. ``protocol``: how the request came
        (:data:`~kvrank.metrics.PROTOCOLS`, a metrics label)."""
        user_id, cands, field = inputs.user_id, inputs.candidates, inputs.seq_hash_from
        if inputs.since is not None and inputs.events is not None:
            since = (inputs.since, inputs.events)
            return await self._score_since(user_id, since, cands, deadline, protocol, field)
        if inputs.seq_hash is not None:
            seq_hash = inputs.seq_hash
            return await self._by_reference(user_id, seq_hash, cands, deadline, field, protocol)
        if inputs.user is None:
            raise ValueError("scoring inputs carry a history, a seq_hash or events since one")
        return await self._score_whole(
            user_id, inputs.user, cands, deadline, protocol, inputs.hashed
        )

    async def _score_whole(
        self,
        user_id: str,
        user: UserInput,
        cands: CandidateInput,
        deadline: Deadline | None,
        protocol: str,
        hashed: str | None,
    ) -> ScoreResult:
        """Scores against the state of the whole history ``user``; ``hashed``: its sequence
        hash, from a front that checked the input (nothing checked or hashed again)."""
        start = time.perf_counter()
        if hashed is None:
            check_user(self.features, user)
            check_candidates(self.features, cands)
        self._observe_interval(user_id)
        with self.admission.admit(deadline or self.deadline()) as ticket:
            if self.settings.cache_mode == "full":
                logits = await self.runner.run(self.model.forward_full, user, cands, stage="full")
                return self._result(logits, Outcome.NONE, {"total": _ms(start)}, protocol)
            came = (start, protocol, hashed)
            return await self._score_cached(user_id, user, cands, ticket, came)

    async def _score_cached(
        self,
        user_id: str,
        user: UserInput,
        cands: CandidateInput,
        ticket: Ticket,
        came: tuple[float, str, str | None],
    ) -> ScoreResult:
        """Scores against the user's state from the nearest tier, else made; a cached state
        whose scores are not finite, or whose tag failed while it was scored, is dropped and
        looked up again, once — with every check made first: an entry forged again meanwhile
        is then refused before it is handed over, and the state made."""
        start, protocol, hashed = came
        for attempt in range(2):
            found, timings, seq_hash = await self._own_user_kv(
                user_id, user, ticket, hashed, tag_beside=attempt == 0
            )
            logits = await self._finite_scores(user_id, seq_hash, found, cands, timings)
            if logits is not None:
                timings["total"] = _ms(start)
                return self._result(logits, found.outcome, timings, protocol, seq_hash, len(user))
            if found.outcome is Outcome.MISS:
                break  # made afresh for this request: the model's own scores
        raise NonFiniteScores(self.model.version)

    async def _by_reference(
        self,
        user_id: str,
        seq_hash: str,
        cands: CandidateInput,
        deadline: Deadline | None,
        field: str,
        protocol: str,
    ) -> ScoreResult:
        """Scores of ``cands`` against the entry under exactly ``(user_id, seq_hash)`` in any
        tier; :class:`~kvrank.errors.HistoryRequired` (naming ``field``, where the hash came
        from) when none holds it: nothing is computed, the caller resends its events."""
        start = time.perf_counter()
        check_candidates(self.features, cands)
        self._observe_interval(user_id)
        with self.admission.admit(deadline or self.deadline()):
            found = await self._find(user_id, seq_hash, tag_beside=True)
            if found is None:
                raise self._history_required(field, seq_hash)
            timings = dict(found.timings_ms)
            logits = await self._finite_scores(user_id, seq_hash, found, cands, timings)
            if logits is None:  # the entry is gone: the caller sends its events
                raise self._history_required(field, seq_hash)
            self.metrics.by_reference["served"].inc()
            timings["total"] = _ms(start)
            return self._result(logits, found.outcome, timings, protocol, seq_hash)

    async def _score_since(
        self,
        user_id: str,
        sent: tuple[str, Mapping[str, Tensor]],
        cands: CandidateInput,
        deadline: Deadline | None,
        protocol: str,
        field: str,
    ) -> ScoreResult:
        """Scores of ``cands`` for the history under ``since`` followed by ``events`` (the
        events after it, nothing before): the entry under ``(user_id, since)`` extended where
        the model extends it exactly (the settings' ``incremental`` policy), its name the whole
        history's sequence hash. :class:`~kvrank.errors.HistoryRequired` when no tier holds
        that entry or it cannot be extended so (naming ``field``, where the hash came from):
        nothing is computed, the caller sends its whole history."""
        since, events = sent
        start = time.perf_counter()
        check_candidates(self.features, cands)
        self._observe_interval(user_id)
        with self.admission.admit(deadline or self.deadline()):
            found = await self._find(user_id, since)
            extension = self._extension(found, since, events)
            if found is None or extension is None:
                why = None if found is None else f"the entry under {since!r} does not extend"
                raise self._history_required(field, since, why)
            model, user, chain = extension
            base, total = found.kv, len(chain) - 1  # events in the whole history
            lookup = await self.cache.get_or_create(
                self.cache.key(user_id, chain.seq_hash),
                total,
                lambda _: self._named(self._extended(model, base, user), chain),
                tag_beside=True,
            )
            timings = dict(lookup.timings_ms)
            logits = await self._finite_scores(user_id, chain.seq_hash, lookup, cands, timings)
            if logits is None:  # the state is gone: the caller sends its events
                raise self._history_required(field, since)
            self.metrics.by_reference["extended"].inc()
            timings["total"] = _ms(start)
            return self._result(logits, lookup.outcome, timings, protocol, chain.seq_hash, total)

    async def _find(self, user_id: str, seq_hash: str, tag_beside: bool = False) -> Lookup | None:
        """The entry under exactly ``(user_id, seq_hash)`` in any tier (none: no cache);
        ``tag_beside``: to be scored only (see :meth:`TieredCache.get_or_create`)."""
        if self.settings.cache_mode == "full":
            return None
        return await self.cache.find(self.cache.key(user_id, seq_hash), tag_beside)

    def _history_required(
        self, field: str, seq_hash: str, why: str | None = None
    ) -> HistoryRequired:
        """The 412 for a history by reference that cannot be served, counted."""
        self.metrics.by_reference["history_required"].inc()
        return HistoryRequired(field, seq_hash, why)

    def _extension(
        self, found: Lookup | None, since: str, events: Mapping[str, Tensor]
    ) -> tuple[Extendable, UserInput, SequenceChain] | None:
        """The model that extends, the events after ``found``'s state as its input (the
        user's columns those of the state) and the chain extended with them; ``None`` when
        that state cannot be extended: it keeps no chain state, or one that is not
        ``since``'s, or the model (or the settings) would not extend it exactly.
        ``InputError`` for bad events."""
        model = self._extender
        if found is None or model is None:
            return None
        kept = _chain_state(found.kv, since, self.features)
        if kept is None:
            return None
        state, columns = kept
        user = UserInput(events, {k: torch.from_numpy(v) for k, v in columns.items()})
        check_user(self.features, user)
        if not self._may_extend(model, found.kv, len(user)):
            return None
        return model, user, extend_chain(state, user, self.features)

    def _observe_interval(self, user_id: str) -> None:
        interval = self.cache.ttl.observe(user_id)
        if interval is not None:
            self.metrics.intervals.observe(interval)

    async def _finite_scores(
        self,
        user_id: str,
        seq_hash: str,
        found: Lookup,
        cands: CandidateInput,
        timings: dict[str, float],
    ) -> Tensor | None:
        """The logits of ``cands`` against ``found``'s state (their time in ``timings``), or
        ``None`` when the state proved bad: its tag, checked while the model scored, did not
        verify (the cache refused the entry), or a score is not finite (the user's entries
        are dropped from every tier, counted as ``scores``). A damaged or forged state is a
        miss, never a wrong score."""
        t = time.perf_counter()
        logits = await self.runner.score(found.kv, cands)
        timings["score"] = _ms(t)
        if found.verifying is not None:
            t = time.perf_counter()
            genuine = await found.genuine()
            timings[TAG_WAIT] = _ms(t)
            if not genuine:
                return None
        if bool(torch.isfinite(logits).all()):
            return logits
        why = "non-finite scores from it"
        await self.cache.discard(self.cache.key(user_id, seq_hash), Reason.SCORES, why)
        return None

    async def _own_user_kv(
        self, user_id: str, user: UserInput, ticket: Ticket, hashed: str | None, tag_beside: bool
    ) -> tuple[Lookup, dict[str, float], str]:
        """:meth:`_user_kv`, made again for this request when the request it shared the
        computation with (same user, same history) was dropped: one caller leaving must not
        fail another."""
        while True:
            try:
                return await self._user_kv(user_id, user, hashed, tag_beside)
            except Abandoned as exc:
                if exc.ticket is ticket:
                    raise

    def prefetch(self, user_id: str, user: UserInput) -> Coroutine[None, None, Outcome]:
        """The work that makes the user's entry ahead of its ranking request (the retrieval
        stage knows the user first): the same lookup, lock and write-through as
        :meth:`score`, no scoring. ``user`` is checked now, before the work is handed out:
        ``InputError`` is the caller's to hear even when the work runs behind an answer.
        Not a request of the user's: it counts in neither the hit ratio nor the request
        intervals the TTL is tuned from."""
        check_user(self.features, user)
        return self._prefetch(user_id, user)

    async def _prefetch(self, user_id: str, user: UserInput) -> Outcome:
        if self.settings.cache_mode == "full":
            outcome = Outcome.NONE
        else:
            outcome = (await self._user_kv(user_id, user))[0].outcome
        self.metrics.prefetches[outcome.value].inc()
        return outcome

    async def _user_kv(
        self, user_id: str, user: UserInput, hashed: str | None = None, tag_beside: bool = False
    ) -> tuple[Lookup, dict[str, float], str]:
        """The user's K/V from the nearest tier holding it, else made once across pods; where
        time went; the sequence hash it is cached under (``hashed``: already known, the
        chain is then computed only if a miss needs it; ``tag_beside``: to be scored only,
        see :meth:`TieredCache.get_or_create`)."""
        t = time.perf_counter()
        chain = _Chain(lambda: sequence_chain(user, self.fingerprint, self.features))
        key = self.cache.key(user_id, hashed if hashed is not None else chain.made.seq_hash)
        timings = {"hash": _ms(t)}
        found = await self.cache.get_or_create(
            key,
            len(user),
            lambda prefix: self._create(user, prefix, chain.made),
            chain if self._extender is not None else None,
            tag_beside,
        )
        return found, timings | found.timings_ms, key.seq_hash

    async def _create(
        self, user: UserInput, prefix: Prefix | None, chain: SequenceChain
    ) -> Created:
        """Extend the cached prefix the cache found (when it may be), else encode it all;
        the state keeps where ``chain`` (the user's) stands, for later extensions by hash."""
        return await self._named(self._made(user, prefix), chain)

    @staticmethod
    async def _named(making: Awaitable[Created], chain: SequenceChain) -> Created:
        """The state ``making`` makes, keeping where ``chain`` stands after its events."""
        made = await making
        named = replace(made.kv, chain_state=chain.state().to_bytes())
        return Created(named, made.outcome, made.stage, made.ms)

    async def _made(self, user: UserInput, prefix: Prefix | None) -> Created:
        model = self._extender
        if (
            prefix is not None
            and model is not None
            and self._may_extend(model, prefix.kv, len(user) - prefix.events)
        ):
            return await self._extended(model, prefix.kv, user.slice(prefix.events))
        t = time.perf_counter()
        kv = await self.runner.run(
            self.model.encode_user, user, self.settings.kv_dtype, stage="encode"
        )
        self.metrics.encodes["full"].inc()
        return Created(kv, Outcome.MISS, "encode", _ms(t))

    async def _extended(self, model: Extendable, kv: UserKV, events: UserInput) -> Created:
        """``kv`` extended with ``events`` (the events after it)."""
        t = time.perf_counter()
        extended = await self.runner.run(model.extend_user, kv, events, stage="extend")
        self.metrics.encodes["incremental"].inc()
        return Created(extended, Outcome.INCREMENTAL, "extend", _ms(t))

    def _may_extend(self, model: Extendable, kv: UserKV, n_new: int) -> bool:
        mode = self.settings.incremental
        if mode == "exact":
            return model.extend_is_exact(kv, n_new)
        # approximate: extend until the drift bound asks for a full re-encode
        return mode == "approximate" and kv.increments < self.settings.refresh_every

    def _result(
        self,
        logits: Tensor,
        outcome: Outcome,
        timings: dict[str, float],
        protocol: str,
        seq_hash: str | None = None,
        events: int | None = None,
    ) -> ScoreResult:
        self.metrics.observe_request(outcome.value, timings, protocol)
        return ScoreResult(logits.sigmoid(), logits, outcome, timings, seq_hash, events)


class _Chain(Sequence[str]):
    """A user's :class:`~kvrank.cache.SequenceChain`, computed when first needed (a hit
    whose hash a front sent needs none)."""

    def __init__(self, make: Callable[[], SequenceChain]) -> None:
        self._make = make

    @functools.cached_property
    def made(self) -> SequenceChain:
        return self._make()

    def __len__(self) -> int:
        return len(self.made)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...
    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        return self.made[i]


def _chain_state(
    kv: UserKV, since: str, spec: FeatureSpec
) -> tuple[ChainState, dict[str, np.ndarray]] | None:
    """The chain state ``kv`` keeps and the user columns it holds, when it is the one of hash
    ``since`` and fits ``spec``."""
    try:
        state = ChainState.from_bytes(kv.chain_state)
        columns = user_columns(state, spec)
    except ValueError:
        return None
    return (state, columns) if state.seq_hash() == since else None


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1e3
