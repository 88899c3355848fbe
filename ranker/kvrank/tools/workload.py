"""A realistic ranking workload: Zipf-popular users, Poisson arrivals, growing histories.

Each request picks a user by Zipf popularity (a few users come back often, most rarely),
arrives after an exponential gap (Poisson traffic at the target rate), and with some
probability the user has gained new events since their last request — so refreshes hit
the cache, sessions extend it incrementally, and cold users miss. Deterministic per seed.
Builds request bodies only; sending them is :mod:`kvrank.tools.replay`'s job.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

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
    seed: int = 0


@dataclass(frozen=True)
class Request:
    at_s: float  # scheduled send time from the start of the replay
    user_id: str
    body: dict[str, Any]


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
            t += float(self.rng.exponential(1.0 / self.settings.rate_qps))
            uid = int(self.rng.choice(self.settings.users, p=self.popularity))
            user = self._user(uid)
            cands, _, _ = self.world.candidates(
                self.world.user(uid), self.settings.candidates, seed=i
            )
            yield Request(t, f"user{uid}", request_body(f"user{uid}", user, cands))

    def _user(self, uid: int) -> UserFeatures:
        if uid not in self._users:
            start = max(4, self.cfg.max_events // 2)
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
