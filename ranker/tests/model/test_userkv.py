"""UserKV storage: byte format round trip, corruption detection, dtypes and INT8 accuracy."""

from __future__ import annotations

import pytest
import torch

from kvrank.cache import CacheKey, EntryCodec, ModelIdentity
from kvrank.errors import CorruptEntryError, IncompatibleKVError
from kvrank.model.config import ModelConfig
from kvrank.model.kv import UserKV


@pytest.fixture
def setup(factory, tiny_cfg):
    model = factory.model(tiny_cfg)
    user, cands = factory.user(tiny_cfg, 20, 11), factory.candidates(tiny_cfg, 6, 11)
    return model, user, cands


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16", "int8"])
def test_bytes_round_trip_gives_identical_scores(setup, dtype) -> None:
    model, user, cands = setup
    kv = model.encode_user(user, kv_dtype=dtype)
    back = UserKV.from_bytes(kv.to_bytes())
    assert back.kv_dtype == dtype and back.length == kv.length
    assert back.nbytes == kv.nbytes
    assert torch.equal(model.score(back, cands), model.score(kv, cands))


@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_an_entry_is_read_as_views_on_the_received_bytes(setup, dtype) -> None:
    """Reading an L2 entry copies no tensor: each one points into the bytes Redis returned
    (what makes a 9 MB entry cheap to read), at an aligned offset, and scores the same."""
    model, user, cands = setup
    kv = model.encode_user(user, kv_dtype=dtype)
    codec, key = (
        EntryCodec(ModelIdentity(kv.model_version, kv.fingerprint)),
        CacheKey("n", "v", "u", "h"),
    )
    data = codec.seal(key, kv)
    back = codec.open(key, data)
    start = id(data) + bytes.__basicsize__ - 1  # where CPython keeps a bytes' contents
    tensors = [t for lk in back.layers.values() for t in (lk.k, lk.v, lk.k_scale) if t is not None]
    for t in tensors:
        assert start <= t.data_ptr() < start + len(data), "copied"
    assert (tensors[0].data_ptr() - start) % 8 == 0
    assert torch.equal(model.score(back, cands), model.score(kv, cands))


def test_payload_is_safetensors_not_pickle(setup) -> None:
    model, user, _ = setup
    data = model.encode_user(user).to_bytes()
    assert not data.startswith(b"\x80")  # pickle protocol marker
    header_len = int.from_bytes(data[:8], "little")
    assert data[8 : 8 + header_len].lstrip().startswith(b"{")


@pytest.mark.parametrize("cut", [0, 5, 8, 100, -1])
def test_truncated_bytes_are_rejected(setup, cut) -> None:
    model, user, _ = setup
    data = model.encode_user(user).to_bytes()
    with pytest.raises(CorruptEntryError):
        UserKV.from_bytes(data[:cut] if cut >= 0 else data[: len(data) // 2])


def test_tampered_header_is_rejected(setup) -> None:
    model, user, _ = setup
    data = bytearray(model.encode_user(user, kv_dtype="int8").to_bytes())
    idx = data.find(b"int8", 8)
    data[idx : idx + 4] = b"fp32"  # claims fp32 while tensors are int8
    with pytest.raises(CorruptEntryError):
        UserKV.from_bytes(bytes(data))


def test_kv_of_other_model_or_version_is_refused(factory, setup, tiny_cfg) -> None:
    model, user, cands = setup
    kv = model.encode_user(user)
    other_version = factory.model(tiny_cfg, version="other")
    with pytest.raises(IncompatibleKVError, match="other"):
        other_version.score(kv, cands)
    other_cfg = factory.model(tiny_cfg.model_copy(update={"ns_tokens": 3}))
    with pytest.raises(IncompatibleKVError):
        other_cfg.score(kv, cands)


def test_scoring_only_kv_cannot_be_extended(factory, tiny_cfg) -> None:
    cfg = tiny_cfg.model_copy(update={"candidate_layers": 1})
    model = factory.model(cfg)
    kv = model.encode_user(factory.user(cfg, 5, 1), layers="scoring")
    assert set(kv.layers) == {cfg.n_layers - 1}
    with pytest.raises(IncompatibleKVError, match="extend_user needs all layers"):
        model.extend_user(kv, factory.events(cfg, 1, 2))


def test_memory_matches_the_formula() -> None:
    # 2 (K,V) × layers × rows × d_model × bytes, plus the NS rows and NS inputs
    cfg = ModelConfig(d_model=64, n_heads=4, n_layers=3, max_events=50, ns_tokens=2)
    from kvrank.model.ranker import RankerModel

    model = RankerModel(cfg).eval()
    user_events = 50
    from kvrank.model.inputs import Events, UserFeatures

    g = torch.Generator().manual_seed(0)
    ev = Events(
        torch.randint(0, 100, (user_events,), generator=g),
        torch.zeros(user_events, dtype=torch.long),
        torch.zeros(user_events, dtype=torch.long),
        torch.zeros(user_events, dtype=torch.long),
        torch.zeros(user_events, cfg.event_dense),
    )
    user = UserFeatures(
        ev,
        torch.zeros(cfg.profile_fields, dtype=torch.long),
        torch.zeros(cfg.context_fields, dtype=torch.long),
        torch.zeros(cfg.user_dense),
    )
    ns_input = cfg.ns_tokens * cfg.d_model * 4
    bf16 = model.encode_user(user, kv_dtype="bf16").nbytes
    assert bf16 == 2 * 3 * (50 + 2) * 64 * 2 + ns_input
    int8 = model.encode_user(user, kv_dtype="int8").nbytes
    scales = 3 * (64 * 4 + (50 + 2) * 4)
    assert int8 == 2 * 3 * (50 + 2) * 64 + scales + ns_input


def test_int8_logits_stay_close(setup) -> None:
    model, user, cands = setup
    ref = model.score(model.encode_user(user), cands)
    q8 = model.score(model.encode_user(user, kv_dtype="int8"), cands)
    bf = model.score(model.encode_user(user, kv_dtype="bf16"), cands)
    assert (q8 - ref).abs().max().item() < 0.1
    assert (bf - ref).abs().max().item() < 0.1
    assert not torch.equal(q8, ref)  # it really is quantised


def test_to_device_keeps_scores(setup) -> None:
    model, user, cands = setup
    kv = model.encode_user(user).to("cpu")
    assert kv.device.type == "cpu"
    assert torch.equal(model.score(kv, cands), model.score(model.encode_user(user), cands))
