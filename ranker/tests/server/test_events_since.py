"""The history as the events since a hash: a request names the sequence hash an earlier
answer gave and sends only the events after it (``events_since``). The entry under that hash
is extended with them where the model extends it exactly, and the answer is named as the
whole history is — so a later request with the whole history finds that entry — or it is a
412 ``history_required`` before any model work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from server_metrics import metric, model_work

from kvrank.model.artifact import save_model
from kvrank.model.config import TINY

SCORE = "/v1/score"
LONG = TINY.model_copy(update={"max_events": 160})
"""TINY with a window of 160 events: histories across the chain's 64-event blocks still
extend exactly."""


@pytest.fixture(scope="module")
def long_artifact(tmp_path_factory, factory) -> Path:
    path = tmp_path_factory.mktemp("long") / "m"
    save_model(factory.model(LONG, seed=3, version="v1"), path)
    return path


def body_of(make_body, factory, user_id: str, n: int, c: int = 6) -> dict[str, Any]:
    user, cands = factory.user(LONG, n, 7), factory.candidates(LONG, c, 7)
    return dict(make_body(user_id, user, cands))


def since(body: dict[str, Any], seq_hash: str, known: int) -> dict[str, Any]:
    """``body`` as the events after its first ``known`` events and the hash named there."""
    after = {name: values[known:] for name, values in body["events"].items()}
    events_since = {"seq_hash": seq_hash, "events": after}
    return {
        "user_id": body["user_id"],
        "candidates": body["candidates"],
        "events_since": events_since,
    }


def prefix(body: dict[str, Any], known: int) -> dict[str, Any]:
    """``body`` with its first ``known`` events only."""
    return body | {"events": {name: v[:known] for name, v in body["events"].items()}}


@pytest.mark.parametrize(("known", "total"), [(10, 15), (60, 70), (64, 130)])
def test_events_since_a_hash_score_as_the_whole_history_and_take_its_name(
    make_client, long_artifact, make_body, factory, known, total
) -> None:
    client: TestClient = make_client(model_dir=str(long_artifact))
    body = body_of(make_body, factory, "nora", total)
    first = client.post(SCORE, json=prefix(body, known)).json()
    assert first["events"] == known
    extended = client.post(SCORE, json=since(body, first["seq_hash"], known))
    assert extended.status_code == 200, extended.text
    doc = extended.json()
    # the whole history, encoded from scratch by another pod: the same name, the same scores
    whole = make_client(model_dir=str(long_artifact)).post(SCORE, json=body).json()
    assert whole["cache"] == "miss" and doc["cache"] == "incremental"
    assert doc["seq_hash"] == whole["seq_hash"] and doc["events"] == total
    assert extended.headers["etag"] == f'"{whole["seq_hash"]}"'
    assert doc["scores"] == pytest.approx(whole["scores"], abs=1e-6)
    # so the whole history sent later finds the extended entry, and is scored from it
    again = client.post(SCORE, json=body).json()
    assert again["cache"] == "l1" and again["scores"] == doc["scores"]
    assert metric(client, "kvrank_user_encodes_total", kind="full") == 1
    assert metric(client, "kvrank_history_by_reference_total", result="extended") == 1


def test_events_since_chain_from_one_answer_to_the_next(
    make_client, long_artifact, make_body, factory
) -> None:
    client = make_client(model_dir=str(long_artifact))
    body = body_of(make_body, factory, "omar", 40)
    answer = client.post(SCORE, json=prefix(body, 20)).json()
    for known, total in ((20, 27), (27, 34), (34, 40)):  # each answer's hash, the events after
        step = prefix(body, total)
        answer = client.post(SCORE, json=since(step, answer["seq_hash"], known)).json()
        assert answer["cache"] == "incremental", answer
    assert answer["events"] == 40
    assert (
        answer["seq_hash"]
        == make_client(model_dir=str(long_artifact)).post(SCORE, json=body).json()["seq_hash"]
    )


def test_a_hash_that_cannot_be_extended_is_a_412_before_any_model_work(
    make_client, request_for, make_body, factory, long_artifact
) -> None:
    """Unknown, another user's, past the model's window (TINY keeps 32 events: extending
    25 by 10 slides it, which is not exact), or a pod that caches nothing: 412 naming
    ``events_since.seq_hash``, nothing computed."""
    client = make_client()
    _, _, body = request_for("pia", n=35, c=4)
    seen = client.post(SCORE, json=prefix(body, 25)).json()["seq_hash"]
    _, _, other = request_for("quinn", n=3, c=4)
    others = client.post(SCORE, json=other).json()["seq_hash"]
    cases = {
        "never seen": since(body, "0" * 32, 25),
        "another user's": since(body, others, 25),
        "past the window": since(body, seen, 25),
    }
    work = model_work(client)
    for name, sent in cases.items():
        resp = client.post(SCORE, json=sent)
        assert resp.status_code == 412, (name, resp.text)
        assert resp.json()["field"] == "events_since.seq_hash", name
        assert resp.headers["x-kvrank-error"] == "history_required", name
    assert model_work(client) == work
    assert metric(client, "kvrank_history_by_reference_total", result="history_required") == 3
    full = make_client(cache_mode="full").post(SCORE, json=since(body, seen, 25))
    assert full.status_code == 412, full.text


def test_events_since_is_the_only_form_of_the_history_in_a_request(
    make_client, request_for
) -> None:
    client = make_client()
    _, _, body = request_for("rae", n=6, c=3)
    seq_hash = client.post(SCORE, json=prefix(body, 4)).json()["seq_hash"]
    sent = since(body, seq_hash, 4)
    user_column = next(k for k in body if k not in ("user_id", "events", "candidates"))
    mixed = {
        "events": sent | {"events": body["events"]},
        "seq_hash": sent | {"seq_hash": seq_hash},
        user_column: sent | {user_column: body[user_column]},
    }
    for field, bad in mixed.items():
        resp = client.post(SCORE, json=bad)
        assert resp.status_code in (400, 422) and resp.json()["field"] == field, resp.text
    tagged = client.post(SCORE, json=sent, headers={"If-Match": f'"{seq_hash}"'})
    assert tagged.status_code == 400 and tagged.json()["field"] == "If-Match", tagged.text
    short = dict(sent["events_since"]["events"])
    first = next(iter(short))
    short[first] = short[first][:-1]  # one column a row short
    uneven = sent | {"events_since": {"seq_hash": seq_hash, "events": short}}
    resp = client.post(SCORE, json=uneven)
    assert resp.status_code == 422, resp.text
    assert resp.json()["field"].startswith("events_since.events."), resp.text


def test_the_v2_protocol_sends_events_since_as_an_input(
    make_client, long_artifact, make_body, factory
) -> None:
    """Over the Open Inference Protocol the hash is the ``events_since`` input (BYTES) and
    the ``events.*`` inputs are the events after it; the user's tensors are left out."""
    from kvrank.model.onetrans import feature_spec
    from kvrank.server.oip import json_request

    spec = feature_spec(LONG)
    client = make_client(model_dir=str(long_artifact))
    body = body_of(make_body, factory, "sam", 30)
    seq_hash = client.post(SCORE, json=prefix(body, 20)).json()["seq_hash"]
    after = body | {"events": {name: v[20:] for name, v in body["events"].items()}}
    request = json_request(spec, after)
    user_columns = {c.name for c in spec.user}
    request["inputs"] = [t for t in request["inputs"] if t["name"] not in user_columns]
    request["inputs"].append(
        {"name": "events_since", "datatype": "BYTES", "shape": [1], "data": [seq_hash]}
    )
    resp = client.post("/v2/models/ranker/infer", json=request)
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    whole = make_client(model_dir=str(long_artifact)).post(SCORE, json=body).json()
    assert answer["parameters"]["seq_hash"] == whole["seq_hash"]
    assert answer["parameters"]["events"] == 30 and answer["parameters"]["cache"] == "incremental"
    assert answer["outputs"][0]["data"] == pytest.approx(whole["scores"], abs=1e-6)
    # a user tensor beside it is refused, naming it; an unknown hash is a 412 naming the input
    users = [t for t in json_request(spec, after)["inputs"] if t["name"] in user_columns]
    refused = client.post("/v2/models/ranker/infer", json={"inputs": request["inputs"] + users})
    assert refused.status_code == 400 and refused.json()["field"] in user_columns, refused.text
    request["inputs"][-1]["data"] = ["0" * 32]
    unknown = client.post("/v2/models/ranker/infer", json=request)
    assert unknown.status_code == 412 and unknown.json()["field"] == "events_since", unknown.text
