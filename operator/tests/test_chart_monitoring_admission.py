"""kvrank's monitoring objects are what prometheus-operator accepts: its CRDs (from its Go
module) are installed into the session's API server, and every ServiceMonitor and
PrometheusRule the chart renders (and its dashboard ConfigMap), and the PodMonitor the
operator makes for a RankerDeployment, pass a strict server-side dry run."""

from __future__ import annotations

from pathlib import Path

import pytest
from api_server import fetched_crds, install_crds, strict_dry_run
from helm_chart import MONITORING, render

from kvrank_operator.manifests import PodMonitoring, pod_monitor

pytestmark = pytest.mark.kube
KINDS = ("servicemonitors", "podmonitors", "prometheusrules")


@pytest.fixture(scope="module")
def admit(cluster):  # type: ignore[no-untyped-def]
    crds = fetched_crds("prometheus-operator-crds.sh")
    install_crds(
        cluster,
        [crds / f"monitoring.coreos.com_{kind}.yaml" for kind in KINDS],
        [f"{kind}.monitoring.coreos.com" for kind in KINDS],
    )

    def admit(doc: dict) -> tuple[bool, str]:  # type: ignore[type-arg]
        # into "default": the release's namespace belongs to the end-to-end suite
        return strict_dry_run(cluster, doc, namespace="default")

    return admit


@pytest.mark.parametrize(
    "values", [(), ("-f", "ci/namespaced-values.yaml")], ids=["cluster-wide", "namespaced"]
)
def test_every_monitoring_object_is_admitted(admit, values: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    chart_values = [
        str(Path(__file__).resolve().parents[2] / "charts" / "kvrank-operator" / v)
        if v.endswith(".yaml")
        else v
        for v in values
    ]
    docs = [
        d
        for d in render(*chart_values, *MONITORING)
        if d["kind"] in ("ServiceMonitor", "PrometheusRule", "ConfigMap")
    ]
    assert len(docs) == 3  # the ConfigMap: the Grafana dashboard
    for doc in docs:
        admitted, message = admit(doc)
        assert admitted, f"{doc['kind']}: {message}"


def test_the_operators_pod_monitor_is_admitted(admit) -> None:  # type: ignore[no-untyped-def]
    doc = pod_monitor("feed-ranker", "default", PodMonitoring({"release": "kps"}, "15s"))
    admitted, message = admit(doc)
    assert admitted, message


def test_a_misspelled_field_is_refused(admit) -> None:  # type: ignore[no-untyped-def]
    doc = pod_monitor("feed-ranker", "default", PodMonitoring())
    doc["spec"]["podTargetLabel"] = doc["spec"].pop("podTargetLabels")
    admitted, message = admit(doc)
    assert not admitted and "podTargetLabel" in message
