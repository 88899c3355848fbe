"""The managed Redis Cluster: its objects, and the ``CacheReady`` condition.

``desired``: the StatefulSet, Services, config and bootstrap Job; the password and TLS
Secrets carry the pass's fresh values but are created only when absent (never replaced
under running pods). ``report``: the cache's health, from the StatefulSet until the cluster
has formed once, from then on from what the nodes say (and it heals a step, see
:mod:`kvrank_operator.redis_cluster`). An external Redis is passed through as valid.
"""

from __future__ import annotations

from kvrank_operator import manifests as m
from kvrank_operator.manifests.desired import Desired
from kvrank_operator.reconcilers.base import Applied, Context, HealthCheck, Pass, Report
from kvrank_operator.reconcilers.observe import Observed, ObservedRedis
from kvrank_operator.redis_cluster import Health
from kvrank_operator.spec import RankerSpec
from kvrank_operator.state import ConditionUpdate


def desired(c: Context) -> list[Desired]:
    i = c.instance
    return m.desired_redis(c.live, i.name, i.namespace, c.fresh.redis_password, c.fresh.redis_tls)


def report(p: Pass, c: Context, seen: Observed, applied: Applied) -> Report:
    created = tuple(
        ("Normal", "RedisPasswordCreated", f"generated Secret {d.obj['metadata']['name']}")
        for d in applied.created
        if d.kind == "Secret"
    )
    health = _health(c.live, seen.redis, c.redis_health)
    condition = ConditionUpdate("CacheReady", health.ok, health.reason, health.message)
    healing = tuple(("Normal", "RedisHealing", action) for action in health.actions)
    return Report(conditions=(condition,), events=created + healing)


def _health(live: RankerSpec, redis: ObservedRedis | None, check: HealthCheck | None) -> Health:
    if redis is None:
        return Health(True, "External", "external Redis (validated, passed through)")
    if not redis.formed or check is None:
        ok = bool(redis.want) and redis.ready >= redis.want and redis.formed
        return Health(
            ok,
            "Ready" if ok else "Waiting",
            f"managed Redis Cluster: {redis.ready}/{redis.want} nodes ready, "
            + ("cluster formed" if redis.formed else "bootstrap pending"),
        )
    # formed once: from now on trust what the nodes say, not the Job
    r = live.cache.redis
    nodes = redis.want or r.shards * (1 + r.replicas_per_shard)
    health = check(redis.addresses, redis.password, nodes, r.replicas_per_shard, redis.tls_ca)
    health.message = f"managed Redis Cluster: {health.message}"
    return health
