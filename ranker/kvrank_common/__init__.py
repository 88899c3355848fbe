"""The rules the rankers and the operator both go by, written once, imported by both.

The operator writes the rankers' config and reads their metrics; these are the names and
the formula both sides must agree on. Standard library only: the operator's image has no
torch, and neither plane's code is imported by the other (an import contract holds this).
"""

from __future__ import annotations

from typing import Literal, get_args

# ------------------------------------------------------------------------- cache TTL
TTL_FACTOR = 3.0
"""A user returning within ~3 mean intervals still finds their entry."""
TTL_MIN_S = 1.0
TTL_MAX_S = 300.0
"""Five minutes: beyond that, incremental updates keep entries fresher."""
TTL_JITTER = 0.1
"""±10 % so entries written together do not expire together."""


def clamp_ttl(mean_interval_s: float, factor: float, min_s: float, max_s: float) -> float:
    """The TTL policy: the mean per-user request interval × ``factor``, within
    ``[min_s, max_s]`` — what a ranker applies to its own measurement and what the operator
    writes into every pod's config from all of theirs."""
    return min(max(mean_interval_s * factor, min_s), max_s)


# ------------------------------------------------------------------------- admission
AdmissionMode = Literal["shed", "drop", "off"]
ADMISSION_MODES: tuple[str, ...] = get_args(AdmissionMode)
SHED_HEADER = "x-kvrank-shed"
"""On a 503 that refused a request before any model work (its value: why); the bundled
router retries such an answer on another pod, and the queue proxy sends it too."""

# ------------------------------------------------------- metrics the operator reads
INTERVAL_METRIC = "kvrank_user_interval_mean_seconds"
"""Gauge: a ranker's mean per-user request interval (0: not measured yet)."""
HIT_RATIO_METRIC = "kvrank_cache_hit_ratio"
REQUESTS_METRIC = "kvrank_requests_total"
"""Counter of scoring requests, labelled by ``outcome``."""
CACHED_OUTCOMES = ("l1", "host", "l2", "incremental")
"""The ``outcome`` labels of a request served from a cache (the hit ratio's numerator)."""
