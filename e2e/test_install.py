"""Install, upgrade and uninstall the operator with Helm, as a platform engineer does.

The upgrade scenario starts from a cluster without kvrank (it removes any release and the
CRD first) and runs first; the uninstall scenario removes the operator and runs last.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from chart import OPERATOR_NS
from rankers import Rankers
from release import CRD, OperatorRelease
from stack import NS, ROOT, Stack

pytestmark = [pytest.mark.kube, pytest.mark.slow, pytest.mark.e2e]

PREVIOUS_CHART_COMMIT = "e3f6f27"
"""The last commit of chart 0.1.0: no artifact checksums in its CRD, no CRD upgrades."""


def previous_chart(workdir: Path) -> Path:
    """Chart 0.1.0 as it was released, from the repository's history."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", PREVIOUS_CHART_COMMIT, "charts/kvrank-operator"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(workdir)], input=archive, check=True)
    return workdir / "charts" / "kvrank-operator"


def crd(stack: Stack) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(stack.kubectl("get", "crd", CRD, "-o", "json"))
    return doc


def model_properties(stack: Stack) -> dict[str, Any]:
    schema = crd(stack)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    props: dict[str, Any] = schema["properties"]["spec"]["properties"]["model"]["properties"]
    return props


def both_operators_ready(stack: Stack) -> dict[str, Any] | None:
    deployments = json.loads(stack.kubectl("get", "deployment", "-n", OPERATOR_NS, "-o", "json"))
    ready = [d for d in deployments["items"] if (d.get("status") or {}).get("readyReplicas") == 2]
    return ready[0] if ready else None


@pytest.mark.lifecycle("first")
def test_the_previous_release_upgrades_in_place_crd_included(
    stack: Stack, release: OperatorRelease
) -> None:
    release.remove_with_crd()
    # the previous release first: chart 0.1.0 installs its CRD from crds/ (no checksums)
    release.install(previous_chart(stack.workdir))
    assert "sha256" not in model_properties(stack)
    assert "kvrank-operator-0.1.0" in stack.cluster.helm("list", "-n", OPERATOR_NS).stdout
    # helm upgrade never touches a chart's crds/: the upgraded operator changes the CRD
    release.upgrade()
    assert "kvrank-operator-0.2.0" in stack.cluster.helm("list", "-n", OPERATOR_NS).stdout
    stack.wait_for(
        lambda: "sha256" in model_properties(stack), "the CRD schema upgraded in place", 120
    )
    crd_doc = crd(stack)
    established = [c for c in crd_doc["status"]["conditions"] if c["type"] == "Established"]
    assert established and established[0]["status"] == "True", crd_doc["status"]
    dep = stack.wait_for(lambda: both_operators_ready(stack), "both operator replicas Ready")
    assert dep["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    # one of the two leads; the other stands by
    replicas = {p["metadata"]["name"] for p in release.pods()}
    assert stack.wait_for(release.leader, "an operator holds the Lease", 60) in replicas
    columns = [c["name"] for c in crd_doc["spec"]["versions"][0]["additionalPrinterColumns"]]
    for column in (
        "Ready",
        "Pods",
        "URL",
        "Version",
        "Canary",
        "Weight",
        "TTL",
        "Hit-Ratio",
        "Age",
    ):
        assert column in columns
    assert "No resources found" in stack.cluster.kubectl("get", "rkd", "-n", NS).stderr


@pytest.mark.lifecycle("last")
def test_uninstalling_the_operator_leaves_no_ranker_deployment_stuck(
    stack: Stack, rankers: Rankers, release: OperatorRelease
) -> None:
    ranker = rankers.new("left-behind")
    ranker.apply(ranker.spec(redis=False, replicas=1))
    finalizer = "kopf.zalando.org/KopfFinalizerMarker"
    stack.wait_for(
        lambda: (
            finalizer in (ranker.must_get()["metadata"].get("finalizers") or [])
            and ranker.deployment("v1")
        ),
        "the operator managing the RankerDeployment",
    )
    # helm's pre-delete hook stops the operator, then takes its finalizer off
    release.uninstall()
    assert not release.pods()
    assert not ranker.must_get()["metadata"].get("finalizers")
    assert ranker.deployment("v1") is not None  # still there, unmanaged
    stack.kubectl("delete", "rkd", ranker.name, "-n", NS, "--timeout=60s")
    ranker.wait_gone("v1")  # garbage-collected
