"""Pure cache policies: keys and hash chains, L1 eviction order, TTL, breaker, singleflight."""

from __future__ import annotations

import asyncio

import pytest

from kvrank.cache import AdaptiveTTL, CacheKey, Head, L1Store, TTLSettings, sequence_chain
from kvrank.cache.adaptive_ttl import IntervalTracker, ttl_for
from kvrank.cache.breaker import CircuitBreaker
from kvrank.cache.singleflight import SingleFlight, wait_for_peer


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_cache_key_round_trips_and_rejects_separators() -> None:
    key = CacheKey("stable-v3", "v3", "user_42", "ab12")
    assert key.to_string() == "kvrank:stable-v3:v3:user_42:ab12"
    assert CacheKey.from_string(key.to_string()) == key
    with pytest.raises(ValueError, match="user_id"):
        CacheKey("ns", "v1", "a:b", "h")
    with pytest.raises(ValueError, match="not a kvrank cache key"):
        CacheKey.from_string("other:ns:v1:u:h")


def test_chain_recognises_prefixes_and_any_change(factory, tiny_cfg) -> None:
    user = factory.user(tiny_cfg, 130, 1)  # two whole blocks and a tail
    chain = factory.chain(user, "fp", tiny_cfg)
    assert len(chain) == 131 and chain[-1] == chain.seq_hash
    longer = user.with_events(user.events.cat(factory.events(tiny_cfg, 3, 9)))
    grown = factory.chain(longer, "fp", tiny_cfg)
    assert grown[: len(chain)] == chain[:]  # every prefix recognisable
    assert grown[-1] != chain[-1]
    assert factory.chain(user, "other-model", tiny_cfg)[-1] != chain[-1]
    from dataclasses import replace

    changed = replace(user, context_ids=user.context_ids + 1)
    assert factory.chain(changed, "fp", tiny_cfg)[-1] != chain[-1]
    ev = user.events
    for i in (0, 63, 64, 129):  # first, last of a block, first of the next, in the tail
        actions = ev.actions.clone()
        actions[i] += 1
        edited = factory.chain(user.with_events(replace(ev, actions=actions)), "fp", tiny_cfg)
        assert edited[i] == chain[i] and edited[i + 1] != chain[i + 1], i
        assert edited[-1] != chain[-1], i


