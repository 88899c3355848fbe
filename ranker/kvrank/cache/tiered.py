"""The two-level cache: read-through/write-through over L1 (device) and L2 (Redis).

``get`` looks in L1, then L2 (a hit is promoted to L1); ``put`` writes both. Per-user
"head" records (latest cached length and chain hash) let an appended sequence find its
prefix entry. L2 is optional (``None``: L1 only); every L2 failure is already a miss in
:mod:`kvrank.cache.redis_tier`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from redis.exceptions import RedisError

from kvrank.cache.keys import PREFIX, CacheKey, head_key
from kvrank.cache.l1 import L1Cache
from kvrank.cache.redis_tier import RedisTier
from kvrank.model.kv import UserKV

Tier = Literal["l1", "l2"]


@dataclass(frozen=True)
class Head:
    """The latest cached state of one user: how many events and the chain hash there."""

    length: int
    seq_hash: str

    def to_json(self) -> str:
        return json.dumps({"length": self.length, "seq_hash": self.seq_hash})

    @staticmethod
    def from_json(data: bytes | str) -> Head | None:
        try:
            doc = json.loads(data)
            return Head(int(doc["length"]), str(doc["seq_hash"]))
        except (ValueError, KeyError, TypeError):
            return None


@dataclass
class TieredCache:
    l1: L1Cache
    l2: RedisTier | None
    model_version: str
    fingerprint: str
    device: str = "cpu"

    def __post_init__(self) -> None:
        self._heads: dict[str, Head] = {}

    async def get(self, key: CacheKey, ttl_s: float) -> tuple[UserKV | None, Tier | None]:
        text = key.to_string()
        kv = self.l1.get(text)
        if kv is not None:
            return kv, "l1"
        if self.l2 is None:
            return None, None
        kv = await self.l2.get(text, self.model_version, self.fingerprint, self.device)
        if kv is None:
            return None, None
        self.l1.put(text, kv, ttl_s)
        return kv, "l2"

    async def get_l1(self, key: CacheKey) -> tuple[UserKV | None, Tier | None]:
        kv = self.l1.get(key.to_string())
        return (kv, "l1") if kv is not None else (None, None)

    async def get_l2(self, key: CacheKey) -> UserKV | None:
        if self.l2 is None:
            return None
        return await self.l2.get(key.to_string(), self.model_version, self.fingerprint, self.device)

    async def put(
        self, key: CacheKey, kv: UserKV, length: int, ttl_s: float, jitter: float
    ) -> None:
        text = key.to_string()
        self.l1.put(text, kv, ttl_s)
        head = Head(length, key.seq_hash)
        self._heads[key.head_key()] = head
        # payload before metadata: a head never points at an entry not yet written
        if self.l2 is not None and await self.l2.put(text, kv, ttl_s, jitter):
            await self.l2.set_raw(key.head_key(), head.to_json(), ttl_s)

    async def head(self, namespace: str, user_id: str) -> Head | None:
        hk = head_key(namespace, self.model_version, user_id)
        if self.l2 is not None:
            raw = await self.l2.get_raw(hk)
            if raw is not None:
                return Head.from_json(raw)
        return self._heads.get(hk)

    async def invalidate_user(self, namespace: str, user_id: str) -> int:
        """Drop every entry of one user (L1 and L2) and its head; returns entries removed."""
        prefix = f"{PREFIX}:{namespace}:{self.model_version}:{user_id}:"
        removed = self.l1.delete_where(lambda k: k.startswith(prefix))
        hk = head_key(namespace, self.model_version, user_id)
        self._heads.pop(hk, None)
        if self.l2 is not None:
            keys = await self._scan(prefix + "*")
            removed = max(removed, await self.l2.delete(*keys))
            await self.l2.delete(hk)
        return removed

    async def _scan(self, pattern: str) -> list[str]:
        assert self.l2 is not None
        keys: list[str] = []
        try:
            async for key in self.l2.client.scan_iter(match=pattern, count=500):
                keys.append(key.decode() if isinstance(key, bytes) else str(key))
        except (OSError, RedisError):
            return keys  # invalidation is best effort while L2 is failing
        return keys
