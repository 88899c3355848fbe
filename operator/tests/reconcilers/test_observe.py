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
