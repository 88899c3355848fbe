"""The tiered cache as the service uses it: one ``get_or_create`` per request that finds
the entry in L1 or L2 or has it made exactly once — across concurrent callers and across
pods sharing Redis — and never fails or returns a wrong entry because of Redis."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
import torch

from kvrank.cache import (
    CacheSettings,
    Created,
    L1Store,
    LockState,
    Outcome,
    Prefix,
    RedisSettings,
    RedisStore,
    Tier,
    TieredCache,
    l1_and_redis,
)

pytestmark = pytest.mark.redis


@dataclass(eq=False)
class Pod(TieredCache):
    """One pod's cache, with the Redis store it was built on (for the test to reach)."""

    l2: RedisStore | None = None


@pytest.fixture
async def make_cache(model, redis_server, patient_s):
    redis_server.cli("flushall")
    caches: list[TieredCache] = []

    def make(url: str | None = redis_server.url, **settings: float) -> Pod:
        l2 = RedisStore(RedisSettings(url, op_timeout_s=patient_s)) if url else None
        s = CacheSettings("ns", "v1", model.cfg.fingerprint(), **settings)
        tiers = [Tier(Outcome.L1, L1Store(10_000_000))]
        tiers += [Tier(Outcome.L2, l2, shared=True)] if l2 is not None else []
        caches.append(Pod(s, tiers, l2, l2=l2))
        return caches[-1]

    yield make
    for c in caches:
        await c.close()


class Encoder:
    """A creator that counts its calls and can be slow."""

    def __init__(self, model, user, delay_s: float = 0.0) -> None:
        self.model, self.user, self.delay_s, self.calls = model, user, delay_s, 0
        self.prefixes: list[Prefix | None] = []

    async def __call__(self, prefix: Prefix | None = None) -> Created:
        self.calls += 1
        self.prefixes.append(prefix)
        await asyncio.sleep(self.delay_s)
        return Created(self.model.encode_user(self.user), Outcome.MISS, "encode", 1.0)


async def test_large_entries_are_sealed_and_opened_off_the_event_loop(
    make_cache, model, factory, tiny_cfg, monkeypatch
):
    """Authenticating an entry reads every byte (milliseconds at production size): from
    ``off_loop_bytes`` on, a worker thread does it while the loop serves other requests;
    what is served, and what is refused, stays the same."""
    import threading

    from kvrank.cache.entry import EntryCodec

    threads: dict[str, set[str]] = {"seal": set(), "open": set()}
    for name in threads:
        real = getattr(EntryCodec, name)

        def recording(self, key, arg, real=real, name=name, **kw):  # type: ignore[no-untyped-def]
            threads[name].add(threading.current_thread().name)
            return real(self, key, arg, **kw)

        monkeypatch.setattr(EntryCodec, name, recording)
    loop_thread = threading.current_thread().name
    user, cands = factory.user(tiny_cfg, 9, 1), factory.candidates(tiny_cfg, 4, 1)
    reference = model.forward_full(user, cands)
    for off_loop_bytes, off in ((0, True), (10**9, False)):
        for seen in threads.values():
            seen.clear()
        pod_a = make_cache(off_loop_bytes=off_loop_bytes)
        key = pod_a.key(f"u{off_loop_bytes}", "h9")
        await pod_a.get_or_create(key, 9, Encoder(model, user))
        await pod_a.flush()
        pod_b = make_cache(off_loop_bytes=off_loop_bytes)
        hit = await pod_b.get_or_create(key, 9, Encoder(model, user))
        assert hit.outcome is Outcome.L2
        torch.testing.assert_close(model.score(hit.kv, cands), reference, atol=1e-5, rtol=0)
        for name in ("seal", "open"):
            assert threads[name] and (loop_thread not in threads[name]) is off, (name, threads)
    # a tampered entry opened off the loop is refused as on it: a miss, counted, made again
    pod_c = make_cache(off_loop_bytes=0)
    data = bytearray(await pod_c.l2.get(key))  # type: ignore[union-attr]
    data[-1] ^= 1
    await pod_c.l2.put(key, bytes(data), 60, 9)  # type: ignore[union-attr]
    again = await pod_c.get_or_create(key, 9, Encoder(model, user))
    assert again.outcome is Outcome.MISS and sum(pod_c.stats.corrupt.values()) == 1


