"""Resilience: the standby operator takes over a half-done rollout when the leader is
killed, with never two reconcilers; a Redis node deleted under load costs misses, never a
failed request, and the operator heals the cluster."""

from __future__ import annotations

import datetime as dt
import itertools
import threading
import time
from typing import Any

import pytest
from rankers import Ranker, Rankers, body
from release import OperatorRelease
from stack import NS, Stack, metric_values

pytestmark = [pytest.mark.kube, pytest.mark.slow, pytest.mark.e2e]


def test_the_standby_operator_takes_over_when_the_leader_is_killed_mid_rollout(
    stack: Stack, rankers: Rankers, operator: OperatorRelease
) -> None:
    def both_running() -> set[str] | None:
        pods = operator.pods()
        names = {p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")}
        return names if len(names) == 2 else None

    ranker = rankers.new("failover")
    stable = ranker.spec(redis=False, replicas=3)
    ranker.apply(stable)
    ranker.wait_ready(timeout=300)
    pods = stack.wait_for(both_running, "two operator pods", 120)
    leader = stack.wait_for(operator.leader, "an operator holds the Lease", 60)
    (standby,) = pods - {leader}
    started = dt.datetime.now(dt.UTC)
    ranker.apply(ranker.with_canary(stable, "v3", weight=40))
    # the leader itself began the rollout (its own apply of v3's Deployment): only then is
    # it killed mid-rollout
    v3 = f" deployments {NS}/{ranker.version_name('v3')}"
    stack.wait_for(
        lambda: any(
            pod == leader and what.endswith(v3) for _, pod, what in operator.writes(started)
        ),
        "the leader created v3's Deployment",
        60,
    )
    killed = dt.datetime.now(dt.UTC)
    operator.kill_pod(leader)  # v3's pods are still starting: the rollout is half done
    # the standby, or the leader's replacement when it observed the Lease expire first (a
    # force-deleted container may renew a little longer: both then wait out the duration)
    successor = stack.wait_for(
        lambda: (holder := operator.leader()) not in (None, leader) and holder,
        "another replica leads",
        60,
    )
    stack.wait_for(
        lambda: (
            {k for k, v in ranker.namespaces().items() if v == "active"}
            == {ranker.cache_namespace("v1"), ranker.cache_namespace("v3")}
        ),
        "both namespaces active after the operator restart",
        240,
    )
    ranker.wait_ready("after the restart")
    assert ranker.must_deployment("v1")["spec"]["replicas"] == 2
    assert ranker.must_deployment("v3")["spec"]["replicas"] == 1
    assert ranker.score("after-operator-restart", version="v3")["model_version"] == "v3"
    # never two reconcilers: every write of the killed leader came before its successor's
    # first, and the replica that did not lead wrote nothing
    writes = [w for w in operator.writes(started) if " leases " not in w[2]]
    writers = [pod for pod, _ in itertools.groupby(w[1] for w in writes)]
    assert writers == [leader, successor], [f"{w[0]:%T.%f} {w[1]} {w[2]}" for w in writes]
    first = next(w[0] for w in writes if w[1] == successor)
    which = "standby" if successor == standby else "replacement"
    print(f"the {which}'s first write {(first - killed).total_seconds():.1f} s after the kill")


def test_a_redis_node_deleted_under_load_costs_no_request_and_the_cluster_heals(
    stack: Stack, rankers: Rankers
) -> None:
    ranker = rankers.create("redis-heal")
    ranker.wait_condition("CacheReady", timeout=180)
    results: list[tuple[int, str]] = []
    stop = threading.Event()

    def load() -> None:
        i = 0
        while not stop.is_set():
            resp = stack.score(ranker.name, body(f"load-{i % 40}", i), timeout=30)
            cache = resp.json().get("cache", "") if resp.status_code == 200 else resp.text[:200]
            results.append((resp.status_code, cache))
            i += 1

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        time.sleep(3)
        killed = ranker.kill_redis_node()  # a master, its emptyDir and its slots gone
        killed_at = len(results)
        # the operator trusts what the nodes say, not the bootstrap Job that once succeeded
        down: dict[str, Any] = ranker.wait_condition("CacheReady", "False", 60)
        assert down["reason"] in (
            "NodesMissing",
            "NodesUnreachable",
            "SlotsUncovered",
            "NodesFailed",
            "NodesNotJoined",
            "StateNotOk",
        ), (killed, down)
        # the re-created pod rejoined and took its slots back
        healed = ranker.wait_condition("CacheReady", "True", 240)
        assert "16384" in healed["message"], healed
    finally:
        stop.set()
        worker.join(timeout=60)
    after_kill = results[killed_at:]
    assert len(after_kill) >= 5, f"too little traffic after the kill: {len(after_kill)}"
    errors = metric_values(ranker.metrics(), "kvrank_redis_errors_total")
    assert sum(errors) > 0, "the rankers never noticed the dead Redis node"
    failed = [r for r in results if r[0] != 200]
    assert not failed, f"{len(failed)}/{len(results)} requests failed: {failed[:5]}"
    _assert_the_cluster_healed(stack, ranker)


def _assert_the_cluster_healed(stack: Stack, ranker: Ranker) -> None:
    """Every node agrees (all slots served, no forgotten id left behind), the operator said
    it healed uncovered slots, and the cluster is an L2 again."""
    pods = ranker.redis_pods()
    assert len(pods) == 3
    for pod in pods:
        info = ranker.redis_cli(pod, "cluster", "info")
        assert "cluster_state:ok" in info and "cluster_slots_assigned:16384" in info, info
        assert "cluster_known_nodes:3" in info, info
    assert any("uncovered slots" in m for m in ranker.events("RedisHealing")), ranker.events(
        "RedisHealing"
    )
    # and the healed cluster is an L2 again: one pod stores, another one reads it (a new
    # user each second try: once every pod holds a user in L1, it never comes from L2)
    tries = itertools.count()
    stack.wait_for(
        lambda: ranker.score(f"after-heal-{next(tries) // 2}", version="v1")["cache"] == "l2",
        "an L2 hit on the healed cluster",
        60,
    )
