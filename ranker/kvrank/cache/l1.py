"""L1: an in-process, byte-budgeted LRU of ``UserKV`` kept on the model's device.

Eviction order (segmented LRU): an entry starts in the *probation* segment; a second hit
within its lifetime promotes it to the *protected* segment. When the byte budget is
exceeded, the least recently used probation entry goes first (one-shot users), and only
when probation is empty the least recently used protected entry (repeat users). Protected
may hold at most ``protected_fraction`` of the budget; overflow demotes its LRU entry back
to probation. Entries carry an expiry time (the TTL in force when they were written).
Each user's :class:`Head` lives as long as the entry it points at. An entry evicted for
room can be handed to a farther tier (``demote``: the host-memory tier) with the TTL it has
left. Not thread-safe by design: the server calls it from one event loop.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from kvrank.cache.keys import CacheKey, Head, entry_prefix, head_key
from kvrank.model.kv import UserKV


@dataclass
class L1Stats:
    """Totals since start (monotonic; the cache's collector reads them at scrape time)."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    expired: int = 0
    promotions: int = 0


@dataclass
class _Slot:
    kv: UserKV
    nbytes: int
    expires_at: float
    events: int | None


Demote = Callable[[CacheKey, UserKV, float, int | None], None]
"""Where an entry evicted for room goes instead of away: ``(key, kv, ttl left, events)``
(the host-memory tier's :meth:`~kvrank.cache.host.HostStore.admit`)."""


@dataclass
class L1Store:
    """LRU by bytes with two activity tiers (see module docstring); a ``Store[UserKV]``."""

    budget_bytes: int
    protected_fraction: float = 0.8
    clock: Callable[[], float] = time.monotonic
    stats: L1Stats = field(default_factory=L1Stats)
    demote: Demote | None = None
    """Entries evicted for room (not expired ones) are handed here instead of dropped."""

    def __post_init__(self) -> None:
        if self.budget_bytes < 0:
            raise ValueError(f"budget_bytes={self.budget_bytes} must be >= 0")
        self._probation: OrderedDict[str, _Slot] = OrderedDict()
        self._protected: OrderedDict[str, _Slot] = OrderedDict()
        self._bytes = {"probation": 0, "protected": 0}
        self._heads: dict[str, Head] = {}

    @property
    def nbytes(self) -> int:
        return self._bytes["probation"] + self._bytes["protected"]

    def __len__(self) -> int:
        return len(self._probation) + len(self._protected)

    async def get(self, key: CacheKey) -> UserKV | None:
        return self._lookup(key.to_string())

    async def put(self, key: CacheKey, value: UserKV, ttl_s: float, events: int | None) -> bool:
        """Insert or replace; ``False`` when one entry alone exceeds the budget."""
        return self.insert(key, value, ttl_s, events)

    def insert(self, key: CacheKey, value: UserKV, ttl_s: float, events: int | None) -> bool:
        """:meth:`put`, synchronously (what a nearer tier's eviction calls)."""
        text = key.to_string()
        self._delete(text)
        if value.nbytes > self.budget_bytes or ttl_s <= 0:
            return False
        slot = _Slot(value, value.nbytes, self.clock() + ttl_s, events)
        self._insert(text, slot, "probation")
        if events is not None:
            self._heads[key.head_key()] = Head(events, key.seq_hash)
        self._evict_to_budget()
        return True

    async def delete(self, key: CacheKey) -> bool:
        return self._delete(key.to_string())

    async def head(self, key: CacheKey) -> Head | None:
        return self._heads.get(key.head_key())

    async def delete_user(self, namespace: str, model_version: str, user_id: str) -> int:
        prefix = entry_prefix(namespace, model_version, user_id)
        keys = [k for k in (*self._probation, *self._protected) if k.startswith(prefix)]
        for k in keys:
            self._delete(k)
        self._heads.pop(head_key(namespace, model_version, user_id), None)
        return len(keys)

    async def ping(self) -> bool:
        return True  # in this process: always there

    async def close(self) -> None:
        return None

    def _lookup(self, key: str) -> UserKV | None:
        """The synchronous read behind :meth:`get` (counts hits, misses, expiries)."""
        slot, segment = self._find(key)
        if slot is None or segment is None:
            self.stats.misses += 1
            return None
        if slot.expires_at <= self.clock():
            self._drop(key, segment)
            self.stats.expired += 1
            self.stats.misses += 1
            return None
        self.stats.hits += 1
        if segment == "probation":
            self._remove(key, "probation")
            self._insert(key, slot, "protected")
            self.stats.promotions += 1
            self._rebalance()
        else:
            self._protected.move_to_end(key)
        return slot.kv

    # ----------------------------------------------------------------- internals
    def _find(self, key: str) -> tuple[_Slot | None, str | None]:
        if key in self._probation:
            return self._probation[key], "probation"
        if key in self._protected:
            return self._protected[key], "protected"
        return None, None

    def _segment(self, name: str) -> OrderedDict[str, _Slot]:
        return self._probation if name == "probation" else self._protected

    def _insert(self, key: str, slot: _Slot, segment: str) -> None:
        self._segment(segment)[key] = slot
        self._bytes[segment] += slot.nbytes

    def _delete(self, key: str) -> bool:
        _, segment = self._find(key)
        if segment is None:
            return False
        self._drop(key, segment)
        return True

    def _drop(self, key: str, segment: str) -> None:
        """Remove an entry for good: with the head pointing at it (heads stay bounded)."""
        self._remove(key, segment)
        parsed = CacheKey.from_string(key)
        head = self._heads.get(parsed.head_key())
        if head is not None and head.seq_hash == parsed.seq_hash:
            del self._heads[parsed.head_key()]

    def _remove(self, key: str, segment: str) -> _Slot:
        slot = self._segment(segment).pop(key)
        self._bytes[segment] -= slot.nbytes
        return slot

    def _rebalance(self) -> None:
        limit = self.budget_bytes * self.protected_fraction
        while self._bytes["protected"] > limit and len(self._protected) > 1:
            key, slot = next(iter(self._protected.items()))
            self._remove(key, "protected")
            self._insert(key, slot, "probation")
        self._evict_to_budget()

    def _evict_to_budget(self) -> None:
        while self.nbytes > self.budget_bytes:
            segment = "probation" if self._probation else "protected"
            key, slot = next(iter(self._segment(segment).items()))
            self._drop(key, segment)
            self.stats.evictions += 1
            ttl_left = slot.expires_at - self.clock()
            if self.demote is not None and ttl_left > 0:
                self.demote(CacheKey.from_string(key), slot.kv, ttl_left, slot.events)
