"""The tiered cache: the only cache object the scoring service talks to.

``get_or_create(key, creator)`` is dogpile's regenerate: L1, then — once per key in this
process (singleflight) — L2, then a cross-pod lock: the winner double-checks L2, runs the
creator and puts the entry in L1; a loser waits a bounded time for the winner's entry and
computes itself when it does not come. The winner writes the entry to L2 and frees the lock
behind the request (write-behind), so no request waits for a SET: a production-size entry
is ~9 MB, ~10 ms to write on loopback. Until it lands, the lock stays held, and a peer pod
that misses waits for the entry as for any lock holder's. An L2 hit is promoted to L1.
``find_prefix`` serves incremental extends: the entry of the longest cached prefix of a
user's sequence, through the user's head record. The cache owns its TTL policy and the
entry codec (L2 holds bytes). Every tier failure and every corrupt entry is a miss; this
module never raises for one.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from kvrank.cache.entry import decode_entry, encode_entry
from kvrank.cache.keys import CacheKey
from kvrank.cache.l1 import L1Store
from kvrank.cache.redis_store import Lock, LockState, RedisStore
from kvrank.cache.singleflight import SingleFlight, wait_for_peer
from kvrank.cache.ttl import AdaptiveTTL
from kvrank.errors import CorruptEntryError
from kvrank.model.kv import UserKV


class Outcome(enum.StrEnum):
    """Where a request's user-side K/V came from (the ``cache`` field of a response)."""

    L1 = "l1"
    L2 = "l2"
    INCREMENTAL = "incremental"
    """A cached prefix extended by the new events."""
    MISS = "miss"
    """Encoded from scratch."""
    NONE = "none"
    """Served without a K/V cache (the no-cache baseline)."""


@dataclass(frozen=True)
class Created:
    """What a creator hands back: the entry and how it was made."""

    kv: UserKV
    outcome: Outcome


@dataclass(frozen=True)
class Prefix:
    """A cached entry of an earlier, shorter state of a user's sequence."""

    kv: UserKV
    events: int
    """How many of the user's events it covers: extend with the ones after."""


@dataclass(frozen=True)
class Lookup:
    """The answer to one ``get_or_create``: the entry, its outcome, and where time went."""

    kv: UserKV
    outcome: Outcome
    timings_ms: dict[str, float]


log = logging.getLogger("kvrank.cache")

MAX_PENDING_WRITES = 32
"""L2 writes behind requests at most at once; a new entry beyond them stays in L1 only (and
its lock is freed at once): a slow Redis must not pile up entries in memory."""

LOCK_WAIT_S = 0.010
"""Bound on waiting for another pod's encode: about one encode of the production-size model on a
GPU; a slow peer must never stall a request for longer."""


@dataclass(frozen=True)
class CacheSettings:
    namespace: str
    model_version: str
    fingerprint: str
    """Of the model config: an entry of another architecture never decodes."""
    device: str = "cpu"
    lock_wait_s: float = LOCK_WAIT_S
    lock_ttl_s: float = 2.0
    """A crashed lock holder blocks others for at most this long."""


@dataclass
class CacheStats:
    """Totals since start (monotonic), read by :class:`~kvrank.cache.metrics.CacheCollector`."""

    lookups: dict[tuple[str, str], int] = field(default_factory=dict)
    """(tier, hit|miss) → count, for the request path's first look in each tier."""
    corrupt: int = 0
    """L2 entries that failed validation (deleted, served as misses)."""
    writes_dropped: int = 0
    """New entries not written to L2 because ``MAX_PENDING_WRITES`` were still in flight."""

    def count(self, tier: str, hit: bool) -> None:
        k = (tier, "hit" if hit else "miss")
        self.lookups[k] = self.lookups.get(k, 0) + 1


