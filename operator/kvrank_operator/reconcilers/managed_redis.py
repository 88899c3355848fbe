"""The managed Redis Cluster: its objects, and the ``CacheReady`` condition.

``apply`` sends the StatefulSet, Services, config and bootstrap Job; the password and TLS
Secrets are generated here but created only when absent (never replaced under running
pods). ``reconcile`` reports the cache's health: from the StatefulSet until the cluster has
formed once, from then on from what the nodes say (and it heals a step, see
:mod:`kvrank_operator.redis_cluster`). An external Redis is passed through as valid.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

from kvrank_operator import manifests as m
from kvrank_operator.certs import redis_tls
from kvrank_operator.reconcilers.base import Event, Pass, Report, send
from kvrank_operator.reconcilers.observe import ObservedRedis
from kvrank_operator.redis_cluster import Health
from kvrank_operator.state import ConditionUpdate

HealthCheck = Callable[[list[str], str | None, int, int, str | None], Health]
"""``(ip:port of each pod, password, expected nodes, replicas per shard, TLS CA or None) →
Health`` (and heal a step)."""


def apply(p: Pass) -> Report:
    name, ns = p.instance.name, p.instance.namespace
    password = secrets.token_urlsafe(24)  # used only if its Secret does not exist yet
    created = send(p, m.desired_redis(p.spec, name, ns, password, _new_tls(p)))
    events: tuple[Event, ...] = tuple(
        ("Normal", "RedisPasswordCreated", f"generated Secret {d.obj['metadata']['name']}")
        for d in created
        if d.kind == "Secret"
    )
    return Report(events=events)


def _new_tls(p: Pass) -> dict[str, str] | None:
    """Fresh certificates for a managed Redis's TLS Secret, used only if it does not exist
    yet (like the password; generating them takes half a millisecond)."""
    r = p.spec.cache.redis
    if r.mode != "managed" or not r.tls or r.tls_secret:
        return None
    name, ns = p.instance.name, p.instance.namespace
    return redis_tls(m.redis_name(name), m.tls_dns_names(name, ns), p.now)


def reconcile(p: Pass, redis: ObservedRedis | None, check: HealthCheck | None) -> Report:
    health = _health(p, redis, check)
    condition = ConditionUpdate("CacheReady", health.ok, health.reason, health.message)
    events = tuple(("Normal", "RedisHealing", action) for action in health.actions)
    return Report(conditions=(condition,), events=events)


def _health(p: Pass, redis: ObservedRedis | None, check: HealthCheck | None) -> Health:
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
    r = p.spec.cache.redis
    nodes = redis.want or r.shards * (1 + r.replicas_per_shard)
    health = check(redis.addresses, redis.password, nodes, r.replicas_per_shard, redis.tls_ca)
    health.message = f"managed Redis Cluster: {health.message}"
    return health
