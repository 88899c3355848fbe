"""A canary by weight: its share of the replicas and a cache namespace of its own;
promoting it (``kubectl rkd promote``) retires and purges the old namespace with no window in
which nothing answers; aborting it (``kubectl rkd abort``) purges its namespace only.
``kubectl rkd status`` shows the versions, the rollout and the namespaces along the way."""

from __future__ import annotations

import time
from typing import Any

import pytest
from rankers import PURGE_S, Ranker, Rankers, body
from stack import Stack

pytestmark = [pytest.mark.kube, pytest.mark.slow, pytest.mark.e2e]


def canary_spec(
    ranker: Ranker, stable: str, canary: str | None, weight: int = 20, replicas: int = 2
) -> dict[str, Any]:
    doc = ranker.serving(ranker.spec(replicas=replicas), stable)
    doc["spec"]["cache"]["retiredNamespaceGraceSeconds"] = 3
    # entries outlive the scenario: one that is gone was purged, not expired
    doc["spec"]["ttl"] = {"mode": "fixed", "fixedSeconds": 300}
    return ranker.with_canary(doc, canary, weight)


def with_canary(rankers: Rankers, prefix: str, stable: str, canary: str) -> Ranker:
    """A ranker serving ``stable`` with ``canary`` at half the replicas, both namespaces
    holding entries in Redis."""
    ranker = rankers.new(prefix)
    ranker.apply(canary_spec(ranker, stable, canary, weight=50))
    ranker.wait_ready("with its canary", 300)
    for version in (stable, canary):
        ranker.warm(version, prefix)
    return ranker


def test_a_canary_gets_its_share_of_replicas_and_a_cache_namespace_of_its_own(
    rankers: Rankers,
) -> None:
    ranker = rankers.new("canary")
    ranker.apply(canary_spec(ranker, "v1", "v2", weight=20, replicas=5))
    ranker.stack.wait_for(
        lambda: (
            ranker.namespaces()
            == {ranker.cache_namespace("v1"): "active", ranker.cache_namespace("v2"): "active"}
        ),
        "two active cache namespaces",
    )
    ranker.wait_ready("with the canary", 300)
    assert ranker.must_deployment("v1")["spec"]["replicas"] == 4
    assert ranker.must_deployment("v2")["spec"]["replicas"] == 1
    canary = ranker.condition("CanaryReady")
    assert canary is not None and canary["status"] == "True", canary
    for version in ("v1", "v2"):
        assert ranker.score(f"canary-user-{version}", version=version)["model_version"] == version
        ranker.warm(version, "canary")  # each version writes its own namespace
    # kube-proxy picks at random: 40 requests miss the 1-in-5 canary with p = 0.8^40 ≈ 1e-4
    versions = {ranker.score(f"mixed-{i}", i)["model_version"] for i in range(40)}
    assert versions == {"v1", "v2"}, "the shared Service must reach both versions"


def test_promoting_retires_and_purges_the_old_namespace(stack: Stack, rankers: Rankers) -> None:
    ranker = with_canary(rankers, "promote", "v1", "v2")
    shown = ranker.rkd("status").stdout
    rows = [line.split() for line in shown.splitlines()]
    assert ["Version", "v1", "stable", "1/1", "ready"] in rows, shown
    assert ["Version", "v2", "canary", "1/1", "ready", "50%"] in rows, shown
    assert any(r[:3] == ["Rollout", "v2", "Manual"] and "50%" in r for r in rows), shown
    for version, role in (("v1", "stable"), ("v2", "canary")):
        assert ["Cache", ranker.cache_namespace(version), version, role, "active"] in rows, shown
    said = ranker.rkd("promote").stdout
    assert "promoted canary v2 (was v1)" in said, said
    model, canary = ranker.must_get()["spec"]["model"], ranker.must_get()["spec"].get("canary")
    assert (model["version"], model["uri"], canary) == ("v2", ranker.stack.model_uri("v2"), None)
    failures: list[str] = []
    deadline = time.monotonic() + PURGE_S  # v1's pods gone, its grace, the purge Job
    i = 0
    while time.monotonic() < deadline:  # no window in which no version answers
        resp = stack.score(ranker.name, body(f"promo-{i % 5}", i))
        if resp.status_code != 200:
            failures.append(f"{resp.status_code} {resp.text[:200]}")
        i += 1
        if ranker.namespaces().get(ranker.cache_namespace("v1")) == "purged":
            break
    assert ranker.namespaces().get(ranker.cache_namespace("v1")) == "purged", stack.report()
    assert not failures, failures[:5]
    assert ranker.redis_keys(ranker.cache_namespace("v1")) == 0, (
        "v1's entries must be gone from Redis"
    )
    selector = (
        f"kvrank.io/cache-namespace={ranker.cache_namespace('v1')},"
        f"app.kubernetes.io/instance={ranker.name}"
    )
    (job,) = stack.select("jobs", selector)
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:4] == ["cache", "purge", "--namespace", ranker.cache_namespace("v1")], args
    assert ranker.redis_keys(ranker.cache_namespace("v2")) > 0
    ranker.wait_gone("v1")
    stack.wait_for(lambda: ranker.ready_replicas("v2") == 2, "v2 at all replicas", 240)
    assert ranker.score("after-promote")["model_version"] == "v2"


def test_aborting_purges_the_canary_namespace_only(stack: Stack, rankers: Rankers) -> None:
    ranker = with_canary(rankers, "abort", "v2", "v3")
    stable = ranker.must_deployment("v2")
    assert "aborted canary v3" in ranker.rkd("abort").stdout
    assert ranker.must_get()["spec"]["model"]["version"] == "v2"
    ranker.wait_purged("v3")
    assert ranker.redis_keys(ranker.cache_namespace("v3")) == 0
    # the stable namespace is never purged (its entries only expire by their TTL)
    selector = (
        f"kvrank.io/cache-namespace={ranker.cache_namespace('v2')},"
        f"app.kubernetes.io/instance={ranker.name}"
    )
    assert not stack.select("jobs", selector)
    assert ranker.must_deployment("v2")["metadata"]["uid"] == stable["metadata"]["uid"]
    assert ranker.namespaces().get(ranker.cache_namespace("v2")) == "active"
    ranker.wait_gone("v3")
    again = ranker.rkd("abort", check=False)
    assert again.returncode == 1 and f"{ranker.name} has no canary to abort" in again.stderr
