"""One conformance suite for every cache tier: L1, Redis, Redis Cluster and the tiered
combination all store, return, replace, delete and expire ``UserKV`` entries the same way."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from kvrank.cache.keys import CacheKey
from kvrank.cache.l1 import L1Cache
from kvrank.cache.redis_tier import RedisSettings, RedisTier
from kvrank.cache.tiered import TieredCache
from kvrank.model.kv import UserKV


@dataclass
class Store:
    """A tier behind one async get/put/delete surface (what every tier must honour)."""

    name: str
    impl: Any
    version: str
    fingerprint: str

    async def get(self, key: CacheKey) -> UserKV | None:
        if isinstance(self.impl, L1Cache):
            return self.impl.get(key.to_string())
        if isinstance(self.impl, RedisTier):
            return await self.impl.get(key.to_string(), self.version, self.fingerprint)
        kv, _ = await self.impl.get(key, ttl_s=30)
        return kv

    async def put(self, key: CacheKey, kv: UserKV, ttl_s: float) -> None:
        if isinstance(self.impl, L1Cache):
            assert self.impl.put(key.to_string(), kv, ttl_s)
        elif isinstance(self.impl, RedisTier):
            assert await self.impl.put(key.to_string(), kv, ttl_s, jitter=0.0)
        else:
            await self.impl.put(key, kv, kv.length, ttl_s, jitter=0.0)

    async def delete(self, key: CacheKey) -> None:
        if isinstance(self.impl, L1Cache):
            self.impl.delete(key.to_string())
        elif isinstance(self.impl, RedisTier):
            await self.impl.delete(key.to_string())
        else:
            await self.impl.invalidate_user(key.namespace, key.user_id)


@pytest.fixture
def model(factory, tiny_cfg):
    return factory.model(tiny_cfg, version="v1")


@pytest.fixture(params=["l1", "redis", "redis-cluster", "tiered"])
async def store(request, model, redis_server, redis_cluster) -> AsyncIterator[Store]:
    fp, closers = model.cfg.fingerprint(), []
    if request.param == "l1":
        impl: Any = L1Cache(budget_bytes=10_000_000)
    elif request.param in ("redis", "tiered"):
        redis_server.cli("flushall")
        impl = RedisTier(RedisSettings(redis_server.url, op_timeout_s=1.0))
        closers.append(impl)
        if request.param == "tiered":
            impl = TieredCache(L1Cache(10_000_000), impl, "v1", fp)
    else:
        redis_cluster.flush()
        impl = RedisTier(RedisSettings(redis_cluster.url, cluster=True, op_timeout_s=1.0))
        closers.append(impl)
    yield Store(request.param, impl, "v1", fp)
    for c in closers:
        await c.close()


def key(user: str, h: str = "abc123") -> CacheKey:
    return CacheKey("ns1", "v1", user, h)


async def test_put_then_get_scores_identically(store, model, factory, tiny_cfg) -> None:
    user, cands = factory.user(tiny_cfg, 12, 1), factory.candidates(tiny_cfg, 5, 1)
    kv = model.encode_user(user)
    await store.put(key("u1"), kv, ttl_s=30)
    got = await store.get(key("u1"))
    assert got is not None
    assert torch.equal(model.score(got, cands), model.score(kv, cands))


async def test_unknown_key_is_a_miss(store) -> None:
    assert await store.get(key("nobody")) is None


async def test_put_replaces(store, model, factory, tiny_cfg) -> None:
    a = model.encode_user(factory.user(tiny_cfg, 5, 1))
    b = model.encode_user(factory.user(tiny_cfg, 9, 2))
    await store.put(key("u2"), a, ttl_s=30)
    await store.put(key("u2"), b, ttl_s=30)
    got = await store.get(key("u2"))
    assert got is not None and got.length == 9


async def test_delete_removes(store, model, factory, tiny_cfg) -> None:
    await store.put(key("u3"), model.encode_user(factory.user(tiny_cfg, 5, 1)), ttl_s=30)
    await store.delete(key("u3"))
    assert await store.get(key("u3")) is None


async def test_entries_expire_after_their_ttl(store, model, factory, tiny_cfg) -> None:
    await store.put(key("u4"), model.encode_user(factory.user(tiny_cfg, 5, 1)), ttl_s=0.3)
    assert await store.get(key("u4")) is not None
    await asyncio.sleep(0.45)
    assert await store.get(key("u4")) is None


async def test_keys_are_isolated(store, model, factory, tiny_cfg) -> None:
    await store.put(key("u5", "h1"), model.encode_user(factory.user(tiny_cfg, 5, 1)), ttl_s=30)
    assert await store.get(key("u5", "h2")) is None
    assert await store.get(CacheKey("ns2", "v1", "u5", "h1")) is None
