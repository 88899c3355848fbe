"""One reconcile pass of a RankerDeployment against the session's real API server: it applies
exactly what ``kvrank-operator render`` prints, for every example (the objects are built
once, by the concerns both loop over), and it reads the cluster once per phase — ranker
pods listed once to decide and once to report, once in all when nothing changed, and not at
all when the operator's watches hold them."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from api_server import install_crds
from spec_fragments import SPEC_FILES

from kvrank_operator.kube import Kube, Owner, load_client
from kvrank_operator.reconcile import Memory, reconcile
from kvrank_operator.reconcilers.observe import Owned
from kvrank_operator.render import redacted, render

EXAMPLES = SPEC_FILES


class CountingKube(Kube):
    """The operator's client, keeping what it applied and counting what it listed."""

    def __init__(self, kubeconfig: Path) -> None:
        super().__init__(load_client(str(kubeconfig)))
        self.applied: list[dict[str, Any]] = []
        self.lists: Counter[tuple[str, str]] = Counter()

    def apply(self, obj: dict[str, Any], owner: Owner | None) -> bool:
        self.applied.append(obj)
        return super().apply(obj, owner)

    def list(
        self, api_version: str, kind: str, namespace: str | None, selector: dict[str, str]
    ) -> list[dict[str, Any]]:
        self.lists[kind, selector.get("app.kubernetes.io/component", "")] += 1
        return super().list(api_version, kind, namespace, selector)


@pytest.fixture
def namespace(cluster) -> Iterator[str]:  # type: ignore[no-untyped-def]
    install_crds(cluster, [], [], ours=True)
    ns = f"pass-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)
    try:
        yield ns
    finally:
        cluster.kubectl("delete", "rkd", "--all", "-n", ns, "--wait=false", check=False)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _created(cluster, ns: str, example: Path) -> tuple[dict[str, Any], dict[str, Any]]:  # type: ignore[no-untyped-def]
    """The example created in ``ns`` under its file's name: (document, the API's object)."""
    doc = yaml.safe_load(example.read_text())
    doc["metadata"] = {"name": example.stem, "namespace": ns}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))
    got = cluster.kubectl("get", "rkd", example.stem, "-n", ns, "-o", "json")
    return doc, json.loads(got.stdout)


def test_a_first_pass_applies_what_render_prints_for_every_example(cluster, namespace) -> None:  # type: ignore[no-untyped-def]
    now = dt.datetime.now(dt.UTC)
    for example in EXAMPLES:
        doc, body = _created(cluster, namespace, example)
        kube = CountingKube(cluster.kubeconfig)
        reconcile(kube, body, now)
        applied = [redacted(obj) for obj in kube.applied]
        rendered = render(doc, namespace)
        assert [(o["kind"], o["metadata"]["name"]) for o in applied] == [
            (o["kind"], o["metadata"]["name"]) for o in rendered
        ], example.name
        assert applied == rendered, example.name


def test_a_pass_lists_the_ranker_pods_once_per_phase(cluster, namespace) -> None:  # type: ignore[no-untyped-def]
    """A canary's pass decides on what the cluster reports (is the canary Ready, its
    metrics) and reports on what it reports after the apply: one read each. The next pass,
    with nothing to change, reads once."""
    (canary,) = (e for e in EXAMPLES if e.name == "canary.yaml")
    _, body = _created(cluster, namespace, canary)
    memory, now = Memory(), dt.datetime.now(dt.UTC)
    kube = CountingKube(cluster.kubeconfig)
    first = reconcile(kube, body, now, memory)
    assert kube.lists["Pod", "ranker"] == 2, kube.lists  # the TTL is due: it read the pods
    assert kube.lists["Deployment", "ranker"] == 2, kube.lists
    body["status"] = first.status.for_storage()
    kube.lists.clear()
    reconcile(kube, body, now + dt.timedelta(seconds=5), memory)
    assert kube.lists["Pod", "ranker"] == 1, kube.lists
    assert kube.lists["Deployment", "ranker"] == 1, kube.lists
    assert sum(kube.lists.values()) == 3, kube.lists  # and the purge Jobs


def _as_watched(kube: Kube, ns: str) -> Owned:
    """The namespace's Deployments, pods and Jobs as the operator's watches report them (a
    watch event's object carries its apiVersion and kind; a list's items do not)."""
    objects = [
        {**obj, "apiVersion": api, "kind": kind}
        for api, kind in sorted(Owned.KINDS)
        for obj in kube.list(api, kind, ns, {})
    ]
    return Owned(tuple(objects))


def test_a_steady_pass_reads_what_the_watches_hold_and_lists_nothing(cluster, namespace) -> None:  # type: ignore[no-untyped-def]
    (canary,) = (e for e in EXAMPLES if e.name == "canary.yaml")
    _, body = _created(cluster, namespace, canary)
    memory, now = Memory(), dt.datetime.now(dt.UTC)
    kube = CountingKube(cluster.kubeconfig)
    first = reconcile(kube, body, now, memory)
    body["status"] = first.status.for_storage()
    owned = _as_watched(kube, namespace)
    kube.lists.clear()
    again = reconcile(kube, body, now + dt.timedelta(seconds=5), memory, owned=owned)
    assert not kube.lists, kube.lists
    assert again.status.serving is not None and first.status.serving is not None
    seen = [(v.version, v.role) for v in again.status.serving.versions]
    assert seen == [(v.version, v.role) for v in first.status.serving.versions]
