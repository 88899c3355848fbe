"""The operator's memory of a RankerDeployment lives in its status: what one operator wrote,
the next one (after a restart, a new leader) must read back exactly — or it would redo a
purge, restart a rollout or lose its TTL."""

from __future__ import annotations

import datetime as dt

from kvrank_operator.state import (
    CacheNamespace,
    ConditionUpdate,
    NamespaceState,
    Phase,
    Rollout,
    Serving,
    Status,
    TTLStatus,
    VersionStatus,
    with_conditions,
)

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def test_a_status_reads_back_as_it_was_written() -> None:
    conditions = with_conditions((), [ConditionUpdate("Ready", True, "AllReady", "ok")], (), 3, NOW)
    status = Status(
        conditions=conditions,
        cache_namespaces=(
            CacheNamespace("v1", "v-v1", "stable", NamespaceState.ACTIVE, "2026-12-01T11:00:00Z"),
            CacheNamespace("v0", "v-v0", "stable", NamespaceState.RETIRED, "t0", purge_after="t1"),
            CacheNamespace("vx", "v-vx", "canary", NamespaceState.PURGING, "t0", job="purge-1"),
        ),
        rollout=Rollout(
            "v2",
            Phase.PROGRESSING,
            "2026-12-01T11:30:00Z",
            step=1,
            message="canary v2 at step 1/2",
            weight=20,
            step_text="1/2",
            checks=({"metric": "errorRatio", "result": "pass"},),
            warm_hit_ratio=0.91,
            warm_requests=400,
        ),
        ttl=TTLStatus(4.5, 1.5, "2026-12-01T11:59:00Z", "pods"),
        hit_ratio=0.87,
        observed_at="2026-12-01T11:59:00Z",
        serving=Serving(
            (VersionStatus("v1", "stable", 2, 2),), 2, "a=b,c=d", "2/2", "http://f.p.svc:8080"
        ),
        observed_generation=3,
    )
    stored = status.for_storage()
    assert Status.from_storage(stored) == status
    assert stored["canary"]["stepText"] == "1/2" and stored["canary"]["phase"] == "Progressing"
    assert stored["cacheNamespaces"][1] == {
        "version": "v0",
        "namespace": "v-v0",
        "role": "stable",
        "state": "retired",
        "since": "t0",
        "purgeAfter": "t1",
    }
    assert Status.from_storage(None) == Status() and Status().for_storage() == {}


def test_a_condition_keeps_its_transition_time_until_it_flips() -> None:
    later = NOW + dt.timedelta(minutes=5)
    ready = with_conditions((), [ConditionUpdate("Ready", False, "Waiting", "a")], (), 1, NOW)
    same = with_conditions(ready, [ConditionUpdate("Ready", False, "Waiting", "b")], (), 2, later)
    assert same[0].last_transition_time == ready[0].last_transition_time
    assert (same[0].message, same[0].observed_generation) == ("b", 2)
    flipped = with_conditions(same, [ConditionUpdate("Ready", True, "AllReady", "c")], (), 2, later)
    assert flipped[0].last_transition_time != ready[0].last_transition_time
    assert with_conditions(flipped, [], ["Ready"], 2, later) == ()
