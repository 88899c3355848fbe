"""History by reference: every answer names the sequence hash its user side is cached under
(body and ``ETag``); a later request may send that hash (``If-Match`` or ``seq_hash``)
instead of the events. It is scored from the entry under exactly that key, in any tier, or
answered 412 ``history_required`` before any model work — never scored from anything else."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from fastapi.testclient import TestClient
from server_metrics import metric, model_work

from kvrank.model.artifact import save_model

SCORE = "/v1/score"


def by_reference(body: dict[str, Any], seq_hash: str | None = None) -> dict[str, Any]:
    """The body without the history (and without the user columns the hash covers)."""
    ref = {"user_id": body["user_id"], "candidates": body["candidates"]}
    return ref if seq_hash is None else ref | {"seq_hash": seq_hash}


def etag(seq_hash: str) -> dict[str, str]:
    return {"If-Match": f'"{seq_hash}"'}


def test_an_answer_names_its_history_and_a_request_by_that_name_scores_the_same(
    make_client, request_for
) -> None:
    client = make_client()
    _, _, body = request_for("alice", n=10, c=6)
    first = client.post(SCORE, json=body)
    assert first.status_code == 200, first.text
    doc = first.json()
    seq_hash = doc["seq_hash"]
    assert len(seq_hash) == 32 and int(seq_hash, 16) >= 0
    assert doc["events"] == 10 and first.headers["etag"] == f'"{seq_hash}"'
    for headers, sent in ((etag(seq_hash), by_reference(body)), ({}, by_reference(body, seq_hash))):
        again = client.post(SCORE, json=sent, headers=headers)
        assert again.status_code == 200, again.text
        ref = again.json()
        assert ref["scores"] == doc["scores"]  # the same floats, to the last bit
        assert ref["cache"] == "l1" and ref["seq_hash"] == seq_hash and ref["events"] is None
        assert again.headers["etag"] == f'"{seq_hash}"'
    assert metric(client, "kvrank_history_by_reference_total", result="served") == 2
    # other candidates by reference: what the full request with them answers
    _, _, other = request_for("alice", n=10, c=9, seed=2)
    other["events"] = body["events"]
    other |= {k: v for k, v in body.items() if k not in ("events", "candidates")}
    full = client.post(SCORE, json=other).json()
    assert full["seq_hash"] == seq_hash
    ref = client.post(SCORE, json=by_reference(other), headers=etag(seq_hash)).json()
    assert ref["scores"] == full["scores"]


@pytest.mark.redis
def test_another_pod_serves_a_request_by_reference_from_redis(
    make_client, redis_server, request_for
):
    redis_server.cli("flushall")
    redis = {"url": redis_server.url}
    writer = make_client(redis=redis, namespace="shared")
    reader = make_client(redis=redis, namespace="shared")
    _, _, body = request_for("bob", n=12, c=5)
    doc = writer.post(SCORE, json=body).json()
    writer.portal.call(writer.app.state.kvrank.service.cache.flush)  # written behind
    for expected in ("l2", "l1"):  # read from Redis once, then from the reader's own L1
        ref = reader.post(SCORE, json=by_reference(body), headers=etag(doc["seq_hash"]))
        assert ref.status_code == 200, ref.text
        assert ref.json()["cache"] == expected and ref.json()["scores"] == doc["scores"]
    assert model_work(reader) == 2  # the two scorings: nothing encoded


@pytest.mark.redis
def test_a_hash_no_tier_holds_under_this_key_is_a_412_and_no_model_work(
    make_client, redis_server, request_for, factory, server_cfg, tmp_path
) -> None:
    """Random, another user's, a stale one (the entry invalidated), another deployment's
    (namespace) and another model version's hashes: each a 412, never a score."""
    redis_server.cli("flushall")
    redis = {"url": redis_server.url}
    pod = make_client(redis=redis, namespace="team-a")
    other_deployment = make_client(redis=redis, namespace="team-b")
    v2 = tmp_path / "v2"
    save_model(factory.model(server_cfg, seed=3, version="v2"), v2)
    other_version = make_client(redis=redis, namespace="team-a", model_dir=str(v2))
    _, _, carol = request_for("carol", n=8, c=4)
    _, _, dave = request_for("dave", n=9, c=4, seed=5)
    carols = pod.post(SCORE, json=carol).json()["seq_hash"]
    daves = pod.post(SCORE, json=dave).json()["seq_hash"]
    _, _, stale = request_for("erin", n=6, c=4, seed=7)
    stales = pod.post(SCORE, json=stale).json()["seq_hash"]
    pod.portal.call(pod.app.state.kvrank.service.cache.flush)
    assert pod.post(f"/admin/invalidate/{stale['user_id']}").json()["removed"] >= 1
    tries: list[tuple[TestClient, dict[str, Any], str]] = [
        (pod, carol, secrets.token_hex(16)) for _ in range(40)
    ]
    tries += [(pod, carol, daves), (pod, dave, carols), (pod, stale, stales)]
    tries += [(other_deployment, carol, carols), (other_version, carol, carols)]
    before = {id(c): model_work(c) for c in (pod, other_deployment, other_version)}
    for i, (client, body, seq_hash) in enumerate(tries):
        sent, headers = (
            (by_reference(body), etag(seq_hash)) if i % 2 else (by_reference(body, seq_hash), {})
        )
        resp = client.post(SCORE, json=sent, headers=headers)
        assert resp.status_code == 412, (i, resp.text)
        doc = resp.json()
        assert doc["error"].startswith("history_required") and "scores" not in doc
        assert doc["field"] == ("If-Match" if i % 2 else "seq_hash")
        assert resp.headers["x-kvrank-error"] == "history_required"
    refused = sum(
        metric(c, "kvrank_history_by_reference_total", result="history_required")
        for c in (pod, other_deployment, other_version)
    )
    assert refused == len(tries)
    assert {id(c): model_work(c) for c in (pod, other_deployment, other_version)} == before
    # the genuine hash still serves: the fuzz removed nothing
    ok = pod.post(SCORE, json=by_reference(carol), headers=etag(carols))
    assert ok.status_code == 200 and ok.json()["cache"] == "l1"


