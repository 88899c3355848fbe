"""Synthetic users, sequences and candidates whose click labels carry real signal.

Each user has a click propensity and latent interests over topics that drift along the
behaviour sequence; events are sampled from the interest at their time and clicked more
often by active users, and a candidate's click probability depends on the user's
propensity, their *current* (end-of-sequence) interest in the candidate's topic, the item's
quality and the context. A model must therefore read the sequence — especially its recent
end — to rank well, which makes held-out AUC meaningful. Deterministic per seed; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kvrank.model.config import ModelConfig
from kvrank.model.inputs import Candidates, Events, UserFeatures

N_TOPICS = 16


@dataclass(frozen=True)
class UserSample:
    """One user's features plus the latent state the labels are drawn from."""

    features: UserFeatures
    interest: np.ndarray  # [N_TOPICS], current (end-of-sequence) interest
    activity: float  # click propensity; shows in the user's event actions
    context_boost: float


class SyntheticWorld:
    """A fixed item catalogue; users and candidate sets drawn from it by seed."""

    def __init__(self, cfg: ModelConfig, seed: int = 0, n_items: int = 20_000) -> None:
        self.cfg = cfg
        rng = np.random.default_rng(seed)
        self.item_ids = rng.integers(1, 2**62, size=n_items, dtype=np.int64)
        self.item_topic = rng.integers(0, N_TOPICS, size=n_items)
        self.item_quality = rng.normal(0.0, 0.5, size=n_items)
        self.by_topic = [np.flatnonzero(self.item_topic == t) for t in range(N_TOPICS)]

    def category(self, idx: np.ndarray) -> np.ndarray:
        per_topic = max(1, self.cfg.n_categories // N_TOPICS)
        cats: np.ndarray = (
            self.item_topic[idx] * per_topic + idx % per_topic
        ) % self.cfg.n_categories
        return cats

    def user(self, seed: int, n_events: int | None = None) -> UserSample:
        cfg = self.cfg
        rng = np.random.default_rng(10_000_019 + seed)
        n = n_events or int(rng.integers(max(1, cfg.max_events // 4), cfg.max_events + 1))
        start = rng.dirichlet(np.full(N_TOPICS, 0.3))
        end = rng.dirichlet(np.full(N_TOPICS, 0.3))
        # Interest drifts from `start` to `end` along the sequence.
        w = np.linspace(0.0, 1.0, n)[:, None]
        interest_t = (1 - w) * start + w * end
        topics = np.array([rng.choice(N_TOPICS, p=p / p.sum()) for p in interest_t])
        idx = np.array([rng.choice(self.by_topic[t]) for t in topics])
        activity = float(rng.normal(0.0, 1.0))
        p_click = 1.0 / (1.0 + np.exp(-(activity - 1.0 + 4.0 * interest_t[np.arange(n), topics])))
        clicked = rng.random(n) < p_click
        actions = np.where(clicked, 1 + (rng.random(n) < 0.2), 0)
        gaps = np.minimum(rng.geometric(0.3, size=n) - 1, cfg.n_gap_buckets - 1)
        dense = rng.normal(0.0, 1.0, size=(n, cfg.event_dense))
        if cfg.event_dense:
            dense[:, 0] = np.log1p(clicked * rng.exponential(30.0, size=n))
        dominant = int(np.argmax(end))
        profile = rng.integers(0, 1000, size=cfg.profile_fields)
        if cfg.profile_fields:
            profile[0] = dominant if rng.random() < 0.5 else rng.integers(N_TOPICS)
        context = rng.integers(0, 24, size=cfg.context_fields)
        boost = 0.0
        if cfg.context_fields:
            boost = 0.5 if context[0] >= 18 else 0.0
        user_dense = rng.normal(0.0, 1.0, size=cfg.user_dense)
        events = Events(
            torch.from_numpy(self.item_ids[idx]),
            torch.from_numpy(self.category(idx).astype(np.int64)),
            torch.from_numpy(actions.astype(np.int64)),
            torch.from_numpy(gaps.astype(np.int64)),
            torch.from_numpy(dense.astype(np.float32)),
        )
        features = UserFeatures(
            events,
            torch.from_numpy(profile.astype(np.int64)),
            torch.from_numpy(context.astype(np.int64)),
            torch.from_numpy(user_dense.astype(np.float32)),
        )
        return UserSample(features, end, activity, boost)

    def candidates(
        self, user: UserSample, count: int, seed: int
    ) -> tuple[Candidates, np.ndarray, np.ndarray]:
        """``count`` candidates for ``user`` with sampled click labels and their probabilities.

        Half the candidates come from the user's current top topics so that positives are
        not vanishingly rare.
        """
        cfg = self.cfg
        rng = np.random.default_rng(20_000_003 + seed)
        top = np.argsort(user.interest)[-3:]
        from_top = rng.random(count) < 0.5
        topics = np.where(from_top, rng.choice(top, size=count), rng.integers(0, N_TOPICS, count))
        idx = np.array([rng.choice(self.by_topic[t]) for t in topics])
        quality = self.item_quality[idx]
        logit = (
            1.5 * user.activity
            + 8.0 * user.interest[topics]
            - 3.0
            + 1.5 * quality
            + user.context_boost
        )
        prob = 1.0 / (1.0 + np.exp(-logit))
        labels = (rng.random(count) < prob).astype(np.float32)
        dense = rng.normal(0.0, 1.0, size=(count, cfg.cand_dense))
        if cfg.cand_dense:
            dense[:, 0] = quality + rng.normal(0.0, 0.1, size=count)
        cands = Candidates(
            torch.from_numpy(self.item_ids[idx]),
            torch.from_numpy(self.category(idx).astype(np.int64)),
            torch.from_numpy(dense.astype(np.float32)),
        )
        return cands, labels, prob
