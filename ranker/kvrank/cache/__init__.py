"""The two-level K/V cache: L1 in the serving process, L2 in Redis, and their policies.

This package's names below are its whole surface: the service and the tools import from
``kvrank.cache`` only (an import contract holds them to it). Inside, data flows one way:
``tiered`` composes stores that share one interface (``store``): ``l1`` keeps ``UserKV``
objects on the model's device, ``redis_store`` keeps the bytes made by ``entry``. Every
tier failure is a miss, never an exception that reaches a request.
"""

from kvrank.cache.entry import decode_entry, encode_entry
from kvrank.cache.keys import CacheKey, Head, sequence_chain
from kvrank.cache.l1 import L1Store
from kvrank.cache.metrics import CONSTANT_LABELS, CacheCollector
from kvrank.cache.redis_store import RedisSettings, RedisStore, purge_namespace
from kvrank.cache.store import Store
from kvrank.cache.tiered import (
    LOCK_WAIT_S,
    CacheSettings,
    Created,
    Lookup,
    Outcome,
    Prefix,
    TieredCache,
)
from kvrank.cache.ttl import AdaptiveTTL, TTLSettings

__all__ = [
    "CONSTANT_LABELS",
    "LOCK_WAIT_S",
    "AdaptiveTTL",
    "CacheCollector",
    "CacheKey",
    "CacheSettings",
    "Created",
    "Head",
    "L1Store",
    "Lookup",
    "Outcome",
    "Prefix",
    "RedisSettings",
    "RedisStore",
    "Store",
    "TTLSettings",
    "TieredCache",
    "decode_entry",
    "encode_entry",
    "purge_namespace",
    "sequence_chain",
]
