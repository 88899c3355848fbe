"""The host-memory tier as a pod uses it: what L1 evicts for room is kept in host memory
with the TTL it had left, found there before Redis, and moved back to L1 — so a working set
larger than L1 but within L1 + host is served without reading Redis, and scores stay the
model's."""

from __future__ import annotations

import pytest
import torch

from kvrank.cache import (
    AdaptiveTTL,
    CacheCollector,
    CacheSettings,
    Created,
    HostStore,
    L1Store,
    Outcome,
    RedisSettings,
    RedisStore,
    TTLSettings,
    l1_and_redis,
)
from kvrank.metrics import Metrics
from kvrank.tools.processes import samples

pytestmark = pytest.mark.redis
USERS = 6


@pytest.fixture
def users(factory, tiny_cfg, model):
    fp = model.cfg.fingerprint()
    return [
        (
            f"u{i}",
            factory.user(tiny_cfg, 9, i),
            factory.chain(factory.user(tiny_cfg, 9, i), fp, tiny_cfg)[-1],
        )
        for i in range(USERS)
    ]


async def serve(cache, model, users, passes: int) -> list[str]:
    """Every user once per pass, in order (an LRU's worst case); the outcomes."""
    outcomes = []
    for _ in range(passes):
        for user_id, user, seq_hash in users:

            async def create(_prefix, user=user) -> Created:
                return Created(model.encode_user(user), Outcome.MISS, "encode", 1.0)

            found = await cache.get_or_create(cache.key(user_id, seq_hash), 9, create)
            outcomes.append(found.outcome.value)
    return outcomes


def entry_bytes(model, users) -> int:
    return model.encode_user(users[0][1]).nbytes


@pytest.mark.parametrize("with_host", [False, True])
async def test_a_working_set_over_l1_but_within_l1_and_host_reads_no_redis(
    model, users, redis_server, with_host, patient_s
) -> None:
    """6 users cycled, L1 room for 3: without the host tier every request past the first
    pass reads Redis; with room for 3 more in host memory none does."""
    redis_server.cli("flushall")
    size = entry_bytes(model, users)
    l1 = L1Store(3 * size)
    host = HostStore(3 * size + size // 2) if with_host else None
    l2 = RedisStore(RedisSettings(redis_server.url, op_timeout_s=patient_s))
    cache = l1_and_redis(CacheSettings("ns", "v1", model.cfg.fingerprint()), l1, l2, None, host)
    try:
        first = await serve(cache, model, users, 1)
        await cache.flush()
        later = await serve(cache, model, users, 2)
        assert first == ["miss"] * USERS
        if with_host:
            assert later == ["host"] * (2 * USERS), later  # each one demoted, then found
            assert l2.stats.bytes_read == 0
        else:
            assert later == ["l2"] * (2 * USERS), later
            assert l2.stats.bytes_read == 2 * sum(len(l2_entry(cache, model, u)) for u in users)
        metrics = Metrics("v1", "ns")
        metrics.registry.register(CacheCollector(cache, l1, l2, host))
        from prometheus_client import generate_latest

        text = generate_latest(metrics.registry).decode()
        assert sum(samples(text, "kvrank_redis_read_bytes_total")) == l2.stats.bytes_read
        assert bool(samples(text, "kvrank_host_bytes")) is with_host
    finally:
        await cache.close()


def l2_entry(cache, model, user) -> bytes:
    """The entry Redis holds for ``user``: sealed to its key."""
    user_id, events, seq_hash = user
    return cache.codec.seal(cache.key(user_id, seq_hash), model.encode_user(events))


async def test_an_entry_lives_in_one_local_tier_and_moves_back_to_l1_on_a_hit(
    model, users, factory, tiny_cfg
) -> None:
    size = entry_bytes(model, users)
    l1, host = L1Store(2 * size), HostStore(10 * size)
    cache = l1_and_redis(CacheSettings("ns", "v1", model.cfg.fingerprint()), l1, None, None, host)
    await serve(cache, model, users[:3], 1)  # u0 evicted from L1 for u2: demoted
    assert (len(l1), len(host)) == (2, 1)
    key = cache.key(users[0][0], users[0][2])
    assert await l1.get(key) is None and await host.lru.get(key) is not None
    found = await cache.get_or_create(key, 9, lambda _p: pytest.fail("made again"))
    assert found.outcome == Outcome.HOST
    # back in L1, out of the host tier (u1 went down to make room): both budgets count
    assert await l1.get(key) is not None and await host.lru.get(key) is None
    assert (len(l1), len(host)) == (2, 1)
    cands = factory.candidates(tiny_cfg, 4, 1)
    expected = model.score(model.encode_user(users[0][1]), cands)
    assert torch.equal(model.score(found.kv, cands), expected)


async def test_a_demoted_entry_keeps_the_ttl_it_had_left(model, users) -> None:
    now = [1000.0]
    size = entry_bytes(model, users)
    l1 = L1Store(size, clock=lambda: now[0])
    host = HostStore(10 * size)
    host.lru.clock = lambda: now[0]
    ttl = AdaptiveTTL(TTLSettings(fixed_seconds=10, jitter=0))
    cache = l1_and_redis(CacheSettings("ns", "v1", model.cfg.fingerprint()), l1, None, ttl, host)
    await serve(cache, model, users[:1], 1)
    now[0] += 6
    await serve(cache, model, users[1:2], 1)  # u0 demoted with 4 s left
    key = cache.key(users[0][0], users[0][2])
    now[0] += 3
    assert await host.get(key) is not None
    now[0] += 2  # 11 s after it was made: gone, as it would be from L1
    assert await host.get(key) is None


async def test_an_entry_expired_in_l1_is_not_demoted(model, users) -> None:
    now = [1000.0]
    size = entry_bytes(model, users)
    l1 = L1Store(size, clock=lambda: now[0])
    host = HostStore(10 * size)
    ttl = AdaptiveTTL(TTLSettings(fixed_seconds=5, jitter=0))
    cache = l1_and_redis(CacheSettings("ns", "v1", model.cfg.fingerprint()), l1, None, ttl, host)
    await serve(cache, model, users[:1], 1)
    now[0] += 6
    await serve(cache, model, users[1:2], 1)
    assert len(host) == 0