@dataclass
class TieredCache:
    settings: CacheSettings
    l1: L1Store
    l2: RedisStore | None = None
    ttl: AdaptiveTTL = field(default_factory=AdaptiveTTL)
    stats: CacheStats = field(default_factory=CacheStats)

    def __post_init__(self) -> None:
        self.flight: SingleFlight[Lookup] = SingleFlight()
        self._writes: set[asyncio.Task[None]] = set()

    def key(self, user_id: str, seq_hash: str) -> CacheKey:
        s = self.settings
        return CacheKey(s.namespace, s.model_version, user_id, seq_hash)

    async def get_or_create(
        self, key: CacheKey, events: int, creator: Callable[[], Awaitable[Created]]
    ) -> Lookup:
        """The entry for ``key`` from the nearest tier, or made once by ``creator``.

        ``events``: how many user events ``key``'s sequence has (kept in the user's head).
        """
        started = time.perf_counter()
        kv = await self.l1.get(key)
        self.stats.count("l1", kv is not None)
        if kv is not None:
            return Lookup(kv, Outcome.L1, {"l1": _ms(started)})
        timings = {"l1": _ms(started)}
        found = await self.flight.do(
            key.to_string(), lambda: self._from_l2_or_create(key, events, creator)
        )
        return Lookup(found.kv, found.outcome, {**timings, **found.timings_ms})

    async def find_prefix(self, key: CacheKey, chain: list[str]) -> Prefix | None:
        """The cached entry of the longest strict prefix of ``chain`` (``key``'s sequence)."""
        head = await self.l2.head(key) if self.l2 is not None else None
        head = head or await self.l1.head(key)  # L2 knows other pods' heads; L1 ours
        if head is None or not 0 < head.length < len(chain) - 1:
            return None
        if chain[head.length] != head.seq_hash:
            return None  # the user's history changed, not just grew
        prefix = self.key(key.user_id, head.seq_hash)
        kv = await self.l1.get(prefix)
        if kv is None:
            kv = await self._l2_entry(prefix)
            if kv is not None:  # promoted: the next extend of this user finds it in L1
                await self.l1.put(prefix, kv, self.ttl.current(), head.length)
        return None if kv is None else Prefix(kv, head.length)

    async def get(self, key: CacheKey) -> UserKV | None:
        """A plain read, L1 then L2, that creates and promotes nothing."""
        kv = await self.l1.get(key)
        return kv if kv is not None else await self._l2_entry(key)

    async def put(self, key: CacheKey, kv: UserKV, events: int) -> None:
        """Write through: L1, then L2 with jitter on the TTL."""
        ttl = self.ttl.current()
        await self.l1.put(key, kv, ttl, events)
        if self.l2 is not None:
            await self._put_l2(self.l2, key, kv, ttl, events)

    async def _put_l2(
        self, l2: RedisStore, key: CacheKey, kv: UserKV, ttl: float, events: int
    ) -> None:
        await l2.put(key, encode_entry(kv), self.ttl.jittered(ttl), events)

    async def invalidate_user(self, user_id: str) -> int:
        """Drop every entry of one user (both tiers) and its head; returns entries removed."""
        s = self.settings
        removed = await self.l1.delete_user(s.namespace, s.model_version, user_id)
        if self.l2 is not None:
            removed = max(removed, await self.l2.delete_user(s.namespace, s.model_version, user_id))
        return removed

    async def ping(self) -> bool:
        """Whether L2 answers (``True`` without L2: nothing to reach)."""
        return self.l2 is None or await self.l2.ping()

    async def flush(self) -> None:
        """Wait until the entries being written to L2 behind requests have landed (or failed)."""
        while self._writes:
            await asyncio.wait(list(self._writes))

    async def close(self) -> None:
        await self.flush()
        if self.l2 is not None:
            await self.l2.close()

    async def _from_l2_or_create(
        self, key: CacheKey, events: int, creator: Callable[[], Awaitable[Created]]
    ) -> Lookup:
        started = time.perf_counter()
        kv, serde_ms = await self._read_l2(key)
        timings = {"l2": _ms(started)} | ({} if serde_ms is None else {"serde": serde_ms})
        if self.l2 is not None:
            self.stats.count("l2", kv is not None)
        if kv is not None:
            await self.l1.put(key, kv, self.ttl.current(), events)
            return Lookup(kv, Outcome.L2, timings)
        found = await self._regenerate(key, events, creator)
        return Lookup(found.kv, found.outcome, timings)

    async def _regenerate(
        self, key: CacheKey, events: int, creator: Callable[[], Awaitable[Created]]
    ) -> Created:
        """Lock, peer wait, double-check, create, L1, write-behind (see module docstring)."""
        lock = await self.l2.acquire(key, self.settings.lock_ttl_s) if self.l2 else _NO_LOCK
        handed_over = False
        try:
            if lock.state is not LockState.UNAVAILABLE:
                peer = await self._peer_entry(key, lock)
                if peer is not None:
                    await self.l1.put(key, peer, self.ttl.current(), events)
                    return Created(peer, Outcome.L2)
            created = await creator()
            ttl = self.ttl.current()
            await self.l1.put(key, created.kv, ttl, events)
            handed_over = self._write_behind(key, created.kv, ttl, events, lock)
            return created
        finally:
            if self.l2 is not None and not handed_over:
                await self.l2.release(key, lock)

    def _write_behind(self, key: CacheKey, kv: UserKV, ttl: float, events: int, lock: Lock) -> bool:
        """Start writing a new entry to L2, then freeing its lock; ``False`` if not started
        (no L2, or too many writes in flight): the caller keeps the lock to free."""
        if self.l2 is None:
            return False
        if len(self._writes) >= MAX_PENDING_WRITES:
            self.stats.writes_dropped += 1
            return False
        task = asyncio.create_task(self._write_l2(self.l2, key, kv, ttl, events, lock))
        self._writes.add(task)
        task.add_done_callback(self._written)
        return True

    async def _write_l2(
        self, l2: RedisStore, key: CacheKey, kv: UserKV, ttl: float, events: int, lock: Lock
    ) -> None:
        try:  # the store turns every Redis failure into False; nothing here raises for one
            await self._put_l2(l2, key, kv, ttl, events)
        finally:
            await l2.release(key, lock)

    def _written(self, task: asyncio.Task[None]) -> None:
        self._writes.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("writing an entry to L2 failed", exc_info=task.exception())

    async def _peer_entry(self, key: CacheKey, lock: Lock) -> UserKV | None:
        """Another pod's entry: waited for while it holds the lock, or double-checked once we
        hold it (it may have stored and unlocked between our miss and our lock)."""
        flight = self.flight.stats
        if lock.state is LockState.HELD:
            flight.remote_waits += 1
            kv = await wait_for_peer(lambda: self._l2_entry(key), self.settings.lock_wait_s)
            if kv is None:
                flight.remote_timeouts += 1
        else:
            kv = await self._l2_entry(key)
        if kv is not None:
            flight.remote_hits += 1
        return kv

    async def _l2_entry(self, key: CacheKey) -> UserKV | None:
        kv, _ = await self._read_l2(key)
        return kv

    async def _read_l2(self, key: CacheKey) -> tuple[UserKV | None, float | None]:
        """Read and decode one L2 entry: (entry or ``None``, ms decoding or ``None``)."""
        data = await self.l2.get(key) if self.l2 is not None else None
        if data is None or self.l2 is None:
            return None, None
        started = time.perf_counter()
        s = self.settings
        try:
            kv = decode_entry(data, s.model_version, s.fingerprint, s.device)
        except CorruptEntryError:
            self.stats.corrupt += 1
            await self.l2.delete(key)
            return None, _ms(started)
        return kv, _ms(started)


_NO_LOCK = Lock(LockState.UNAVAILABLE)
"""Without L2 there is nobody to share with: create at once."""


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1e3
