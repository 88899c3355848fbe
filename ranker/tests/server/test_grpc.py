"""The Open Inference Protocol (v2) over gRPC, on a real ``kvrank serve --grpc-port``, called
by the real ``tritonclient.grpc``: the same scores as ``/v1/score`` to the bit, the history
by reference, and every refusal a status code whose message names the input."""

from __future__ import annotations

import json
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton
from oip_inputs import MODEL, SCORE, tensors
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from kvrank.model.onetrans import feature_spec
from kvrank.tools.processes import free_port

METHOD = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def spec(server_cfg):
    return feature_spec(server_cfg)


@pytest.fixture
def grpc_server(spawn_server):
    port = free_port()
    return spawn_server("--grpc-port", str(port)), f"127.0.0.1:{port}"


def _inputs(arrays: list[tuple]) -> list[Any]:
    """``tritonclient`` inputs of ``(name, datatype, array)``: raw contents, as it sends."""
    inputs = []
    for name, kind, array in arrays:
        tensor = triton.InferInput(name, list(array.shape), kind)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _refused(client: Any, arrays: list[tuple], model: str = MODEL, **kw: Any) -> Any:
    with pytest.raises(triton.InferenceServerException) as err:
        client.infer(model, _inputs(arrays), **kw)
    return err.value


def test_tritonclient_grpc_scores_as_the_json_api_does(grpc_server, request_for, spec) -> None:
    server, address = grpc_server
    _, _, body = request_for("kim", n=11, c=6)
    expected = httpx.post(f"{server.url}{SCORE}", json=body, timeout=30).json()
    client = triton.InferenceServerClient(url=address)
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready(MODEL) and not client.is_model_ready("other")
        meta = client.get_model_metadata(MODEL, as_json=True)
        assert meta["versions"] == ["v1"]
        assert {t["name"] for t in meta["inputs"]} >= {name for name, _, _ in tensors(body, spec)}
        result = client.infer(MODEL, _inputs(tensors(body, spec)), request_id="r-1")
        assert result.as_numpy("scores").astype(float).tolist() == expected["scores"]
        answer = result.get_response(as_json=True)
        assert answer["id"] == "r-1" and answer["model_version"] == "v1"
        params = answer["parameters"]
        assert params["cache"]["string_param"] == "l1"
        assert params["seq_hash"]["string_param"] == expected["seq_hash"]
        assert int(params["events"]["int64_param"]) == 11
        # the history by reference: candidates and the hash only
        ref = client.infer(MODEL, _inputs(tensors(body, spec, by_reference=expected["seq_hash"])))
        assert ref.as_numpy("scores").astype(float).tolist() == expected["scores"]
    finally:
        client.close()
    served = server.metric("kvrank_http_responses_total", route=METHOD, code="200")
    assert served == 2
    assert server.metric("kvrank_requests_total", protocol="v2-grpc", outcome="l1") == 2
    assert server.metric("kvrank_requests_total", protocol="json") == 1


def test_grpc_refusals_are_status_codes_naming_the_input(grpc_server, request_for, spec) -> None:
    server, address = grpc_server
    _, _, body = request_for("jo", n=5, c=3)
    client = triton.InferenceServerClient(url=address)
    try:
        unknown = _refused(client, tensors(body, spec, by_reference="0" * 32))
        assert unknown.status() == "StatusCode.FAILED_PRECONDITION", unknown
        assert "history_required" in unknown.message()
        negative = tensors(body, spec)
        name = next(t[0] for t in negative if t[0].startswith("events."))
        negative = [(n, k, -np.ones_like(a) if n == name else a) for n, k, a in negative]
        bad = _refused(client, negative)
        assert bad.status() == "StatusCode.INVALID_ARGUMENT" and bad.message().startswith(name)
        other = _refused(client, tensors(body, spec), model="other")
        assert other.status() == "StatusCode.NOT_FOUND", other
        routed = _refused(client, tensors(body, spec), headers={"x-kvrank-user": "someone"})
        assert routed.status() == "StatusCode.INVALID_ARGUMENT", routed
    finally:
        client.close()
    # the unknown hash cost no model work: refused before any
    assert server.metric("kvrank_history_by_reference_total", result="history_required") == 1
    assert server.metric("kvrank_requests_total") == 0


