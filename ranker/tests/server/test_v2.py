"""The Open Inference Protocol (v2) on the scoring port: what ``tritonclient`` and KServe
callers send — JSON or binary tensors — is scored exactly as ``/v1/score`` scores the same
user and candidates, with the same checks (an error names the input), the same cache and the
history by reference."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from oip_inputs import INFER, MODEL, SCORE, tensors

from kvrank.model.onetrans import feature_spec


@pytest.fixture(scope="module")
def spec(server_cfg):
    return feature_spec(server_cfg)


def json_request(inputs: list[tuple], **extra: Any) -> dict[str, Any]:
    rows = []
    for name, kind, array in inputs:
        data = [s.decode() for s in array.ravel()] if kind == "BYTES" else array.ravel().tolist()
        rows.append({"name": name, "datatype": kind, "shape": list(array.shape), "data": data})
    return {"inputs": rows, **extra}


def binary_request(inputs: list[tuple]) -> tuple[bytes, dict[str, str]]:
    """The binary tensor extension, by hand: JSON header, then each input's bytes."""
    rows, blobs = [], []
    for name, kind, array in inputs:
        if kind == "BYTES":
            blob = b"".join(len(s).to_bytes(4, "little") + s for s in array.ravel())
        else:
            blob = array.astype(array.dtype.newbyteorder("<")).tobytes()
        params = {"binary_data_size": len(blob)}
        rows.append(
            {"name": name, "datatype": kind, "shape": list(array.shape), "parameters": params}
        )
        blobs.append(blob)
    head = json.dumps({"inputs": rows, "parameters": {"binary_data_output": True}}).encode()
    headers = {"Inference-Header-Content-Length": str(len(head))}
    return head + b"".join(blobs), headers


def scores_of(resp) -> list[float]:
    """The ``scores`` output of an answer, JSON or binary."""
    length = resp.headers.get("inference-header-content-length")
    if length is None:
        return resp.json()["outputs"][0]["data"]
    head = json.loads(resp.content[: int(length)])
    assert head["outputs"][0]["parameters"]["binary_data_size"] == len(resp.content) - int(length)
    return np.frombuffer(resp.content[int(length) :], "<f4").astype(float).tolist()


def test_metadata_and_health_describe_the_model_from_its_features(make_client, spec) -> None:
    client = make_client()
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v2/health/ready").status_code == 200
    assert client.get(f"/v2/models/{MODEL}/ready").status_code == 200
    assert "binary_tensor_data" in client.get("/v2").json()["extensions"]
    doc = client.get(f"/v2/models/{MODEL}").json()
    assert doc["versions"] == ["v1"] and doc["outputs"][0]["name"] == "scores"
    inputs = {t["name"]: t for t in doc["inputs"]}
    assert inputs["user_id"]["datatype"] == "BYTES" and inputs["seq_hash"]["optional"]
    for col in spec.sequence:
        shape = [-1] if col.kind == "id" else [-1, col.width]
        assert inputs[f"events.{col.name}"]["shape"] == shape
    for col in spec.candidate:
        assert f"candidates.{col.name}" in inputs
    assert {c.name for c in spec.user} <= set(inputs)
    assert client.get(f"/v2/models/{MODEL}/versions/v1").status_code == 200
    for path in ("/v2/models/other", f"/v2/models/{MODEL}/versions/v9", "/v2/models/other/ready"):
        resp = client.get(path)
        assert resp.status_code == 404 and "this pod serves ranker version v1" in resp.text


def test_json_and_binary_tensors_score_as_the_json_api_does(make_client, request_for, spec):
    client = make_client()
    _, _, body = request_for("ivy", n=9, c=7)
    expected = client.post(SCORE, json=body).json()
    resp = client.post(INFER, json=json_request(tensors(body, spec), id="r-1"))
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    assert doc["id"] == "r-1" and doc["model_name"] == MODEL and doc["model_version"] == "v1"
    assert scores_of(resp) == expected["scores"]  # to the last bit
    assert doc["parameters"] == {"cache": "l1", "seq_hash": expected["seq_hash"], "events": 9}
    assert resp.headers["etag"] == f'"{expected["seq_hash"]}"'
    raw, headers = binary_request(tensors(body, spec))
    binary = client.post(INFER, content=raw, headers=headers)
    assert binary.status_code == 200, binary.text
    assert binary.headers["content-type"] == "application/octet-stream"
    assert scores_of(binary) == expected["scores"]
    # by reference: the seq_hash input, or If-Match, with the candidates only
    ref = tensors(body, spec, by_reference=expected["seq_hash"])
    assert scores_of(client.post(INFER, json=json_request(ref))) == expected["scores"]
    tag = {"If-Match": f'"{expected["seq_hash"]}"'}
    plain = json_request(tensors(body, spec, by_reference="0" * 32)[:1] + ref[2:])
    assert scores_of(client.post(INFER, json=plain, headers=tag)) == expected["scores"]
    missing = client.post(INFER, json=json_request(tensors(body, spec, by_reference="0" * 32)))
    assert missing.status_code == 412 and missing.json()["field"] == "seq_hash"


