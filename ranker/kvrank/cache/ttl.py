"""TTL policy: ``ttl = clamp(mean per-user request interval × factor, min, max)``.

The server measures intervals itself (time between two requests of the same user), keeps
a bounded table of last-seen times, and feeds a Prometheus histogram so the operator can
tune the TTL cluster-wide. A fixed TTL (from config, e.g. written by the operator) takes
precedence over the measured one.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TTLSettings:
    factor: float = 3.0
    """A user returning within ~3 mean intervals still finds their entry."""
    min_s: float = 1.0
    max_s: float = 300.0
    """Five minutes: beyond that, incremental updates keep entries fresher than a TTL."""
    jitter: float = 0.1
    """±10 % so entries written together do not expire together."""
    fixed_s: float | None = None
    """Set (by config or the operator) to override the measured TTL."""
    default_s: float = 60.0
    """Used until enough intervals are observed."""


def clamp_ttl(mean_interval_s: float, s: TTLSettings) -> float:
    return min(max(mean_interval_s * s.factor, s.min_s), s.max_s)


@dataclass
class IntervalTracker:
    """Per-user request intervals with bounded memory (oldest users forgotten first)."""

    max_users: int = 100_000
    min_samples: int = 20
    decay: float = 0.999
    """Per-sample decay of the running mean: it follows traffic over ~1000 intervals."""
    clock: Callable[[], float] = time.monotonic
    _last: OrderedDict[str, float] = field(default_factory=OrderedDict)
    _sum: float = 0.0
    _weight: float = 0.0
    _count: int = 0

    def observe(self, user_id: str) -> float | None:
        """Record a request; returns the interval since this user's previous one."""
        now = self.clock()
        prev = self._last.pop(user_id, None)
        self._last[user_id] = now
        if len(self._last) > self.max_users:
            self._last.popitem(last=False)
        if prev is None:
            return None
        interval = now - prev
        self._sum = self._sum * self.decay + interval
        self._weight = self._weight * self.decay + 1.0
        self._count += 1
        return interval

    def mean(self) -> float | None:
        return self._sum / self._weight if self._count >= self.min_samples else None


def current_ttl(tracker: IntervalTracker, s: TTLSettings) -> float:
    if s.fixed_s is not None:
        return s.fixed_s
    mean = tracker.mean()
    return s.default_s if mean is None else clamp_ttl(mean, s)
