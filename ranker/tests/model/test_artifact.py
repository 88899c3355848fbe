"""Model artifacts: config.json + model.safetensors round trip; broken artifacts are refused."""

from __future__ import annotations

import json

import pytest
import torch

from kvrank.errors import ArtifactError
from kvrank.model.artifact import load_model, save_model


def test_round_trip_scores_identically(factory, tiny_cfg, tmp_path) -> None:
    model = factory.model(tiny_cfg, version="v7")
    save_model(model, tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    assert loaded.version == "v7" and loaded.cfg == tiny_cfg
    user, cands = factory.user(tiny_cfg, 9, 1), factory.candidates(tiny_cfg, 4, 1)
    assert torch.equal(
        loaded.score(loaded.encode_user(user), cands), model.score(model.encode_user(user), cands)
    )
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == [
        "config.json",
        "model.safetensors",
    ]


def test_missing_weights(factory, tiny_cfg, tmp_path) -> None:
    save_model(factory.model(tiny_cfg), tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ArtifactError, match=r"missing model\.safetensors"):
        load_model(tmp_path)


def test_config_that_does_not_match_weights(factory, tiny_cfg, tmp_path) -> None:
    save_model(factory.model(tiny_cfg), tmp_path)
    doc = json.loads((tmp_path / "config.json").read_text())
    doc["config"]["d_model"] = 64
    (tmp_path / "config.json").write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match="do not match"):
        load_model(tmp_path)


def test_invalid_config_values(factory, tiny_cfg, tmp_path) -> None:
    save_model(factory.model(tiny_cfg), tmp_path)
    doc = json.loads((tmp_path / "config.json").read_text())
    doc["config"]["n_heads"] = 5
    (tmp_path / "config.json").write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match="not divisible"):
        load_model(tmp_path)


def test_pickled_weights_are_not_loaded(factory, tiny_cfg, tmp_path) -> None:
    save_model(factory.model(tiny_cfg), tmp_path)
    torch.save({"x": torch.zeros(1)}, tmp_path / "model.safetensors")  # a pickle in disguise
    with pytest.raises(ArtifactError):
        load_model(tmp_path)
