"""The tiered cache: the only cache object the scoring service talks to.

The cache is a list of stores, nearest first (:class:`Tier`): *local* tiers hold ``UserKV``
objects in this process (L1 on the model's device), *shared* tiers hold encoded entries
other pods read too (L2 in Redis). Creation across pods is guarded by a separate
:class:`~kvrank.cache.lock.KeyLock`. ``get_or_create(key, events, creator, chain)`` is
dogpile's regenerate: the local tiers, then — once per key in this process (singleflight) —
the shared tiers, then the lock: the winner double-checks, looks up the longest cached
prefix of ``chain`` and hands it to the creator, and puts the new entry in the local tiers;
a loser waits a bounded time for the winner's entry and computes itself when it does not
come. The winner writes the entry to the shared tiers and frees the lock behind the request
(write-behind), so no request waits for a SET: a production-size entry is ~9 MB, ~10 ms to
write on loopback. Until it lands, the lock stays held, and a peer pod that misses waits
for the entry as for any lock holder's. A hit in a farther tier is promoted to the nearer
local ones; a *demoted* tier (host memory) holds what the nearer one evicted for room. The
cache owns its TTL policy and the entry codec (shared tiers hold bytes).
Every tier failure and every corrupt entry is a miss; this module never raises for one.
A lookup that only scores (``tag_beside``) may be handed a large shared-tier entry whose
tag a worker thread is still checking, every other check made: the caller answers only once
:meth:`Lookup.genuine` says so, and no local tier takes the entry before that.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from kvrank.cache.adaptive_ttl import AdaptiveTTL
from kvrank.cache.entry import EntryCodec, ModelIdentity, Reason, describe
from kvrank.cache.keys import CacheKey
from kvrank.cache.lock import NO_LOCK, KeyLock, Lock, LockState
from kvrank.cache.singleflight import SingleFlight, wait_for_peer
from kvrank.cache.store import Store
from kvrank.errors import CorruptEntryError
from kvrank.model.kv import UserKV


class Outcome(enum.StrEnum):
    """Where a request's user-side K/V came from (the ``cache`` field of a response)."""

    L1 = "l1"
    HOST = "host"
    """The host-memory tier: an entry L1 evicted for room."""
    L2 = "l2"
    INCREMENTAL = "incremental"
    """A cached prefix extended by the new events."""
    MISS = "miss"
    """Encoded from scratch."""
    NONE = "none"
    """Served without a K/V cache (the no-cache baseline)."""


@dataclass(frozen=True)
class Created:
    """What a creator hands back: the entry, how it was made, and how long that took."""

    kv: UserKV
    outcome: Outcome
    stage: str | None = None
    """The timing stage the creator's work is reported under (``encode``, ``extend``)."""
    ms: float = 0.0


@dataclass(frozen=True)
class Prefix:
    """A cached entry of an earlier, shorter state of a user's sequence."""

    kv: UserKV
    events: int
    """How many of the user's events it covers: extend with the ones after."""


Creator = Callable[[Prefix | None], Awaitable[Created]]
"""Makes a missing entry, given the cached entry of the longest prefix of the user's
events (``None``: none, or the caller asked for none)."""


@dataclass(frozen=True)
class Tier:
    """One store in the cache's list."""

    outcome: Outcome
    """What a hit here is: the tier's name in answers and metrics (``l1``, ``l2``)."""
    store: Store[Any]
    shared: bool = False
    """Other pods read and write it: it holds encoded entries (bytes), is read once per key
    in this process (singleflight) and written behind the request. A local tier holds
    ``UserKV`` objects in this process and is written inline."""
    demoted: bool = False
    """Fed by the nearer tier's evictions (the host-memory tier), never written through:
    an entry found here moves back to the nearer tiers and out of this one."""


