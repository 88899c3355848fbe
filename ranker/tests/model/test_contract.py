"""The model contract's seams: the built-in ranker keeps its request schema and its cache
keys, a cached state holds K and V of their own widths plus named extras, and the registry
loads only what the installed code can serve; a FeatureSpec refuses what would only fail at
the first request."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated

import numpy as np
import pytest
import torch
from pydantic import BaseModel, ConfigDict, Field
from safetensors.torch import save as st_save

from kvrank.errors import ArtifactError
from kvrank.model import registry
from kvrank.model.artifact import load_ranker, save_ranker
from kvrank.model.contract import Column, FeatureSpec
from kvrank.model.kv import UserKV
from kvrank.model.onetrans import OneTransRanker, feature_spec, from_features
from kvrank.server.schemas import request_model

# ----------------------------------------------------------- what clients were promised
Id = Annotated[int, Field(ge=0, le=2**63 - 1)]
Finite = Annotated[float, Field(allow_inf_nan=False)]


class _EventsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    item_ids: list[Id] = Field(min_length=1, max_length=10_000)
    categories: list[Id] = Field(max_length=10_000)
    actions: list[Id] = Field(max_length=10_000)
    gaps: list[Id] = Field(max_length=10_000)
    dense: list[list[Finite]] = Field(default_factory=list, max_length=10_000)


class _CandidatesIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    item_ids: list[Id] = Field(min_length=1, max_length=1_000)
    categories: list[Id] = Field(max_length=1_000)
    dense: list[list[Finite]] = Field(default_factory=list, max_length=1_000)


class _ScoreRequest(BaseModel):
    """The request body the built-in ranker was served with before models became plugins."""

    model_config = ConfigDict(extra="forbid")
    user_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")
    events: _EventsIn
    profile_ids: list[Id] = Field(default_factory=list, max_length=64)
    context_ids: list[Id] = Field(default_factory=list, max_length=64)
    user_dense: list[Finite] = Field(default_factory=list, max_length=256)
    candidates: _CandidatesIn


class _EventsSince(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seq_hash: str = Field(pattern=r"^[0-9a-f]{32}$")
    events: _EventsIn


class _ScoreRequestNow(BaseModel):
    """The same, plus the history by reference: ``events`` may give way to ``seq_hash`` or to
    ``events_since`` — every body valid before is still valid and means the same."""

    model_config = ConfigDict(extra="forbid")
    user_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")
    events: _EventsIn | None = None
    seq_hash: str | None = Field(None, pattern=r"^[0-9a-f]{32}$")
    events_since: _EventsSince | None = None
    profile_ids: list[Id] = Field(default_factory=list, max_length=64)
    context_ids: list[Id] = Field(default_factory=list, max_length=64)
    user_dense: list[Finite] = Field(default_factory=list, max_length=256)
    candidates: _CandidatesIn


def _without_docs(doc: object) -> object:
    if isinstance(doc, dict):
        return {
            k.lstrip("_"): _without_docs(v)
            for k, v in doc.items()
            if k not in ("description", "title")
        }
    if isinstance(doc, list):
        return [_without_docs(v) for v in doc]
    return doc.replace("#/$defs/_", "#/$defs/") if isinstance(doc, str) else doc


def test_the_built_in_request_schema_is_the_one_clients_were_given(tiny_cfg) -> None:
    derived = request_model(feature_spec(tiny_cfg)).model_json_schema()
    assert _without_docs(derived) == _without_docs(_ScoreRequestNow.model_json_schema())
    before = _without_docs(_ScoreRequest.model_json_schema())
    assert isinstance(before, dict)
    assert set(before["properties"]) | {"seq_hash", "events_since"} == set(derived["properties"])


def _built_in_chain(user, fingerprint: str) -> list[str]:
    """The sequence hash of the built-in ranker's user, its columns named one by one."""

    def digest(*parts: bytes) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        for p in parts:
            h.update(len(p).to_bytes(8, "little"))
            h.update(p)
        return h.digest()

    ev = user.events
    base = digest(
        fingerprint.encode(),
        user.profile_ids.numpy().astype("<i8").tobytes(),
        user.context_ids.numpy().astype("<i8").tobytes(),
        user.dense.numpy().astype("<f4").tobytes(),
    )
    columns = np.stack(
        [ev.item_ids.numpy(), ev.categories.numpy(), ev.actions.numpy(), ev.gaps.numpy()], axis=1
    ).astype("<i8")
    dense = ev.dense.numpy().astype("<f4")
    events = [
        b"".join(len(p).to_bytes(8, "little") + p for p in (ids.tobytes(), d.tobytes()))
        for ids, d in zip(columns, dense, strict=True)
    ]
    blocks = [base]
    for j in range(len(ev) // 64):
        block = blocks[-1] + b"".join(events[64 * j : 64 * j + 64])
        blocks.append(hashlib.blake2b(block, digest_size=16, person=b"kvrank-block").digest())
    return [
        hashlib.blake2b(
            blocks[i // 64] + i.to_bytes(8, "little") + b"".join(events[i // 64 * 64 : i]),
            digest_size=16,
            person=b"kvrank-seq",
        ).hexdigest()
        for i in range(len(ev) + 1)
    ]


def test_cache_keys_of_the_built_in_model_hash_its_columns_in_order(factory, tiny_cfg) -> None:
    """The built-in ranker's columns go into its keys in the order its servers have always
    hashed them (ids, then dense; profile, context, dense): its feature spec cannot reorder
    them and orphan every cached entry."""
    user = factory.user(tiny_cfg, 70, 4)
    assert factory.chain(user, "fp", tiny_cfg)[:] == _built_in_chain(user, "fp")


# ------------------------------------------------------------------- the cached state
def test_k_and_v_of_their_own_widths_and_extras_round_trip(factory) -> None:
    g = torch.Generator().manual_seed(0)
    kv = UserKV.build(
        model_version="v1",
        fingerprint="f" * 16,
        kv={0: (torch.randn(5, 3, 12, generator=g), torch.randn(5, 3, 16, generator=g))},
        length=4,
        kv_dtype="int8",
        extras={"positions": torch.arange(4), "summary": torch.randn(2, 8, generator=g)},
    )
    back = UserKV.from_bytes(kv.to_bytes())
    assert back.layers[0].k.shape == (5, 3, 12) and back.layers[0].v.shape == (5, 3, 16)
    assert torch.equal(back.extras["positions"], torch.arange(4))
    assert torch.equal(back.extras["summary"], kv.extras["summary"])
    k, v = back.layers[0].dequantize(torch.float32)
    assert k.shape == (5, 3, 12)
    assert v.shape == (5, 3, 16) and back.nbytes == kv.nbytes


def test_a_format_1_payload_still_reads(factory, tiny_cfg) -> None:
    """What servers wrote before extras had names: its one extra was ``ns_input``."""
    model = factory.model(tiny_cfg)
    user, cands = factory.user(tiny_cfg, 7, 1), factory.candidates(tiny_cfg, 5, 1)
    kv = model.encode_user(user)
    tensors = {"ns_input": kv.extras["ns_input"]}
    for i, lk in kv.layers.items():
        tensors[f"l{i}.k"], tensors[f"l{i}.v"] = lk.k, lk.v
    header = {
        "format": "1",
        "model_version": kv.model_version,
        "fingerprint": kv.fingerprint,
        "kv_dtype": kv.kv_dtype,
        "length": kv.length,
        "increments": 0,
        "layers": sorted(kv.layers),
        "meta": {},
    }
    old = UserKV.from_bytes(st_save(tensors, metadata={"kvrank": json.dumps(header)}))
    assert torch.equal(model.score(old, cands), model.score(kv, cands))


# -------------------------------------------------------------------------- registry
def test_the_example_plugin_is_found_through_its_entry_point() -> None:
    found = registry.architectures()
    assert found["sasrec"].distribution == "kvrank-sasrec"
    assert found["onetrans"].distribution == "kvrank"


def test_an_unknown_architecture_names_the_installed_ones(sasrec_artifact, tmp_path) -> None:
    doc = json.loads((sasrec_artifact / "config.json").read_text())
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.safetensors").write_bytes(
        (sasrec_artifact / "model.safetensors").read_bytes()
    )
    (tmp_path / "m" / "config.json").write_text(json.dumps({**doc, "architecture": "hstu"}))
    with pytest.raises(ArtifactError, match="'hstu' is not installed") as info:
        load_ranker(tmp_path / "m")
    assert "onetrans" in str(info.value) and "sasrec" in str(info.value)


def test_an_artifact_of_another_plugin_version_is_refused(sasrec_artifact, tmp_path) -> None:
    doc = json.loads((sasrec_artifact / "config.json").read_text())
    assert doc["format"] == 2 and doc["provider"]["distribution"] == "kvrank-sasrec"
    doc["provider"]["version"] = "0.0.9"
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.safetensors").write_bytes(
        (sasrec_artifact / "model.safetensors").read_bytes()
    )
    (tmp_path / "m" / "config.json").write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match=r"written by kvrank-sasrec 0\.0\.9") as info:
        load_ranker(tmp_path / "m")
    assert "this image has kvrank-sasrec 0.1.0" in str(info.value)


