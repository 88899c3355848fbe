"""Serving: a RankerDeployment answers through its Service with the model's own scores,
caches, scales (also under an autoscaler), serves a team's own model from its image, and
leaves nothing behind when deleted."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest
import torch
from artifacts import MODEL_CONFIG, PLUGIN
from rankers import CANDIDATES, NOWHERE, Ranker, Rankers, example
from release import OperatorRelease
from stack import NS, Stack

from kvrank.data.synthetic import SyntheticWorld
from kvrank.model.artifact import load_model, load_ranker
from kvrank.model.features import example_candidates, example_user
from kvrank.server.schemas import body_for
from kvrank.tools.workload import request_body
from kvrank_operator.crd import API_VERSION

pytestmark = [pytest.mark.kube, pytest.mark.slow, pytest.mark.e2e]
ROOT = Path(__file__).resolve().parent.parent


def test_the_basic_example_serves_the_models_scores_and_caches(
    stack: Stack, rankers: Rankers, operator: OperatorRelease
) -> None:
    ranker = rankers.create("feed")
    name = ranker.name
    _assert_it_owns_its_objects(stack, ranker)
    assert ranker.ready_replicas("v1") == 2
    assert len(stack.endpoints(name)) == 2
    assert ranker.namespaces() == {ranker.cache_namespace("v1"): "active"}
    # the bootstrap Job formed the managed Redis Cluster over the headless Service's DNS names
    stack.wait_for(
        lambda: (
            (stack.get("job", f"{name}-redis-bootstrap") or {}).get("status", {}).get("succeeded")
        ),
        "the Redis bootstrap Job succeeded",
        180,
    )
    for pod in ranker.redis_pods():
        info = ranker.redis_cli(pod, "cluster", "info")
        assert "cluster_state:ok" in info and "cluster_slots_assigned:16384" in info, info
    ranker.wait_condition("CacheReady")
    users = itertools.count()

    def a_repeat() -> tuple[dict[str, Any], dict[str, Any]] | None:
        """A new user scored twice through the Service: the first a miss, the second an
        answer from the cache (``None`` while it is not one). A pod Ready before the
        cluster's DNS names resolved reaches Redis within its breaker's cooldown; until
        then its misses are not written and the other pod misses them again — a cache
        failure is a miss, never an error."""
        user = f"basic-user-{next(users)}"
        first = ranker.score(user)
        assert first["cache"] == "miss" and first["model_version"] == "v1", first
        second = ranker.score(user)
        return (first, second) if second["cache"] in ("l1", "l2") else None

    first, second = stack.wait_for(a_repeat, "a repeat request answered from the cache", 60)
    assert second["scores"] == pytest.approx(first["scores"], abs=1e-4)
    # what the pods answer is the model's full forward pass (no cache), miss and hit alike
    world = SyntheticWorld(MODEL_CONFIG, 0)
    user = world.user(3, n_events=10).features
    cands, _, _ = world.candidates(world.user(3), CANDIDATES, seed=1)
    expected = load_model(stack.models / "feed-ranker" / "v1").forward_full(user, cands).sigmoid()
    for outcome in ("miss", "hit"):
        resp = stack.score(name, request_body("exact-user", user, cands))
        assert resp.status_code == 200, resp.text
        got = torch.tensor(resp.json()["scores"])
        assert torch.allclose(got, expected, atol=1e-5), (outcome, got, expected)
    table = stack.kubectl("get", "rkd", name, "-n", NS)
    for column in ("READY", "VERSION", "CANARY", "WEIGHT", "TTL", "HIT-RATIO", "AGE"):
        assert column in table
    assert "2/2" in table, table
    # `helm test`: the operator is healthy and this ranker's Service answers /readyz
    log = operator.helm_test(name)
    assert log.count("ok   200") == 3 and "FAIL" not in log, log
    # status.url is where in-cluster callers score (the test pod reached /readyz there)
    url = ranker.status()["url"]
    assert url == f"http://{name}.{NS}.svc:8080" and f"ok   200 {url}/readyz" in log, log


def _assert_it_owns_its_objects(stack: Stack, ranker: Ranker) -> None:
    """Every object the basic example makes exists and is owned by its RankerDeployment
    (deleted with it)."""
    name = ranker.name
    uid = ranker.must_get()["metadata"]["uid"]
    owned = [
        ("deployment", f"{name}-v1"),
        ("service", name),
        ("service", f"{name}-v1"),
        ("configmap", f"{name}-config"),
        ("pdb", name),
        ("statefulset", f"{name}-redis"),
        ("secret", f"{name}-redis-auth"),
        ("secret", f"{name}-redis-ranker-auth"),
        ("secret", f"{name}-cache-key"),
        ("networkpolicy", f"{name}-redis"),
        ("networkpolicy", name),
        ("networkpolicy", f"{name}-default-deny"),
        ("job", f"{name}-redis-bootstrap"),
    ]
    for kind, obj_name in owned:
        obj = stack.get(kind, obj_name)
        assert obj is not None, f"{kind}/{obj_name} missing\n{stack.report()}"
        refs = obj["metadata"].get("ownerReferences") or []
        assert refs and refs[0]["uid"] == uid, f"{kind}/{obj_name} is not owned by {name}"


def test_the_quickstart_applied_as_it_is_answers_the_readmes_request_through_status_url(
    stack: Stack, rankers: Rankers
) -> None:
    """The README's first hour: ``examples/quickstart.yaml`` unmodified (its image holds the
    model; Redis from the chart's default image), the README's ``kubectl wait`` line, the
    Service ``status.url`` names, and ``examples/request.json`` answered."""
    ranker = rankers.from_example("quickstart.yaml")
    stack.kubectl("wait", f"rkd/{ranker.name}", "-n", NS, "--for=condition=Ready", "--timeout=300s")
    url = urlsplit(ranker.status()["url"])
    assert (url.scheme, url.hostname, url.port) == ("http", f"{ranker.name}.{NS}.svc", 8080)
    (base,) = stack.base_urls(ranker.name)  # the Service the URL names, as cluster DNS has it
    request = json.loads((ROOT / "examples" / "request.json").read_text())
    first = httpx.post(f"{base}/v1/score", json=request, timeout=30)
    assert first.status_code == 200, first.text
    answer = first.json()
    assert len(answer["scores"]) == len(request["candidates"]["item_ids"]), answer
    assert answer["model_version"] == "v1" and answer["cache"] == "miss", answer
    again = httpx.post(f"{base}/v1/score", json=request, timeout=30).json()
    assert again["cache"] == "l1" and again["scores"] == answer["scores"], again
    # the same request by reference, and as Open Inference Protocol tensors under the
    # deployment's name, built from the model metadata the pod serves
    by_ref = {"user_id": request["user_id"], "candidates": request["candidates"]}
    tag = {"If-Match": first.headers["etag"]}
    ref = httpx.post(f"{base}/v1/score", json=by_ref, headers=tag, timeout=30).json()
    assert ref["scores"] == answer["scores"], ref
    model = httpx.get(f"{base}/v2/models/{ranker.name}", timeout=30).json()
    v2 = v2_request(model, request)
    infer = httpx.post(f"{base}/v2/models/{ranker.name}/infer", json=v2, timeout=30)
    assert infer.status_code == 200, infer.text
    assert infer.json()["outputs"][0]["data"] == answer["scores"]
    # and over gRPC, through the Service's grpc port, as the protocol's own messages
    assert grpc_infer(stack.grpc_address(ranker.name), ranker.name, v2) == answer["scores"]
    (pod,) = ranker.pods()
    assert pod["spec"]["containers"][0]["image"] == stack.images.quickstart
    redis = {p["spec"]["containers"][0]["image"] for p in ranker.pods("redis")}
    assert redis == {stack.images.redis}, "the chart's defaultImages.redis"


def grpc_infer(address: str, model: str, v2: dict[str, Any]) -> list[float]:
    """The scores of ``v2`` (a JSON inference request) sent as a gRPC ``ModelInfer`` with
    typed contents, as any v2 client can."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    from kvrank.server.oip_grpc import request_message

    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        reply = stub.ModelInfer(request_message(v2, model), timeout=30)
    return [float(x) for x in np.frombuffer(reply.raw_output_contents[0], "<f4")]


