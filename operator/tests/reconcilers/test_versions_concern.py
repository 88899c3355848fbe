"""The versions concern's report: what ``kubectl get`` and ``kubectl wait`` read of the model
versions, from one observation — Progressing while any version rolls out, why the instance is
not Ready yet, a canary's readiness, and why a pod failed to start."""

from __future__ import annotations

from passes import STABLE, deployment, observed, pass_of

from kvrank_operator.reconcilers import versions
from kvrank_operator.reconcilers.base import Applied, Report

CANARY = {**STABLE, "canary": {"version": "v2", "uri": "/models/v2", "weight": 10}}


def _conditions(report: Report) -> dict[str, tuple[bool, str]]:
    return {u.type: (u.ok, u.reason) for u in report.conditions}


def test_a_version_rolling_out_keeps_the_instance_from_ready_and_says_which() -> None:
    p, c = pass_of(CANARY)
    rolling = versions.report(
        p, c, observed({"v1": deployment(1), "v2": deployment(0, 1)}), Applied()
    )
    assert rolling.unready == (("Waiting", "waiting for v2"),)
    assert _conditions(rolling)["Progressing"] == (True, "Rolling")
    assert _conditions(rolling)["CanaryReady"] == (False, "Waiting")
    assert "Ready" not in _conditions(rolling)  # the pass composes Ready from every concern
    done = versions.report(p, c, observed({"v1": deployment(1), "v2": deployment(1)}), Applied())
    assert done.unready == () and _conditions(done)["Progressing"] == (False, "Stable")
    assert (
        done.serving is not None and done.serving.ready_text == "2/2"
    )  # 2 replicas: 1 stable, 1 canary


def test_a_deployment_not_rolled_out_to_its_generation_is_not_ready() -> None:
    """Right after a spec change the Deployment's pods are the old template's: Ready only
    once the Deployment controller observed the new generation."""
    p, c = pass_of(STABLE)
    stale = deployment(2, generation=2)
    stale["status"]["observedGeneration"] = 1
    assert versions.report(p, c, observed({"v1": stale}), Applied()).unready


def test_a_pod_that_fails_to_start_is_named_with_its_reason() -> None:
    p, c = pass_of(STABLE)
    seen = observed(
        {"v1": deployment(0, 2)}, failures={"v1": "model sha256 mismatch (exit code 1)"}
    )
    (started,) = (
        u for u in versions.report(p, c, seen, Applied()).conditions if u.type == "RankersStarted"
    )
    assert (started.ok, started.reason) == (False, "StartFailed")
    assert started.message == "v1: model sha256 mismatch (exit code 1)"


def test_a_generated_cache_entry_secret_is_an_event() -> None:
    p, c = pass_of(STABLE)
    secret = next(d for d in versions.desired(c) if d.kind == "Secret")
    assert secret.create_only  # never replaced under running pods
    events = versions.report(
        p, c, observed({"v1": deployment(2)}), Applied(created=(secret,))
    ).events
    assert [reason for _, reason, _ in events] == ["CacheKeyCreated"]
