"""One conformance suite for every cache tier: L1, the host tier, Redis and Redis Cluster
implement the same ``Store`` interface and all store, return, replace, delete and expire
entries, and keep a user's head, the same way. L1 and the host tier hold ``UserKV`` objects,
Redis the encoded entry bytes; the suite checks both by scoring what comes back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from kvrank.cache import (
    CacheKey,
    EntryCodec,
    Head,
    HostStore,
    L1Store,
    ModelIdentity,
    RedisSettings,
    RedisStore,
    Store,
)
from kvrank.model.kv import UserKV


@dataclass
class Tier:
    """A store under test and how a ``UserKV`` becomes its value and back."""

    name: str
    store: Store[Any]
    to_value: Callable[[CacheKey, UserKV], Any]
    to_kv: Callable[[CacheKey, Any], UserKV]


THREADED = {"threaded_read_bytes": 0}
"""Every entry read on a thread with the blocking client, as large entries are."""


@pytest.fixture(
    params=[
        "l1",
        "host",
        "redis",
        "redis-threaded-reads",
        "redis-cluster",
        "redis-cluster-threaded-reads",
    ]
)
async def tier(request, model, redis_server, redis_cluster, patient_s) -> AsyncIterator[Tier]:
    fp = model.cfg.fingerprint()
    if request.param == "l1":
        yield Tier("l1", L1Store(budget_bytes=10_000_000), as_is, as_is)
        return
    if request.param == "host":
        yield Tier("host", HostStore(budget_bytes=10_000_000), as_is, as_is)
        return
    reads = THREADED if request.param.endswith("threaded-reads") else {}
    if request.param.startswith("redis-cluster"):
        redis_cluster.flush()
        settings = RedisSettings(redis_cluster.url, cluster=True, op_timeout_s=patient_s, **reads)
    else:
        redis_server.cli("flushall")
        settings = RedisSettings(redis_server.url, op_timeout_s=patient_s, **reads)
    store = RedisStore(settings)
    codec = EntryCodec(ModelIdentity("v1", fp))
    yield Tier(request.param, store, codec.seal, codec.open)
    await store.close()


def as_is(key: CacheKey, kv: UserKV) -> UserKV:
    return kv


def key(user: str, h: str = "abc123", ns: str = "ns1") -> CacheKey:
    return CacheKey(ns, "v1", user, h)


async def put(tier: Tier, k: CacheKey, kv: UserKV, ttl_s: float = 30, events: int = 5) -> None:
    assert await tier.store.put(k, tier.to_value(k, kv), ttl_s, events)


async def get(tier: Tier, k: CacheKey) -> UserKV | None:
    value = await tier.store.get(k)
    return None if value is None else tier.to_kv(k, value)


async def test_put_then_get_scores_identically(tier, model, factory, tiny_cfg) -> None:
    user, cands = factory.user(tiny_cfg, 12, 1), factory.candidates(tiny_cfg, 5, 1)
    kv = model.encode_user(user)
    await put(tier, key("u1"), kv)
    got = await get(tier, key("u1"))
    assert got is not None
    assert torch.equal(model.score(got, cands), model.score(kv, cands))


async def test_unknown_key_is_a_miss(tier) -> None:
    assert await get(tier, key("nobody")) is None
    assert await tier.store.head(key("nobody")) is None


async def test_put_replaces(tier, model, factory, tiny_cfg) -> None:
    await put(tier, key("u2"), model.encode_user(factory.user(tiny_cfg, 5, 1)))
    await put(tier, key("u2"), model.encode_user(factory.user(tiny_cfg, 9, 2)))
    got = await get(tier, key("u2"))
    assert got is not None and got.length == 9


async def test_delete_removes(tier, model, factory, tiny_cfg) -> None:
    await put(tier, key("u3"), model.encode_user(factory.user(tiny_cfg, 5, 1)))
    assert await tier.store.delete(key("u3"))
    assert await get(tier, key("u3")) is None
    assert not await tier.store.delete(key("u3"))


async def test_entries_expire_after_their_ttl(tier, model, factory, tiny_cfg) -> None:
    # a TTL long enough that a loaded machine's put-then-get ends well inside it
    await put(tier, key("u4"), model.encode_user(factory.user(tiny_cfg, 5, 1)), ttl_s=1.0)
    assert await get(tier, key("u4")) is not None
    await asyncio.sleep(1.25)
    assert await get(tier, key("u4")) is None


async def test_keys_are_isolated(tier, model, factory, tiny_cfg) -> None:
    await put(tier, key("u5", "h1"), model.encode_user(factory.user(tiny_cfg, 5, 1)))
    assert await get(tier, key("u5", "h2")) is None
    assert await get(tier, key("u5", "h1", ns="ns2")) is None
    assert await tier.store.head(key("u5", ns="ns2")) is None


async def test_head_follows_the_latest_put(tier, model, factory, tiny_cfg) -> None:
    kv = model.encode_user(factory.user(tiny_cfg, 5, 1))
    await put(tier, key("u6", "h5"), kv, events=5)
    await put(tier, key("u6", "h8"), kv, events=8)
    assert await tier.store.head(key("u6", "any")) == Head(8, "h8")


async def test_delete_user_removes_every_entry_and_the_head(tier, model, factory, tiny_cfg) -> None:
    kv = model.encode_user(factory.user(tiny_cfg, 5, 1))
    for h in ("h1", "h2", "h3"):
        await put(tier, key("u7", h), kv)
    await put(tier, key("other", "h1"), kv)
    assert await tier.store.delete_user("ns1", "v1", "u7") == 3
    assert all([await get(tier, key("u7", h)) is None for h in ("h1", "h2", "h3")])
    assert await tier.store.head(key("u7")) is None
    assert await get(tier, key("other", "h1")) is not None
