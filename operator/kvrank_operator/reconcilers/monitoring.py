"""The instance's PodMonitor (prometheus-operator), and the ``Monitoring`` condition.

The condition says whether the PodMonitor exists or why not (no such CRD in the cluster,
the API refused it). Without settings the operator manages no PodMonitor and the condition
is removed. Nothing else in the pass depends on it: a refusal is a condition, not an error.
"""

from __future__ import annotations

from kubernetes.client.exceptions import ApiException

from kvrank_operator import manifests as m
from kvrank_operator.reconcilers.base import Pass, Report
from kvrank_operator.state import ConditionUpdate

CONDITION = "Monitoring"


def reconcile(p: Pass, settings: m.PodMonitoring | None) -> Report:
    if settings is None:
        return Report(removed=(CONDITION,))
    if not p.kube.serves(m.POD_MONITOR_API, "PodMonitor"):
        why = (
            f"this cluster serves no {m.POD_MONITOR_API} PodMonitor: install the"
            " prometheus-operator CRDs (kube-prometheus-stack), or scrape the ranker pods by"
            " their prometheus.io/* annotations"
        )
        return _condition(False, "PodMonitorCRDMissing", why)
    obj = m.pod_monitor(p.instance.name, p.instance.namespace, settings)
    try:
        p.kube.apply(obj, p.instance.owner)
    except ApiException as exc:
        why = f"PodMonitor {obj['metadata']['name']}: API {exc.status} {exc.reason}"
        return _condition(False, "PodMonitorRefused", why)
    why = f"PodMonitor {obj['metadata']['name']} selects every ranker pod of this instance"
    return _condition(True, "PodMonitorApplied", why)


def _condition(ok: bool, reason: str, message: str) -> Report:
    return Report(conditions=(ConditionUpdate(CONDITION, ok, reason, message),))
