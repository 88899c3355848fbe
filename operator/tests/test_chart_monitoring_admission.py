"""kvrank's monitoring objects are what prometheus-operator accepts: its CRDs (from its Go
module) are installed into the session's API server, and every ServiceMonitor and
PrometheusRule the chart renders (and its dashboard ConfigMap), and the PodMonitor the
operator makes for a RankerDeployment, pass a strict server-side dry run."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest
from test_chart import MONITORING, render

from kvrank_operator.crd import crd
from kvrank_operator.manifests import PodMonitoring, pod_monitor

pytestmark = pytest.mark.kube
LOCALKUBE = Path(__file__).resolve().parents[2] / "e2e" / "localkube"
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


def fetched_crds(script: str) -> Path:
    """The directory of CRD files that ``e2e/localkube/<script>`` fetched (and cached)."""
    out = subprocess.run(
        ["bash", str(LOCALKUBE / script)], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip())


def install_crds(cluster, paths: Iterable[Path], names: Iterable[str], ours: bool = False) -> None:  # type: ignore[no-untyped-def]
    """The CRD files at ``paths`` (and, with ``ours``, the RankerDeployment CRD) applied to
    the session's API server, once the CRDs ``names`` are Established."""
    for path in paths:
        cluster.kubectl("apply", "--server-side", "-f", str(path))
    if ours:
        cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(crd())
        )
    for name in (*names, *(["rankerdeployments.kvrank.io"] if ours else [])):
        cluster.wait_established(name)


def strict_dry_run(cluster, doc: dict, namespace: str | None = None) -> tuple[bool, str]:  # type: ignore[no-untyped-def, type-arg]
    """Whether the API server would admit ``doc`` (a strict server-side dry run; into
    ``namespace`` when given), and why not."""
    if namespace is not None:
        doc = {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}
    out = cluster.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-f", "-",
        input=json.dumps(doc), check=False,
    )  # fmt: skip
    return out.returncode == 0, out.stderr


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
