"""The operator's chart: where it is, its release, and the monitoring it ships (its alerts and
its Grafana dashboard, rendered by ``helm template`` as a user's GitOps tool would)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from localkube.tools import Cluster

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "kvrank-operator"
RELEASE = "kvrank"
OPERATOR_NS = "kvrank-system"
OPERATOR_SELECTOR = "app.kubernetes.io/name=kvrank-operator,!app.kubernetes.io/component"
"""The operator's own pods (the chart's test and hook pods carry a component label)."""


def monitoring_objects(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """The chart's PrometheusRule and dashboard ConfigMap (``helm template``), by kind."""
    rendered = cluster.helm(
        "template", RELEASE, str(CHART), "--namespace", OPERATOR_NS,
        "--api-versions", "monitoring.coreos.com/v1",
        "--set", "monitoring.rules.enabled=true", "--set", "monitoring.dashboard.enabled=true",
    ).stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    return {d["kind"]: d for d in docs if d["kind"] in ("PrometheusRule", "ConfigMap")}


def alert_rules(cluster: Cluster) -> dict[str, Any]:
    """The chart's alerts as a Prometheus rule file."""
    return dict(monitoring_objects(cluster)["PrometheusRule"]["spec"])


def dashboard(cluster: Cluster) -> dict[str, Any]:
    """The chart's Grafana dashboard."""
    (text,) = monitoring_objects(cluster)["ConfigMap"]["data"].values()
    return dict(json.loads(text))
