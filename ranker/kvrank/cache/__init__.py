"""The tiered K/V cache: L1 on the serving device, an optional host-memory tier, L2 in
Redis shared by every pod, and their policies.

This package's names below are its whole surface: the service and the tools import from
``kvrank.cache`` only (an import contract holds them to it). Inside, data flows one way:
``tiered`` composes a list of stores that share one interface (``store``) and a separate
cross-pod lock (``lock``): ``l1`` keeps ``UserKV`` objects on the model's device,
``host`` keeps what L1 evicts for room, ``redis_store`` keeps the bytes ``entry`` seals
(bound to their key and model, authenticated with the deployment's secret) and locks;
``compose`` builds the usual stack. Every
tier failure is a miss, never an exception that reaches a request.
"""

from kvrank.cache.adaptive_ttl import AdaptiveTTL, IntervalTracker, TTLSettings, ttl_for
from kvrank.cache.compose import l1_and_redis
from kvrank.cache.entry import EntryCodec, ModelIdentity, Reason
from kvrank.cache.host import HostStore
from kvrank.cache.keys import (
    SEQ_HASH_PATTERN,
    CacheKey,
    ChainState,
    Head,
    SequenceChain,
    extend_chain,
    sequence_chain,
    user_columns,
)
from kvrank.cache.l1 import L1Store
from kvrank.cache.lock import KeyLock, Lock, LockState
from kvrank.cache.metrics import CONSTANT_LABELS, CacheCollector
from kvrank.cache.redis_store import RedisSettings, RedisStore, purge_namespace
from kvrank.cache.store import Store
from kvrank.cache.tiered import (
    LOCK_WAIT_S,
    OFF_LOOP_BYTES,
    TAG_WAIT,
    CacheSettings,
    Created,
    Creator,
    Lookup,
    Outcome,
    Prefix,
    Tier,
    TieredCache,
)

__all__ = [
    "CONSTANT_LABELS",
    "LOCK_WAIT_S",
    "OFF_LOOP_BYTES",
    "SEQ_HASH_PATTERN",
    "TAG_WAIT",
    "AdaptiveTTL",
    "CacheCollector",
    "CacheKey",
    "CacheSettings",
    "ChainState",
    "Created",
    "Creator",
    "EntryCodec",
    "Head",
    "HostStore",
    "IntervalTracker",
    "KeyLock",
    "L1Store",
    "Lock",
    "LockState",
    "Lookup",
    "ModelIdentity",
    "Outcome",
    "Prefix",
    "Reason",
    "RedisSettings",
    "RedisStore",
    "SequenceChain",
    "Store",
    "TTLSettings",
    "Tier",
    "TieredCache",
    "extend_chain",
    "l1_and_redis",
    "purge_namespace",
    "sequence_chain",
    "ttl_for",
    "user_columns",
]
