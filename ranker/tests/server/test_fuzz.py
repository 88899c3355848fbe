"""The HTTP API fuzzed from its own OpenAPI schema: whatever a client sends, no 5xx."""

from __future__ import annotations

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


def test_score_endpoint_never_answers_5xx(client) -> None:
    schema = schemathesis.openapi.from_dict(client.app.openapi())
    strategy = schema["/v1/score"]["POST"].as_strategy()

    @settings(
        max_examples=150,
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.filter_too_much,
            HealthCheck.data_too_large,
        ],
    )
    @given(case=strategy)
    def check(case) -> None:
        resp = client.post("/v1/score", json=case.body)
        assert resp.status_code < 500, (case.body, resp.text)
        if resp.status_code == 200:
            assert len(resp.json()["scores"]) == len(case.body["candidates"]["item_ids"])

    check()


def test_admin_endpoints_never_answer_5xx(client) -> None:
    schema = schemathesis.openapi.from_dict(client.app.openapi())
    strategy = schema["/admin/invalidate/{user_id}"]["POST"].as_strategy()

    @settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def check(case) -> None:
        resp = client.post(f"/admin/invalidate/{case.path_parameters['user_id']}")
        assert resp.status_code < 500, resp.text

    check()
