"""The PodMonitor concern: what it wants applied, and a condition for every way it can end —
switched off, no prometheus-operator CRD in the cluster, refused by the API, applied."""

from __future__ import annotations

from passes import STABLE, observed, pass_of

from kvrank_operator.manifests import PodMonitoring
from kvrank_operator.reconcilers import monitoring
from kvrank_operator.reconcilers.base import Applied


def test_without_settings_it_wants_nothing_and_removes_its_condition() -> None:
    p, c = pass_of(STABLE)
    assert monitoring.desired(c) == []
    assert monitoring.report(p, c, observed(), Applied()).removed == ("Monitoring",)


def test_each_outcome_of_the_apply_is_a_condition_naming_why() -> None:
    p, c = pass_of(STABLE, monitoring=PodMonitoring())
    (wanted,) = monitoring.desired(c)
    assert wanted.optional and wanted.kind == "PodMonitor"  # a refusal never fails the pass

    def condition(applied: Applied) -> tuple[bool, str, str]:
        (u,) = monitoring.report(p, c, observed(), applied).conditions
        assert u.type == "Monitoring"
        return u.ok, u.reason, u.message

    ok, reason, message = condition(Applied(unserved=("PodMonitor (monitoring.coreos.com/v1)",)))
    assert (ok, reason) == (False, "PodMonitorCRDMissing") and "prometheus.io/*" in message
    refusal = "PodMonitor feed-ranker: API 422 Unprocessable Entity"
    assert condition(Applied(refused=(refusal,))) == (False, "PodMonitorRefused", refusal)
    ok, reason, message = condition(Applied())
    assert (ok, reason) == (True, "PodMonitorApplied") and "feed-ranker" in message
