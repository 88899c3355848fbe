"""The usual composition of the cache: L1 on the model's device, optionally a host-memory
tier fed by L1's evictions, Redis shared by every pod.

Redis is both the shared tier and the cross-pod lock. Other compositions (another shared
backend) build their :class:`~kvrank.cache.Tier` list themselves; the tiered cache knows no
concrete store.
"""

from __future__ import annotations

from collections.abc import Callable

from kvrank.cache.adaptive_ttl import AdaptiveTTL
from kvrank.cache.host import HostStore
from kvrank.cache.l1 import L1Store
from kvrank.cache.redis_store import RedisStore
from kvrank.cache.tiered import CacheSettings, Outcome, Tier, TieredCache
from kvrank.model.kv import UserKV


def l1_and_redis(
    settings: CacheSettings,
    l1: L1Store,
    l2: RedisStore | None,
    ttl: AdaptiveTTL | None = None,
    host: HostStore | None = None,
    check: Callable[[UserKV], None] | None = None,
) -> TieredCache:
    """``check``: the model's check of a state it is handed, run on every entry read from
    Redis before a tier admits it (see :attr:`TieredCache.check`)."""
    tiers = [Tier(Outcome.L1, l1)]
    if host is not None:  # what L1 evicts for room goes there instead of away
        l1.demote = host.admit
        tiers.append(Tier(Outcome.HOST, host, demoted=True))
    if l2 is not None:
        tiers.append(Tier(Outcome.L2, l2, shared=True))
    return TieredCache(settings, tiers, l2, ttl or AdaptiveTTL(), check=check)
