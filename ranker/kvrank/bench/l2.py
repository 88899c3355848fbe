"""L2 round trip of one entry: encode, write, read and decode a ``UserKV`` through Redis.

Measures the wall time a pod pays to share K/V through Redis, for the entry sizes that
matter (the production-size model's bf16 entry, ~9.2 MB, and the INT8 + pyramid entry, < 1 MB),
next to a plain redis-py asyncio GET of the same bytes (no decode) in the same loop: what a
service that just used the asyncio client would pay for the transfer alone; and what opening
an entry costs (every check, the keyed tag, parsing the tensors) and the tag alone; and
what the checks and the tag cost an L2 hit as the service serves it (:func:`served_l2_hits`).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import redis.asyncio as aioredis

from kvrank.cache import (
    OFF_LOOP_BYTES,
    CacheKey,
    CacheSettings,
    Created,
    L1Store,
    Outcome,
    RedisSettings,
    RedisStore,
    TieredCache,
    l1_and_redis,
)
from kvrank.model.inputs import Candidates
from kvrank.model.kv import UserKV
from kvrank.model.ranker import RankerModel


async def _round_trips(url: str, kv: UserKV, reps: int) -> dict[str, Any]:
    store = RedisStore(RedisSettings(url, op_timeout_s=10.0))
    # L1 holds nothing: every read below goes to Redis and through the entry codec
    cache = l1_and_redis(_sealing(kv), L1Store(0), store)
    key = cache.key("u", "h")
    plain = aioredis.Redis.from_url(url)
    put_ms, get_ms, plain_ms, open_ms, tag_ms = [], [], [], [], []
    raw: bytes | str | None = None
    try:
        for i in range(reps + 2):
            t0 = time.perf_counter()
            await cache.put(key, kv, kv.length)
            t1 = time.perf_counter()
            got = await cache.get(key)
            t2 = time.perf_counter()
            raw = await plain.get(key.to_string())
            t3 = time.perf_counter()
            assert got is not None and isinstance(raw, bytes)
            cache.codec.open(key, raw)  # every check, the tag and parsing the tensors
            t4 = time.perf_counter()
            cache.codec.tag(raw)  # the tag alone
            t5 = time.perf_counter()
            if i >= 2:  # warm-up
                put_ms.append((t1 - t0) * 1e3)
                get_ms.append((t2 - t1) * 1e3)
                plain_ms.append((t3 - t2) * 1e3)
                open_ms.append((t4 - t3) * 1e3)
                tag_ms.append((t5 - t4) * 1e3)
        await cache.invalidate_user("u")
    finally:
        await cache.close()
        await plain.aclose()
    return {
        "entry_bytes": len(raw or b""),
        "put_p50_ms": statistics.median(put_ms),
        "get_p50_ms": statistics.median(get_ms),
        "get_p99_ms": float(np.percentile(get_ms, 99)),
        "plain_asyncio_get_p50_ms": statistics.median(plain_ms),
        "open_p50_ms": statistics.median(open_ms),
        "tag_p50_ms": statistics.median(tag_ms),
        "tag_share_of_get": statistics.median(tag_ms) / statistics.median(get_ms),
        "reps": reps,
    }


def l2_round_trip(url: str, entries: dict[str, UserKV], reps: int = 20) -> dict[str, Any]:
    return {name: asyncio.run(_round_trips(url, kv, reps)) for name, kv in entries.items()}


def served_l2_hits(
    url: str, model: RankerModel, kv: UserKV, candidates: Candidates, reps: int = 15
) -> dict[str, Any]:
    """What the entry's checks and tag cost an L2 hit as the service serves one: pod A
    writes ``kv``'s entry, pod B (L1 emptied before each hit) reads it, scores
    ``candidates`` on a worker thread as the model runner does, and answers once the entry
    is genuine. Side by side, hit after hit (each first in turn): the tag checked before the
    entry is handed over (``inline``), and beside the scoring (``beside``, what a lookup for
    scoring does from ``off_loop_bytes`` on). The checks are opening the entry without its
    tag, less parsing its tensors (which a hit needs anyway), plus the model's check."""
    return asyncio.run(_served_l2_hits(url, model, kv, candidates, reps))


