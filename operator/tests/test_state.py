"""The operator's memory of a RankerDeployment lives in its status: what one operator wrote,
the next one (after a restart, a new leader) must read back exactly — or it would redo a
purge, restart a rollout or lose its TTL."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from kvrank_operator import crd
from kvrank_operator.analysis import Result
from kvrank_operator.spec import Check
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


def _undeclared(doc: Any, schema: dict[str, Any], path: str = "status") -> list[str]:
    """Where ``doc`` holds what the CRD's structural schema would prune or refuse: a key it
    does not declare, a value outside its enum, a null where it is not nullable, a wrong
    type. The API server drops undeclared status fields silently: an operator that wrote
    one would not find it after a restart."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if doc is None:
        return [] if schema.get("nullable") else [f"{path}: null"]
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool}
    numbers = {"integer": (int,), "number": (int, float)}
    want = schema.get("type")
    if want in kinds and not isinstance(doc, kinds[want]):
        return [f"{path}: not {want}"]
    if want in numbers and (isinstance(doc, bool) or not isinstance(doc, numbers[want])):
        return [f"{path}: not {want}"]
    if "enum" in schema and doc not in schema["enum"]:
        return [f"{path}: {doc!r} not in {schema['enum']}"]
    if want == "array":
        items = schema["items"]
        return [p for i, x in enumerate(doc) for p in _undeclared(x, items, f"{path}[{i}]")]
    if want != "object":
        return []
    props = schema.get("properties", {})
    missing = [f"{path}.{k}: required" for k in schema.get("required", []) if k not in doc]
    return missing + [
        p
        for key, value in doc.items()
        for p in (
            _undeclared(value, props[key], f"{path}.{key}")
            if key in props
            else [f"{path}.{key}: undeclared"]
        )
    ]


def test_everything_the_operator_writes_survives_the_crds_status_schema() -> None:
    checks = {
        "errorRatio": Check("max", 0.01, 50),
        "hitRatio": Check("min", 0.5, 50),
        "scoreDelta": Check("max", 0.1, 50, quantile=0.99),
    }
    results = (
        Result("errorRatio", checks["errorRatio"], 0.0, 400).status(),
        Result("hitRatio", checks["hitRatio"], None, 0).status(),
        Result("scoreDelta", checks["scoreDelta"], 0.02, 10).status(),
    )
    conditions = with_conditions(
        (),
        [ConditionUpdate("Ready", True, "AllReady", "ok"), ConditionUpdate("X", False, "Y", "z")],
        (),
        3,
        NOW,
    )
    statuses = [
        Status(
            conditions=conditions,
            cache_namespaces=tuple(
                CacheNamespace("v1", "rkd-v1", role, state, "2026-12-01T11:00:00Z", "t1", "job")
                for role in ("stable", "canary")
                for state in NamespaceState
            ),
            rollout=dataclasses.replace(
                Rollout("v2", phase, "2026-12-01T11:30:00Z"),
                step=1,
                message="m",
                weight=20,
                step_text="1/2",
                checks=results,
                warm_hit_ratio=0.5,
                warm_requests=10,
                reason="errorRatio failed",
                ended=True,
            ),
            ttl=TTLStatus(4.5, mean, "2026-12-01T11:59:00Z", source),
            hit_ratio=0.87,
            observed_at="2026-12-01T11:59:00Z",
            serving=Serving(
                (VersionStatus("v1", "stable", 2, 2), VersionStatus("v2", "canary", 1, 0)),
                3,
                "a=b",
                "3/3",
                "http://f.p.svc:8080",
            ),
            observed_generation=3,
        )
        for phase, (mean, source) in zip(
            Phase, [(1.5, "pods"), (None, "fixed"), (2.0, "prometheus")] * 2, strict=True
        )
    ]
    schema = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    for status in statuses:
        stored = status.for_storage()
        assert _undeclared(stored, schema) == []
        assert Status.from_storage(stored) == status
    assert [p.value for p in Phase] == crd.PHASES
    assert [s.value for s in NamespaceState] == crd.NAMESPACE_STATES
    wrong = {"bogus": 2, "canary": {"version": "v2", "phase": "Done"}, "hitRatio": None}
    wrong["url"] = None
    assert _undeclared(wrong, schema) == [
        "status.bogus: undeclared",
        f"status.canary.phase: 'Done' not in {crd.PHASES}",
        "status.url: null",
    ]
