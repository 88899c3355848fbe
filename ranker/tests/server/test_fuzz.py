"""The HTTP API fuzzed from its own OpenAPI schema: whatever a client sends, no 5xx."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings


@pytest.fixture(scope="module")
def client(artifact):
    from fastapi.testclient import TestClient

    from kvrank.server.app import create_app
    from kvrank.server.config import load_config

    with TestClient(create_app(load_config({"model_dir": str(artifact)}))) as c:
        yield c


def fuzz(client, route: str, examples: int, answered: Callable[[Any, Any], None]) -> None:
    """``examples`` bodies drawn from ``route``'s schema: never a 5xx, and ``answered``
    checks the successful answers."""
    schema = schemathesis.openapi.from_dict(client.app.openapi())
    strategy = schema[route]["POST"].as_strategy()
    slow = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large]

    @settings(max_examples=examples, deadline=None, suppress_health_check=slow)
    @given(case=strategy)
    def check(case) -> None:
        resp = client.post(route, json=case.body)
        assert resp.status_code < 500, (case.body, resp.text)
        if resp.status_code < 300:
            answered(case, resp)

    check()


def test_score_endpoint_never_answers_5xx(client) -> None:
    def answered(case, resp) -> None:
        assert len(resp.json()["scores"]) == len(case.body["candidates"]["item_ids"])

    fuzz(client, "/v1/score", 150, answered)


def test_prefetch_endpoint_never_answers_5xx(client) -> None:
    def answered(case, resp) -> None:
        assert resp.status_code == 202 and resp.json()["status"] in ("accepted", "dropped")

    fuzz(client, "/v1/prefetch", 100, answered)


def test_admin_endpoints_never_answer_5xx(client) -> None:
    schema = schemathesis.openapi.from_dict(client.app.openapi())
    strategy = schema["/admin/invalidate/{user_id}"]["POST"].as_strategy()

    @settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def check(case) -> None:
        resp = client.post(f"/admin/invalidate/{case.path_parameters['user_id']}")
        assert resp.status_code < 500, resp.text

    check()