def test_the_chain_keeps_its_definition_so_entries_outlive_an_upgrade(factory, tiny_cfg) -> None:
    """Block by block of 64 events, then the events past the last whole block: pods of
    different releases sharing a Redis name the same history the same way, and a client's
    hash stays valid across a roll-out. Rebuilt here from the definition, event by event."""
    import hashlib

    from kvrank.cache.keys import _digest
    from kvrank.model.onetrans import feature_spec, from_features

    user = factory.user(tiny_cfg, 150, 4)
    spec, inputs = feature_spec(tiny_cfg), from_features(user)
    chain = factory.chain(user, "fp", tiny_cfg)
    user_cols = [inputs.user[c.name] for c in spec.user]
    base = _digest(
        b"fp",
        *(t.numpy().astype("<i8" if c.kind == "id" else "<f4").tobytes()
          for c, t in zip(spec.user, user_cols, strict=True)),
    )  # fmt: skip

    def event(i: int) -> bytes:
        ids = [inputs.events[c.name][i].item() for c in spec.sequence if c.kind == "id"]
        dense = [inputs.events[c.name][i] for c in spec.sequence if c.kind == "dense"]
        id_bytes = b"".join(int(v).to_bytes(8, "little", signed=True) for v in ids)
        dense_bytes = b"".join(d.numpy().astype("<f4").tobytes() for d in dense)
        return b"".join(len(p).to_bytes(8, "little") + p for p in (id_bytes, dense_bytes))

    def blake(data: bytes, person: bytes) -> bytes:
        return hashlib.blake2b(data, digest_size=16, person=person).digest()

    blocks = [base]
    for j in range(len(inputs) // 64):
        events = b"".join(event(i) for i in range(64 * j, 64 * j + 64))
        blocks.append(blake(blocks[-1] + events, b"kvrank-block"))
    for i in range(len(inputs) + 1):
        tail = b"".join(event(e) for e in range(i // 64 * 64, i))
        value = blake(blocks[i // 64] + i.to_bytes(8, "little") + tail, b"kvrank-seq")
        assert chain[i] == value.hex(), i


@pytest.mark.parametrize("known", [0, 1, 63, 64, 65, 130])
def test_a_chain_extends_from_its_state_without_the_old_events(factory, tiny_cfg, known) -> None:
    """What ``events_since`` relies on: from the state a chain stands in after ``known``
    events (stored with the entry), the events after them give every later value the whole
    history's chain gives — whatever block boundary either side falls on; the state's own
    value is the hash it stands after, and its user columns come back as they went in."""
    from kvrank.cache import ChainState, extend_chain, user_columns
    from kvrank.model.onetrans import feature_spec, from_features

    spec = feature_spec(tiny_cfg)
    whole = from_features(factory.user(tiny_cfg, known + 70, 5))
    full = sequence_chain(whole, "fp", spec)
    state = sequence_chain(whole.slice(0, known), "fp", spec).state()
    assert ChainState.from_bytes(state.to_bytes()) == state
    assert state.seq_hash() == full[known]
    extended = extend_chain(state, whole.slice(known), spec)
    assert extended.seq_hash == full.seq_hash and len(extended) == len(full)
    assert extended[known + 1 :] == full[known + 1 :]
    assert extended.state() == full.state()
    for name, values in user_columns(state, spec).items():
        assert values.tolist() == whole.user[name].tolist(), name
    with pytest.raises(ValueError):  # a state whose tail does not fit the model's events
        extend_chain(ChainState(known + 1, state.block, state.tail, state.user), whole, spec)


def k(name: str) -> CacheKey:
    return CacheKey("ns", "v1", name, "h")


async def test_l1_budget_is_bytes_and_one_shot_users_go_first(factory, tiny_cfg) -> None:
    model = factory.model(tiny_cfg)
    kv = model.encode_user(factory.user(tiny_cfg, 4, 1))
    cache = L1Store(budget_bytes=kv.nbytes * 4, clock=Clock())
    await cache.put(k("repeat-1"), kv, 60, 4)
    await cache.put(k("repeat-2"), kv, 60, 4)
    assert await cache.get(k("repeat-1")) and await cache.get(k("repeat-2"))  # seen twice
    for i in range(5):
        await cache.put(k(f"once-{i}"), kv, 60, 4)
    assert cache.nbytes <= kv.nbytes * 4
    assert await cache.get(k("repeat-1")) is not None
    assert await cache.get(k("repeat-2")) is not None
    assert await cache.get(k("once-0")) is None and await cache.get(k("once-4")) is not None
    assert cache.stats.evictions == 3
    # an evicted entry takes its user's head with it: heads stay bounded by entries
    assert await cache.head(k("once-0")) is None
    assert await cache.head(k("once-4")) == Head(4, "h")


async def test_l1_expiry_and_oversized_entries(factory, tiny_cfg) -> None:
    model = factory.model(tiny_cfg)
    kv = model.encode_user(factory.user(tiny_cfg, 4, 1))
    clock = Clock()
    cache = L1Store(budget_bytes=kv.nbytes * 2, clock=clock)
    await cache.put(k("a"), kv, ttl_s=5, events=4)
    clock.now = 6
    assert await cache.get(k("a")) is None and cache.stats.expired == 1
    tiny = L1Store(budget_bytes=kv.nbytes - 1)
    assert await tiny.put(k("big"), kv, 60, 4) is False and len(tiny) == 0


def test_ttl_formula_and_measured_intervals() -> None:
    s = TTLSettings(factor=3, min_seconds=1, max_seconds=300)
    assert ttl_for(10, s) == 30 and ttl_for(0.1, s) == 1 and ttl_for(1000, s) == 300
    clock = Clock()
    ttl = AdaptiveTTL(s, IntervalTracker(min_samples=5, min_watch_s=0, clock=clock))
    assert ttl.current() == s.default_seconds  # not enough data yet
    for t in range(10):
        clock.now = t * 4.0
        ttl.observe("u1")
    assert ttl.tracker.mean() == pytest.approx(4.0)
    assert ttl.current() == pytest.approx(12.0)
    ttl.settings = TTLSettings(fixed_seconds=7)  # what a config reload does
    assert ttl.current() == 7


def test_ttl_jitter_spreads_expiries_within_bounds() -> None:
    ttl = AdaptiveTTL(TTLSettings(jitter=0.1))
    values = {ttl.jittered(100.0) for _ in range(50)}
    assert len(values) > 10 and all(90.0 <= v <= 110.0 for v in values)
    assert AdaptiveTTL(TTLSettings(jitter=0.0)).jittered(100.0) == 100.0


def test_interval_mean_weights_users_not_requests() -> None:
    """A busy user refreshing every second must not shrink the TTL of everyone else."""
    clock = Clock()
    tracker = IntervalTracker(min_samples=1, min_watch_s=0, clock=clock)
    for t in range(0, 61):  # busy: every second for a minute
        clock.now = float(t)
        tracker.observe("busy")
    for t in (0.0, 60.0):  # quiet: once a minute
        clock.now = t
        tracker.observe("quiet")
    assert tracker.mean() == pytest.approx((1.0 + 60.0) / 2)


def test_the_ttl_waits_until_long_intervals_could_have_been_seen() -> None:
    # ten seconds in, only the fastest returners have come back: a mean of their intervals
    # would give everyone a TTL of a few seconds
    clock = Clock()
    ttl = AdaptiveTTL(TTLSettings(factor=3), IntervalTracker(min_samples=3, clock=clock))
    for t in range(50):
        clock.now = t * 0.2
        ttl.observe("busy")
    assert ttl.tracker.mean() is None and ttl.current() == TTLSettings().default_seconds
    for clock.now in (9.0, 49.0):
        ttl.observe("slow")
    clock.now = 60.0
    assert ttl.current() == pytest.approx(3 * (0.2 + 40.0) / 2)


def test_interval_tracker_memory_is_bounded() -> None:
    clock = Clock()
    tracker = IntervalTracker(max_users=10, min_samples=1, min_watch_s=0, clock=clock)
    for i in range(100):
        clock.now = float(i)
        tracker.observe(f"u{i % 50}")
    assert len(tracker._users) == 10


def test_breaker_opens_and_closes_by_itself() -> None:
    clock = Clock()
    b = CircuitBreaker(failure_threshold=2, cooldown_s=1.0, clock=clock)
    b.failure()
    assert b.allow()
    b.failure()
    assert not b.allow() and b.state == "open"
    clock.now = 1.5
    assert b.state == "half_open" and b.allow()
    b.success()
    assert b.state == "closed"


async def test_singleflight_runs_once_and_shares_the_result() -> None:
    flight: SingleFlight[int] = SingleFlight()
    calls = 0

    async def create() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)
        return 42

    results = await asyncio.gather(*[flight.do("k", create) for _ in range(50)])
    assert results == [42] * 50 and calls == 1
    assert flight.stats.leaders == 1 and flight.stats.shared == 49


async def test_singleflight_errors_reach_every_waiter_once() -> None:
    flight: SingleFlight[int] = SingleFlight()

    async def boom() -> int:
        await asyncio.sleep(0.01)
        raise RuntimeError("encode failed")

    results = await asyncio.gather(
        *[flight.do("k", boom) for _ in range(3)], return_exceptions=True
    )
    assert all(isinstance(r, RuntimeError) for r in results)


async def test_wait_for_peer_is_bounded() -> None:
    async def never() -> int | None:
        return None

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await wait_for_peer(never, bound_s=0.01) is None
    assert loop.time() - t0 < 1.0  # its bound, not a poll forever (a wide margin: loaded CI)
