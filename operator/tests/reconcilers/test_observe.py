"""What the operator reads from observed pods."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("last_line", "shown"),
    [
        ("kvrank serve: sha256 of model.safetensors is ab…, expected 00…", "expected 00…"),
        ('{"severity": "error", "message": "model version \'v1\', expected \'v2\'"}', "expected"),
    ],
)
def test_a_pods_start_failure_is_its_last_log_message(last_line: str, shown: str) -> None:
    from kvrank_operator.reconcilers.observe import start_failure

    pod = {
        "status": {
            "containerStatuses": [
                {
                    "ready": False,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {
                        "terminated": {"exitCode": 2, "message": f"starting\n{last_line}\n"}
                    },
                }
            ]
        }
    }
    why = start_failure(pod)
    assert why is not None and shown in why and why.endswith("(exit code 2)")
    assert "severity" not in why  # a JSON line shows as its message


def test_what_the_watches_hold_is_listed_by_kind_namespace_and_labels() -> None:
    from kvrank_operator.reconcilers.observe import Owned

    def obj(api: str, kind: str, ns: str, **labels: str) -> dict[str, object]:
        return {"apiVersion": api, "kind": kind, "metadata": {"namespace": ns, "labels": labels}}

    pod = obj("v1", "Pod", "prod", app="feed", component="ranker")
    owned = Owned(
        (
            pod,
            obj("v1", "Pod", "prod", app="feed", component="redis"),
            obj("v1", "Pod", "dev", app="feed", component="ranker"),
            obj("apps/v1", "Deployment", "prod", app="feed", component="ranker"),
        )
    )
    assert owned.list("v1", "Pod", "prod", {"app": "feed", "component": "ranker"}) == [pod]
    assert len(owned.list("v1", "Pod", None, {"component": "ranker"})) == 2
    assert owned.list("batch/v1", "Job", "prod", {}) == []
    with pytest.raises(ValueError, match="not watched"):
        owned.list("apps/v1", "StatefulSet", "prod", {})