async def test_a_large_entry_read_for_scoring_has_its_tag_checked_beside_and_only_then_a_tier(
    make_cache, model, factory, tiny_cfg
):
    """A lookup that only scores (``tag_beside``) is handed a large L2 entry with every check
    made but its tag, checked on a worker thread meanwhile: the entry reaches L1 only once it
    verified. One whose tag fails is refused (counted, deleted) and no tier takes it; a lookup
    that does not ask verifies first, as before."""
    user = factory.user(tiny_cfg, 9, 1)
    pod_a = make_cache(off_loop_bytes=0)
    key = pod_a.key("tagged", "h9")
    await pod_a.get_or_create(key, 9, Encoder(model, user))
    await pod_a.flush()
    sealed = await pod_a.l2.get(key)  # type: ignore[union-attr]
    pod_b = make_cache(off_loop_bytes=0)
    hit = await pod_b.get_or_create(key, 9, Encoder(model, user), tag_beside=True)
    assert hit.outcome is Outcome.L2 and hit.verifying is not None
    assert await hit.genuine() and await pod_b.tiers[0].store.get(key) is not None
    assert pod_b.stats.corrupt == {}
    # the same key's entry with one payload bit flipped, read by a third pod
    await pod_a.l2.put(key, sealed[:-1] + bytes([sealed[-1] ^ 1]), 60, 9)  # type: ignore[union-attr]
    pod_c = make_cache(off_loop_bytes=0)
    forged = await pod_c.get_or_create(key, 9, Encoder(model, user), tag_beside=True)
    assert forged.outcome is Outcome.L2  # handed over with its tag unchecked ...
    assert not await forged.genuine()  # ... which fails: nothing made from it is answered
    assert pod_c.stats.corrupt == {"tag": 1}
    assert await pod_c.tiers[0].store.get(key) is None
    assert await pod_c.l2.get(key) is None  # type: ignore[union-attr]
    made = await pod_c.get_or_create(key, 9, Encoder(model, user), tag_beside=True)
    assert made.outcome is Outcome.MISS and made.verifying is None
    # without tag_beside, a forged entry never leaves the cache
    await pod_c.flush()
    await pod_a.l2.put(key, sealed[:-1] + bytes([sealed[-1] ^ 1]), 60, 9)  # type: ignore[union-attr]
    pod_d = make_cache(off_loop_bytes=0)
    assert (await pod_d.get_or_create(key, 9, Encoder(model, user))).outcome is Outcome.MISS
    assert pod_d.stats.corrupt == {"tag": 1}
    # small entries (under off_loop_bytes) are checked whole before they are handed over
    pod_e = make_cache()
    small = await pod_e.get_or_create(key, 9, Encoder(model, user), tag_beside=True)
    assert small.verifying is None and await small.genuine()


async def test_miss_then_l1_and_another_pod_reads_l2(make_cache, model, factory, tiny_cfg):
    pod_a, pod_b = make_cache(), make_cache()
    user, cands = factory.user(tiny_cfg, 9, 1), factory.candidates(tiny_cfg, 4, 1)
    key = pod_a.key("bob", factory.chain(user, model.cfg.fingerprint(), tiny_cfg)[-1])
    encode = Encoder(model, user)
    first = await pod_a.get_or_create(key, 9, encode)
    again = await pod_a.get_or_create(key, 9, encode)
    await pod_a.flush()  # the entry reaches L2 behind the request that made it
    shared = await pod_b.get_or_create(key, 9, encode)
    assert [first.outcome, again.outcome, shared.outcome] == [Outcome.MISS, Outcome.L1, Outcome.L2]
    assert encode.calls == 1
    assert 0 < shared.timings_ms["serde"] <= shared.timings_ms["l2"]
    assert torch.equal(model.score(shared.kv, cands), model.score(first.kv, cands))
    assert (await pod_b.get_or_create(key, 9, encode)).outcome is Outcome.L1  # promoted
    assert pod_b.stats.lookups == {("l1", "hit"): 1, ("l1", "miss"): 1, ("l2", "hit"): 1}


