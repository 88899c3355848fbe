"""The managed Redis concern's report: ``CacheReady`` from the StatefulSet until the cluster
formed, then from what the nodes say; an external Redis passed through; generated Secrets
announced."""

from __future__ import annotations

from collections.abc import Sequence

from passes import STABLE, observed, pass_of

from kvrank_operator.reconcilers import managed_redis
from kvrank_operator.reconcilers.base import Applied
from kvrank_operator.reconcilers.observe import ObservedRedis
from kvrank_operator.redis_cluster import AclUser, Health
from kvrank_operator.spec import cache_owner

EXTERNAL = {**STABLE, "cache": {"redis": {"mode": "external", "url": "redis://cache:6379"}}}


def _cache_ready(report_conditions: tuple) -> tuple[bool, str, str]:  # type: ignore[type-arg]
    (u,) = report_conditions
    assert u.type == "CacheReady"
    return u.ok, u.reason, u.message


def test_an_external_redis_wants_nothing_and_is_passed_through() -> None:
    p, c = pass_of(EXTERNAL)
    assert managed_redis.desired(c) == []
    report = managed_redis.report(p, c, observed(), Applied())
    assert _cache_ready(report.conditions)[:2] == (True, "External")


def test_until_the_cluster_formed_the_statefulset_says() -> None:
    p, c = pass_of(STABLE)
    assert {d.kind for d in managed_redis.desired(c)} >= {"StatefulSet", "Secret", "Job"}
    booting = ObservedRedis(want=6, ready=6, formed=False, addresses=[], password=None)
    ok, reason, message = _cache_ready(
        managed_redis.report(p, c, observed(redis=booting), Applied()).conditions
    )
    assert (ok, reason) == (False, "Waiting") and "6/6 nodes ready, bootstrap pending" in message


def test_once_formed_the_nodes_are_asked_and_what_they_heal_is_an_event() -> None:
    asked: list[tuple[list[str], int]] = []

    def check(
        addresses: list[str],
        password: str | None,
        nodes: int,
        replicas: int,
        ca: str | None,
        users: Sequence[AclUser],
    ) -> Health:
        asked.append((addresses, nodes))
        # the rankers' user, on every node: the deployment's keys, the rankers' commands
        assert [(u.name, u.password) for u in users] == [("ranker", "rpw")]
        assert f"~kvrank:{cache_owner(p.instance.name, p.instance.namespace)}.*:*" in users[0].rules
        assert "-@all" in users[0].rules and "+flushall" not in users[0].rules
        return Health(False, "Degraded", "1 shard without a replica", ["added replica to shard 2"])

    p, c = pass_of(STABLE, redis_health=check)
    formed = ObservedRedis(
        want=6,
        ready=6,
        formed=True,
        addresses=["10.0.0.1:6379"],
        password="pw",
        ranker_password="rpw",
    )
    report = managed_redis.report(p, c, observed(redis=formed), Applied())
    assert asked == [(["10.0.0.1:6379"], 6)]
    assert _cache_ready(report.conditions) == (
        False,
        "Degraded",
        "managed Redis Cluster: 1 shard without a replica",
    )
    assert report.events == (("Normal", "RedisHealing", "added replica to shard 2"),)
