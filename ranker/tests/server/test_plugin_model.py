"""A team's own model served end to end: the example SASRec plugin's request fields in the
OpenAPI document, its cache outcomes, its scores equal to its no-cache reference, 422s naming
its fields, a model that cannot extend served by full encodes, and `kvrank example-request`
printing a body each model scores."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

from kvrank.model.artifact import load_ranker, save_model
from kvrank.model.config import QUICK
from kvrank.model.contract import UserInput
from kvrank.model.features import example_candidates, example_user
from kvrank.model.ranker import RankerModel
from kvrank.server.schemas import body_for


@pytest.fixture
def plugin_client(make_client, sasrec_artifact):
    return make_client(model_dir=str(sasrec_artifact))


def _request(model, user_id: str, n: int, c: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    user = example_user(model.features, n, g)
    cands = example_candidates(model.features, c, g)
    return user, cands, body_for(model.features, user_id, user, cands)


def _grown(model, user: UserInput, n: int) -> UserInput:
    """``user`` with ``n`` more events."""
    more = example_user(model.features, n, torch.Generator().manual_seed(n))
    events = {k: torch.cat([v, more.events[k]]) for k, v in user.events.items()}
    return UserInput(events, user.user)


def test_the_openapi_document_shows_the_plugins_own_fields(plugin_client) -> None:
    doc = plugin_client.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    assert set(schemas["EventsIn"]["properties"]) == {"item_id", "genre", "rating"}
    assert set(schemas["CandidatesIn"]["properties"]) == {"item_id", "genre"}
    assert {"age", "occupation"} <= set(schemas["ScoreRequest"]["properties"])
    assert "profile_ids" not in schemas["ScoreRequest"]["properties"]
    body = doc["paths"]["/v1/score"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": "#/components/schemas/ScoreRequest"}


def test_plugin_scores_equal_its_reference_and_repeat_and_grow_from_the_cache(
    plugin_client, sasrec_artifact
) -> None:
    model = load_ranker(sasrec_artifact)
    user, cands, body = _request(model, "ann", 6, 9, 1)
    outcomes = []
    for _ in range(2):
        doc = plugin_client.post("/v1/score", json=body).json()
        outcomes.append(doc["cache"])
        reference = model.forward_full(user, cands).sigmoid()
        assert (torch.tensor(doc["scores"]) - reference).abs().max() <= 1e-5
    g = torch.Generator().manual_seed(5)
    more = example_user(model.features, 3, g)
    grown = type(user)(
        {k: torch.cat([v, more.events[k]]) for k, v in user.events.items()}, user.user
    )
    doc = plugin_client.post("/v1/score", json=body_for(model.features, "ann", grown, cands)).json()
    outcomes.append(doc["cache"])
    reference = model.forward_full(grown, cands).sigmoid()
    assert (torch.tensor(doc["scores"]) - reference).abs().max() <= 1e-5
    assert outcomes == ["miss", "l1", "incremental"]


def test_a_model_that_cannot_extend_encodes_grown_histories_in_full(
    make_client, sasrec_tail_artifact
) -> None:
    client = make_client(model_dir=str(sasrec_tail_artifact))
    model = load_ranker(sasrec_tail_artifact)
    user, cands, body = _request(model, "bo", 5, 4, 2)
    assert client.post("/v1/score", json=body).json()["cache"] == "miss"
    grown = user.slice(0, None)
    g = torch.Generator().manual_seed(9)
    more = example_user(model.features, 2, g)
    grown = type(user)(
        {k: torch.cat([v, more.events[k]]) for k, v in user.events.items()}, user.user
    )
    doc = client.post("/v1/score", json=body_for(model.features, "bo", grown, cands)).json()
    assert doc["cache"] == "miss"  # never "incremental": positions from the newest moved
    reference = model.forward_full(grown, cands).sigmoid()
    assert (torch.tensor(doc["scores"]) - reference).abs().max() <= 1e-5


def test_another_pod_reads_a_plugin_entry_from_redis(
    make_client, sasrec_artifact, redis_server
) -> None:
    pods = [
        # each Redis read and write given a second: the claim is what is found, not how fast
        make_client(
            model_dir=str(sasrec_artifact),
            redis={"url": redis_server.url, "op_timeout_ms": 1000},
        )
        for _ in range(2)
    ]
    model = load_ranker(sasrec_artifact)
    _, _, body = _request(model, "cy", 8, 5, 3)
    first = pods[0].post("/v1/score", json=body).json()
    pods[0].portal.call(pods[0].app.state.kvrank.service.cache.flush)
    second = pods[1].post("/v1/score", json=body).json()
    assert (first["cache"], second["cache"]) == ("miss", "l2")
    assert first["scores"] == second["scores"]


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda b: b["candidates"]["genre"].__setitem__(0, 7), "candidates.genre"),
        (lambda b: b["events"]["rating"].pop(), "events.rating"),
        (lambda b: b["events"]["item_id"].__setitem__(0, 300), "events.item_id"),
        (lambda b: b.__setitem__("age", []), "age"),
        (lambda b: b.__setitem__("profile_ids", [1]), "profile_ids"),
    ],
    ids=["genre-range", "short-ratings", "item-range", "missing-age", "built-in-field"],
)
def test_bad_plugin_requests_name_the_field(plugin_client, sasrec_artifact, mutate, field) -> None:
    _, _, body = _request(load_ranker(sasrec_artifact), "dee", 4, 3, 4)
    mutate(body)
    resp = plugin_client.post("/v1/score", json=body)
    assert resp.status_code == 422, resp.text
    assert resp.json()["field"] == field


def test_kvrank_serve_runs_the_plugin_and_reports_its_device(spawn_server, sasrec_artifact) -> None:
    pod = spawn_server(artifact=sasrec_artifact)
    ready = httpx.get(f"{pod.url}/readyz").json()
    assert ready == {
        "status": "ready",
        "model_version": "s1",
        "device": "cpu",
        "l1_budget_bytes": 512 * 2**20,  # unset: the CPU's default
    }
    assert pod.metric("kvrank_model_info", device="cpu") == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("which", ["built-in", "plugin"])
def test_example_request_prints_a_body_the_model_scores(
    which: str, make_client, artifact, sasrec_artifact, kvrank_cli
) -> None:
    directory = artifact if which == "built-in" else sasrec_artifact
    out = kvrank_cli("example-request", str(directory), "--user", "ann", "--candidates", "7")
    body = json.loads(out.stdout)
    assert body["user_id"] == "ann"
    client = make_client(model_dir=str(directory))
    resp = client.post("/v1/score", json=body)
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["scores"]) == 7
    # the same seed, the same body (a request.json that stays put)
    again = kvrank_cli("example-request", str(directory), "--user", "ann", "--candidates", "7")
    assert again.stdout == out.stdout
    # each other form of the same request: the same scores
    seq_hash, scores = resp.json()["seq_hash"], resp.json()["scores"]
    args = ("example-request", str(directory), "--user", "ann", "--candidates", "7")
    forms = {
        "/v1/score": kvrank_cli(*args, "--seq-hash", seq_hash),
        "/v2/models/ranker/infer": kvrank_cli(*args, "--protocol", "v2"),
        "/v2/models/ranker/infer ": kvrank_cli(*args, "--protocol", "v2", "--seq-hash", seq_hash),
    }
    for route, printed in forms.items():
        answer = client.post(route.strip(), json=json.loads(printed.stdout))
        assert answer.status_code == 200, (route, answer.text)
        doc = answer.json()
        assert doc.get("scores", doc.get("outputs", [{}])[0].get("data")) == scores, route


def test_example_request_without_an_artifact_says_so(tmp_path) -> None:
    out = subprocess.run(
        [str(Path(sys.executable).parent / "kvrank"), "example-request", str(tmp_path / "none")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "kvrank example-request:" in out.stderr and "none" in out.stderr


def test_the_readmes_request_json_is_the_quick_models_example_request(
    make_client, tmp_path, kvrank_cli
) -> None:
    """``examples/request.json`` (the README's curl) is what ``kvrank example-request``
    prints for any model trained with the quick profile, and it is scored."""
    quick = tmp_path / "quick"
    save_model(RankerModel(QUICK, "v1").eval(), quick)
    printed = kvrank_cli("example-request", str(quick)).stdout
    shipped = (Path(__file__).resolve().parents[3] / "examples" / "request.json").read_text()
    assert printed == shipped, "regenerate: kvrank example-request <quick artifact>"
    resp = make_client(model_dir=str(quick)).post("/v1/score", json=json.loads(shipped))
    assert resp.status_code == 200 and len(resp.json()["scores"]) == 50, resp.text
