"""A pod with fronts (``fronts: N``): an engine process owns the model, the cache and
admission control; N front processes parse requests and hand it tensors. Every answer is
the one a single-process server gives, every process counts in one scrape, a caller that
hangs up costs the engine no work, and the pod drains and stops as one."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from kvrank.model.artifact import load_ranker
from kvrank.model.features import example_candidates, example_user
from kvrank.server.oip import json_request
from kvrank.server.oip_grpc import request_message
from kvrank.server.schemas import body_for
from kvrank.tools.processes import RankerProcess, free_port

pytestmark = pytest.mark.slow  # real pods of three processes each: seconds to start

SCORE = "/v1/score"
FRONTS = {"KVRANK_FRONTS": "2"}


def post(pod: RankerProcess, body: dict[str, Any], path: str = SCORE) -> httpx.Response:
    return httpx.post(f"{pod.url}{path}", json=body, timeout=60)


def answer(resp: httpx.Response) -> tuple[int, Any]:
    """What a caller reads of an answer (not the request id, timings or latency)."""
    doc = resp.json()
    if resp.status_code != 200:
        return resp.status_code, (doc.get("field"), doc.get("error", "").split(";")[0])
    if "outputs" in doc:  # the v2 protocol's
        return 200, (doc["parameters"]["cache"], doc["outputs"][0]["data"])
    return 200, (doc["cache"], doc["scores"], doc["seq_hash"], doc["events"])


def test_a_pod_with_fronts_answers_every_form_as_one_process_does(
    spawn_server, request_for, artifact
) -> None:
    spec = load_ranker(artifact).features
    grpc_port = free_port()
    one, split = spawn_server(), spawn_server("--grpc-port", str(grpc_port), env=FRONTS)
    seen: dict[str, list[tuple[int, Any]]] = {"one": [], "split": []}
    for name, pod in (("one", one), ("split", split)):
        for user in ("ada", "bo", "cy"):
            _, _, body = request_for(user, n=9, c=6)
            first = post(pod, body)
            seq_hash = first.json()["seq_hash"]
            v2 = json_request(spec, body)
            prefetch = {k: v for k, v in body.items() if k != "candidates"} | {"user_id": "p"}
            forms = [
                first,
                post(pod, body),  # now from L1
                post(
                    pod, {"user_id": user, "seq_hash": seq_hash, "candidates": body["candidates"]}
                ),
                post(
                    pod, {"user_id": user, "seq_hash": "0" * 32, "candidates": body["candidates"]}
                ),
                post(pod, body | {"candidates": {k: [] for k in body["candidates"]}}),
                post(pod, v2, "/v2/models/ranker/infer"),
                post(pod, {"inputs": []}, "/v2/models/ranker/infer"),
                post(pod, prefetch, "/v1/prefetch"),
                post(pod, prefetch | {"user_id": ""}, "/v1/prefetch"),
            ]
            seen[name] += [answer(r) for r in forms]
    assert seen["split"] == seen["one"]
    statuses = [status for status, _ in seen["split"]]
    assert statuses == [200, 200, 200, 412, 422, 200, 400, 202, 422] * 3
    outcomes = [doc[0] for status, doc in seen["split"] if status == 200]
    assert outcomes == ["miss", "l1", "l1", "l1"] * 3
    ready = httpx.get(f"{split.url}/readyz").json()
    assert ready == httpx.get(f"{one.url}/readyz").json()
    # the v2 gRPC service, on every front's listener of the same port
    body = request_for("ada", n=9, c=6)[2]
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        reply = stub.ModelInfer(request_message(json_request(spec, body)), timeout=60)
    assert reply.parameters["cache"].string_param == "l1"
    scores = np.frombuffer(reply.raw_output_contents[0], dtype="<f4").tolist()
    assert scores == seen["one"][0][1][1]  # ada's, from one process's JSON answer


def scrape(pod: RankerProcess) -> dict[str, list[Any]]:
    """Every family in one scrape, by name (each must appear once)."""
    text = httpx.get(f"{pod.url}/metrics", timeout=30).text
    families: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        assert family.name not in families, f"{family.name} exported twice"
        families[family.name] = family.samples
    return families


def total(families: dict[str, list[Any]], name: str, **labels: str) -> float:
    return sum(
        s.value
        for s in families[name]
        if s.name == f"{name}_total" and labels.items() <= s.labels.items()
    )


def test_every_process_of_the_pod_counts_in_one_scrape(spawn_server, request_for) -> None:
    pod = spawn_server(env=FRONTS)
    bodies = [request_for(f"user-{i}", n=5, c=4)[2] for i in range(12)]
    # a connection each: the kernel spreads them over both fronts' accept queues
    for body in bodies:
        assert post(pod, body).status_code == 200
    families = scrape(pod)
    assert total(families, "kvrank_requests", outcome="miss") == 12
    assert total(families, "kvrank_http_responses", route=SCORE, code="200") == 12
    assert [s.value for s in families["kvrank_model_info"]] == [1.0]
    assert total(families, "kvrank_shed_requests") == 0
    assert families["kvrank_inflight_requests"][0].value == 0
    assert families["process_cpu_seconds"]  # the engine's own
    again = scrape(pod)  # the scrapes themselves count, the requests do not move
    assert total(again, "kvrank_requests", outcome="miss") == 12


GATE = textwrap.dedent(
    """
    import os, time
    from kvrank_sasrec.model import build as sasrec

    HOLD = os.environ["GATE_FILE"]

    def build(config, version):
        model = sasrec(config, version)
        encode = model.encode_user

        def gated(*args, **kwargs):
            deadline = time.monotonic() + 60
            while os.path.exists(HOLD) and time.monotonic() < deadline:
                time.sleep(0.01)
            return encode(*args, **kwargs)

        model.encode_user = gated
        return model
    """
)


def test_a_caller_that_hangs_up_costs_the_engine_no_model_work(
    spawn_server, sasrec_artifact, tmp_path: Path
) -> None:
    """The engine's model thread is held (the example SASRec model with a gate in its
    encode) while one caller's request holds it and a second caller's queues behind; the
    second hangs up. Released, the engine computes the first only."""
    (tmp_path / "plugin").mkdir()
    (tmp_path / "plugin" / "gate_ranker.py").write_text(GATE)
    hold = tmp_path / "hold"
    env = {
        **FRONTS,
        "KVRANK_PLUGIN": "gate_ranker:build",
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "plugin"), os.environ.get("PYTHONPATH", "")]),
        "GATE_FILE": str(hold),
    }
    pod = spawn_server(env=env, artifact=sasrec_artifact)
    hold.touch()
    held, leaver = (sasrec_body(sasrec_artifact, user) for user in ("held", "leaver"))
    first: list[httpx.Response] = []
    holder = threading.Thread(target=lambda: first.append(post(pod, held)))
    holder.start()
    wait_for(lambda: gauge(pod, "kvrank_inflight_requests") == 1)
    with socket.create_connection(("127.0.0.1", pod.port)) as caller:
        caller.sendall(raw_post(leaver))
        # it queues behind the held one in the engine; its caller hangs up
        wait_for(lambda: gauge(pod, "kvrank_inflight_requests") == 2)
    wait_for(lambda: total(scrape(pod), "kvrank_callers_left") == 1)
    hold.unlink()
    holder.join(timeout=60)
    assert first and first[0].status_code == 200, first
    families = scrape(pod)
    assert total(families, "kvrank_user_encodes", kind="full") == 1  # the held one's only
    assert total(families, "kvrank_abandoned_requests", reason="disconnected") == 1
    assert total(families, "kvrank_requests") == 1


def sasrec_body(artifact: Path, user_id: str) -> dict[str, Any]:
    spec = load_ranker(artifact).features
    user = example_user(spec, 12, torch.Generator().manual_seed(1))
    cands = example_candidates(spec, 5, torch.Generator().manual_seed(2))
    return body_for(spec, user_id, user, cands)


def raw_post(body: dict[str, Any]) -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"POST {SCORE} HTTP/1.1\r\nhost: ranker\r\ncontent-type: application/json\r\n"
        f"content-length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


def gauge(pod: RankerProcess, name: str) -> float:
    return float(scrape(pod)[name][0].value)


def wait_for(condition: Any, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, "not within a minute"
        time.sleep(0.05)


def test_sigterm_drains_the_fronts_then_stops_the_engine(
    artifact, request_for, tmp_path: Path
) -> None:
    probe = free_port()
    env = {**FRONTS, "KVRANK_DRAIN_DELAY_S": "60", "KVRANK_PROBE_PORT": str(probe)}
    pod = RankerProcess.start(artifact, tmp_path, env=env, timeout_s=60)
    try:
        # ready once every front is (the first one answering is not enough)
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{probe}/readyz").status_code == 200)
        processes = children_of(pod.proc.pid)
        assert len(processes) >= 3  # the engine and two fronts
        pod.proc.send_signal(signal.SIGTERM)
        # draining: out of the Service, still answering what comes meanwhile
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{probe}/readyz").status_code == 503)
        assert post(pod, request_for("dee", n=5, c=4)[2]).status_code == 200
        pod.proc.send_signal(signal.SIGTERM)  # a second one: stop now
        assert pod.proc.wait(timeout=30) == 0
    finally:
        pod.stop()
    wait_for(lambda: not [p for p in processes if Path(f"/proc/{p}").exists()])


def children_of(pid: int) -> list[str]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return found.stdout.split()


def fronts_of(pod: RankerProcess) -> list[int]:
    """The pod's front processes (its own process is the engine)."""
    return [
        int(pid)
        for pid in children_of(pod.proc.pid)
        if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]


