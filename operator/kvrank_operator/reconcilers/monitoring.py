"""The instance's PodMonitor (prometheus-operator), and the ``Monitoring`` condition.

The condition says whether the PodMonitor exists or why not (no such CRD in the cluster,
the API refused it). Without settings the operator manages no PodMonitor and the condition
is removed. Nothing else in the pass depends on it: a refusal is a condition, not an error.
"""

from __future__ import annotations

from kvrank_operator import manifests as m
from kvrank_operator.manifests.desired import Desired
from kvrank_operator.reconcilers.base import Applied, Context, Pass, Report
from kvrank_operator.reconcilers.observe import Observed
from kvrank_operator.state import ConditionUpdate

CONDITION = "Monitoring"


def desired(c: Context) -> list[Desired]:
    if c.monitoring is None:
        return []
    obj = m.pod_monitor(c.instance.name, c.instance.namespace, c.monitoring)
    return [Desired(obj, optional=True)]


def report(p: Pass, c: Context, seen: Observed, applied: Applied) -> Report:
    if c.monitoring is None:
        return Report(removed=(CONDITION,))
    if applied.unserved:
        why = (
            f"this cluster serves no {m.POD_MONITOR_API} PodMonitor: install the"
            " prometheus-operator CRDs (kube-prometheus-stack), or scrape the ranker pods by"
            " their prometheus.io/* annotations"
        )
        return _condition(False, "PodMonitorCRDMissing", why)
    if applied.refused:
        return _condition(False, "PodMonitorRefused", applied.refused[0])
    (monitor,) = desired(c)
    why = f"PodMonitor {monitor.obj['metadata']['name']} selects every ranker pod of this instance"
    return _condition(True, "PodMonitorApplied", why)


def _condition(ok: bool, reason: str, message: str) -> Report:
    return Report(conditions=(ConditionUpdate(CONDITION, ok, reason, message),))