def test_a_builder_that_does_not_implement_the_contract_is_refused(tmp_path, factory, tiny_cfg):
    class Half:
        version = "v1"

        def score(self) -> None: ...

    registry.register("test-half", lambda cfg, v: Half(), "kvrank-test-plugins", "1.0")  # type: ignore[arg-type,return-value]
    try:
        save_ranker(OneTransRanker(factory.model(tiny_cfg)), tmp_path / "m", "test-half", {})
        with pytest.raises(ArtifactError, match="does not implement CacheableRanker") as info:
            load_ranker(tmp_path / "m")
        assert "encode_user" in str(info.value) and "forward_full" in str(info.value)
    finally:
        registry.unregister("test-half")


def test_a_plugin_sees_validated_columns_only(factory, tiny_cfg) -> None:
    """The built-in adapter gets exactly the columns of its spec, in tensors."""
    user = from_features(factory.user(tiny_cfg, 3, 1))
    assert list(user.events) == [c.name for c in feature_spec(tiny_cfg).sequence]
    assert list(user.user) == [c.name for c in feature_spec(tiny_cfg).user]


# ------------------------------------------------ a spec refuses what fails later

_SEQUENCE = (Column("item_id", "id", 100),)
_CANDIDATE = (Column("item_id", "id", 100),)


def _spec(*user: Column) -> FeatureSpec:
    return FeatureSpec(sequence=_SEQUENCE, user=user, candidate=_CANDIDATE, window=8)


def test_a_user_id_column_without_a_width_is_refused_naming_it() -> None:
    # The default once was width 0: every request then had to send the column empty, and a
    # model reading one id crashed with a shape error at its first request.
    with pytest.raises(ValueError, match="user column age needs width"):
        _spec(Column("age", "id", 10))


def test_a_dense_column_without_a_width_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="column score: a dense column needs width"):
        Column("score", "dense")


def test_a_declared_width_holds_and_zero_declares_an_empty_column() -> None:
    s = _spec(Column("age", "id", 10, width=1), Column("context", "id", width=0))
    assert [c.per_row for c in s.user] == [1, 0]
    # sequence and candidate ids are one per row: their width is unused
    assert s.sequence[0].width is None and s.sequence[0].per_row == 0


def test_a_negative_width_is_refused() -> None:
    with pytest.raises(ValueError, match="width -1 is negative"):
        Column("age", "id", 10, width=-1)
