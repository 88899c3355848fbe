"""Entries in Redis that no healthy pod of this deployment and model wrote for this key are
misses: refused, counted by reason, deleted, made again, and the next request served from
the cache with the model's own scores. Two kinds of writer:

- *outsiders* — anyone holding only the Redis password, a pod of another deployment (another
  secret, another namespace), a pod of other weights or another version, an older kvrank —
  and genuine entries copied under another user's or sequence's key: the key, model or tag
  check refuses them before a byte of the payload is parsed;
- *insiders* — a buggy pod holding the secret, which seals whatever it made: the entry's
  framing, the tensors' header and the model's own shape check refuse anything that is not a
  state this model can score.

Each runs against a real redis-server and a real Redis Cluster, with two pods' caches (L1,
host tier, Redis), and both ways an entry is opened: whole before it is handed over, and as
a large entry read for scoring (its tag checked beside the scoring, every other check made
first). Nothing read from Redis reaches the model without its framing, key, model and shape
checks, nothing made from it is answered before its tag verified, and no tier admits it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest
import torch

from kvrank.cache import (
    CacheKey,
    CacheSettings,
    Created,
    EntryCodec,
    HostStore,
    L1Store,
    Lookup,
    ModelIdentity,
    Outcome,
    Reason,
    RedisSettings,
    RedisStore,
    TieredCache,
    l1_and_redis,
)
from kvrank.cache.entry import ENTRY_FORMAT, MAGIC, PREAMBLE, SALT_BYTES
from kvrank.model.kv import LayerKV, UserKV

pytestmark = pytest.mark.redis

SECRET = b"this deployment's secret, 32 b.."
DIGEST = "0123456789abcdef0123456789abcdef"


@pytest.fixture(params=["redis", "redis-cluster"])
async def pod(request, model, redis_server, redis_cluster, patient_s):
    """A new pod's cache (empty L1 and host tier) on the shared Redis, built as ``kvrank
    serve`` builds it (the deployment's secret, the artifact's digest, the model's check)."""
    if request.param == "redis":
        redis_server.cli("flushall")
        url, cluster = redis_server.url, False
    else:
        redis_cluster.flush()
        url, cluster = redis_cluster.url, True
    made: list[TieredCache] = []

    def make(**more: int) -> TieredCache:
        fp = model.cfg.fingerprint()
        settings = CacheSettings(
            "ns", "v1", fp, model_digest=DIGEST, kv_dtype="fp32", secrets=(SECRET,), **more
        )
        l2 = RedisStore(RedisSettings(url, cluster=cluster, op_timeout_s=patient_s))
        host = HostStore(10_000_000)
        made.append(l1_and_redis(settings, L1Store(10_000_000), l2, None, host, model.check_kv))
        return made[-1]

    yield make
    for cache in made:
        await cache.close()


@dataclass(frozen=True)
class Scene:
    """What a crafter may use: the model, the key the request reads, the user's own state,
    and this deployment's codec (an insider seals with it, an outsider may not)."""

    model: Any
    key: CacheKey
    kv: UserKV
    codec: EntryCodec
    other_user: UserKV
    bf16: UserKV
    """The user's state stored in bf16 (this deployment stores fp32)."""


def codec(
    model: Any,
    *,
    version: str = "v1",
    digest: str = DIGEST,
    secret: bytes = SECRET,
    kv_dtype: str | None = None,
) -> EntryCodec:
    identity = ModelIdentity(version, model.cfg.fingerprint(), digest, kv_dtype)
    return EntryCodec(identity, (secret,))


def sealed(c: EntryCodec, header: object, payload: bytes = b"") -> bytes:
    """Any header and payload framed as an entry and tagged with ``c``'s secret."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    frame = MAGIC + len(raw).to_bytes(4, "little") + bytes(PREAMBLE - 8) + raw + payload
    return frame[: 8 + SALT_BYTES] + c.tag(frame) + frame[PREAMBLE:]


def with_payload(s: Scene, payload: bytes) -> bytes:
    """``payload`` in a header that matches the key and model, sealed by an insider."""
    header = {
        "format": ENTRY_FORMAT,
        "key": s.key.to_string(),
        "model_version": "v1",
        "fingerprint": s.kv.fingerprint,
        "model_digest": DIGEST,
        "kv_dtype": s.kv.kv_dtype,
        "size": len(payload),
    }
    return sealed(s.codec, header, payload)


def tensors_header_edited(s: Scene, edit: Callable[[dict[str, Any]], None]) -> bytes:
    """The user's state with its safetensors header ``edit``ed (the tensor data as is:
    offsets count from the end of the header), sealed by an insider."""
    raw = s.kv.to_bytes()
    size = int.from_bytes(raw[:8], "little")
    st_header = json.loads(raw[8 : 8 + size])
    edit(st_header)
    body = json.dumps(st_header).encode()
    return with_payload(s, len(body).to_bytes(8, "little") + body + raw[8 + size :])


def meta_as_list(st_header: dict[str, Any]) -> None:
    ours = json.loads(st_header["__metadata__"]["kvrank"])
    ours["meta"] = ["a", "b"]
    st_header["__metadata__"]["kvrank"] = json.dumps(ours)


def first_tensor_shaped(shape: list[int]) -> Callable[[dict[str, Any]], None]:
    def edit(st_header: dict[str, Any]) -> None:
        name = next(n for n in st_header if n != "__metadata__")
        st_header[name]["shape"] = shape

    return edit


def layers_changed(s: Scene, change: Callable[[LayerKV], LayerKV]) -> bytes:
    """The user's state with its layers ``change``d, sealed by an insider."""
    return s.codec.seal(
        s.key, replace(s.kv, layers={i: change(lk) for i, lk in s.kv.layers.items()})
    )