async def test_concurrent_callers_in_one_process_share_one_creation(
    make_cache, model, factory, tiny_cfg
):
    cache = make_cache()
    user = factory.user(tiny_cfg, 6, 2)
    encode = Encoder(model, user, delay_s=0.05)
    key = cache.key("hot", "h6")
    found = await asyncio.gather(*[cache.get_or_create(key, 6, encode) for _ in range(20)])
    assert encode.calls == 1 and {f.outcome for f in found} == {Outcome.MISS}
    assert cache.flight.stats.shared == 19


async def test_pods_racing_for_one_user_create_once(make_cache, model, factory, tiny_cfg):
    pods = [make_cache(lock_wait_s=2.0) for _ in range(3)]
    user = factory.user(tiny_cfg, 6, 3)
    encode = Encoder(model, user, delay_s=0.2)
    key = pods[0].key("hot", "h6")
    found = await asyncio.gather(*[p.get_or_create(key, 6, encode) for p in pods])
    assert encode.calls == 1
    assert sorted(f.outcome for f in found) == [Outcome.L2, Outcome.L2, Outcome.MISS]
    assert sum(p.flight.stats.remote_hits for p in pods) == 2


class HeldWrites:
    """An L2 whose writes land only once the test lets them (a slow link to Redis, as slow
    as the test needs whatever the machine's speed)."""

    def __init__(self, store: RedisStore) -> None:
        self.put, self.gate = store.put, asyncio.Event()
        store.put = self.held_put  # type: ignore[method-assign]

    async def held_put(self, *args, **kwargs) -> bool:
        await self.gate.wait()
        return await self.put(*args, **kwargs)


async def until(condition, what: str, task) -> None:
    """Yield to the loop until ``condition()`` holds (failing if ``task`` ends first)."""
    while not condition():
        assert not task.done(), f"{what}: the task ended first ({task.result()!r})"
        await asyncio.sleep(0.005)


async def test_a_new_entry_reaches_l2_behind_the_request_and_peers_wait_for_it(
    make_cache, model, factory, tiny_cfg
):
    writer, peer = make_cache(), make_cache(lock_wait_s=60.0)
    assert writer.l2 is not None
    held = HeldWrites(writer.l2)
    user = factory.user(tiny_cfg, 7, 1)
    encode = Encoder(model, user)
    key = writer.key("u", "h7")
    # answered while its entry's write to L2 is still held back
    assert (await writer.get_or_create(key, 7, encode)).outcome is Outcome.MISS
    assert await writer.l2.get(key) is None
    # a peer pod missing meanwhile finds the lock held and waits for the entry: one encode
    waiting = asyncio.create_task(peer.get_or_create(key, 7, encode))
    await until(lambda: peer.flight.stats.remote_waits == 1, "the peer waits", waiting)
    held.gate.set()
    assert (await waiting).outcome is Outcome.L2
    assert encode.calls == 1 and peer.flight.stats.remote_hits == 1
    await writer.flush()
    assert await writer.l2.get(key) is not None


