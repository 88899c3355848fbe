"""Cache namespaces: one per model version *of one RankerDeployment*, so that deployments
sharing a Redis never read, overwrite or purge each other's keys, and a purge never touches
a namespace a live version uses."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kvrank_operator import manifests as m
from kvrank_operator.kube import Kube, Owner, load_client
from kvrank_operator.reconcilers import cache_namespaces
from kvrank_operator.reconcilers.base import Applied, Context, Fresh, Pass
from kvrank_operator.reconcilers.observe import Observed, cache_namespace
from kvrank_operator.spec import (
    CACHE_NAMESPACE_MAX,
    VERSION_MAX,
    cache_owner,
    namespace_for,
    parse_spec,
)
from kvrank_operator.state import CacheNamespace, Instance, NamespaceState, Status

NOW = dt.datetime(2026, 12, 5, 10, 0, tzinfo=dt.UTC)
ACTIVE, RETIRED = NamespaceState.ACTIVE, NamespaceState.RETIRED
PURGING, PURGED = NamespaceState.PURGING, NamespaceState.PURGED


def test_deployments_and_versions_that_look_alike_get_namespaces_of_their_own() -> None:
    pairs = [
        # one name in two Kubernetes namespaces; names whose slugs agree; long names whose
        # first characters agree; versions that differ in '.' against '-'
        (("feed", "prod", "v1"), ("feed", "staging", "v1")),
        (("a.b", "prod", "v1"), ("a-b", "prod", "v1")),
        (("recommendations-home", "p", "v1"), ("recommendations-feed", "p", "v1")),
        (("feed", "prod", "1.0"), ("feed", "prod", "1-0")),
    ]
    for one, other in pairs:
        assert namespace_for(*one) != namespace_for(*other), (one, other)
    longest = "v" + "1." * 20 + "0"
    assert len(longest) == VERSION_MAX
    for name in ("feed", "x" * 253, "a." * 100 + "b"):
        ns = namespace_for(name, "prod", longest)
        # a label value (the purge Job carries it) and a key part the rankers accept
        assert len(ns) <= CACHE_NAMESPACE_MAX, ns
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", ns), ns
        # the version verbatim after the deployment's part, which has no dot: an ACL
        # pattern on "<owner>.*" covers every version of this deployment and no other's
        owner = cache_owner(name, "prod")
        assert ns == f"{owner}.{longest}" and "." not in owner


def test_two_deployments_at_one_version_use_two_namespaces() -> None:
    """Two deployments on one Redis at one version: neither reads, overwrites nor purges
    the other's entries."""
    spec = parse_spec({"model": {"version": "v1", "uri": "/m"}})
    home, feed = Instance("home", "prod", "u1", 1), Instance("feed", "prod", "u2", 1)
    home_ns = _pass(home, spec, Status()).cache_namespaces[0].namespace
    feed_ns = _pass(feed, spec, Status()).cache_namespaces[0].namespace
    assert home_ns != feed_ns


def test_namespaces_named_by_an_older_operator_retire_once_no_pod_writes_into_them() -> None:
    """Upgraded from an operator that named a version's namespace ``v-<version>``: the
    version's pods roll to the new name, and the old one is retired and purged after the
    grace period counted from the last pod still writing into it."""
    spec = parse_spec(
        {
            "model": {"version": "v1", "uri": "/m"},
            "cache": {"retiredNamespaceGraceSeconds": 600},
        }
    )
    feed = Instance("feed", "prod", "u1", 1)
    old = CacheNamespace("v1", "v-v1", "stable", ACTIVE, "2026-12-01T00:00:00Z")
    status = _pass(feed, spec, Status(cache_namespaces=(old,)), writing={"v-v1"})
    by_ns = {e.namespace: e for e in status.cache_namespaces}
    new = namespace_for("feed", "prod", "v1")
    assert by_ns[new].state is ACTIVE and by_ns[new].role == "stable"
    assert by_ns["v-v1"].state is RETIRED
    ten_minutes_on = NOW + dt.timedelta(minutes=10)
    assert by_ns["v-v1"].purge_due_in(NOW) == pytest.approx(600)
    # an old pod still writes into it: the grace period starts again
    later = _pass(feed, spec, status, writing={"v-v1", new}, now=ten_minutes_on)
    old_now = next(e for e in later.cache_namespaces if e.namespace == "v-v1")
    assert old_now.state is RETIRED
    assert old_now.purge_due_in(ten_minutes_on) == pytest.approx(600)