def flipped(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :]


Crafter = Callable[[Scene], bytes]

INSIDERS: dict[str, tuple[Crafter, Reason]] = {
    "header a list": (lambda s: sealed(s.codec, [1, 2, 3]), Reason.FRAMING),
    "header nested": (lambda s: sealed(s.codec, b"[" * 2000 + b"]" * 2000), Reason.FRAMING),
    "header oversized": (lambda s: sealed(s.codec, {"pad": "x" * 10_000}), Reason.FRAMING),
    "size disagrees": (lambda s: with_payload(s, s.kv.to_bytes())[:-1], Reason.FRAMING),
    "payload not tensors": (lambda s: with_payload(s, b"\x00" * 64), Reason.PAYLOAD),
    "meta a list": (lambda s: tensors_header_edited(s, meta_as_list), Reason.PAYLOAD),
    "negative shape": (
        lambda s: tensors_header_edited(s, first_tensor_shaped([-1, 4, 8])),
        Reason.PAYLOAD,
    ),
    "huge shape": (
        lambda s: tensors_header_edited(s, first_tensor_shaped([2**40, 2**40])),
        Reason.PAYLOAD,
    ),
    "tensors of another dtype than the header's": (
        lambda s: layers_changed(s, lambda lk: LayerKV(lk.k.half(), lk.v.half())),
        Reason.PAYLOAD,
    ),
    "one row fewer": (
        lambda s: layers_changed(s, lambda lk: replace(lk, k=lk.k[:-1], v=lk.v[:-1])),
        Reason.CHECK,
    ),
    "V of another head count": (
        lambda s: layers_changed(s, lambda lk: replace(lk, v=lk.v[:, :1])),
        Reason.CHECK,
    ),
    "K of another width": (
        lambda s: layers_changed(s, lambda lk: replace(lk, k=lk.k[:, :, :-1])),
        Reason.CHECK,
    ),
}