async def test_writes_beyond_the_bound_stay_in_l1_and_free_their_lock(
    make_cache, model, factory, tiny_cfg, monkeypatch
):
    monkeypatch.setattr("kvrank.cache.tiered.MAX_PENDING_WRITES", 1)
    writer, other = make_cache(), make_cache()
    assert writer.l2 is not None
    held = HeldWrites(writer.l2)
    users = [factory.user(tiny_cfg, 5, i) for i in range(2)]
    keys = [writer.key(f"u{i}", "h5") for i in range(2)]
    for key, user in zip(keys, users, strict=True):
        assert (await writer.get_or_create(key, 5, Encoder(model, user))).outcome is Outcome.MISS
    assert writer.stats.writes_dropped == 1
    # the second entry is served from L1 here, and its lock is free for another pod at once
    assert (await writer.get_or_create(keys[1], 5, Encoder(model, users[1]))).outcome is Outcome.L1
    assert other.l2 is not None
    lock = await other.l2.acquire(keys[1], ttl_s=1)
    assert lock.state is LockState.ACQUIRED
    held.gate.set()
    await writer.flush()
    assert await other.get(keys[0]) is not None and await other.get(keys[1]) is None


async def test_a_peer_that_never_delivers_costs_a_bounded_wait(
    make_cache, model, factory, tiny_cfg, redis_server
):
    cache = make_cache(lock_wait_s=0.05)
    key = cache.key("stuck", "h4")
    redis_server.cli("set", key.lock_key(), "crashed-pod", "px", "10000")
    encode = Encoder(model, factory.user(tiny_cfg, 4, 4))
    loop = asyncio.get_running_loop()
    started = loop.time()
    found = await cache.get_or_create(key, 4, encode)
    assert found.outcome is Outcome.MISS and encode.calls == 1
    assert loop.time() - started < 1.0
    assert cache.flight.stats.remote_waits == 1 and cache.flight.stats.remote_timeouts == 1


