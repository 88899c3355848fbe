"""TTL policy: ``ttl = clamp(mean per-user request interval × factor, min, max)``.

The server measures intervals itself (time between two requests of the same user), keeps
a bounded table of last-seen times, and feeds a Prometheus histogram so the operator can
tune the TTL cluster-wide. A fixed TTL (from config, e.g. written by the operator) takes
precedence over the measured one. :class:`AdaptiveTTL` is what the tiered cache holds:
the tracker plus the settings in force (swapped whole when the config file changes).
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvrank_common import TTL_FACTOR, TTL_JITTER, TTL_MAX_S, TTL_MIN_S, clamp_ttl


class TTLSettings(BaseModel):
    """The TTL policy's knobs: the ``ttl`` section of the ranker's config file.

    The same type is the config file's schema (the operator writes that section into the
    ranker's ConfigMap and pods hot-reload it) and what the cache computes with.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    fixed_seconds: float | None = Field(
        None,
        gt=0,
        le=86_400,
        description="Set (by config or the operator): overrides the measured TTL.",
    )
    factor: float = Field(
        TTL_FACTOR,
        gt=0,
        le=100,
        description="A user returning within ~3 mean intervals still finds their entry.",
    )
    min_seconds: float = Field(TTL_MIN_S, gt=0)
    max_seconds: float = Field(
        TTL_MAX_S,
        gt=0,
        description="Five minutes: beyond that, incremental updates keep entries fresher.",
    )
    jitter: float = Field(
        TTL_JITTER,
        ge=0,
        le=0.5,
        description="±10 % so entries written together do not expire together.",
    )
    default_seconds: float = Field(
        60.0, gt=0, description="Used until intervals are measured (after a minute's watch)."
    )

    @model_validator(mode="after")
    def _bounds_in_order(self) -> TTLSettings:
        if self.min_seconds > self.max_seconds:
            raise ValueError(
                f"min_seconds={self.min_seconds} exceeds max_seconds={self.max_seconds}"
            )
        return self


def ttl_for(mean_interval_s: float, s: TTLSettings) -> float:
    return clamp_ttl(mean_interval_s, s.factor, s.min_seconds, s.max_seconds)


@dataclass
class IntervalTracker:
    """Mean per-user request interval, with bounded memory (oldest users forgotten first).

    Each user keeps an exponentially weighted mean of their own intervals; the tracker's
    :meth:`mean` is the average of those per-user means, so a user who returns every few
    minutes counts as much as one who refreshes every second — the TTL then serves the
    typical user rather than the busiest few.
    """

    max_users: int = 100_000
    min_samples: int = 20
    min_watch_s: float = 60.0
    """How long the tracker watches before :meth:`mean` answers. An interval longer than the
    time watched cannot have been measured yet, so early means hold only the users who
    return fastest (in a load test, a mean of ~0.5 s after ten seconds: a 1.5 s TTL for
    everyone). Until then entries get ``default_seconds`` (a minute, as long as this watch),
    so no interval such an entry would cover goes unmeasured."""
    alpha: float = 0.3
    """Weight of a user's newest interval in their own running mean."""
    clock: Callable[[], float] = time.monotonic
    _users: OrderedDict[str, tuple[float, float | None]] = field(default_factory=OrderedDict)
    _sum_means: float = 0.0
    _n_means: int = 0
    _count: int = 0
    _since: float | None = None

    def observe(self, user_id: str) -> float | None:
        """Record a request; returns the interval since this user's previous one."""
        now = self.clock()
        if self._since is None:
            self._since = now
        last, mean = self._users.pop(user_id, (None, None))
        interval = None if last is None else now - last
        if interval is not None:
            new_mean = interval if mean is None else (1 - self.alpha) * mean + self.alpha * interval
            self._sum_means += new_mean - (mean or 0.0)
            self._n_means += mean is None
            mean = new_mean
            self._count += 1
        self._users[user_id] = (now, mean)
        if len(self._users) > self.max_users:
            _, (_, old_mean) = self._users.popitem(last=False)
            if old_mean is not None:
                self._sum_means -= old_mean
                self._n_means -= 1
        return interval

    def mean(self) -> float | None:
        if self._count < self.min_samples or self._n_means == 0:
            return None
        if self._since is None or self.clock() - self._since < self.min_watch_s:
            return None
        return self._sum_means / self._n_means


@dataclass
class AdaptiveTTL:
    """The TTL applied to new entries, from the settings in force and observed intervals."""

    settings: TTLSettings = field(default_factory=TTLSettings)
    tracker: IntervalTracker = field(default_factory=IntervalTracker)

    def observe(self, user_id: str) -> float | None:
        """Record one request of ``user_id``; returns the interval since their previous one."""
        return self.tracker.observe(user_id)

    def current(self) -> float:
        s = self.settings
        if s.fixed_seconds is not None:
            return s.fixed_seconds
        mean = self.tracker.mean()
        return s.default_seconds if mean is None else ttl_for(mean, s)

    def jittered(self, ttl_s: float) -> float:
        """``ttl_s`` moved by up to ±jitter, so entries written together expire apart."""
        jitter = self.settings.jitter
        return ttl_s * (1.0 + random.uniform(-jitter, jitter))
