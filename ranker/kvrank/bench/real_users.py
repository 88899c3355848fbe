"""What each cache shortcut costs in ranking quality on real users (MovieLens-100k).

Every comparison scores the *same* evaluation requests (the true next item plus 100 sampled
negatives, see :mod:`kvrank.data.movielens_features`) two ways and reports both AUC, HR@10 and
NDCG@10, their differences and the largest |Δlogit|:

- **INT8 K/V** vs fp32 K/V of the same model;
- **compact entries** (a model of the pyramid + ``candidate_layers`` config, trained the same
  way) vs the full model — two trainings, so the figure includes training noise;
- **approximate increments**: a user's window encoded ``n`` events ago, then extended one
  event at a time (each sliding the window) vs a full encode of the same history.

Pure measurement: no training, no I/O (the job in :mod:`kvrank.tools` does those).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvrank.data.movielens_features import MovieLensFeatures, Target
from kvrank.model.kv import UserKV
from kvrank.model.ranker import RankerModel
from kvrank.train import RankingResult, movielens_scores, ranking_metrics


def _row(result: RankingResult) -> dict[str, float]:
    return {"auc": result.auc, "hr_at_10": result.hr_at_10, "ndcg_at_10": result.ndcg_at_10}


def compare(base: list[np.ndarray], other: list[np.ndarray]) -> dict[str, Any]:
    """Both rankings' metrics, ``other - base`` of each, and the largest |Δlogit|."""
    a, b = ranking_metrics(base), ranking_metrics(other)
    worst = max(float(np.abs(x - y).max()) for x, y in zip(base, other, strict=True))
    return {
        "base": _row(a),
        "shortcut": _row(b),
        "delta_auc": b.auc - a.auc,
        "delta_hr_at_10": b.hr_at_10 - a.hr_at_10,
        "delta_ndcg_at_10": b.ndcg_at_10 - a.ndcg_at_10,
        "max_abs_logit_diff": worst,
        "requests": a.requests,
    }


def int8_entries(
    model: RankerModel, data: MovieLensFeatures, targets: list[Target], fp32: list[np.ndarray]
) -> dict[str, Any]:
    """INT8 K/V against the fp32 scores ``fp32`` of the same ``targets``."""
    return compare(fp32, movielens_scores(model, data, targets, "int8"))


def slid_targets(data: MovieLensFeatures, targets: list[Target], n_max: int) -> list[Target]:
    """The targets with a full window and ``n_max`` more events before them (every
    increment then slides the window, so none is exact)."""
    return [t for t in targets if t.pos >= data.cfg.max_events + n_max]


def approximate_increments(
    model: RankerModel,
    data: MovieLensFeatures,
    targets: list[Target],
    increments: tuple[int, ...] = (1, 10, 50),
) -> list[dict[str, Any]]:
    """For each ``n``: every target's request scored from a window that ended ``n`` events
    before it, extended by those ``n`` one at a time, against a full encode of the window
    that ends at it. ``targets`` must come from :func:`slid_targets`."""
    window, rows = data.cfg.max_events, []
    exact = movielens_scores(model, data, targets)
    cands = [data.candidates(data.eval_items(t)) for t in targets]
    for n in increments:
        approx = [
            model.score(_extended(model, data, t, n, window), c).numpy()
            for t, c in zip(targets, cands, strict=True)
        ]
        rows.append({"increments": n, **compare(exact, approx)})
    return rows


def _extended(
    model: RankerModel, data: MovieLensFeatures, t: Target, n: int, window: int
) -> UserKV:
    start = t.pos - n - window
    assert start >= 0, "target without enough history for a sliding increment"
    kv = model.encode_user(data.user(t.user, start + window, start))
    for p in range(t.pos - n, t.pos):
        kv = model.extend_user(kv, data.user(t.user, p + 1, p).events)
    return kv
