"""L2 round trip of one entry: encode, write, read and decode a ``UserKV`` through Redis.

Measures the wall time a pod pays to share K/V through Redis, for the entry sizes that
matter (the production-size model's bf16 entry, ~9.2 MB, and the INT8 + pyramid entry, < 1 MB),
next to a plain redis-py asyncio GET of the same bytes (no decode) in the same loop: what a
service that just used the asyncio client would pay for the transfer alone; and what opening
an entry costs (every check, the keyed tag, parsing the tensors) and the tag alone.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import numpy as np
import redis.asyncio as aioredis

from kvrank.cache import (
    CacheSettings,
    L1Store,
    RedisSettings,
    RedisStore,
    l1_and_redis,
)
from kvrank.model.kv import UserKV


async def _round_trips(url: str, kv: UserKV, reps: int) -> dict[str, Any]:
    store = RedisStore(RedisSettings(url, op_timeout_s=10.0))
    # L1 holds nothing: every read below goes to Redis and through the entry codec, sealed
    # as a deployment seals (a secret, the artifact's digest)
    settings = CacheSettings(
        "bench",
        kv.model_version,
        kv.fingerprint,
        model_digest="0" * 32,
        kv_dtype=kv.kv_dtype,
        secrets=(b"a deployment's entry secret....",),
    )
    cache = l1_and_redis(settings, L1Store(0), store)
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
