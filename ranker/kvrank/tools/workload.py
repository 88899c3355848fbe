"""A realistic ranking workload: Zipf-popular users, Poisson or bursty arrivals, growing
histories.

Each request picks a user by Zipf popularity (a few users come back often, most rarely),
arrives after a gap drawn for the arrival law at the target mean rate — exponential
(Poisson traffic) or heavy-tailed Pareto (bursts of near-simultaneous requests between long
pauses) —, and with some probability the user has gained new events since their last
request — so refreshes hit the cache, sessions extend it incrementally, and cold users
miss. Each request records whether its user was seen before: the share of those is the
**oracle hit ratio**, what an unbounded, never-expiring cache would serve. Deterministic
per seed. Builds request bodies only; sending them is :mod:`kvrank.tools.replay`'s job.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from kvrank.data.synthetic import SyntheticWorld
from kvrank.model.artifact import load_ranker
from kvrank.model.config import ModelConfig
from kvrank.model.contract import CandidateInput, FeatureSpec, UserInput
from kvrank.model.features import example_candidates, example_user
from kvrank.model.inputs import Candidates, UserFeatures
from kvrank.model.onetrans import OneTransRanker, feature_spec, from_candidates, from_features
from kvrank.server.schemas import body_for


@dataclass(frozen=True)
class WorkloadSettings:
    users: int = 400
    zipf_s: float = 1.2
    """Zipf exponent of user popularity; ~1.2 gives a heavy head as in feed traffic."""
    rate_qps: float = 40.0
    candidates: int = 100
    new_events_prob: float = 0.15
    """Chance that a returning user brings 1–3 new events (session activity)."""
    arrival: Literal["poisson", "bursty"] = "poisson"
    history_fill: float = 0.5
    """Share of the model's event window a user's history fills at first sight (then it
    grows with new events): a short history is cheap to score without a cache, a full
    window is the brief's ~1,500-token production case."""
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.history_fill <= 1.0:
            raise ValueError(f"history_fill={self.history_fill} must be in (0, 1]")


_BUILTIN = feature_spec(ModelConfig())
"""The built-in ranker's columns, to name request fields (sizes do not change the names)."""

PARETO_SHAPE = 1.5
"""Tail index of the bursty law's gaps: finite mean, infinite variance (most gaps tiny, a few
very long), as measured for request bursts in web traffic."""


@dataclass(frozen=True)
class Request:
    at_s: float  # scheduled send time from the start of the replay
    user_id: str
    body: dict[str, Any]
    returning: bool = False
    """The user sent a request before: an unbounded, never-expiring cache would hit."""


@dataclass
class Workload:
    """Requests for a model with ``features``. With a ``ModelConfig`` (the built-in ranker)
    users and candidates come from the synthetic world with planted structure; with only a
    feature spec (any plugin model) they are random valid values of its columns."""

    model: ModelConfig | FeatureSpec
    settings: WorkloadSettings = field(default_factory=WorkloadSettings)

    def __post_init__(self) -> None:
        s = self.settings
        if isinstance(self.model, ModelConfig):
            self.features = feature_spec(self.model)
            self.world: SyntheticWorld | None = SyntheticWorld(self.model, s.seed)
        else:
            self.features, self.world = self.model, None
        self.rng = np.random.default_rng(s.seed)
        ranks = np.arange(1, s.users + 1, dtype=np.float64)
        self.popularity = ranks**-s.zipf_s / np.sum(ranks**-s.zipf_s)
        self._users: dict[int, UserInput] = {}

    def requests(self, count: int) -> Iterator[Request]:
        t = 0.0
        for i in range(count):
            t += self._gap()
            uid = int(self.rng.choice(self.settings.users, p=self.popularity))
            returning = uid in self._users
            user = self._user(uid)
            body = body_for(self.features, f"user{uid}", user, self._candidates(uid, i))
            yield Request(t, f"user{uid}", body, returning)

    def _gap(self) -> float:
        """Seconds to the next request; the mean is ``1 / rate_qps`` under either law."""
        mean = 1.0 / self.settings.rate_qps
        if self.settings.arrival == "poisson":
            return float(self.rng.exponential(mean))
        # Lomax (Pareto II) with shape a has mean scale / (a - 1)
        return float(self.rng.pareto(PARETO_SHAPE)) * mean * (PARETO_SHAPE - 1)

    def _user(self, uid: int) -> UserInput:
        if uid not in self._users:
            start = max(1, round(self.features.window * self.settings.history_fill))
            self._users[uid] = self._history(uid, start)
        elif self.rng.random() < self.settings.new_events_prob:
            user = self._users[uid]
            k = int(self.rng.integers(1, 4))
            extra = self._history(uid * 7919 + len(user), k).events
            events = {name: torch.cat([t, extra[name]]) for name, t in user.events.items()}
            self._users[uid] = UserInput(events, user.user)
        return self._users[uid]

    def _history(self, seed: int, n: int) -> UserInput:
        if self.world is not None:
            return from_features(self.world.user(seed, n_events=n).features)
        return example_user(self.features, n, _generator(self.settings.seed, seed))

    def _candidates(self, uid: int, i: int) -> CandidateInput:
        c = self.settings.candidates
        if self.world is not None:
            cands, _, _ = self.world.candidates(self.world.user(uid), c, seed=i)
            return from_candidates(cands)
        return example_candidates(self.features, c, _generator(self.settings.seed, 1_000_003 + i))


def _generator(seed: int, stream: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 2_654_435_761 + stream)


def request_body(user_id: str, user: UserFeatures, cands: Candidates) -> dict[str, Any]:
    """The body of a built-in ranker's request (its column names do not depend on sizes)."""
    return body_for(_BUILTIN, user_id, from_features(user), from_candidates(cands))


def workload_model(model_dir: Path) -> ModelConfig | FeatureSpec:
    """What a :class:`Workload` for the artifact at ``model_dir`` is built from: the built-in
    ranker's config (its synthetic world), else the plugin model's feature spec."""
    model = load_ranker(model_dir)
    return model.net.cfg if isinstance(model, OneTransRanker) else model.features
