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
from typing import Any, Literal

import numpy as np

from kvrank.data.synthetic import SyntheticWorld
from kvrank.model.config import ModelConfig
from kvrank.model.inputs import Events, UserFeatures


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
    cfg: ModelConfig
    settings: WorkloadSettings = field(default_factory=WorkloadSettings)

    def __post_init__(self) -> None:
        s = self.settings
        self.world = SyntheticWorld(self.cfg, s.seed)
        self.rng = np.random.default_rng(s.seed)
        ranks = np.arange(1, s.users + 1, dtype=np.float64)
        self.popularity = ranks**-s.zipf_s / np.sum(ranks**-s.zipf_s)
        self._users: dict[int, UserFeatures] = {}

    def requests(self, count: int) -> Iterator[Request]:
        t = 0.0
        for i in range(count):
            t += self._gap()
            uid = int(self.rng.choice(self.settings.users, p=self.popularity))
            returning = uid in self._users
            user = self._user(uid)
            cands, _, _ = self.world.candidates(
                self.world.user(uid), self.settings.candidates, seed=i
            )
            yield Request(t, f"user{uid}", request_body(f"user{uid}", user, cands), returning)

    def _gap(self) -> float:
        """Seconds to the next request; the mean is ``1 / rate_qps`` under either law."""
        mean = 1.0 / self.settings.rate_qps
        if self.settings.arrival == "poisson":
            return float(self.rng.exponential(mean))
        # Lomax (Pareto II) with shape a has mean scale / (a - 1)
        return float(self.rng.pareto(PARETO_SHAPE)) * mean * (PARETO_SHAPE - 1)

    def _user(self, uid: int) -> UserFeatures:
        if uid not in self._users:
            start = max(1, round(self.cfg.max_events * self.settings.history_fill))
            self._users[uid] = self.world.user(uid, n_events=start).features
        elif self.rng.random() < self.settings.new_events_prob:
            user = self._users[uid]
            k = int(self.rng.integers(1, 4))
            extra = self.world.user(uid * 7919 + len(user.events), n_events=k).features.events
            events: Events = user.events.cat(extra)
            self._users[uid] = user.with_events(events)
        return self._users[uid]


def request_body(user_id: str, user: UserFeatures, cands: Any) -> dict[str, Any]:
    ev = user.events
    return {
        "user_id": user_id,
        "events": {
            "item_ids": ev.item_ids.tolist(),
            "categories": ev.categories.tolist(),
            "actions": ev.actions.tolist(),
            "gaps": ev.gaps.tolist(),
            "dense": ev.dense.tolist(),
        },
        "profile_ids": user.profile_ids.tolist(),
        "context_ids": user.context_ids.tolist(),
        "user_dense": user.dense.tolist(),
        "candidates": {
            "item_ids": cands.item_ids.tolist(),
            "categories": cands.categories.tolist(),
            "dense": cands.dense.tolist(),
        },
    }
