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
MAX_TIMEOUT_MS = 60_000
"""The longest deadline a caller may state (``x-kvrank-timeout-ms``, a gRPC deadline): the
ranker refuses a longer one, and the bundled router waits this long for an answer, so that
it never cuts a deadline the ranker honours."""
PROBE_TIMEOUT_S = 5
"""How long every probe of a kvrank pod, and the operator's, waits for its answer (the
operator renders it into each probe it makes; the chart's are the same). A busy or
CPU-throttled process answers a probe late, not never: the kubelet's default second made a
node under load fail the probes of healthy rankers and operators at one moment (liveness
restarted them, emptying their L1; readiness pulled them from routing). A hung process is
still found, after ``failureThreshold`` × ``periodSeconds`` as before."""

# ------------------------------------------------------- metrics the operator reads
INTERVAL_METRIC = "kvrank_user_interval_mean_seconds"
"""Gauge: a ranker's mean per-user request interval (0: not measured yet)."""
HIT_RATIO_METRIC = "kvrank_cache_hit_ratio"
REQUESTS_METRIC = "kvrank_requests_total"
"""Counter of scoring requests, labelled by ``outcome``."""
CACHED_OUTCOMES = ("l1", "host", "l2", "incremental")
"""The ``outcome`` labels of a request served from a cache (the hit ratio's numerator)."""

# ------------------------------------------------------- Redis keys and their ACL user
KEY_PREFIX = "kvrank"
"""An entry's key: ``kvrank:<cache namespace>:<version>:<user>:<sequence hash>``."""
HEAD_PREFIX = f"{KEY_PREFIX}-head"
"""A user's latest state: ``kvrank-head:<cache namespace>:<version>:<user>``."""
LOCK_PREFIX = f"{KEY_PREFIX}-lock"
"""A cross-pod lock on making one entry: ``kvrank-lock:`` and the entry key's fields."""
KEY_PREFIXES = (KEY_PREFIX, HEAD_PREFIX, LOCK_PREFIX)
"""Every kind of key a ranker writes."""


def namespace_patterns(namespace: str) -> list[str]:
    """Glob patterns (SCAN's, and an ACL's key patterns) matching every key of cache
    namespace ``namespace`` (itself a pattern where it holds ``*``)."""
    return [f"{prefix}:{namespace}:*" for prefix in KEY_PREFIXES]


RANKER_COMMANDS = (
    # entries, heads and locks; a lock is released by a script; a user's entries are found
    # by SCAN (keyless: every name is listed, only the namespace's can then be touched)
    "+get", "+set", "+unlink", "+eval", "+evalsha", "+scan",
    # connecting and health: the handshake, the readiness PING, a cluster client's topology
    # and command table (redis-py's CLIENT SETINFO, Redis >= 7.2, is left refused: it
    # ignores the refusal, and naming it fails on 7.0)
    "+auth", "+hello", "+client|setname", "+ping",
    "+cluster|slots", "+cluster|shards", "+command",
)  # fmt: skip
"""What a ranker and a purge Job send to Redis, and nothing else."""

RANKER_REDIS_USER = "ranker"
"""The ACL user a managed Redis's rankers and purge Jobs authenticate as (the operator keeps
the ``default`` user, whose password forms and heals the cluster)."""


def acl_rules(namespace: str) -> list[str]:
    """The ``ACL SETUSER`` rules that let a ranker (and the purge Job) use the keys of cache
    namespace ``namespace`` (``<owner>.*``: every version of one deployment) and nothing
    else: a deployment sharing a Redis with others can neither read nor overwrite their
    entries, nor flush, configure or list anything."""
    keys = [f"~{pattern}" for pattern in namespace_patterns(namespace)]
    return ["resetkeys", *keys, "resetchannels", "-@all", *RANKER_COMMANDS]
