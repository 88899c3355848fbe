"""L1: an in-process, byte-budgeted LRU of ``UserKV`` kept on the model's device.

Eviction order (segmented LRU): an entry starts in the *probation* segment; a second hit
within its lifetime promotes it to the *protected* segment. When the byte budget is
exceeded, the least recently used probation entry goes first (one-shot users), and only
when probation is empty the least recently used protected entry (repeat users). Protected
may hold at most ``protected_fraction`` of the budget; overflow demotes its LRU entry back
to probation. Entries carry an expiry time (the TTL in force when they were written).
Not thread-safe by design: the server calls it from one event loop.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from kvrank.model.kv import UserKV


@dataclass
class L1Stats:
    """Counters since the last :meth:`reset` (collected into Prometheus by the service)."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    expired: int = 0
    promotions: int = 0

    def reset(self) -> None:
        self.hits = self.misses = self.evictions = self.expired = self.promotions = 0


@dataclass
class _Slot:
    kv: UserKV
    nbytes: int
    expires_at: float


@dataclass
class L1Cache:
    """LRU by bytes with two activity tiers (see module docstring)."""

    budget_bytes: int
    protected_fraction: float = 0.8
    clock: Callable[[], float] = time.monotonic
    stats: L1Stats = field(default_factory=L1Stats)

    def __post_init__(self) -> None:
        if self.budget_bytes < 0:
            raise ValueError(f"budget_bytes={self.budget_bytes} must be >= 0")
        self._probation: OrderedDict[str, _Slot] = OrderedDict()
        self._protected: OrderedDict[str, _Slot] = OrderedDict()
        self._bytes = {"probation": 0, "protected": 0}

    @property
    def nbytes(self) -> int:
        return self._bytes["probation"] + self._bytes["protected"]

    def __len__(self) -> int:
        return len(self._probation) + len(self._protected)

    def get(self, key: str) -> UserKV | None:
        slot, segment = self._find(key)
        if slot is None or segment is None:
            self.stats.misses += 1
            return None
        if slot.expires_at <= self.clock():
            self._remove(key, segment)
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

    def put(self, key: str, kv: UserKV, ttl_s: float) -> bool:
        """Insert or replace; returns False when one entry alone exceeds the budget."""
        nbytes = kv.nbytes
        self.delete(key)
        if nbytes > self.budget_bytes or ttl_s <= 0:
            return False
        self._insert(key, _Slot(kv, nbytes, self.clock() + ttl_s), "probation")
        self._evict_to_budget()
        return True

    def delete(self, key: str) -> bool:
        _, segment = self._find(key)
        if segment is None:
            return False
        self._remove(key, segment)
        return True

    def delete_where(self, predicate: Callable[[str], bool]) -> int:
        keys = [k for k in (*self._probation, *self._protected) if predicate(k)]
        for k in keys:
            self.delete(k)
        return len(keys)

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
            key = next(iter(self._segment(segment)))
            self._remove(key, segment)
            self.stats.evictions += 1
