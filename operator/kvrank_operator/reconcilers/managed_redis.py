"""The managed Redis Cluster: its objects, and the ``CacheReady`` condition.

``desired``: the StatefulSet, Services, config and bootstrap Job; the password and TLS
Secrets carry the pass's fresh values but are created only when absent (never replaced
under running pods). ``report``: the cache's health, from the StatefulSet until the cluster
has formed once, from then on from what the nodes say (and it heals a step, see
:mod:`kvrank_operator.redis_cluster`); on every node it sets the ACL user the rankers and
purge Jobs authenticate as, limited to the deployment's keys and to the commands they send
(:func:`kvrank_common.acl_rules`): a ranker cannot flush, configure or list the cache
server. An external Redis is passed through as valid.
"""

from __future__ import annotations

from kvrank_common import RANKER_REDIS_USER, acl_rules
from kvrank_operator import manifests as m
from kvrank_operator.manifests.desired import Desired
from kvrank_operator.reconcilers.base import Applied, Context, Pass, Report
from kvrank_operator.reconcilers.observe import Observed, ObservedRedis
from kvrank_operator.redis_cluster import AclUser, Health
from kvrank_operator.spec import cache_owner
from kvrank_operator.state import ConditionUpdate


def desired(c: Context) -> list[Desired]:
    i = c.instance
    f = c.fresh
    return m.desired_redis(
        c.live, i.name, i.namespace, (f.redis_password, f.ranker_password), f.redis_tls
    )


def report(p: Pass, c: Context, seen: Observed, applied: Applied) -> Report:
    created = tuple(
        ("Normal", "RedisPasswordCreated", f"generated Secret {d.obj['metadata']['name']}")
        for d in applied.created
        if d.kind == "Secret"
    )
    health = _health(c, seen.redis)
    condition = ConditionUpdate("CacheReady", health.ok, health.reason, health.message)
    healing = tuple(("Normal", "RedisHealing", action) for action in health.actions)
    return Report(conditions=(condition,), events=created + healing)


def _health(c: Context, redis: ObservedRedis | None) -> Health:
    live, check = c.live, c.redis_health
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
    users: tuple[AclUser, ...] = ()
    if redis.ranker_password is not None:
        owner = cache_owner(c.instance.name, c.instance.namespace)
        rules = tuple(acl_rules(f"{owner}.*"))
        users = (AclUser(RANKER_REDIS_USER, redis.ranker_password, rules),)
    health = check(
        redis.addresses, redis.password, nodes, r.replicas_per_shard, redis.tls_ca, users
    )
    health.message = f"managed Redis Cluster: {health.message}"
    return health
