"""Redis tier behaviour a user relies on: corrupt entries are misses (and deleted), an
outage is a fast miss that heals by itself, namespaces purge across every cluster master,
and cross-process locks expire when their holder dies."""

from __future__ import annotations

import asyncio
import time

import pytest

from kvrank.cache.entry import encode_entry
from kvrank.cache.keys import CacheKey
from kvrank.cache.redis_tier import HELD, RedisSettings, RedisTier, purge_namespace

pytestmark = pytest.mark.redis


@pytest.fixture
def model(factory, tiny_cfg):
    return factory.model(tiny_cfg, version="v1")


@pytest.fixture
async def tier(redis_server):
    redis_server.cli("flushall")
    t = RedisTier(RedisSettings(redis_server.url, op_timeout_s=0.5))
    yield t
    await t.close()


def k(user: str, ns: str = "ns") -> str:
    return CacheKey(ns, "v1", user, "h0").to_string()


@pytest.mark.parametrize(
    "mangle",
    [
        lambda b: b[: len(b) // 2],  # truncated
        lambda b: b[:-10] + b"0123456789",  # payload bytes changed: checksum fails
        lambda b: b"garbage",
        lambda b: b"KVRC" + (10**6).to_bytes(4, "little") + b"{}",  # header length lies
    ],
    ids=["truncated", "bitflip", "garbage", "bad-header-length"],
)
async def test_corrupt_entries_are_misses_and_deleted(
    tier, model, factory, tiny_cfg, redis_server, mangle
) -> None:
    kv = model.encode_user(factory.user(tiny_cfg, 8, 1))
    await tier.client.set(k("u"), mangle(encode_entry(kv)))
    assert await tier.get(k("u"), "v1", model.cfg.fingerprint()) is None
    assert tier.stats.corrupt == 1 and tier.stats.errors == 0
    assert redis_server.cli("exists", k("u")).stdout.strip() == "0"


async def test_entry_of_another_model_version_is_a_miss(tier, model, factory, tiny_cfg) -> None:
    kv = model.encode_user(factory.user(tiny_cfg, 8, 1))
    await tier.put(k("u"), kv, ttl_s=30)
    assert await tier.get(k("u"), "v2", model.cfg.fingerprint()) is None
    assert tier.stats.corrupt == 1


async def test_ttl_has_jitter(tier, model, factory, tiny_cfg, redis_server) -> None:
    kv = model.encode_user(factory.user(tiny_cfg, 4, 1))
    for i in range(20):
        await tier.put(k(f"u{i}"), kv, ttl_s=100, jitter=0.1)
    ttls = {int(redis_server.cli("pttl", k(f"u{i}")).stdout) for i in range(20)}
    assert len(ttls) > 10 and all(89_000 <= t <= 110_000 for t in ttls)


async def test_outage_is_a_fast_miss_and_heals(spawn_redis, model, factory, tiny_cfg) -> None:
    server = spawn_redis()
    tier = RedisTier(RedisSettings(server.url, op_timeout_s=0.05))
    tier.breaker.cooldown_s = 0.3
    kv = model.encode_user(factory.user(tiny_cfg, 4, 1))
    try:
        assert await tier.put(k("u"), kv, ttl_s=30)
        server.stop()
        started = time.monotonic()
        for _ in range(10):
            assert await tier.get(k("u"), "v1", model.cfg.fingerprint()) is None
        assert time.monotonic() - started < 2.0
        assert tier.breaker.state == "open" and tier.stats.refused > 0
        server.start()
        await asyncio.sleep(0.35)
        assert await tier.put(k("u"), kv, ttl_s=30)  # half-open trial succeeds
        assert tier.breaker.state == "closed"
        assert await tier.get(k("u"), "v1", model.cfg.fingerprint()) is not None
    finally:
        await tier.close()
        server.stop()


async def test_purge_removes_one_namespace_on_every_cluster_master(
    redis_cluster, model, factory, tiny_cfg
) -> None:
    redis_cluster.flush()
    settings = RedisSettings(redis_cluster.url, cluster=True, op_timeout_s=1.0)
    tier = RedisTier(settings)
    kv = model.encode_user(factory.user(tiny_cfg, 4, 1))
    try:
        for i in range(60):
            await tier.put(k(f"user{i}", "old"), kv, ttl_s=60)
            await tier.put(k(f"user{i}", "new"), kv, ttl_s=60)
        per_node = [int(n.cli("dbsize").stdout) for n in redis_cluster.nodes]
        assert all(c > 0 for c in per_node), per_node  # keys really spread over masters
        removed = await purge_namespace(settings, "old")
        assert removed == 60
        assert sum(int(n.cli("dbsize").stdout) for n in redis_cluster.nodes) == 60
        assert await tier.get(k("user7", "new"), "v1", model.cfg.fingerprint()) is not None
    finally:
        await tier.close()


async def test_lock_is_exclusive_and_expires(tier) -> None:
    token = await tier.acquire("kvrank-lock:x", ttl_s=0.2)
    assert token not in (None, HELD)
    assert await tier.acquire("kvrank-lock:x", ttl_s=0.2) == HELD
    await asyncio.sleep(0.25)  # holder "crashed": the lock frees itself
    second = await tier.acquire("kvrank-lock:x", ttl_s=5)
    assert second not in (None, HELD)
    await tier.release("kvrank-lock:x", token)  # a stale token must not free it
    assert await tier.acquire("kvrank-lock:x", ttl_s=5) == HELD
    await tier.release("kvrank-lock:x", second)
    assert await tier.acquire("kvrank-lock:x", ttl_s=5) not in (None, HELD)


async def test_lock_on_a_dead_redis_says_unavailable_not_held(spawn_redis) -> None:
    server = spawn_redis()
    tier = RedisTier(RedisSettings(server.url, op_timeout_s=0.05))
    server.stop()
    try:
        assert await tier.acquire("kvrank-lock:y", ttl_s=1) is None  # compute, don't wait
    finally:
        await tier.close()
