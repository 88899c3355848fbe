"""The host-memory tier: entries the device tier evicts for room, kept in host memory.

Between the device (L1) and Redis: an entry L1 must evict is demoted here with the TTL it
has left instead of dropped, and a lookup that misses L1 looks here before Redis. A hit
moves the entry back to the device (and out of here: the two tiers hold different entries,
so together they hold as many users as both budgets allow). On CUDA the tensors live in
pinned memory, so moving one back is one DMA; on a CPU-only pod this is a second byte
budget with the same semantics. Its own LRU, budget and counters (an :class:`L1Store`
underneath); a ``Store[UserKV]`` like L1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvrank.cache.keys import CacheKey, Head
from kvrank.cache.l1 import L1Stats, L1Store
from kvrank.model.kv import UserKV


@dataclass
class HostStore:
    budget_bytes: int
    device: str = "cpu"
    """Where entries are served: a hit is moved back to this device."""
    lru: L1Store = field(init=False)

    def __post_init__(self) -> None:
        self.lru = L1Store(self.budget_bytes)
        self._pin = torch.device(self.device).type == "cuda"

    @property
    def stats(self) -> L1Stats:
        return self.lru.stats

    @property
    def nbytes(self) -> int:
        return self.lru.nbytes

    def __len__(self) -> int:
        return len(self.lru)

    def admit(self, key: CacheKey, value: UserKV, ttl_s: float, events: int | None) -> None:
        """An entry the device tier evicted (its :data:`~kvrank.cache.l1.Demote`)."""
        self.lru.insert(key, self._to_host(value), ttl_s, events)

    async def get(self, key: CacheKey) -> UserKV | None:
        kv = await self.lru.get(key)
        return None if kv is None else kv.to(self.device)

    async def put(self, key: CacheKey, value: UserKV, ttl_s: float, events: int | None) -> bool:
        return self.lru.insert(key, self._to_host(value), ttl_s, events)

    async def delete(self, key: CacheKey) -> bool:
        return await self.lru.delete(key)

    async def head(self, key: CacheKey) -> Head | None:
        return await self.lru.head(key)

    async def delete_user(self, namespace: str, model_version: str, user_id: str) -> int:
        return await self.lru.delete_user(namespace, model_version, user_id)

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None

    def _to_host(self, kv: UserKV) -> UserKV:
        return kv.pinned() if self._pin else kv.to("cpu")