OUTSIDERS: dict[str, tuple[Crafter, Reason]] = {
    "truncated": (lambda s: s.codec.seal(s.key, s.kv)[:30], Reason.FRAMING),
    "random bytes": (lambda s: bytes(range(256)) * 8, Reason.FRAMING),
    "an older format": (
        lambda s: MAGIC + (2).to_bytes(4, "little") + bytes(32) + b"{}" + s.kv.to_bytes(),
        Reason.FORMAT,
    ),
    "another user's entry": (
        lambda s: s.codec.seal(replace(s.key, user_id="someone-else"), s.other_user),
        Reason.KEY,
    ),
    "another sequence's entry": (
        lambda s: s.codec.seal(replace(s.key, seq_hash="h7"), s.other_user),
        Reason.KEY,
    ),
    "another deployment's entry": (  # its own namespace and secret, on the same Redis
        lambda s: codec(s.model, secret=b"another deployment's secret....").seal(
            replace(s.key, namespace="other"), s.other_user
        ),
        Reason.KEY,
    ),
    "another weights' entry under the same version": (
        lambda s: codec(s.model, digest="f" * 32).seal(s.key, s.other_user),
        Reason.MODEL,
    ),
    "another version's entry": (
        lambda s: codec(s.model, version="v0").seal(
            s.key, replace(s.other_user, model_version="v0")
        ),
        Reason.MODEL,
    ),
    "another K/V dtype": (
        lambda s: s.codec.seal(s.key, s.bf16),
        Reason.MODEL,
    ),
    "forged without the secret": (
        lambda s: codec(s.model, secret=b"a guess at the secret, 32 bytes.").seal(
            s.key, s.other_user
        ),
        Reason.TAG,
    ),
    "NaN payload, tag recomputed without the secret": (
        lambda s: codec(s.model, secret=b"a guess at the secret, 32 bytes.").seal(
            s.key,
            replace(
                s.kv,
                layers={
                    i: LayerKV(torch.full_like(lk.k, float("nan")), lk.v)
                    for i, lk in s.kv.layers.items()
                },
            ),
        ),
        Reason.TAG,
    ),
    "one payload bit flipped": (lambda s: flipped(s.codec.seal(s.key, s.kv), -5), Reason.TAG),
    "one salt bit flipped": (lambda s: flipped(s.codec.seal(s.key, s.kv), 9), Reason.TAG),
    "one tag bit flipped": (lambda s: flipped(s.codec.seal(s.key, s.kv), PREAMBLE - 1), Reason.TAG),
}

CRAFTED = {**INSIDERS, **OUTSIDERS}


async def lookup_as_scoring(cache: TieredCache, key: CacheKey, creator: Any) -> Lookup:
    """What the service does for a request it scores: a lookup whose large entry comes with
    its tag still being checked, looked up again (a miss) if the tag then fails."""
    found = await cache.get_or_create(key, 8, creator, tag_beside=True)
    if await found.genuine():
        return found
    assert found.outcome is Outcome.L2  # handed over before its tag failed
    return await cache.get_or_create(key, 8, creator, tag_beside=True)


@pytest.mark.parametrize("tag", ["checked first", "checked beside scoring"])
@pytest.mark.parametrize("case", CRAFTED.values(), ids=list(CRAFTED))
async def test_a_crafted_entry_is_a_miss_counted_by_reason_made_again_and_then_served(
    pod, model, factory, tiny_cfg, case, tag
) -> None:
    """Both ways an entry is opened: its tag checked before it is handed over, and (every
    entry read as a large one is) beside the scoring, with the same reasons."""
    craft, reason = case
    beside = tag != "checked first"
    user, other = factory.user(tiny_cfg, 8, 1), factory.user(tiny_cfg, 8, 2)
    cands = factory.candidates(tiny_cfg, 6, 1)
    reference = model.forward_full(user, cands)
    reader = pod(off_loop_bytes=0) if beside else pod()
    key = reader.key("u", "h8")
    kv = model.encode_user(user)
    scene = Scene(
        model, key, kv, codec(model), model.encode_user(other), model.encode_user(user, "bf16")
    )
    assert reader.codec.open(key, scene.codec.seal(key, scene.kv)) is not None  # as a pod seals
    bad = craft(scene)
    l2 = reader.tiers[-1].store
    await l2.client.set(key.to_string(), bad)

    async def create(prefix: object = None) -> Created:
        return Created(model.encode_user(user), Outcome.MISS, "encode")

    if beside:
        found = await lookup_as_scoring(reader, key, create)
    else:
        found = await reader.get_or_create(key, 8, create)
    assert found.outcome is Outcome.MISS
    assert reader.stats.corrupt == {reason.value: 1}
    torch.testing.assert_close(model.score(found.kv, cands), reference, atol=1e-5, rtol=0)
    await reader.flush()
    assert await l2.client.get(key.to_string()) != bad  # overwritten by the fresh encode
    other_pod = pod()  # another pod: served from Redis, the model's own scores
    again = await other_pod.get_or_create(key, 8, create)
    assert again.outcome is Outcome.L2 and other_pod.stats.corrupt == {}
    torch.testing.assert_close(model.score(again.kv, cands), reference, atol=1e-5, rtol=0)