def v2_request(model: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """``request`` (a /v1/score body) as the v2 inference request the model's metadata
    describes: every input but the optional seq_hash, its values flattened."""
    inputs = []
    for t in model["inputs"]:
        if t.get("optional"):
            continue
        group, _, column = t["name"].rpartition(".")
        values = request[t["name"]] if not group else request[group][column]
        flat = [values] if t["datatype"] == "BYTES" else values
        while flat and isinstance(flat[0], list):
            flat = [v for row in flat for v in row]
        rows = len(values) if isinstance(values, list) else 1
        shape = [rows if d == -1 else d for d in t["shape"]]
        inputs.append({**t, "shape": shape, "data": flat})
    return {"inputs": inputs}


def test_the_scale_subresource_and_an_autoscaler_owning_the_replicas(
    stack: Stack, rankers: Rankers
) -> None:
    ranker = rankers.create("scale", redis=False)
    stack.kubectl("scale", f"rkd/{ranker.name}", "-n", NS, "--replicas=3")
    stack.wait_for(lambda: ranker.ready_replicas("v1") == 3, "3 ready replicas", 180)
    stack.wait_for(lambda: len(stack.endpoints(ranker.name)) == 3, "3 endpoints behind it")
    stack.wait_for(lambda: ranker.status().get("replicas") == 3, "status.replicas 3")
    path = f"/apis/{API_VERSION}/namespaces/{NS}/rankerdeployments/{ranker.name}/scale"
    scale = json.loads(stack.kubectl("get", "--raw", path))
    assert scale["spec"]["replicas"] == 3 and scale["status"]["replicas"] == 3, scale
    # an autoscaler takes over: the operator must leave the Deployment's replicas alone
    doc = ranker.spec(redis=False, replicas=3)
    doc["spec"]["model"]["externalReplicas"] = True
    ranker.apply(doc)
    stack.kubectl("scale", f"deployment/{ranker.version_name('v1')}", "-n", NS, "--replicas=2")
    # a reconcile after the autoscaler's change reports its 2 replicas; the same pass applied
    # the Deployment first, so replicas still at 2 means the apply left them alone
    stack.wait_for(
        lambda: [v["replicas"] for v in ranker.status().get("versions", [])] == [2],
        "status.versions at the autoscaler's 2 replicas",
    )
    ranker.wait_ready("at the autoscaler's replicas")
    assert ranker.must_deployment("v1")["spec"]["replicas"] == 2


def plugin_spec(stack: Stack, name: str, canary: str | None = None) -> dict[str, Any]:
    """``examples/bring-your-own-model.yaml`` adapted to the run: the example plugin's model
    in its own image (a derived one), L1 only (the plugin's Redis paths are the ranker
    tests' business)."""
    doc = stack.adapt(example("bring-your-own-model.yaml"))
    doc["metadata"]["name"] = name
    model = doc["spec"]["model"]
    model.update(image=stack.images.plugin, replicas=2, uri=stack.model_uri("s1", model=PLUGIN))
    model.update(version="s1", resources={}, sha256=stack.artifact_sha256("s1", model=PLUGIN))
    doc["spec"]["cache"]["redis"] = dict(NOWHERE)
    if canary is not None:
        uri = stack.model_uri(canary, model=PLUGIN)
        doc["spec"]["canary"] = {
            "version": canary,
            "uri": uri,
            "image": stack.images.plugin_canary,
            "weight": 50,
        }
    return doc


def plugin_request(stack: Stack, version: str, user: str) -> tuple[dict[str, Any], torch.Tensor]:
    """A request built from the plugin's own feature spec, and the scores its no-cache
    reference gives for it."""
    model = load_ranker(stack.models / PLUGIN / version)
    g = torch.Generator().manual_seed(len(user))
    u, c = example_user(model.features, 9, g), example_candidates(model.features, 6, g)
    return body_for(model.features, user, u, c), model.forward_full(u, c).sigmoid()


def test_a_teams_own_model_serves_from_its_image_and_a_canary_brings_its_own_code(
    stack: Stack, rankers: Rankers
) -> None:
    ranker = rankers.new("sasrec")
    name = ranker.name

    def images(version: str) -> set[str]:
        return {c["image"] for p in ranker.pods(version=version) for c in p["spec"]["containers"]}

    ranker.apply(plugin_spec(stack, name))
    ranker.wait_ready("with the plugin model", 300)
    assert images("s1") == {stack.images.plugin}
    body, expected = plugin_request(stack, "s1", "plugin-user")
    first = stack.score(name, body).json()
    assert first["model_version"] == "s1" and first["cache"] == "miss", first
    assert (torch.tensor(first["scores"]) - expected).abs().max() <= 1e-5
    again = [stack.score(name, body).json()["cache"] for _ in range(6)]
    assert "l1" in again, again  # two pods, no shared L2 here: each hits once it has the user
    bad = {**body, "candidates": {**body["candidates"], "genre": [99] * 6}}
    resp = stack.score(name, bad)
    assert resp.status_code == 422 and resp.json()["field"] == "candidates.genre", resp.text
    # a canary with its code in an image of its own, in a cache namespace of its own
    ranker.apply(plugin_spec(stack, name, canary="s2"))
    stack.wait_for(
        lambda: (
            ranker.namespaces()
            == {ranker.cache_namespace("s1"): "active", ranker.cache_namespace("s2"): "active"}
        ),
        "the plugin canary's own cache namespace",
    )
    ranker.wait_ready("with the plugin canary", 300)
    assert images("s2") == {stack.images.plugin_canary}
    body, expected = plugin_request(stack, "s2", "canary-user")
    doc = stack.score(ranker.version_name("s2"), body).json()
    assert doc["model_version"] == "s2" and doc["cache"] == "miss", doc
    assert (torch.tensor(doc["scores"]) - expected).abs().max() <= 1e-5
    # a listwise canary (candidates see the slate): its pods refuse it, naming the check
    ranker.apply(plugin_spec(stack, name, canary="s3"))
    failed = ranker.wait_condition("RankersStarted", "False", 240)
    assert "s3:" in failed["message"] and "candidates_independent" in failed["message"], failed
    still = plugin_request(stack, "s1", "still")[0]
    assert stack.score(ranker.version_name("s1"), still).status_code == 200


def test_the_claim_and_url_examples_serve_as_written_and_delete_removes_what_they_made(
    stack: Stack, rankers: Rankers
) -> None:
    """``examples/pvc-model.yaml`` with ``examples/model-store/claim.yaml`` (the claim, and a
    Job publishing the demo model onto it) and ``examples/url-model.yaml`` with
    ``examples/model-store/http.yaml`` (an artifact server in the namespace), all applied as
    written: one ranker reads its model from the claim mounted read-only, the other downloads
    it at pod start; both answer ``examples/request.json``. Deleting either RankerDeployment
    removes everything it made — and not the claim, which is the user's. (The cluster's
    storage for the claim: a volume pre-bound to it, as a provisioner would make.)"""
    store = ROOT / "examples" / "model-store"
    claim = example("pvc-model.yaml")["spec"]["model"]["volume"]["persistentVolumeClaim"]
    volume = stack.storage_for(claim["claimName"])
    try:
        for path in (store / "claim.yaml", store / "http.yaml"):
            stack.kubectl("apply", "-n", NS, "-f", str(path))
        on_claim, by_url = (
            rankers.from_example("pvc-model.yaml"),
            rankers.from_example("url-model.yaml"),
        )
        on_claim.wait_ready("from the claim", timeout=420)
        by_url.wait_ready("from the URL", timeout=420)
        (pod, *_) = on_claim.pods(version="v1")
        mounts = pod["spec"]["containers"][0]["volumeMounts"]
        mount = next(m for m in mounts if m["name"] == "models")
        assert mount == {"name": "models", "mountPath": "/models", "readOnly": True}, mount
        (pod, *_) = by_url.pods(version="v1")
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["KVRANK_MODEL_DIR"] == example("url-model.yaml")["spec"]["model"]["uri"], env
        request = json.loads((ROOT / "examples" / "request.json").read_text())
        answers = []
        for ranker in (on_claim, by_url):
            resp = stack.score(ranker.name, request)
            assert resp.status_code == 200, resp.text
            answers.append(resp.json())
            assert answers[-1]["model_version"] == "v1", answers[-1]
        # the same artifact by both roads: the same scores
        assert answers[0]["scores"] == answers[1]["scores"], answers
        for ranker in (on_claim, by_url):
            assert {"statefulset", "job", "deployment", "pod"} <= {
                kind.split(".")[0].split("/")[0] for kind in ranker.owned()
            }, ranker.owned()
            stack.kubectl("delete", "rkd", ranker.name, "-n", NS, "--wait=false")
        for ranker in (on_claim, by_url):
            stack.wait_for(lambda r=ranker: r.get() is None, f"rkd/{ranker.name} gone")
            stack.wait_for(lambda r=ranker: not r.owned(), f"everything of {ranker.name} gone", 180)
            assert not stack.endpoints(ranker.name)
        assert stack.get("pvc", claim["claimName"]) is not None, "the user's claim stays"
    finally:
        for path in (store / "claim.yaml", store / "http.yaml"):
            stack.kubectl("delete", "-n", NS, "-f", str(path), "--ignore-not-found", "--wait")
        stack.cluster.kubectl("delete", "pv", volume, "--ignore-not-found")