def test_bad_tensors_are_refused_naming_the_input(make_client, request_for, spec) -> None:
    client = make_client()
    _, _, body = request_for("jo")
    good = json_request(tensors(body, spec))

    def edited(name: str, **change: Any) -> dict[str, Any]:
        rows = [dict(r, **change) if r["name"] == name else r for r in good["inputs"]]
        return {"inputs": rows}

    first_event = f"events.{spec.sequence[0].name}"
    first_cand = f"candidates.{spec.candidate[0].name}"
    n = len(body["events"][spec.sequence[0].name])
    cases = [
        ({"inputs": [r for r in good["inputs"] if r["name"] != first_cand]}, first_cand),
        ({"inputs": [*good["inputs"], {**good["inputs"][-1], "name": "extra"}]}, "extra"),
        (edited(first_event, datatype="FP32"), first_event),  # ids as floats: refused
        (edited(first_event, data=[0.5] * n), first_event),
        (edited(first_event, datatype="INT8"), first_event),
        (edited(first_event, shape=[n + 1]), first_event),
        (edited(first_event, data=[-1] * n), first_event),  # a negative id
        (edited(first_cand, shape=[2, -1]), first_cand),
        (edited("user_id", data=["a*b"]), "user_id"),
        (edited("user_id", data=["jo\n"]), "user_id"),  # "$" would take the newline
        (edited("user_id", datatype="INT64", data=[1]), "user_id"),
        ({"inputs": [*good["inputs"], good["inputs"][0]]}, "user_id"),  # sent twice
        ({"inputs": "none"}, "inputs"),
    ]
    for request, field in cases:
        resp = client.post(INFER, json=request)
        assert resp.status_code == 400, (field, resp.text)
        assert resp.json()["field"] == field, (field, resp.json())
        assert resp.json()["error"].startswith(f"{field}: "), resp.json()  # what clients show
    inputs = tensors(body, spec)
    raw, headers = binary_request(inputs)
    short = client.post(INFER, content=raw[:-4], headers=headers)  # the last input cut short
    assert short.status_code == 400 and short.json()["field"] == inputs[-1][0]
    length = {"Inference-Header-Content-Length": "9" * 9}
    too_long = client.post(INFER, content=raw, headers=length)
    assert too_long.status_code == 400
    assert too_long.json()["field"] == "inference-header-content-length"
    other_user = client.post(INFER, json=good, headers={"X-KVRank-User": "someone-else"})
    assert other_user.status_code == 400 and other_user.json()["field"] == "X-KVRank-User"


def test_tritonclient_scores_against_a_real_server(spawn_server, request_for, spec) -> None:
    """The real ``tritonclient`` (HTTP), binary and JSON tensors, against ``kvrank serve``."""
    server = spawn_server()
    _, _, body = request_for("kim", n=11, c=6)
    import httpx

    expected = httpx.post(f"{server.url}{SCORE}", json=body, timeout=30).json()
    client = triton.InferenceServerClient(url=server.url.removeprefix("http://"))
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready(MODEL)
        assert client.get_model_metadata(MODEL)["versions"] == ["v1"]
        for binary in (True, False):
            inputs = []
            for name, kind, array in tensors(body, spec):
                tensor = triton.InferInput(name, list(array.shape), kind)
                tensor.set_data_from_numpy(array, binary_data=binary)
                inputs.append(tensor)
            outputs = [triton.InferRequestedOutput("scores", binary_data=binary)]
            result = client.infer(MODEL, inputs, outputs=outputs)
            assert result.as_numpy("scores").astype(float).tolist() == expected["scores"]
            assert result.get_response()["parameters"]["cache"] == "l1"
        with pytest.raises(triton.InferenceServerException, match="user_id"):
            bad = triton.InferInput("user_id", [1], "BYTES")
            bad.set_data_from_numpy(np.array([b"no spaces"], dtype=object))
            client.infer(MODEL, [bad])
    finally:
        client.close()
    # each request counted under the protocol it came by
    assert server.metric("kvrank_requests_total", protocol="json") == 1
    assert server.metric("kvrank_requests_total", protocol="v2-http", outcome="l1") == 2
    assert server.metric("kvrank_request_seconds_count", protocol="v2-http") == 2


def test_whatever_a_client_sends_to_infer_is_never_a_server_error(make_client, request_for, spec):
    """Inference requests drawn at random — names, datatypes, shapes, data and binary parts
    of any kind, around a valid request's inputs — are answered 200, 400 or 412, never 5xx."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    client = make_client()
    _, _, body = request_for("lee")
    valid = json_request(tensors(body, spec))["inputs"]
    scalars = st.one_of(
        st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.text(max_size=5), st.none()
    )
    data = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=12)
    tensor = st.fixed_dictionaries(
        {
            "name": st.sampled_from([t["name"] for t in valid] + ["x", ""]),
            "datatype": st.sampled_from(["INT64", "FP32", "BYTES", "INT8", 7]),
            "shape": st.one_of(st.lists(st.integers(-2, 5), max_size=3), st.none()),
        },
        optional={
            "data": data,
            "parameters": st.fixed_dictionaries(
                {"binary_data_size": st.one_of(st.integers(-1, 64), st.booleans())}
            ),
        },
    )
    requests = st.tuples(
        st.lists(st.one_of(tensor, st.sampled_from(valid)), max_size=6), st.binary(max_size=64)
    )
    slow = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]

    @settings(max_examples=300, deadline=None, suppress_health_check=slow)
    @given(req=requests)
    def check(req) -> None:
        inputs, tail = req
        head = json.dumps({"inputs": inputs}).encode()
        headers = {"Inference-Header-Content-Length": str(len(head))} if tail else {}
        resp = client.post(INFER, content=head + tail, headers=headers)
        assert resp.status_code in (200, 400, 412), (inputs, tail, resp.text)

    check()
