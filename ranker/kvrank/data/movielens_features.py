"""MovieLens-100k as the built-in model's inputs: a time-based split, ranking requests of the
true next item plus sampled negatives, and the features of each side.

- **Events** (one per rating, oldest first): the item, its first genre as the category, the
  rating (1–5) as the action, and the gap since the user's previous rating in log2 buckets.
- **Profile**: age decade, gender, occupation and zip prefix (each field in an id range of
  its own, as they share one hashed table).
- **Candidates**: the item, its genre, and two dense values known before serving: its
  popularity in the training part (log-scaled) and its release year.
- **Split**: each user's last :data:`EVAL_SHARE` of ratings (at least one) are evaluation
  targets; everything before is training. A request for a target carries the user's whole
  history before it (the window keeps the latest ``max_events``), the true item and
  :data:`NEGATIVES` items the user never rated, drawn uniformly — the usual 1-plus-100
  sampled protocol, so HR@10 of a random ranker is 10/101.

No model code and no training here: :mod:`kvrank.train` fits, :mod:`kvrank.bench` measures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from kvrank.data.movielens import GENRES, MovieLens
from kvrank.model.config import QUICK, ModelConfig
from kvrank.model.inputs import Candidates, Events, UserFeatures

EVAL_SHARE = 0.1
"""Share of each user's latest ratings held out (users have 20–737, so 2–74 each)."""
NEGATIVES = 100
"""Sampled negatives per evaluation request (the protocol of SASRec, BERT4Rec, RecBole)."""

MOVIELENS = QUICK.model_copy(
    update={
        "n_actions": 6,  # ratings 1..5
        "n_categories": len(GENRES),
        "profile_fields": 4,
        "context_fields": 0,
        "event_dense": 0,
        "user_dense": 0,
        "cand_dense": 2,
        "max_events": 64,  # half the users have more ratings, so windows slide
        "cand_tokens": 4,  # 101 candidates per request: 4 tokens each keep scoring cheap on CPUs
        "item_buckets": 16_384,  # 1,682 items: ~10% share a row; a bigger table only costs steps
        "profile_buckets": 4_096,
    }
)
"""The quick model's width and depth with MovieLens' vocabularies (what ``kvrank train --data
movielens-100k`` trains)."""

MOVIELENS_COMPACT = MOVIELENS.model_copy(update={"pyramid": (32, 8), "candidate_layers": 1})
"""The same with the memory-saving choices: the cache holds 1 layer of at most 8 user rows."""

_PROFILE_OFFSETS = (0, 100, 200, 1_000)  # age decade, gender, occupation, zip3: disjoint ids


def gap_bucket(gap_s: np.ndarray, buckets: int) -> np.ndarray:
    """0 for no gap (same second, or a first event), else ``1 + log2(gap) // 2``, capped."""
    safe = np.maximum(gap_s, 1).astype(np.float64)
    b = 1 + np.floor(np.log2(safe)).astype(np.int64) // 2
    return np.where(gap_s > 0, np.minimum(b, buckets - 1), 0)


@dataclass(frozen=True)
class Target:
    """A ranking request: ``user``'s rating at position ``pos`` of their timeline."""

    user: int
    pos: int


class MovieLensFeatures:
    """The split and the built-in model's features for one loaded :class:`MovieLens`."""

    def __init__(self, ml: MovieLens, cfg: ModelConfig = MOVIELENS) -> None:
        self.ml, self.cfg = ml, cfg
        self.rows = ml.by_user
        self.n_eval = {u: max(1, round(EVAL_SHARE * len(r))) for u, r in self.rows.items()}
        gaps = np.zeros(len(ml), dtype=np.int64)
        for r in self.rows.values():
            gaps[r[1:]] = ml.timestamp[r[1:]] - ml.timestamp[r[:-1]]
        self.gap = gap_bucket(gaps, cfg.n_gap_buckets)

    # ------------------------------------------------------------------ the split
    def train_targets(self) -> list[Target]:
        """Every training position with at least one event before it."""
        return [
            Target(u, p) for u, r in self.rows.items() for p in range(1, len(r) - self.n_eval[u])
        ]

    def eval_targets(self) -> list[Target]:
        return [
            Target(u, p)
            for u, r in self.rows.items()
            for p in range(len(r) - self.n_eval[u], len(r))
        ]

    @cached_property
    def train_counts(self) -> np.ndarray:
        """Ratings per item id in the training part only (what a popularity ranker knows)."""
        idx = np.concatenate([r[: len(r) - self.n_eval[u]] for u, r in self.rows.items()])
        return np.bincount(self.ml.item[idx], minlength=self.ml.n_items + 1)

    @cached_property
    def _rated(self) -> dict[int, set[int]]:
        return {u: set(self.ml.item[r].tolist()) for u, r in self.rows.items()}

    def item_at(self, t: Target) -> int:
        return int(self.ml.item[self.rows[t.user][t.pos]])

    def negatives(self, user: int, count: int, rng: np.random.Generator) -> np.ndarray:
        """``count`` distinct items ``user`` never rated, uniformly."""
        rated, out = self._rated[user], list[int]()
        while len(out) < count:
            i = int(rng.integers(1, self.ml.n_items + 1))
            if i not in rated and i not in out:
                out.append(i)
        return np.array(out, dtype=np.int64)

    def eval_items(self, t: Target, seed: int = 0) -> np.ndarray:
        """The true item first, then :data:`NEGATIVES` sampled ones (deterministic per target)."""
        rng = np.random.default_rng([seed, t.user, t.pos])
        return np.concatenate([[self.item_at(t)], self.negatives(t.user, NEGATIVES, rng)])

    # ------------------------------------------------------------------ features
    def user(self, user: int, stop: int, start: int | None = None) -> UserFeatures:
        """``user``'s events ``[start, stop)`` of their timeline (default: the latest window
        before ``stop``) and their profile."""
        r = self.rows[user][max(0, stop - self.cfg.max_events) if start is None else start : stop]
        ml = self.ml
        events = Events(
            torch.from_numpy(ml.item[r]),
            torch.from_numpy(ml.items.genre[ml.item[r]]),
            torch.from_numpy(ml.rating[r]),
            torch.from_numpy(self.gap[r]),
            torch.zeros(len(r), self.cfg.event_dense),
        )
        u = ml.users
        fields = (u.age[user] // 10, u.gender[user], u.occupation[user], u.zip3[user])
        profile = torch.tensor([o + int(f) for o, f in zip(_PROFILE_OFFSETS, fields, strict=True)])
        return UserFeatures(
            events,
            profile[: self.cfg.profile_fields],
            torch.zeros(0, dtype=torch.int64),
            torch.zeros(0),
        )

    def candidates(self, items: np.ndarray) -> Candidates:
        ml = self.ml
        pop = np.log1p(self.train_counts[items]) / math.log1p(int(self.train_counts.max()))
        year = np.where(ml.items.year[items] > 0, (ml.items.year[items] - 1990) / 10.0, 0.0)
        dense = np.stack([pop, year], axis=1)[:, : self.cfg.cand_dense]
        return Candidates(
            torch.from_numpy(items.astype(np.int64)),
            torch.from_numpy(ml.items.genre[items]),
            torch.from_numpy(dense.astype(np.float32)),
        )
