"""Hit ratio vs cache TTL on MovieLens' real timeline, and where kvrank's TTL formula falls.

Every rating becomes that user's ranking request at its timestamp, with the clock compressed
by a stated factor (a replay of seven months in minutes). Each request writes the user's entry
with a fresh TTL (a changed history is a new key whose prefix the next request extends), so a
request finds an entry of the user's previous one exactly when the gap since it is at most the
TTL: the hit ratio of an unbounded cache is the share of gaps ≤ TTL, and the oracle (an
infinite TTL) misses only each user's first request.

The TTL kvrank would pick comes from the product's own pieces: the ranker's
:class:`~kvrank.cache.adaptive_ttl.IntervalTracker` fed the compressed timeline on a virtual
clock, and :func:`~kvrank.cache.adaptive_ttl.ttl_for` (the formula the operator applies
cluster-wide). Pure computation, no servers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvrank.cache import IntervalTracker, TTLSettings, ttl_for
from kvrank.data.movielens import MovieLens

TTLS_S = (1.0, 3.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3_600.0, 86_400.0)
"""TTLs the curve is drawn at, in seconds of the (compressed) replay clock."""


def request_gaps(ml: MovieLens) -> np.ndarray:
    """Seconds since the same user's previous rating, per rating (``inf`` for a first one)."""
    gaps = np.full(len(ml), np.inf)
    for rows in ml.by_user.values():
        gaps[rows[1:]] = ml.timestamp[rows[1:]] - ml.timestamp[rows[:-1]]
    return gaps


def hit_ratio(gaps: np.ndarray, ttl_s: float, compression: float = 1.0) -> float:
    """Share of requests that find their user's previous entry alive under ``ttl_s``."""
    return float((gaps / compression <= ttl_s).mean())


def measured_ttl(
    ml: MovieLens, compression: float, settings: TTLSettings | None = None
) -> dict[str, float]:
    """The mean interval a ranker's tracker measures over the compressed replay and the TTL
    the formula makes of it (``min`` and ``max`` of ``settings`` applied)."""
    settings = settings or TTLSettings()
    now = [0.0]
    tracker = IntervalTracker(clock=lambda: now[0])
    start = float(ml.timestamp[0])
    for user, ts in zip(ml.user.tolist(), ml.timestamp.tolist(), strict=True):
        now[0] = (ts - start) / compression
        tracker.observe(str(user))
    mean = tracker.mean()
    assert mean is not None, "a replay of 100,000 requests always measures intervals"
    return {"mean_interval_s": mean, "ttl_s": ttl_for(mean, settings)}


def ttl_curve(
    ml: MovieLens, compression: float, ttls: tuple[float, ...] = TTLS_S
) -> dict[str, Any]:
    """Hit ratio at each TTL of the compressed replay, the oracle's, and the formula's point."""
    gaps = request_gaps(ml)
    picked = measured_ttl(ml, compression)
    span = float(ml.timestamp[-1] - ml.timestamp[0])
    return {
        "compression": compression,
        "replay_s": span / compression,
        "requests": len(ml),
        "requests_per_s": len(ml) / (span / compression),
        "oracle_hit_ratio": float(np.isfinite(gaps).mean()),
        "curve": [{"ttl_s": t, "hit_ratio": hit_ratio(gaps, t, compression)} for t in ttls],
        "formula": {**picked, "hit_ratio": hit_ratio(gaps, picked["ttl_s"], compression)},
        "same_second_share": float((gaps == 0).mean()),
    }
