"""Entries in Redis that no healthy pod of this model wrote — well framed, with the checksum
recomputed, as anyone holding the Redis password could write them — are misses: dropped,
counted, made again, and the next request served from the cache with the model's own
scores. Nothing read from Redis reaches the model unchecked."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch

from kvrank.cache import (
    CacheSettings,
    Created,
    L1Store,
    Outcome,
    RedisSettings,
    RedisStore,
    TieredCache,
    encode_entry,
    l1_and_redis,
)
from kvrank.cache.entry import ENTRY_FORMAT, MAGIC
from kvrank.model.kv import LayerKV, UserKV

pytestmark = pytest.mark.redis


@pytest.fixture
async def pod(model, redis_server):
    """A new pod's cache (empty L1) on the shared Redis, checking entries with the model as
    ``kvrank serve`` does; and its Redis client."""
    redis_server.cli("flushall")
    made: list[TieredCache] = []

    def make() -> tuple[TieredCache, RedisStore]:
        settings = CacheSettings("ns", "v1", model.cfg.fingerprint())
        l2 = RedisStore(RedisSettings(redis_server.url, op_timeout_s=1.0))
        made.append(l1_and_redis(settings, L1Store(10_000_000), l2, check=model.check_kv))
        return made[-1], l2

    yield make
    for cache in made:
        await cache.close()


def framed(header: object, payload: bytes = b"") -> bytes:
    """An entry's framing around any header: the layout :func:`encode_entry` writes."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return MAGIC + len(raw).to_bytes(4, "little") + raw + payload


def with_payload(kv: UserKV, payload: bytes) -> bytes:
    """``payload`` framed as ``kv``'s entry, its size and checksum recomputed (as anyone
    holding the Redis password could)."""
    import xxhash

    header = {
        "format": ENTRY_FORMAT,
        "model_version": kv.model_version,
        "fingerprint": kv.fingerprint,
        "kv_dtype": kv.kv_dtype,
        "size": len(payload),
        "checksum": xxhash.xxh3_64_intdigest(payload),
    }
    return framed(header, payload)


def tensors_header_edited(kv: UserKV, edit: Callable[[dict[str, Any]], None]) -> bytes:
    """``kv``'s genuine entry with its safetensors header ``edit``ed (the tensor data as is:
    offsets count from the end of the header)."""
    raw = kv.to_bytes()
    size = int.from_bytes(raw[:8], "little")
    st_header = json.loads(raw[8 : 8 + size])
    edit(st_header)
    body = json.dumps(st_header).encode()
    return with_payload(kv, len(body).to_bytes(8, "little") + body + raw[8 + size :])


def meta_as_list(st_header: dict[str, Any]) -> None:
    ours = json.loads(st_header["__metadata__"]["kvrank"])
    ours["meta"] = ["a", "b"]
    st_header["__metadata__"]["kvrank"] = json.dumps(ours)


def first_tensor_shaped(shape: list[int]) -> Callable[[dict[str, Any]], None]:
    def edit(st_header: dict[str, Any]) -> None:
        name = next(n for n in st_header if n != "__metadata__")
        st_header[name]["shape"] = shape

    return edit


def layers_changed(kv: UserKV, change: Callable[[LayerKV], LayerKV]) -> bytes:
    """A genuine entry (framing, checksum, model identity) whose layers were ``change``d."""
    return encode_entry(replace(kv, layers={i: change(lk) for i, lk in kv.layers.items()}))


CRAFTED: dict[str, Callable[[UserKV], bytes]] = {
    "header a list": lambda kv: framed([1, 2, 3]),
    "header nested": lambda kv: framed(b"[" * 2000 + b"]" * 2000),
    "header oversized": lambda kv: framed({"pad": "x" * 10_000}),
    "meta a list": lambda kv: tensors_header_edited(kv, meta_as_list),
    "negative shape": lambda kv: tensors_header_edited(kv, first_tensor_shaped([-1, 4, 8])),
    "huge shape": lambda kv: tensors_header_edited(kv, first_tensor_shaped([2**40, 2**40])),
    "one row fewer": lambda kv: layers_changed(
        kv, lambda lk: replace(lk, k=lk.k[:-1], v=lk.v[:-1])
    ),
    "V of another head count": lambda kv: layers_changed(kv, lambda lk: replace(lk, v=lk.v[:, :1])),
    "K of another width": lambda kv: layers_changed(kv, lambda lk: replace(lk, k=lk.k[:, :, :-1])),
    "tensors of another dtype than the header's": lambda kv: layers_changed(
        kv, lambda lk: LayerKV(lk.k.half(), lk.v.half())
    ),
}


@pytest.mark.parametrize("craft", CRAFTED.values(), ids=list(CRAFTED))
async def test_a_crafted_entry_is_a_miss_made_again_and_then_served_with_the_models_scores(
    pod, model, factory, tiny_cfg, craft
) -> None:
    user = factory.user(tiny_cfg, 8, 1)
    cands = factory.candidates(tiny_cfg, 6, 1)
    reference = model.forward_full(user, cands)
    reader, redis = pod()
    key = reader.key("u", "h8")
    await redis.client.set(key.to_string(), craft(model.encode_user(user)))

    async def create(prefix: object = None) -> Created:
        return Created(model.encode_user(user), Outcome.MISS, "encode")

    found = await reader.get_or_create(key, 8, create)
    assert found.outcome is Outcome.MISS and reader.stats.corrupt == 1
    torch.testing.assert_close(model.score(found.kv, cands), reference, atol=1e-5, rtol=0)
    await reader.flush()
    other, _ = pod()  # another pod: the entry was made again in Redis
    again = await other.get_or_create(key, 8, create)
    assert again.outcome is Outcome.L2 and other.stats.corrupt == 0
    torch.testing.assert_close(model.score(again.kv, cands), reference, atol=1e-5, rtol=0)