@dataclass(frozen=True)
class Lookup:
    """The answer to one ``get_or_create``: the entry, its outcome, and where time went."""

    kv: UserKV
    outcome: Outcome
    timings_ms: dict[str, float]
    verifying: asyncio.Task[bool] | None = None
    """A large shared-tier entry handed over before its tag was checked (a lookup that asked
    for it: ``tag_beside=True``): the check, on a worker thread meanwhile, then the entry
    promoted to the local tiers (``True``) or refused (``False``: counted, deleted)."""

    async def genuine(self) -> bool:
        """Whether what was made from this entry may be answered: at once unless its tag was
        still being checked; then whether it verified. Nothing made from an entry whose tag
        failed may leave the pod."""
        return True if self.verifying is None else await asyncio.shield(self.verifying)


log = logging.getLogger("kvrank.cache")

SERDE = "serde"
"""The timing stage of opening an entry read from a shared tier (checks, tag, tensors)."""
TAG_WAIT = "tag"
"""The timing stage of an answer waiting, its scores made, for the tag of the shared-tier
entry it was scored from (checked on a worker thread while the model scored)."""
MAX_PENDING_WRITES = 32
"""L2 writes behind requests at most at once; a new entry beyond them stays in L1 only (and
its lock is freed at once): a slow Redis must not pile up entries in memory."""

LOCK_WAIT_S = 0.010
"""Bound on waiting for another pod's encode: about one encode of the production-size model on a
GPU; a slow peer must never stall a request for longer."""


A = TypeVar("A")
R = TypeVar("R")
OFF_LOOP_BYTES = 1 << 20
"""Sealing or opening a production-size entry (9 MB: its tag over every byte) takes
milliseconds; the event loop serves other requests meanwhile (the MAC releases the GIL)."""


@dataclass(frozen=True)
class CacheSettings:
    namespace: str
    model_version: str
    fingerprint: str
    """Of the model config: an entry of another architecture never decodes."""
    device: str = "cpu"
    model_digest: str = ""
    """Of the loaded artifact (:func:`~kvrank.model.artifact.artifact_digest`): an entry
    of other weights under the same version never decodes."""
    kv_dtype: str | None = None
    """The K/V dtype this deployment stores; an entry of another is a miss (``None``: any)."""
    secrets: tuple[bytes, ...] = field(default=(), repr=False)
    """The deployment's entry secret(s) (:class:`~kvrank.cache.entry.EntryCodec`)."""
    lock_wait_s: float = LOCK_WAIT_S
    lock_ttl_s: float = 2.0
    """A crashed lock holder blocks others for at most this long."""
    off_loop_bytes: int = OFF_LOOP_BYTES
    """Entries at least this large are sealed and opened on a worker thread; read by a
    lookup that only scores (``tag_beside=True``), their tag is checked on another one
    while the model scores."""


@dataclass
class CacheStats:
    """Totals since start (monotonic), read by :class:`~kvrank.cache.metrics.CacheCollector`."""

    lookups: dict[tuple[str, str], int] = field(default_factory=dict)
    """(tier, hit|miss) → count, for the request path's first look in each tier."""
    corrupt: dict[str, int] = field(default_factory=dict)
    """Reason (:class:`~kvrank.cache.entry.Reason`) → entries refused (deleted, served as
    misses): a shared tier's that failed a check, or any tier's whose scores were not finite."""
    writes_dropped: int = 0
    """New entries not written to L2 because ``MAX_PENDING_WRITES`` were still in flight."""

    def count(self, tier: str, hit: bool) -> None:
        k = (tier, "hit" if hit else "miss")
        self.lookups[k] = self.lookups.get(k, 0) + 1


