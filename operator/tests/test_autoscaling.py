"""The autoscaling recipes in ``examples/autoscaling`` are what the API server admits: KEDA's
CRDs (from its Go module) and the RankerDeployment CRD installed into the session's API
server, the ScaledObject and the HorizontalPodAutoscaler pass a strict server-side dry run
(and one with a misspelt field would not), both target the RankerDeployment's scale
subresource, and the metric they scale on is one the rankers export."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from api_server import fetched_crds, install_crds, strict_dry_run

from kvrank_operator.crd import API_VERSION, KIND, crd
from kvrank_operator.reconcilers import versions
from kvrank_operator.reconcilers.base import Applied, Context, Fresh, Pass
from kvrank_operator.reconcilers.observe import Observed
from kvrank_operator.spec import parse_spec
from kvrank_operator.state import Instance, Status

pytestmark = pytest.mark.kube
RECIPES = Path(__file__).resolve().parents[2] / "examples" / "autoscaling"


def recipe(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((RECIPES / name).read_text())
    return doc


@pytest.fixture(scope="module")
def admit(cluster):  # type: ignore[no-untyped-def]
    keda = sorted(fetched_crds("keda-crds.sh").glob("*.yaml"))
    install_crds(cluster, keda, ["scaledobjects.keda.sh"], ours=True)

    def admit(doc: dict[str, Any]) -> tuple[bool, str]:
        # into "default": the release's namespace belongs to the end-to-end suite
        return strict_dry_run(cluster, doc, namespace="default")

    return admit


@pytest.mark.parametrize("name", ["keda-scaledobject.yaml", "hpa.yaml"])
def test_each_recipe_is_admitted_and_scales_the_ranker_deployment(admit, name: str) -> None:
    doc = recipe(name)
    ok, err = admit(doc)
    assert ok, err
    target = doc["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"]) == (API_VERSION, KIND)
    scale = crd()["spec"]["versions"][0]["subresources"]["scale"]
    assert scale["specReplicasPath"] == ".spec.model.replicas"


def test_the_scale_subresource_reports_the_replicas_that_are_ready() -> None:
    """An autoscaler reads the scale's status.replicas as the pods running: while 4 are
    asked for and 1 stable pod of 3 and no canary pod are Ready, it says 1, not 4."""
    spec = parse_spec(
        {
            "model": {"version": "v1", "uri": "/m", "replicas": 4},
            "canary": {"version": "v2", "uri": "/m2", "weight": 25},
        }
    )

    def deployment(ready: int) -> dict[str, Any]:
        return {"metadata": {"generation": 1}, "status": {"readyReplicas": ready}}

    seen = Observed({"v1": deployment(1), "v2": deployment(0)}, {"v1", "v2"}, {}, set(), None, [])
    now = dt.datetime(2026, 12, 3, tzinfo=dt.UTC)
    p = Pass(None, Instance("feed", "prod", "uid-1", 1), spec, Status(), now)  # type: ignore[arg-type]
    c = Context(p.instance, spec, None, frozenset(), Fresh("", "", "", None))
    serving = versions.report(p, c, seen, Applied()).serving
    assert serving is not None
    assert [(v.version, v.replicas, v.ready_replicas) for v in serving.versions] == [
        ("v1", 3, 1),
        ("v2", 1, 0),
    ]
    assert serving.replicas == 1 and serving.ready_text == "1/4"
    assert Status(serving=serving).for_storage()["replicas"] == 1
    assert crd()["spec"]["versions"][0]["subresources"]["scale"]["statusReplicasPath"] == (
        ".status.replicas"
    )


def test_a_scaled_object_the_crd_does_not_describe_is_refused(admit) -> None:
    doc = recipe("keda-scaledobject.yaml")
    doc["spec"]["maxReplicas"] = 16  # the HPA's name for it; KEDA's is maxReplicaCount
    ok, err = admit(doc)
    assert not ok and "maxReplicas" in err, err


def test_the_recipes_scale_on_a_metric_the_rankers_export() -> None:
    from prometheus_client import generate_latest

    from kvrank.admission import Admission, AdmissionSettings
    from kvrank.metrics import Metrics

    metrics = Metrics("v1", "v-v1")
    metrics.watch_admission(Admission(AdmissionSettings()), lambda: 0)
    exported = set(re.findall(r"^(kvrank_\w+)", generate_latest(metrics.registry).decode(), re.M))
    (trigger,) = recipe("keda-scaledobject.yaml")["spec"]["triggers"]
    queried = set(re.findall(r"kvrank_\w+", trigger["metadata"]["query"]))
    hpa_metric = recipe("hpa.yaml")["spec"]["metrics"][0]["pods"]["metric"]["name"]
    assert queried | {hpa_metric} <= exported, (queried | {hpa_metric}) - exported
