"""Redis store behaviour a user relies on: an outage is a fast miss that heals by itself,
namespaces purge across every cluster master, and cross-process locks are exclusive,
expire when their holder dies, and tell "held by another pod" from "Redis is down"."""

from __future__ import annotations

import asyncio
import time

import pytest

from kvrank.cache import CacheKey, LockState, RedisSettings, RedisStore, purge_namespace
from kvrank.tools.processes import start_redis_cluster

pytestmark = pytest.mark.redis


@pytest.fixture
async def store(redis_server, patient_s):
    redis_server.cli("flushall")
    s = RedisStore(RedisSettings(redis_server.url, op_timeout_s=patient_s))
    yield s
    await s.close()


def k(user: str, ns: str = "ns") -> CacheKey:
    return CacheKey(ns, "v1", user, "h0")


READS = pytest.mark.parametrize(
    "reads",
    [{}, {"threaded_read_bytes": 0}],  # small entries: asyncio client; large: blocking, on threads
    ids=["asyncio-reads", "threaded-reads"],
)


@READS
async def test_outage_is_a_fast_miss_and_heals(spawn_redis, reads) -> None:
    server = spawn_redis()
    # a stopped server refuses at once: the misses are fast whatever the operation timeout,
    # which only has to let the writes before and after the outage through on a loaded box
    store = RedisStore(RedisSettings(server.url, op_timeout_s=0.5, **reads))
    store.breaker.cooldown_s = 0.3
    try:
        assert await store.put(k("u"), b"entry", ttl_s=30, events=1)
        server.stop()
        started = time.monotonic()
        for _ in range(10):
            assert await store.get(k("u")) is None
        assert time.monotonic() - started < 2.0
        assert store.breaker.state == "open" and store.stats.refused > 0
        server.start()
        await asyncio.sleep(0.35)
        assert await store.put(k("u"), b"entry", ttl_s=30, events=1)  # half-open trial
        assert store.breaker.state == "closed"
        assert await store.get(k("u")) == b"entry"
    finally:
        await store.close()
        server.stop()


@READS
async def test_a_redis_restart_between_requests_fails_no_operation(spawn_redis, reads) -> None:
    # pooled connections predate the restart: each client must find that out and reconnect
    # within the operation, not fail the first write and read after it
    server = spawn_redis()
    store = RedisStore(RedisSettings(server.url, op_timeout_s=0.5, **reads))
    try:
        assert await store.put(k("u"), b"before", ttl_s=30, events=1)
        assert await store.get(k("u")) == b"before"
        server.stop()
        server.start()
        assert await store.put(k("u"), b"after", ttl_s=30, events=1)
        assert await store.get(k("u")) == b"after"
        assert store.stats.errors == 0 and store.breaker.state == "closed"
    finally:
        await store.close()
        server.stop()


@READS
async def test_a_cluster_that_cannot_be_reached_at_all_is_a_miss(spawn_redis, reads) -> None:
    # a cluster client that reaches no node at start raises no RedisError of its own
    server = spawn_redis()
    server.stop()
    store = RedisStore(RedisSettings(server.url, cluster=True, op_timeout_s=0.5, **reads))
    try:
        assert await store.get(k("u")) is None
        assert not await store.put(k("u"), b"entry", ttl_s=30, events=1)
        assert await store.delete_user("ns", "v1", "u") == 0
        assert store.stats.errors >= 2
    finally:
        await store.close()


@pytest.mark.slow
@READS
async def test_a_cluster_node_outage_is_a_miss_and_reads_heal_after_it_rejoins(
    tmp_path, reads
) -> None:
    cluster = start_redis_cluster(tmp_path / "cluster")
    store = RedisStore(RedisSettings(cluster.url, cluster=True, op_timeout_s=0.5, **reads))
    store.breaker.cooldown_s = 0.2
    users = [f"user{i}" for i in range(30)]
    try:
        for u in users:
            assert await store.put(k(u), b"entry-" + u.encode(), ttl_s=60, events=1)
        assert [await store.get(k(u)) for u in users] == [b"entry-" + u.encode() for u in users]
        cluster.nodes[1].stop()
        during = [await store.get(k(u)) for u in users]  # never raises
        assert None in during and set(during) - {None} <= {b"entry-" + u.encode() for u in users}
        cluster.nodes[1].start()  # rejoins from its nodes.conf, its keys lost
        cluster.wait_ok()

        async def healed() -> bool:
            await asyncio.sleep(0.25)  # past the breaker's cooldown
            for u in users:
                await store.put(k(u), b"again-" + u.encode(), ttl_s=60, events=1)
            got = [await store.get(k(u)) for u in users]
            return got == [b"again-" + u.encode() for u in users]

        deadline = time.monotonic() + 15
        while not await healed():
            assert time.monotonic() < deadline, "reads did not recover after the node rejoined"
    finally:
        await store.close()
        cluster.stop()


async def test_purge_removes_one_namespace_on_every_cluster_master(
    redis_cluster, patient_s
) -> None:
    redis_cluster.flush()
    settings = RedisSettings(redis_cluster.url, cluster=True, op_timeout_s=patient_s)
    store = RedisStore(settings)
    try:
        for i in range(60):
            await store.put(k(f"user{i}", "old"), b"x", ttl_s=60, events=1)
            await store.put(k(f"user{i}", "new"), b"x", ttl_s=60, events=1)
        per_node = [int(n.cli("dbsize").stdout) for n in redis_cluster.nodes]
        assert all(c > 0 for c in per_node), per_node  # keys really spread over masters
        removed = await purge_namespace(settings, "old")
        assert removed == 120  # 60 entries and 60 heads
        assert sum(int(n.cli("dbsize").stdout) for n in redis_cluster.nodes) == 120
        assert await store.get(k("user7", "new")) == b"x"
    finally:
        await store.close()


async def test_lock_is_exclusive_and_expires(store) -> None:
    # a lock of 2 s: the second try comes well within it even on a stalled machine
    first = await store.acquire(k("x"), ttl_s=2.0)
    assert first.state is LockState.ACQUIRED
    assert (await store.acquire(k("x"), ttl_s=2.0)).state is LockState.HELD
    await asyncio.sleep(2.1)  # holder "crashed": the lock frees itself
    second = await store.acquire(k("x"), ttl_s=5)
    assert second.state is LockState.ACQUIRED
    await store.release(k("x"), first)  # a stale token must not free it
    assert (await store.acquire(k("x"), ttl_s=5)).state is LockState.HELD
    await store.release(k("x"), second)
    assert (await store.acquire(k("x"), ttl_s=5)).state is LockState.ACQUIRED


async def test_lock_on_a_dead_redis_says_unavailable_not_held(spawn_redis) -> None:
    server = spawn_redis()
    store = RedisStore(RedisSettings(server.url, op_timeout_s=0.05))
    server.stop()
    try:  # nobody can be waited for: the caller computes at once
        assert (await store.acquire(k("y"), ttl_s=1)).state is LockState.UNAVAILABLE
    finally:
        await store.close()