def test_a_pod_is_seen_writing_into_the_namespace_its_spec_names() -> None:
    spec = parse_spec({"model": {"version": "v1", "uri": "/m"}})
    template = m.deployment(spec, "feed", "prod", "v1", "/m", 1, "stable")["spec"]["template"]
    pod = {"spec": template["spec"]}
    assert cache_namespace(pod) == namespace_for("feed", "prod", "v1")
    assert cache_namespace({"spec": {"containers": [{"name": "router", "env": []}]}}) is None


def _pass(
    instance: Instance,
    spec: Any,
    prior: Status,
    *,
    writing: set[str] | None = None,
    now: dt.datetime = NOW,
    kube: Kube | None = None,
) -> Status:
    seen = Observed({}, writing or set(), {}, set(), None, [])
    p = Pass(kube, instance, spec, prior, now)  # type: ignore[arg-type]
    c = Context(instance, spec, None, frozenset(), Fresh("", "", "", None))
    entries = cache_namespaces.report(p, c, seen, Applied()).cache_namespaces
    return dataclasses.replace(prior, cache_namespaces=entries or ())


# ------------------------------------------------- on the session's real API server


@dataclasses.dataclass(frozen=True)
class Anchored(Instance):
    """An instance whose objects are owned by a ConfigMap of the test (no operator runs
    for it, and the garbage collector must not take its Job away)."""

    anchor_uid: str = ""

    @property
    def owner(self) -> Owner:
        return Owner("v1", "ConfigMap", self.name, self.anchor_uid)


@pytest.fixture
def anchored(cluster) -> Iterator[tuple[Kube, Anchored]]:  # type: ignore[no-untyped-def]
    ns = f"cachens-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)
    kube = Kube(load_client(str(cluster.kubeconfig)))
    try:
        anchor = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "feed", "namespace": ns},
        }
        kube.apply(anchor, None)
        uid = kube.get("v1", "ConfigMap", ns, "feed")["metadata"]["uid"]  # type: ignore[index]
        yield kube, Anchored("feed", ns, "uid", 1, anchor_uid=uid)
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.mark.kube
def test_a_version_back_while_its_namespace_is_purged_stops_the_purge(
    anchored: tuple[Kube, Anchored],
) -> None:
    """A canary aborted is purged at once; brought back while the purge Job runs, the Job
    is deleted before its namespace is active again (it would delete the new entries)."""
    kube, feed = anchored
    stable = {"model": {"version": "v1", "uri": "/m"}}
    with_canary = parse_spec({**stable, "canary": {"version": "v2", "uri": "/m2", "weight": 10}})
    without = parse_spec(stable)
    canary_ns = namespace_for(feed.name, feed.namespace, "v2")

    first = _pass(feed, with_canary, Status(), kube=kube)
    assert {e.namespace: e.state for e in first.cache_namespaces}[canary_ns] is ACTIVE
    aborted = _pass(feed, without, first, kube=kube, now=NOW + dt.timedelta(seconds=5))
    purging = next(e for e in aborted.cache_namespaces if e.namespace == canary_ns)
    assert purging.state is PURGING and purging.job
    job = kube.get("batch/v1", "Job", feed.namespace, purging.job)
    assert job is not None, "the purge Job was not created"
    assert job["metadata"]["labels"]["kvrank.io/cache-namespace"] == canary_ns

    back = _pass(feed, with_canary, aborted, kube=kube, now=NOW + dt.timedelta(seconds=10))
    states = [(e.namespace, e.state) for e in back.cache_namespaces if e.namespace == canary_ns]
    assert states == [(canary_ns, ACTIVE)]
    gone = kube.get("batch/v1", "Job", feed.namespace, purging.job)
    assert gone is None or gone["metadata"].get("deletionTimestamp"), "the purge still runs"