@dataclass
class TieredCache:
    settings: CacheSettings
    tiers: Sequence[Tier]
    """Nearest first; the local ones before the shared ones."""
    lock: KeyLock | None = None
    """Guards creation across pods (``None``: nobody to share with, create at once)."""
    ttl: AdaptiveTTL = field(default_factory=AdaptiveTTL)
    stats: CacheStats = field(default_factory=CacheStats)
    check: Callable[[UserKV], None] | None = None
    """The loaded model's own check of a state it is handed (its layers' shapes, the length):
    an entry from a shared tier that it refuses is corrupt, before any tier admits it."""

    def __post_init__(self) -> None:
        self._local = [t for t in self.tiers if not t.shared]
        self._inline = [t for t in self._local if not t.demoted]
        """The local tiers a new or promoted entry is written to."""
        self._shared = [t for t in self.tiers if t.shared]
        assert list(self.tiers) == [*self._local, *self._shared], "local tiers come first"
        self.flight: SingleFlight[Lookup] = SingleFlight()
        s = self.settings
        identity = ModelIdentity(s.model_version, s.fingerprint, s.model_digest, s.kv_dtype)
        self.codec = EntryCodec(identity, s.secrets, s.device)
        self._writes: set[asyncio.Task[None]] = set()
        self._verifying: set[asyncio.Task[bool]] = set()

    @property
    def l1_budget_bytes(self) -> int:
        """What L1 may hold (0 without one)."""
        l1 = next((t.store for t in self.tiers if t.outcome == Outcome.L1), None)
        return int(getattr(l1, "budget_bytes", 0))

    def set_secrets(self, secrets: Sequence[bytes]) -> None:
        """The entry secrets from now on (a rotation step): the first seals new entries, any
        opens; an entry being sealed or opened meanwhile uses the ones it started with."""
        self.codec = replace(self.codec, secrets=tuple(secrets))

    def key(self, user_id: str, seq_hash: str) -> CacheKey:
        s = self.settings
        return CacheKey(s.namespace, s.model_version, user_id, seq_hash)

    async def get_or_create(
        self,
        key: CacheKey,
        events: int,
        creator: Creator,
        chain: Sequence[str] | None = None,
        tag_beside: bool = False,
    ) -> Lookup:
        """The entry for ``key`` from the nearest tier, or made once by ``creator``.

        ``events``: how many user events ``key``'s sequence has (kept in the user's head).
        ``chain``: the sequence's prefix hashes (:func:`~kvrank.cache.keys.sequence_chain`)
        when the creator can extend a cached prefix; ``None``: it is handed none.
        ``tag_beside``: the caller only scores the entry and answers once
        :meth:`Lookup.genuine` says so, so a large shared-tier entry is handed over with
        its tag still being checked (every other check made).
        """
        timings: dict[str, float] = {}
        local = await self._from_local(key, events, timings)
        if local is not None:
            return local
        found = await self.flight.do(
            key.to_string(), lambda: self._shared_or_create(key, events, creator, chain, tag_beside)
        )
        return replace(found, timings_ms={**timings, **found.timings_ms})

    async def find(self, key: CacheKey, tag_beside: bool = False) -> Lookup | None:
        """The entry under exactly ``key`` from the nearest tier, promoted like any hit, or
        ``None``: nothing is made (a request that sent its history by reference).
        ``tag_beside``: as for :meth:`get_or_create`."""
        timings: dict[str, float] = {}
        found = await self._from_local(key, None, timings)
        if found is None:
            found = await self._from_shared(key, None, timings, tag_beside)
        return found

    async def _from_local(
        self, key: CacheKey, events: int | None, timings: dict[str, float]
    ) -> Lookup | None:
        """A hit in the nearest local tier holding ``key``, moved up (``events``: the
        sequence's length, for the user's head; ``None``: unknown, the head is left as it is)."""
        for i, tier in enumerate(self._local):
            started = time.perf_counter()
            kv = await tier.store.get(key)
            timings[tier.outcome.value] = _ms(started)
            self.stats.count(tier.outcome.value, kv is not None)
            if kv is not None:
                await self._move_up(key, kv, events, i)
                return Lookup(kv, tier.outcome, timings)
        return None

    async def _from_shared(
        self, key: CacheKey, events: int | None, timings: dict[str, float], tag_beside: bool
    ) -> Lookup | None:
        """A hit in the first shared tier holding ``key``, promoted into the local ones once
        its tag verified (``tag_beside``: handed over while a worker thread checks it)."""
        for tier in self._shared:
            started = time.perf_counter()
            kv, serde_ms, unchecked = await self._read_shared(tier, key, tag_beside)
            timings[tier.outcome.value] = _ms(started)
            if serde_ms is not None:
                timings[SERDE] = serde_ms
            self.stats.count(tier.outcome.value, kv is not None)
            if kv is None:
                continue
            if unchecked is None:
                await self._promote(key, kv, events, self._inline)
                return Lookup(kv, tier.outcome, timings)
            task = asyncio.create_task(self._verify(tier, key, unchecked, kv, events))
            self._verifying.add(task)
            task.add_done_callback(self._verifying.discard)
            return Lookup(kv, tier.outcome, timings, task)
        return None

    async def _verify(
        self, tier: Tier, key: CacheKey, data: bytes, kv: UserKV, events: int | None
    ) -> bool:
        """The tag of ``data`` (opened as ``kv`` but for it) checked on a worker thread:
        ``kv`` then promoted into the local tiers, or the entry refused."""
        started = time.perf_counter()
        try:
            await asyncio.to_thread(self.codec.check_tag, data)
        except Exception as exc:  # bytes from a shared store: any failure is a miss
            reason = exc.reason if isinstance(exc, CorruptEntryError) else Reason.TAG.value
            await self._refused(tier, key, reason, exc, started)
            return False
        await self._promote(key, kv, events, self._inline)
        return True

    async def find_prefix(self, key: CacheKey, chain: Sequence[str]) -> Prefix | None:
        """The cached entry of the longest strict prefix of ``chain`` (``key``'s sequence)."""
        head = None
        for tier in (*self._shared, *self._local):  # shared tiers know other pods' heads
            head = await tier.store.head(key)
            if head is not None:
                break
        if head is None or not 0 < head.length < len(chain) - 1:
            return None
        if chain[head.length] != head.seq_hash:
            return None  # the user's history changed, not just grew
        prefix = self.key(key.user_id, head.seq_hash)
        kv = await self._local_entry(prefix)
        if kv is None:
            kv = await self._shared_entry(prefix)
            if kv is not None:  # promoted: the next extend of this user finds it here
                await self._promote(prefix, kv, head.length, self._inline)
        return None if kv is None else Prefix(kv, head.length)

    async def get(self, key: CacheKey) -> UserKV | None:
        """A plain read, nearest tier first, that creates and promotes nothing."""
        kv = await self._local_entry(key)
        return kv if kv is not None else await self._shared_entry(key)

    async def put(self, key: CacheKey, kv: UserKV, events: int) -> None:
        """Write through every tier (the shared ones with jitter on the TTL)."""
        ttl = self.ttl.current()
        await self._promote(key, kv, events, self._inline)
        await self._put_shared(key, kv, ttl, events)

    async def discard(self, key: CacheKey, reason: Reason, why: str) -> None:
        """``key``'s entry, served, proved bad: counted and logged as a refused entry, and
        every entry of its user dropped from every tier with its head (the state may have
        been extended from another of them), so the next request makes it from its events."""
        self._count_refused(key, reason.value, why)
        await self.invalidate_user(key.user_id)

    async def invalidate_user(self, user_id: str) -> int:
        """Drop every entry of one user (every tier) and its head; returns entries removed."""
        s = self.settings
        removed = [
            await t.store.delete_user(s.namespace, s.model_version, user_id) for t in self.tiers
        ]
        return max(removed, default=0)

    async def ping(self) -> bool:
        """Whether every shared tier answers (``True`` without one: nothing to reach)."""
        return all([await t.store.ping() for t in self._shared])

    async def flush(self) -> None:
        """Wait until the entries being written behind requests have landed (or failed), and
        the tags being checked beside scoring have been."""
        while self._writes or self._verifying:
            await asyncio.wait([*self._writes, *self._verifying])

    async def close(self) -> None:
        await self.flush()
        for tier in self.tiers:
            await tier.store.close()

    async def _promote(
        self, key: CacheKey, kv: UserKV, events: int | None, tiers: list[Tier]
    ) -> bool:
        """Put ``kv`` in ``tiers`` (but demoted ones); whether every one took it."""
        taken = True
        for tier in tiers:
            if not tier.demoted:
                taken = bool(await tier.store.put(key, kv, self.ttl.current(), events)) and taken
        return taken

    async def _move_up(self, key: CacheKey, kv: UserKV, events: int | None, i: int) -> None:
        """A hit in local tier ``i``: into the nearer ones. Out of a demoted tier first (each
        entry in one of the two, so both budgets count, and what the nearer one evicts to
        make room finds its room here), back in if the nearer ones could not take it."""
        tier = self._local[i]
        if tier.demoted:
            await tier.store.delete(key)
        taken = await self._promote(key, kv, events, self._local[:i])
        if tier.demoted and not taken:
            await tier.store.put(key, kv, self.ttl.current(), events)

    async def _shared_or_create(
        self,
        key: CacheKey,
        events: int,
        creator: Creator,
        chain: Sequence[str] | None,
        tag_beside: bool,
    ) -> Lookup:
        timings: dict[str, float] = {}
        started = time.perf_counter()
        shared = await self._from_shared(key, events, timings, tag_beside)
        if shared is not None:
            return shared
        created = await self._regenerate(key, events, creator, chain)
        if created.stage is not None:
            timings[created.stage] = created.ms
        if created.stage == SERDE:
            # another pod's entry, waited for or read again: the shared tier's time is all of
            # it, from the first read on
            timings[created.outcome.value] = _ms(started)
        return Lookup(created.kv, created.outcome, timings)

    async def _regenerate(
        self, key: CacheKey, events: int, creator: Creator, chain: Sequence[str] | None
    ) -> Created:
        """Lock, peer wait, double-check, prefix, create, local tiers, write-behind (see
        module docstring)."""
        lock = await self.lock.acquire(key, self.settings.lock_ttl_s) if self.lock else NO_LOCK
        handed_over = False
        try:
            if lock.state is not LockState.UNAVAILABLE:
                peer = await self._peer_entry(key, lock)
                if peer is not None:
                    kv, serde_ms = peer
                    await self._promote(key, kv, events, self._inline)
                    return Created(kv, self._shared[0].outcome, SERDE, serde_ms)
            prefix = await self.find_prefix(key, chain) if chain is not None else None
            created = await creator(prefix)
            ttl = self.ttl.current()
            for tier in self._inline:
                await tier.store.put(key, created.kv, ttl, events)
            handed_over = self._write_behind(key, created.kv, ttl, events, lock)
            return created
        finally:
            if self.lock is not None and not handed_over:
                await self.lock.release(key, lock)

    def _write_behind(self, key: CacheKey, kv: UserKV, ttl: float, events: int, lock: Lock) -> bool:
        """Start writing a new entry to the shared tiers, then freeing its lock; ``False`` if
        not started (no shared tier, or too many writes in flight): the caller keeps the lock
        to free."""
        if not self._shared:
            return False
        if len(self._writes) >= MAX_PENDING_WRITES:
            self.stats.writes_dropped += 1
            return False
        task = asyncio.create_task(self._write_shared(key, kv, ttl, events, lock))
        self._writes.add(task)
        task.add_done_callback(self._written)
        return True

    async def _write_shared(
        self, key: CacheKey, kv: UserKV, ttl: float, events: int, lock: Lock
    ) -> None:
        try:  # a store turns every failure into False; nothing here raises for one
            await self._put_shared(key, kv, ttl, events)
        finally:
            if self.lock is not None:
                await self.lock.release(key, lock)

    async def _put_shared(self, key: CacheKey, kv: UserKV, ttl: float, events: int) -> None:
        if self._shared:
            data = await self._off_loop_if(kv.nbytes, self.codec.seal, key, kv)
            for tier in self._shared:
                await tier.store.put(key, data, self.ttl.jittered(ttl), events)

    def _written(self, task: asyncio.Task[None]) -> None:
        self._writes.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("writing an entry to a shared tier failed", exc_info=task.exception())

    async def _peer_entry(self, key: CacheKey, lock: Lock) -> tuple[UserKV, float] | None:
        """Another pod's entry and the ms its decoding took: waited for while it holds the
        lock, or double-checked once we hold it (it may have stored and unlocked between our
        miss and our lock)."""
        flight = self.flight.stats
        if lock.state is LockState.HELD:
            flight.remote_waits += 1
            found = await wait_for_peer(lambda: self._shared_read(key), self.settings.lock_wait_s)
            if found is None:
                flight.remote_timeouts += 1
        else:
            found = await self._shared_read(key)
        if found is not None:
            flight.remote_hits += 1
        return found

    async def _local_entry(self, key: CacheKey) -> UserKV | None:
        for tier in self._local:
            kv: UserKV | None = await tier.store.get(key)
            if kv is not None:
                return kv
        return None

    async def _shared_entry(self, key: CacheKey) -> UserKV | None:
        found = await self._shared_read(key)
        return None if found is None else found[0]

    async def _shared_read(self, key: CacheKey) -> tuple[UserKV, float] | None:
        """The entry under ``key`` in the first shared tier holding one that opens, and the
        ms its decoding took."""
        for tier in self._shared:
            kv, serde_ms, _ = await self._read_shared(tier, key)
            if kv is not None:
                return kv, serde_ms or 0.0
        return None

    async def _read_shared(
        self, tier: Tier, key: CacheKey, tag_beside: bool = False
    ) -> tuple[UserKV | None, float | None, bytes | None]:
        """Read and decode one entry of a shared tier: (entry or ``None``, ms decoding or
        ``None``, the entry's bytes when its tag is still to be checked: ``tag_beside`` and
        an entry large enough to be worth a thread of its own)."""
        data = await tier.store.get(key)
        if data is None:
            return None, None, None
        started = time.perf_counter()
        beside = tag_beside and len(data) >= self.settings.off_loop_bytes
        try:
            opening = functools.partial(self.codec.open, tag=not beside)
            kv = await self._off_loop_if(len(data), opening, key, data)
        except Exception as exc:  # bytes from a shared store: any failure is a miss
            reason = exc.reason if isinstance(exc, CorruptEntryError) else Reason.PAYLOAD.value
            return await self._refused(tier, key, reason, exc, started)
        if self.check is not None:
            try:
                self.check(kv)
            except Exception as exc:  # the model refused the state it would be handed
                return await self._refused(tier, key, Reason.CHECK.value, exc, started)
        return kv, _ms(started), data if beside else None

    async def _off_loop_if(
        self, size: int, fn: Callable[[CacheKey, A], R], key: CacheKey, arg: A
    ) -> R:
        """``fn(key, arg)``, on a worker thread when ``size`` bytes make it worth the hop."""
        if size >= self.settings.off_loop_bytes:
            return await asyncio.to_thread(fn, key, arg)
        return fn(key, arg)

    async def _refused(
        self, tier: Tier, key: CacheKey, reason: str, exc: Exception, started: float
    ) -> tuple[None, float, None]:
        """An entry not served: counted by reason, logged once per reason, deleted."""
        self._count_refused(key, reason, describe(exc))
        await tier.store.delete(key)
        return None, _ms(started), None

    def _count_refused(self, key: CacheKey, reason: str, why: str) -> None:
        corrupt = self.stats.corrupt
        corrupt[reason] = corrupt.get(reason, 0) + 1
        log_it = log.warning if corrupt[reason] == 1 else log.debug
        log_it("entry %s refused (%s): %s", key.to_string(), reason, why)


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1e3
