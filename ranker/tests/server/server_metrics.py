"""What a test reads of an in-process server's ``/metrics``."""

from __future__ import annotations

from fastapi.testclient import TestClient

from kvrank.tools.processes import samples


def metric(client: TestClient, name: str, **labels: str) -> float:
    return sum(samples(client.get("/metrics").text, name, **labels))


def model_work(client: TestClient) -> float:
    """Every piece of model work the pod did: user-side encodes and candidate scoring."""
    return metric(client, "kvrank_user_encodes_total") + metric(
        client, "kvrank_stage_seconds_count", stage="score"
    )