def test_a_front_that_dies_ends_the_pod(spawn_server) -> None:
    pod = spawn_server(env=FRONTS)
    fronts = fronts_of(pod)
    assert len(fronts) == 2
    os.kill(fronts[0], signal.SIGKILL)
    assert pod.proc.wait(timeout=30) == 1  # the kubelet restarts it whole
    assert "exited; stopping the pod" in pod.log.read_text()
    wait_for(lambda: not [p for p in fronts if Path(f"/proc/{p}").exists()])


def test_fronts_do_not_outlive_their_engine(spawn_server) -> None:
    pod = spawn_server(env=FRONTS)
    fronts = fronts_of(pod)
    pod.proc.kill()  # the engine, killed outright: it stops nothing itself
    pod.proc.wait(timeout=30)
    wait_for(lambda: not [p for p in fronts if Path(f"/proc/{p}").exists()])


def test_a_refused_model_ends_the_pod_saying_why(artifact, tmp_path: Path) -> None:
    env = {**FRONTS, "KVRANK_MODEL_VERSION": "v9"}
    with pytest.raises(RuntimeError):
        RankerProcess.start(artifact, tmp_path, env=env, timeout_s=60)
    logs = sorted(tmp_path.glob("ranker-*.log"))[-1].read_text().strip().splitlines()
    assert "expected model_version='v9'" in logs[-1]
