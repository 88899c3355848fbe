"""MovieLens-100k's real timeline as a load-test workload.

Every rating becomes its user's ranking request at its timestamp: the history is everything
the user rated before (as a caller sends it; the model keeps its latest window), so each
request's history is the previous one's plus one rating — the prefix the cache extends. The
candidates are the item they rated next plus items they never rated. A replay takes the first
``count`` such requests of the timeline with the clock compressed so they arrive at the
profile's mean rate (the factor is stated in the report); a user's very first rating has no
history to rank with, so it only starts their history. Real users bring what synthetic ones
cannot: bursts of ratings seconds apart, sessions, and histories longer than the window.
Builds request bodies only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kvrank.bench.timeline import measured_ttl
from kvrank.data import movielens
from kvrank.data.movielens_features import MOVIELENS, MovieLensFeatures
from kvrank.errors import WorkloadError
from kvrank.model.config import ModelConfig
from kvrank.model.onetrans import feature_spec, from_candidates, from_features
from kvrank.server.schemas import body_for
from kvrank.tools.workload import Request

NAME = movielens.NAME


@dataclass(frozen=True)
class TimelineReplay:
    requests: list[Request]
    workload: dict[str, Any]
    """What the report states: the source, the compression factor, the rate, the TTL kvrank's
    formula makes of the real intervals at that compression."""


def timeline_requests(
    cfg: ModelConfig, count: int, rate_qps: float, candidates: int, seed: int = 0
) -> TimelineReplay:
    """The first ``count`` requests of the timeline for a built-in model of ``cfg`` (its
    vocabularies must hold MovieLens': see :data:`MOVIELENS`)."""
    _check_fits(cfg)
    data = MovieLensFeatures(movielens.load(), cfg)
    pos_of = np.empty(len(data.ml), dtype=np.int64)
    for rows in data.rows.values():
        pos_of[rows] = np.arange(len(rows))
    picked = np.flatnonzero(pos_of > 0)[:count]
    ts = data.ml.timestamp[picked].astype(np.float64)
    compression = max(float(ts[-1] - ts[0]) * rate_qps / max(count - 1, 1), 1e-9)
    spec, seen, out = feature_spec(cfg), set[int](), []
    for row, at in zip(picked.tolist(), ts.tolist(), strict=True):
        user, pos = int(data.ml.user[row]), int(pos_of[row])
        rng = np.random.default_rng([seed, user, pos])
        items = np.concatenate([[data.ml.item[row]], data.negatives(user, candidates - 1, rng)])
        body = body_for(
            spec,
            f"ml{user}",
            from_features(data.user(user, pos, start=0)),
            from_candidates(data.candidates(items)),
        )
        out.append(Request((at - ts[0]) / compression, f"ml{user}", body, user in seen))
        seen.add(user)
    formula = measured_ttl(data.ml, compression)
    return TimelineReplay(
        out,
        {
            "source": f"{NAME}: the first {count} ratings with a history, as requests",
            "compression": compression,
            "rate_qps": rate_qps,
            "candidates": candidates,
            "users": len(seen),
            "formula_mean_interval_s": formula["mean_interval_s"],
            "formula_ttl_s": formula["ttl_s"],
        },
    )


WIDTHS = ("profile_fields", "context_fields", "event_dense", "user_dense", "cand_dense")
VOCABULARIES = ("n_actions", "n_categories", "n_gap_buckets")


def _check_fits(cfg: ModelConfig) -> None:
    """``ValueError`` naming each field where ``cfg`` cannot take MovieLens' features."""
    wrong = [
        f"{k}={getattr(cfg, k)} (needs {getattr(MOVIELENS, k)})"
        for k in WIDTHS
        if getattr(cfg, k) != getattr(MOVIELENS, k)
    ] + [
        f"{k}={getattr(cfg, k)} (needs >= {getattr(MOVIELENS, k)})"
        for k in VOCABULARIES
        if getattr(cfg, k) < getattr(MOVIELENS, k)
    ]
    if wrong:
        raise WorkloadError(
            f"the {NAME} workload needs a built-in model trained on it (kvrank train --data"
            f" {NAME}); this model has {', '.join(wrong)}"
        )