def test_typed_contents_score_as_raw_ones(grpc_server, request_for, spec) -> None:
    """A client that fills ``contents`` (int64, fp32, bytes) instead of raw bytes."""
    server, address = grpc_server
    _, _, body = request_for("lee", n=7, c=4)
    expected = httpx.post(f"{server.url}{SCORE}", json=body, timeout=30).json()
    inputs = []
    for name, kind, array in tensors(body, spec):
        if kind == "BYTES":
            contents = pb.InferTensorContents(bytes_contents=list(array.ravel()))
        elif kind == "INT64":
            contents = pb.InferTensorContents(int64_contents=array.ravel().tolist())
        else:
            contents = pb.InferTensorContents(fp32_contents=array.ravel().tolist())
        inputs.append(
            pb.ModelInferRequest.InferInputTensor(
                name=name, datatype=kind, shape=list(array.shape), contents=contents
            )
        )
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        answer = stub.ModelInfer(pb.ModelInferRequest(model_name=MODEL, inputs=inputs), timeout=30)
    scores = np.frombuffer(answer.raw_output_contents[0], "<f4").astype(float).tolist()
    assert scores == expected["scores"]
    assert answer.parameters["cache"].string_param == "l1"


@pytest.mark.parametrize("protocol", ["v2-http", "v2-grpc"])
def test_a_replay_by_the_v2_protocols_reads_each_answer_as_the_json_replay_does(
    spawn_server, request_for, spec, protocol
) -> None:
    """``kvrank loadtest --protocol v2-http|v2-grpc``'s caller against a real server: each
    answer's cache outcome read from the protocol's own answer, a refusal recorded under the
    HTTP status its gRPC code stands for, and every call counted under its protocol."""
    import asyncio

    from kvrank.tools.replay import replay
    from kvrank.tools.workload import Request

    port = free_port()
    server = spawn_server("--grpc-port", str(port))
    target = f"127.0.0.1:{port}" if protocol == "v2-grpc" else server.url
    _, _, body = request_for("ines", n=9, c=5)
    bad = {**body, "candidates": {**body["candidates"]}}
    column = next(iter(bad["candidates"]))
    bad["candidates"][column] = bad["candidates"][column][:-1]  # one row short: a bad input
    requests = [Request(0.0, "ines", b, returning=i > 0) for i, b in enumerate([body, body, bad])]
    results = asyncio.run(replay(requests, [target], concurrency=1, protocol=protocol, spec=spec))
    assert [(r.status, r.outcome) for r in results] == [(200, "miss"), (200, "l1"), (400, "error")]
    assert server.metric("kvrank_requests_total", protocol=protocol) == 2
    assert server.metric("kvrank_requests_total", protocol="json") == 0


@pytest.mark.slow
def test_example_requests_grpc_form_is_scored_as_its_json_form(
    grpc_server, artifact, kvrank_cli
) -> None:
    """``kvrank example-request --protocol v2-grpc`` prints a ``ModelInferRequest`` in
    protobuf's JSON form (what ``grpcurl -d`` sends): parsed and sent, the same scores as the
    JSON form's, and by reference with ``--seq-hash``."""
    from google.protobuf import json_format

    server, address = grpc_server
    args = ("example-request", str(artifact), "--user", "ann", "--candidates", "5")
    expected = httpx.post(f"{server.url}{SCORE}", json=json.loads(kvrank_cli(*args).stdout)).json()
    channel = grpc.insecure_channel(address)
    try:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for extra in ((), ("--seq-hash", expected["seq_hash"])):
            printed = kvrank_cli(*args, "--protocol", "v2-grpc", *extra).stdout
            request = json_format.Parse(printed, pb.ModelInferRequest())
            reply = stub.ModelInfer(request, timeout=30)
            scores = np.frombuffer(reply.raw_output_contents[0], "<f4").astype(float).tolist()
            assert scores == expected["scores"], extra
    finally:
        channel.close()