@pytest.mark.parametrize(
    "mangle",
    [
        lambda b: b[: len(b) // 2],  # truncated
        lambda b: b[:-10] + b"0123456789",  # payload bytes changed: the tag fails
        lambda b: b"garbage",
        lambda b: b"KVRC" + (10**6).to_bytes(4, "little") + b"{}",  # header length lies
    ],
    ids=["truncated", "bitflip", "garbage", "bad-header-length"],
)
async def test_corrupt_entries_are_misses_and_deleted(
    make_cache, model, factory, tiny_cfg, redis_server, mangle
):
    cache = make_cache()
    user = factory.user(tiny_cfg, 8, 1)
    kv = model.encode_user(user)
    key = cache.key("u", "h8")
    assert cache.l2 is not None
    await cache.l2.client.set(key.to_string(), mangle(cache.codec.seal(key, kv)))
    found = await cache.get_or_create(key, 8, Encoder(model, user))
    assert found.outcome is Outcome.MISS and sum(cache.stats.corrupt.values()) == 1
    assert cache.l2.stats.errors == 0
    await cache.flush()
    assert await make_cache().get(key) is not None  # replaced by the fresh encode


async def test_entry_of_another_model_is_a_miss(make_cache, model, factory, tiny_cfg):
    user = factory.user(tiny_cfg, 8, 1)
    writer = make_cache()
    key = writer.key("u", "h8")
    await writer.put(key, model.encode_user(user), 8)
    other = l1_and_redis(
        CacheSettings("ns", "v2", model.cfg.fingerprint()), L1Store(10_000_000), writer.l2
    )
    # same key, a reader that serves model v2: the entry's header says v1 → a miss
    assert await other.get(key) is None and other.stats.corrupt == {"model": 1}


async def test_redis_down_still_creates_and_serves(
    make_cache, model, factory, tiny_cfg, spawn_redis
):
    server = spawn_redis()
    cache = make_cache(url=server.url)
    server.stop()
    user = factory.user(tiny_cfg, 5, 5)
    encode = Encoder(model, user)
    key = cache.key("u", "h5")
    assert (await cache.get_or_create(key, 5, encode)).outcome is Outcome.MISS
    assert (await cache.get_or_create(key, 5, encode)).outcome is Outcome.L1
    assert encode.calls == 1


async def test_find_prefix_extends_only_a_grown_history(make_cache, model, factory, tiny_cfg):
    writer, reader = make_cache(), make_cache()
    fp = model.cfg.fingerprint()
    user = factory.user(tiny_cfg, 6, 7)
    chain = factory.chain(user, fp, tiny_cfg)
    await writer.put(writer.key("u", chain[-1]), model.encode_user(user), 6)
    grown = user.with_events(user.events.cat(factory.events(tiny_cfg, 3, 8)))
    grown_chain = factory.chain(grown, fp, tiny_cfg)
    prefix = await reader.find_prefix(reader.key("u", grown_chain[-1]), grown_chain)
    assert prefix is not None and prefix.events == 6  # found through L2's head
    other = factory.user(tiny_cfg, 9, 9)  # same user id, a different history
    other_chain = factory.chain(other, fp, tiny_cfg)
    assert await reader.find_prefix(reader.key("u", other_chain[-1]), other_chain) is None


async def test_invalidate_user_clears_both_tiers(make_cache, model, factory, tiny_cfg):
    cache = make_cache()
    user = factory.user(tiny_cfg, 5, 1)
    for h in ("h1", "h2"):
        await cache.put(cache.key("alice", h), model.encode_user(user), 5)
    assert await cache.invalidate_user("alice") == 2
    assert await cache.get(cache.key("alice", "h1")) is None
    assert await make_cache().get(cache.key("alice", "h2")) is None


@pytest.mark.parametrize("glob", ["*", "al*", "?lice", "[ab]lice", "alice\\"])
async def test_invalidating_a_user_id_made_of_glob_characters_removes_no_other_user(
    make_cache, model, factory, tiny_cfg, glob
):
    cache = make_cache()
    user = factory.user(tiny_cfg, 5, 1)
    for name in ("alice", "blice"):
        await cache.put(cache.key(name, "h1"), model.encode_user(user), 5)
    assert await cache.invalidate_user(glob) == 0
    for name in ("alice", "blice"):  # still in Redis: another pod finds them
        assert await make_cache().get(cache.key(name, "h1")) is not None, name


async def test_the_creator_is_handed_the_cached_prefix_and_reports_its_own_time(
    make_cache, model, factory, tiny_cfg
):
    cache = make_cache()
    fp = model.cfg.fingerprint()
    user = factory.user(tiny_cfg, 6, 7)
    chain = factory.chain(user, fp, tiny_cfg)
    await cache.put(cache.key("u", chain[-1]), model.encode_user(user), 6)
    grown = user.with_events(user.events.cat(factory.events(tiny_cfg, 3, 8)))
    grown_chain = factory.chain(grown, fp, tiny_cfg)
    encode = Encoder(model, grown)
    found = await cache.get_or_create(cache.key("u", grown_chain[-1]), 9, encode, grown_chain)
    (prefix,) = encode.prefixes
    assert prefix is not None and prefix.events == 6
    assert found.timings_ms["encode"] == 1.0  # what the creator said, under its stage
    # without a chain the creator is handed nothing (a model that cannot extend)
    other = Encoder(model, grown)
    await cache.get_or_create(cache.key("v", grown_chain[-1]), 9, other)
    assert other.prefixes == [None]


async def test_a_hit_in_a_farther_local_tier_is_promoted_to_the_nearer_ones(
    model, factory, tiny_cfg
):
    """Any number of tiers: here two in this process (a small near one, a larger far one,
    as a host-memory tier behind the device's) and no shared one."""
    near, far = L1Store(10_000_000), L1Store(10_000_000)
    s = CacheSettings("ns", "v1", model.cfg.fingerprint())
    cache = TieredCache(s, [Tier(Outcome.L1, near), Tier(Outcome.L2, far)])
    user = factory.user(tiny_cfg, 5, 3)
    key = cache.key("u", "h5")
    await far.put(key, model.encode_user(user), 60, 5)
    encode = Encoder(model, user)
    first = await cache.get_or_create(key, 5, encode)
    assert first.outcome is Outcome.L2 and set(first.timings_ms) == {"l1", "l2"}
    assert await near.get(key) is not None  # promoted
    assert (await cache.get_or_create(key, 5, encode)).outcome is Outcome.L1
    assert encode.calls == 0 and await cache.ping()
