"""Training on the synthetic world learns real signal, and artifacts carry it to serving."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvrank.data.synthetic import SyntheticWorld
from kvrank.model.artifact import load_model, save_model
from kvrank.model.config import TINY
from kvrank.model.ranker import RankerModel
from kvrank.train import TrainSettings, auc, evaluate, held_out, train

SMALL = TINY.model_copy(
    update={
        "n_layers": 2,
        "max_events": 48,
        "emb_dim": 16,
        # the synthetic world's whole vocabularies
        "item_buckets": 20_000,
        "n_categories": 64,
        "profile_buckets": 10_000,
    }
)
"""The test preset with histories, embeddings and vocabularies wide enough to learn the
synthetic world's signal in a few epochs."""


def test_auc_matches_the_textbook_definition() -> None:
    y = np.array([0, 0, 1, 1, 0, 1])
    s = np.array([0.1, 0.4, 0.35, 0.8, 0.4, 0.4])
    pairs = [(p, n) for p in s[y == 1] for n in s[y == 0]]
    expected = np.mean([1.0 if p > n else 0.5 if p == n else 0.0 for p, n in pairs])
    assert auc(y, s) == expected


@pytest.mark.slow
def test_training_beats_chance_on_held_out_users(tmp_path) -> None:
    model = train(SMALL, TrainSettings(steps=120, batch_users=32, cands_per_user=8))
    world = SyntheticWorld(SMALL, 0)
    data = held_out(world, 120, 16)
    trained = evaluate(lambda u, c: model.score(model.encode_user(u.features), c), data)
    assert trained.auc > 0.7, trained
    # what was learnt, not the evaluation, makes the AUC: an untrained model scores far lower
    untrained = RankerModel(SMALL).eval()
    baseline = evaluate(lambda u, c: untrained.score(untrained.encode_user(u.features), c), data)
    assert trained.auc > baseline.auc + 0.1, (trained, baseline)
    save_model(model, tmp_path, {"auc": trained.auc})
    again = evaluate(
        lambda u, c: (m := load_model(tmp_path)).score(m.encode_user(u.features), c), data[:10]
    )
    first = evaluate(lambda u, c: model.score(model.encode_user(u.features), c), data[:10])
    assert again.auc == first.auc
    assert json.loads((tmp_path / "config.json").read_text())["extra"]["auc"] == trained.auc


def test_synthetic_world_is_deterministic() -> None:
    a, b = SyntheticWorld(SMALL, 3).user(17), SyntheticWorld(SMALL, 3).user(17)
    assert np.array_equal(a.features.events.item_ids.numpy(), b.features.events.item_ids.numpy())
    assert a.activity == b.activity


@pytest.mark.slow
def test_kvrank_train_reports_the_int8_cost_and_rejects_unknown_profiles(tmp_path) -> None:
    from typer.testing import CliRunner

    from kvrank.cli import app

    runner = CliRunner()
    bad = runner.invoke(app, ["train", "--profile", "huge", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "profile must be one of" in bad.output
    out = tmp_path / "m"
    ok = runner.invoke(
        app,
        ["train", "--steps", "3", "--batch-users", "4", "--out", str(out)],
        catch_exceptions=False,
    )
    assert ok.exit_code == 0, ok.output
    assert "from INT8 K/V AUC" in " ".join(ok.output.split())  # rich wraps long lines
    extra = json.loads((out / "config.json").read_text())["extra"]
    assert extra["steps"] == 3 and extra["batch_users"] == 4 and extra["profile"] == "quick"
    assert extra["auc_delta_int8"] == extra["auc_int8_kv"] - extra["auc"]