async def _served_l2_hits(
    url: str, model: RankerModel, kv: UserKV, candidates: Candidates, reps: int
) -> dict[str, Any]:
    settings = _sealing(kv, off_loop_bytes=0)  # the tag beside, at either size
    writer = l1_and_redis(settings, L1Store(0), RedisStore(RedisSettings(url, op_timeout_s=10.0)))
    l1 = L1Store(4 * kv.nbytes)
    reader = l1_and_redis(
        settings, l1, RedisStore(RedisSettings(url, op_timeout_s=10.0)), check=model.check_kv
    )
    key = writer.key("served", "h")
    kinds = (*MODES, *(f"{m}_less_score" for m in MODES), "score", "tag", "wait", "checks")
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    try:
        await writer.put(key, kv, kv.length)
        raw = await writer.tiers[-1].store.get(key)
        assert isinstance(raw, bytes)
        payload = kv.to_bytes()  # what the entry holds after its header
        for i in range(reps + 1):
            for mode in MODES if i % 2 else MODES[::-1]:
                await l1.delete(key)
                hit, score_ms, wait_ms = await _one_hit(reader, key, kv, model, candidates, mode)
                if i:  # the first round warms up
                    times[mode].append(hit)
                    times[f"{mode}_less_score"].append(hit - score_ms)  # this hit's own
                    times["score"].append(score_ms)
                    times["wait"] += [wait_ms] if mode == "beside" else []
            if i:  # each a median of its own: alone they take microseconds
                times["tag"].append(_median_ms(lambda: reader.codec.tag(raw)))
                times["checks"].append(_checks_ms(reader, key, raw, payload))
        await writer.invalidate_user("served")
    finally:
        await writer.close()
        await reader.close()
    p50 = {name: statistics.median(ms) for name, ms in times.items()}
    return {
        "entry_bytes": len(raw),
        "candidates": len(candidates.item_ids),
        "hit_inline_p50_ms": p50["inline"],
        "hit_beside_p50_ms": p50["beside"],
        "score_p50_ms": p50["score"],
        # each hit's time less its own scoring's: the lookup, the checks and the tag's wait
        "hit_inline_less_score_p50_ms": p50["inline_less_score"],
        "hit_beside_less_score_p50_ms": p50["beside_less_score"],
        "tag_p50_ms": p50["tag"],
        "tag_wait_p50_ms": p50["wait"],
        "checks_p50_ms": p50["checks"],
        "share_inline": (p50["checks"] + p50["tag"]) / p50["inline"],
        "share_beside": (p50["checks"] + p50["wait"]) / p50["beside"],
        "beside_vs_inline": p50["beside"] / p50["inline"],
        # a lookup for scoring checks a smaller entry's tag before handing it over
        "served": "beside" if len(raw) >= OFF_LOOP_BYTES else "inline",
        "reps": reps,
    }


MODES = ("inline", "beside")


def _sealing(kv: UserKV, off_loop_bytes: int = OFF_LOOP_BYTES) -> CacheSettings:
    """A deployment's settings for ``kv``'s model: entries sealed as a deployment seals
    them (a secret, the artifact's digest)."""
    return CacheSettings(
        "bench",
        kv.model_version,
        kv.fingerprint,
        model_digest="0" * 32,
        kv_dtype=kv.kv_dtype,
        secrets=(b"a deployment's entry secret....",),
        off_loop_bytes=off_loop_bytes,
    )


async def _one_hit(
    reader: TieredCache,
    key: CacheKey,
    kv: UserKV,
    model: RankerModel,
    candidates: Candidates,
    mode: str,
) -> tuple[float, float, float]:
    """One L2 hit scored and answered: (its ms, the scoring's, the wait for the tag after)."""

    async def never(_: object) -> Created:
        raise AssertionError("the entry is in Redis: nothing is made")

    t0 = time.perf_counter()
    found = await reader.get_or_create(key, kv.length, never, tag_beside=mode == "beside")
    t1 = time.perf_counter()
    await asyncio.to_thread(model.score, found.kv, candidates)
    t2 = time.perf_counter()
    genuine = await found.genuine()
    t3 = time.perf_counter()
    assert found.outcome is Outcome.L2 and genuine, (found.outcome, genuine)
    return (t3 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3


def _median_ms(fn: Callable[[], object], runs: int = 21) -> float:
    """``fn``'s median time over ``runs`` calls in a row."""
    ms = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ms)


def _checks_ms(reader: TieredCache, key: CacheKey, raw: bytes, payload: bytes) -> float:
    """Opening ``raw`` without its tag, and the model's check, less parsing its tensors
    (``payload``: the entry's state as bytes)."""
    check = reader.check or (lambda _: None)
    opened = _median_ms(lambda: check(reader.codec.open(key, raw, tag=False)))
    return max(0.0, opened - _median_ms(lambda: UserKV.from_bytes(payload)))
