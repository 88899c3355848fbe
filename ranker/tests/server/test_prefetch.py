"""``POST /v1/prefetch`` and the routing header, as the retrieval stage and a proxy see them:
a prefetch answers 202 at once and makes the user's entry behind it (the ranking request
that follows is a hit), bad input is the caller's to hear, cache trouble never is, and a
routing header that names another user than the body is refused naming the header."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

import kvrank.service
from kvrank.model.inputs import Candidates, Events, UserFeatures
from kvrank.tools.processes import samples


def prefetch_body(req: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in req.items() if k != "candidates"}


def settled(client: TestClient, timeout_s: float = 10.0) -> None:
    """Wait until no prefetch is in flight."""
    state = client.app.state.kvrank  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout_s
    while len(state.prefetches) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not len(state.prefetches), "prefetches still in flight"


def metric(client: TestClient, name: str, **labels: str) -> float:
    return sum(samples(client.get("/metrics").text, name, **labels))


def test_a_ranking_request_after_its_prefetch_is_an_l1_hit(make_client, request_for) -> None:
    client = make_client()
    _, _, req = request_for("prefetched")
    resp = client.post("/v1/prefetch", json=prefetch_body(req))
    assert resp.status_code == 202, resp.text
    assert resp.json()["status"] == "accepted" and resp.json()["request_id"]
    settled(client)
    doc = client.post("/v1/score", json=req).json()
    assert doc["cache"] == "l1", doc
    assert metric(client, "kvrank_prefetches_total", result="miss") == 1
    # a prefetch is not a request of the user's: the hit ratio counts the ranking one only
    assert metric(client, "kvrank_requests_total") == 1
    assert metric(client, "kvrank_requests_total", outcome="l1") == 1
    # a second prefetch of a cached user finds it and makes nothing
    client.post("/v1/prefetch", json=prefetch_body(req))
    settled(client)
    assert metric(client, "kvrank_prefetches_total", result="l1") == 1
    assert metric(client, "kvrank_user_encodes_total", kind="full") == 1


def test_bad_prefetch_input_is_refused_naming_the_field(make_client, request_for) -> None:
    client = make_client()
    _, _, req = request_for()
    bad = prefetch_body(req)
    bad["events"] = {**bad["events"], "item_ids": [-1] * len(bad["events"]["item_ids"])}
    resp = client.post("/v1/prefetch", json=bad)
    assert resp.status_code == 422 and resp.json()["field"].startswith("events.item_ids"), resp.text
    resp = client.post("/v1/prefetch", json=req)  # candidates are not a prefetch's
    assert resp.status_code == 422 and resp.json()["field"] == "candidates", resp.text
    assert metric(client, "kvrank_prefetches_total") == 0


def test_a_full_prefetch_queue_drops_with_202_and_counts_it(make_client, request_for) -> None:
    client = make_client(prefetch_max_inflight=0)
    _, _, req = request_for()
    resp = client.post("/v1/prefetch", json=prefetch_body(req))
    assert resp.status_code == 202 and resp.json()["status"] == "dropped", resp.text
    assert metric(client, "kvrank_prefetches_total", result="dropped") == 1
    bad = prefetch_body(req)
    bad["events"] = {**bad["events"], "actions": [99] * len(bad["events"]["actions"])}
    resp = client.post("/v1/prefetch", json=bad)  # dropped or not, bad input is a 422
    assert resp.status_code == 422 and resp.json()["field"] == "events.actions", resp.text
    assert metric(client, "kvrank_prefetches_total", result="dropped") == 1
    assert client.post("/v1/score", json=req).json()["cache"] == "miss"


def test_a_prefetch_is_shed_while_scoring_requests_would_wait(make_client, request_for) -> None:
    """Scoring comes first: with model work queued a prefetch would only delay it (the
    ranking request makes the entry anyway), so the pod drops it (202, counted ``shed``);
    with the queue empty again it runs."""
    client = make_client()
    admission = client.app.state.kvrank.started.admission  # type: ignore[attr-defined]
    _, _, busy = request_for("busy")
    _, _, idle = request_for("idle")
    admission.queued_work_s = lambda: 1.0  # a second of model work ahead
    resp = client.post("/v1/prefetch", json=prefetch_body(busy))
    assert resp.status_code == 202 and resp.json()["status"] == "dropped", resp.text
    assert metric(client, "kvrank_prefetches_total", result="shed") == 1
    assert client.post("/v1/score", json=busy).json()["cache"] == "miss"  # still answered
    admission.queued_work_s = lambda: 0.0
    assert client.post("/v1/prefetch", json=prefetch_body(idle)).json()["status"] == "accepted"
    settled(client)
    assert client.post("/v1/score", json=idle).json()["cache"] == "l1"
    assert metric(client, "kvrank_prefetches_total", result="shed") == 1


def test_a_prefetch_against_a_dead_redis_is_accepted_and_the_score_still_right(
    make_client, request_for
) -> None:
    client = make_client(redis={"url": "redis://127.0.0.1:9", "op_timeout_ms": 50})
    _, _, req = request_for()
    assert client.post("/v1/prefetch", json=prefetch_body(req)).status_code == 202
    settled(client)
    assert metric(client, "kvrank_prefetches_total", result="failed") == 0  # a miss, no failure
    doc = client.post("/v1/score", json=req)
    assert doc.status_code == 200 and doc.json()["cache"] == "l1", doc.text


@pytest.mark.parametrize("route", ["/v1/score", "/v1/prefetch"])
def test_a_routing_header_naming_another_user_is_refused_naming_the_header(
    make_client, request_for, route
) -> None:
    client = make_client()
    _, _, req = request_for("alice")
    body = req if route == "/v1/score" else prefetch_body(req)
    resp = client.post(route, json=body, headers={"X-KVRank-User": "bob"})
    assert resp.status_code == 400, resp.text
    assert resp.json()["field"] == "X-KVRank-User" and "user_id" in resp.json()["error"]
    ok = client.post(route, json=body, headers={"X-KVRank-User": "alice"})
    assert ok.status_code in (200, 202), ok.text
    assert client.post(route, json=body).status_code in (200, 202)  # no header: no proxy


def test_the_routing_header_is_configurable(make_client, request_for) -> None:
    client = make_client(routing_header="X-User")
    _, _, req = request_for("alice")
    resp = client.post("/v1/score", json=req, headers={"X-User": "bob"})
    assert resp.status_code == 400 and resp.json()["field"] == "X-User", resp.text
    assert client.post("/v1/score", json=req, headers={"X-KVRank-User": "bob"}).status_code == 200


def test_a_request_is_checked_once_by_the_service_not_again_by_the_model(
    make_client, request_for, monkeypatch
) -> None:
    """Each request's input is checked against the model's feature spec once, where the
    service takes it; the model (which checks what its direct callers hand it) does not
    check it a second time: on the serving path that would be time on every request."""
    checks: list[str] = []

    def counted(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        def check(*args: Any, **kwargs: Any) -> Any:
            checks.append(name)
            return fn(*args, **kwargs)

        return check

    monkeypatch.setattr(kvrank.service, "check_user", counted(kvrank.service.check_user, "user"))
    monkeypatch.setattr(
        kvrank.service, "check_candidates", counted(kvrank.service.check_candidates, "cands")
    )
    for typed in (Events, UserFeatures, Candidates):
        monkeypatch.setattr(typed, "validate", counted(typed.validate, "model"))
    client = make_client()
    _, _, req = request_for("checked")
    assert client.post("/v1/prefetch", json=prefetch_body(req)).status_code == 202
    settled(client)
    assert checks == ["user"]
    checks.clear()
    doc = client.post("/v1/score", json={**req, "user_id": "checked-2"}).json()
    assert doc["cache"] == "miss" and checks == ["user", "cands"], (doc, checks)