def test_a_pod_that_caches_nothing_answers_every_reference_with_412(make_client, request_for):
    client = make_client(cache_mode="full")
    _, _, body = request_for("frank")
    doc = client.post(SCORE, json=body).json()
    assert doc["seq_hash"] is None and doc["cache"] == "none"
    resp = client.post(SCORE, json=by_reference(body, secrets.token_hex(16)))
    assert resp.status_code == 412 and resp.json()["field"] == "seq_hash"


def test_mixed_or_malformed_references_are_refused_naming_the_field(make_client, request_for):
    client = make_client()
    _, _, body = request_for("gina")
    seq_hash = client.post(SCORE, json=body).json()["seq_hash"]
    user_columns = [k for k in body if k not in ("user_id", "events", "candidates")]
    cases: list[tuple[dict[str, Any], dict[str, str], int, str]] = [
        (by_reference(body), {}, 422, "events"),  # neither events nor a hash
        (body | {"seq_hash": seq_hash}, {}, 422, "events"),  # both
        (body, etag(seq_hash), 422, "events"),
        (by_reference(body, seq_hash.upper()), {}, 422, "seq_hash"),
        (by_reference(body, seq_hash[:-1]), {}, 422, "seq_hash"),
        (by_reference(body), {"If-Match": seq_hash}, 400, "If-Match"),  # unquoted
        (by_reference(body), {"If-Match": f'W/"{seq_hash}"'}, 400, "If-Match"),  # weak
        (by_reference(body), {"If-Match": f'"{seq_hash}", "{seq_hash}"'}, 400, "If-Match"),
        (by_reference(body), {"If-Match": "*"}, 400, "If-Match"),
        (by_reference(body, seq_hash), etag("0" * 32), 400, "If-Match"),  # two hashes
    ]
    cases += [
        (by_reference(body, seq_hash) | {c: body[c]}, {}, 422, c) for c in user_columns if body[c]
    ]
    for sent, headers, status, field in cases:
        resp = client.post(SCORE, json=sent, headers=headers)
        assert resp.status_code == status, (field, headers, resp.text)
        assert resp.json()["field"] == field, resp.json()
    assert metric(client, "kvrank_history_by_reference_total") == 0


def test_a_replay_by_reference_resends_the_history_only_after_a_412(
    spawn_server, request_for
) -> None:
    """``kvrank loadtest --protocol json-ref``'s caller, against two real servers in turn
    (no shared Redis): the second server does not hold the user's entry, answers the
    reference 412, and the history is sent whole there; every later reference is served."""
    import asyncio

    from kvrank.tools.replay import replay
    from kvrank.tools.workload import Request

    servers = [spawn_server(), spawn_server()]
    _, _, body = request_for("hana", n=7, c=5)
    requests = [Request(0.0, "hana", body, returning=i > 0) for i in range(4)]
    urls = [s.url for s in servers]
    results = asyncio.run(replay(requests, urls, concurrency=1, protocol="json-ref"))
    assert [r.status for r in results] == [200] * 4, results
    assert [r.by_reference for r in results] == ["", "history_required", "served", "served"]
    assert [r.outcome for r in results] == ["miss", "miss", "l1", "l1"]
    # a changed history is sent whole, whatever the user's last ETag
    _, _, changed = request_for("hana", n=8, c=5)
    bodies = [body, body, changed, changed]
    sent = [Request(0.0, "hana", b, returning=True) for b in bodies]
    again = asyncio.run(replay(sent, urls[:1], concurrency=1, protocol="json-ref"))
    assert [r.status for r in again] == [200] * 4, again
    assert [r.by_reference for r in again] == ["", "served", "", "served"]


def test_a_cached_state_that_scores_nan_is_dropped_and_made_again_never_answered(
    make_client, request_for
) -> None:
    """A state damaged in place (as device memory or a buggy writer could leave it): its
    scores are not finite, so they are never answered — the user's entries are dropped and
    made again from the events, or a request by reference hears 412 and sends them."""
    client = make_client()
    _, _, body = request_for("nan", n=9, c=5)
    first = client.post(SCORE, json=body).json()
    svc = client.app.state.kvrank.service

    def poison() -> None:
        found = client.portal.call(svc.cache.find, svc.cache.key("nan", first["seq_hash"]))
        assert found is not None and found.outcome.value == "l1"
        for layer in found.kv.layers.values():
            layer.v.fill_(float("nan"))

    poison()
    again = client.post(SCORE, json=body)
    assert again.status_code == 200, again.text
    assert again.json()["scores"] == first["scores"] and again.json()["cache"] == "miss"
    assert metric(client, "kvrank_cache_corrupt_entries_total", reason="scores") == 1
    poison()
    ref = client.post(SCORE, json=by_reference(body), headers=etag(first["seq_hash"]))
    assert ref.status_code == 412, ref.text
    assert metric(client, "kvrank_cache_corrupt_entries_total", reason="scores") == 2
    assert client.post(SCORE, json=body).json()["scores"] == first["scores"]
