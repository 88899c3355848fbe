"""End-to-end: what a platform engineer does with kvrank, on a real API server.

``helm install`` the operator, ``kubectl apply`` RankerDeployments, send scoring traffic
through the Services, roll a canary, promote, abort, tune the TTL, break things. The same
scenarios run on two backends (``KVRANK_CLUSTER``): ``local`` (in ``make test``: the local
cluster's real node — kubelet, containerd, kube-proxy, CoreDNS, kube-router —, the images
``make images`` builds, a managed Redis Cluster, a real Prometheus) and ``kind``
(``make e2e-kind``). The scenarios build on each other and run in file order; every wait
reports the RankerDeployments, pods, Events and operator log when it times out.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import math
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import yaml
from localkube import Cluster
from localkube.engine import Docker, Images
from stack import (
    MODEL_CONFIG,
    NS,
    OPERATOR_NS,
    OPERATOR_SELECTOR,
    PLUGIN,
    Stack,
    metric_values,
    stack_for,
)

from kvrank.data.synthetic import SyntheticWorld
from kvrank.model.artifact import load_model, load_ranker
from kvrank.model.features import example_candidates, example_user
from kvrank.server.schemas import body_for
from kvrank.tools.workload import Workload, WorkloadSettings, request_body
from kvrank_operator.sources import HIT_RATIO_WINDOW
from kvrank_operator.spec import namespace_for, parse_spec
from kvrank_operator.ttl import target_ttl

pytestmark = [pytest.mark.kube, pytest.mark.slow, pytest.mark.e2e]
ROOT = Path(__file__).resolve().parent.parent
CANDIDATES = 20


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, cluster: Cluster, docker: Docker, images: Images
) -> Iterator[Stack]:
    s = stack_for(cluster, tmp_path_factory.mktemp("e2e"), docker, images)
    s.start()
    try:
        yield s
    finally:
        s.stop()


BODIES = [
    r.body
    for r in Workload(MODEL_CONFIG, WorkloadSettings(users=50, candidates=CANDIDATES)).requests(50)
]


def prometheus_seconds(duration: str) -> int:
    """``"2m"`` → 120."""
    units = {"s": 1, "m": 60, "h": 3600}
    return int(duration[:-1]) * units[duration[-1]]


def body(user: str, i: int = 0) -> dict[str, Any]:
    return {**BODIES[i % len(BODIES)], "user_id": user}


def example(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / name).read_text())
    return doc


def status(stack: Stack, name: str) -> dict[str, Any]:
    return ((stack.get("rkd", name) or {}).get("status")) or {}


def condition(stack: Stack, name: str, ctype: str) -> dict[str, Any] | None:
    for c in status(stack, name).get("conditions", []):
        if c["type"] == ctype:
            return dict(c)
    return None


def ready(stack: Stack, name: str) -> bool:
    st = stack.get("rkd", name) or {}
    c = condition(stack, name, "Ready")
    return bool(
        c
        and c["status"] == "True"
        and c.get("observedGeneration", st.get("metadata", {}).get("generation"))
        == st.get("metadata", {}).get("generation")
    )


def namespaces(stack: Stack, name: str) -> dict[str, str]:
    return {e["namespace"]: e["state"] for e in status(stack, name).get("cacheNamespaces", [])}


def ok_score(stack: Stack, service: str, user: str, i: int = 0) -> dict[str, Any]:
    resp = stack.score(service, body(user, i))
    assert resp.status_code == 200, f"{service}: {resp.status_code} {resp.text[:500]}"
    out: dict[str, Any] = resp.json()
    assert len(out["scores"]) == CANDIDATES
    assert all(math.isfinite(s) for s in out["scores"])
    return out


def feed_ranker(stack: Stack, **spec: Any) -> dict[str, Any]:
    doc = stack.adapt(example("basic.yaml"))
    for key, value in spec.items():
        doc["spec"][key] = value
    return doc


# ---------------------------------------------------------------------------- install
PREVIOUS_CHART_COMMIT = "e3f6f27"
"""The last commit of chart 0.1.0: no artifact checksums in its CRD, no CRD upgrades."""


def previous_chart(workdir: Path) -> Path:
    """Chart 0.1.0 as it was released, from the repository's history."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", PREVIOUS_CHART_COMMIT, "charts/kvrank-operator"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(workdir)], input=archive, check=True)
    return workdir / "charts" / "kvrank-operator"


def model_properties(stack: Stack) -> dict[str, Any]:
    doc = json.loads(stack.kubectl("get", "crd", "rankerdeployments.kvrank.io", "-o", "json"))
    schema = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    props: dict[str, Any] = schema["properties"]["spec"]["properties"]["model"]["properties"]
    return props


def test_01_install_chart_crd_and_operator(stack: Stack) -> None:
    # the previous release first: chart 0.1.0 installs its CRD from crds/ (no checksums)
    stack.kubectl("delete", "crd", "rankerdeployments.kvrank.io", "--ignore-not-found")
    stack.install_operator(previous_chart(stack.workdir))
    assert "sha256" not in model_properties(stack)
    assert "kvrank-operator-0.1.0" in stack.cluster.helm("list", "-n", OPERATOR_NS).stdout
    # helm upgrade never touches a chart's crds/: the upgraded operator changes the CRD
    stack.upgrade_operator()
    assert "kvrank-operator-0.2.0" in stack.cluster.helm("list", "-n", OPERATOR_NS).stdout
    stack.wait_for(
        lambda: "sha256" in model_properties(stack), "the CRD schema upgraded in place", 120
    )
    crd_doc = json.loads(stack.kubectl("get", "crd", "rankerdeployments.kvrank.io", "-o", "json"))
    established = [c for c in crd_doc["status"]["conditions"] if c["type"] == "Established"]
    assert established and established[0]["status"] == "True", crd_doc["status"]
    dep = stack.wait_for(
        lambda: next(
            (
                d
                for d in json.loads(
                    stack.kubectl("get", "deployment", "-n", OPERATOR_NS, "-o", "json")
                )["items"]
                if (d.get("status") or {}).get("readyReplicas") == 2
            ),
            None,
        ),
        "both operator replicas Ready",
    )
    assert dep["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    # one of the two leads; the other stands by
    replicas = {p["metadata"]["name"] for p in stack.select("pods", OPERATOR_SELECTOR, OPERATOR_NS)}
    assert stack.wait_for(stack.operator_leader, "an operator holds the Lease", 60) in replicas
    columns = [c["name"] for c in crd_doc["spec"]["versions"][0]["additionalPrinterColumns"]]
    for column in ("Ready", "Version", "Canary", "Weight", "TTL", "Hit-Ratio", "Age"):
        assert column in columns
    assert "No resources found" in stack.cluster.kubectl("get", "rkd", "-n", NS).stderr


# ---------------------------------------------------------------------------- basic
def test_02_basic_example_serves_and_caches(stack: Stack) -> None:
    stack.apply(feed_ranker(stack))
    stack.wait_for(lambda: ready(stack, "feed-ranker"), "feed-ranker Ready", 240)
    uid = stack.must_get("rkd", "feed-ranker")["metadata"]["uid"]
    owned = [
        ("deployment", "feed-ranker-v1"),
        ("service", "feed-ranker"),
        ("service", "feed-ranker-v1"),
        ("configmap", "feed-ranker-config"),
        ("pdb", "feed-ranker"),
        ("statefulset", "feed-ranker-redis"),
        ("secret", "feed-ranker-redis-auth"),
        ("networkpolicy", "feed-ranker-redis"),
        ("job", "feed-ranker-redis-bootstrap"),
    ]
    for kind, name in owned:
        obj = stack.get(kind, name)
        assert obj is not None, f"{kind}/{name} missing\n{stack.report()}"
        refs = obj["metadata"].get("ownerReferences") or []
        assert refs and refs[0]["uid"] == uid, f"{kind}/{name} is not owned by feed-ranker"
    assert stack.must_get("deployment", "feed-ranker-v1")["status"]["readyReplicas"] == 2
    assert len(stack.endpoints("feed-ranker")) == 2
    assert namespaces(stack, "feed-ranker") == {namespace_for("v1"): "active"}
    # the bootstrap Job formed the managed Redis Cluster over the headless Service's DNS names
    stack.wait_for(
        lambda: (
            (stack.get("job", "feed-ranker-redis-bootstrap") or {})
            .get("status", {})
            .get("succeeded")
        ),
        "the Redis bootstrap Job succeeded",
        180,
    )
    for pod in stack.redis_pods():
        info = stack.redis_cli(pod, "cluster", "info")
        assert "cluster_state:ok" in info and "cluster_slots_assigned:16384" in info, info
    stack.wait_for(
        lambda: (c := condition(stack, "feed-ranker", "CacheReady")) and c["status"] == "True",
        "CacheReady",
    )
    first = ok_score(stack, "feed-ranker", "basic-user")
    assert first["cache"] == "miss" and first["model_version"] == "v1"
    second = ok_score(stack, "feed-ranker", "basic-user")
    assert second["cache"] in ("l1", "l2"), second
    assert second["scores"] == pytest.approx(first["scores"], abs=1e-4)
    # what the pods answer is the model's full forward pass (no cache), miss and hit alike
    world = SyntheticWorld(MODEL_CONFIG, 0)
    user = world.user(3, n_events=10).features
    cands, _, _ = world.candidates(world.user(3), CANDIDATES, seed=1)
    expected = load_model(stack.models / "feed-ranker" / "v1").forward_full(user, cands).sigmoid()
    for outcome in ("miss", "hit"):
        resp = stack.score("feed-ranker", request_body("exact-user", user, cands))
        assert resp.status_code == 200, resp.text
        got = torch.tensor(resp.json()["scores"])
        assert torch.allclose(got, expected, atol=1e-5), (outcome, got, expected)
    table = stack.kubectl("get", "rkd", "-n", NS)
    for column in ("READY", "VERSION", "CANARY", "WEIGHT", "TTL", "HIT-RATIO", "AGE"):
        assert column in table
    assert "2/2" in table, table
    # `helm test`: the operator is healthy and feed-ranker's Service answers /readyz
    log = stack.helm_test("feed-ranker")
    assert log.count("ok   200") == 3 and "FAIL" not in log, log
    assert "feed-ranker.kvrank-e2e.svc:8080/readyz" in log, log


# ---------------------------------------------------------------------------- network policy
def connect_from(stack: Stack, pod: str, ip: str, port: int) -> str:
    """Try a TCP connection from inside ``pod``: 'connected' or the error."""
    code = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('{ip}', {port}), timeout=4).close(); print('connected')\n"
        "except OSError as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    return stack.kubectl("exec", "-n", NS, pod, "--", "python", "-c", code).strip()


def http_status_from(stack: Stack, pod: str, url: str) -> str:
    """The HTTP status of a GET from inside ``pod`` (or the error)."""
    code = (
        "import httpx\n"
        "try:\n"
        f"    print(httpx.get('{url}', timeout=5).status_code)\n"
        "except httpx.HTTPError as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    return stack.kubectl("exec", "-n", NS, pod, "--", "python", "-c", code).strip()


def test_03_network_policy_lets_only_rankers_reach_redis(stack: Stack) -> None:
    redis_pod = stack.get("pod", "feed-ranker-redis-0")
    assert redis_pod is not None
    redis_ip = redis_pod["status"]["podIP"]
    ranker = stack.select("pods", "app.kubernetes.io/instance=feed-ranker,kvrank.io/version=v1")[0]
    outsider = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "outsider", "labels": {"app": "outsider"}},
        "spec": {
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 10001,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "sleep",
                    "image": stack.images.ranker,
                    "command": ["sleep", "3600"],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }
    stack.apply(outsider)
    try:
        stack.kubectl("wait", "-n", NS, "--for=condition=Ready", "pod/outsider", "--timeout=120s")
        # the same pod reaches an unprotected pod (a ranker): only the policy stands in between
        ranker_ip = ranker["status"]["podIP"]
        assert connect_from(stack, "outsider", ranker_ip, 8080) == "connected"
        assert connect_from(stack, "outsider", redis_ip, 6379) != "connected"
        assert connect_from(stack, ranker["metadata"]["name"], redis_ip, 6379) == "connected"
        # admin actions: on the pods' admin port, not through the scoring Service
        admin = f"http://{ranker_ip}:8081/admin/config"
        scoring = f"http://feed-ranker.{NS}.svc:8080/admin/config"
        assert http_status_from(stack, "outsider", admin) == "200"
        assert http_status_from(stack, "outsider", scoring) == "404"
    finally:
        stack.kubectl("delete", "pod", "-n", NS, "outsider", "--wait=false", check=False)


def test_04_every_pod_is_admitted_under_restricted_pod_security(stack: Stack) -> None:
    for ns in (NS, OPERATOR_NS):
        labels = json.loads(stack.kubectl("get", "namespace", ns, "-o", "json"))["metadata"][
            "labels"
        ]
        assert labels.get("pod-security.kubernetes.io/enforce") == "restricted", labels
    # a pod the profile forbids is refused, so the label is enforced, not decorative
    root = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "runs-as-root"},
        "spec": {"containers": [{"name": "c", "image": stack.images.ranker}]},
    }
    out = stack.apply(root, check=False)
    assert out.returncode != 0 and "restricted" in out.stderr, out.stderr
    # everything the chart and the operator created runs: Redis, its bootstrap Job, rankers
    pods = stack.select("pods", "app.kubernetes.io/instance=feed-ranker")
    components = {p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods}
    assert {"ranker", "redis", "redis-bootstrap"} <= components, components
    operator = stack.select("pods", OPERATOR_SELECTOR, OPERATOR_NS)
    assert operator and operator[0]["status"]["phase"] == "Running"
    # the managed Redis password is in no process's command line on the node (any local
    # user can read those): redis-server includes it from a memory-backed file, redis-cli
    # (probes, bootstrap) reads it from REDISCLI_AUTH
    password = stack.redis_password()
    lines = stack.command_lines()
    assert any("redis-server" in line for line in lines), "no redis-server process seen"
    assert not [line for line in lines if password in line]


# ---------------------------------------------------------------------------- scale
def test_05_scale_subresource_and_autoscaler_owned_replicas(stack: Stack) -> None:
    stack.kubectl("scale", "rkd/feed-ranker", "-n", NS, "--replicas=3")
    stack.wait_for(
        lambda: (
            (stack.get("deployment", "feed-ranker-v1") or {}).get("status", {}).get("readyReplicas")
            == 3
        ),
        "feed-ranker-v1 at 3 ready replicas",
        180,
    )
    stack.wait_for(
        lambda: len(stack.endpoints("feed-ranker")) == 3, "3 endpoints behind feed-ranker"
    )
    stack.wait_for(lambda: status(stack, "feed-ranker").get("replicas") == 3, "status.replicas 3")
    scale = json.loads(
        stack.kubectl(
            "get",
            "--raw",
            f"/apis/kvrank.io/v1alpha1/namespaces/{NS}/rankerdeployments/feed-ranker/scale",
        )
    )
    assert scale["spec"]["replicas"] == 3 and scale["status"]["replicas"] == 3, scale
    # an autoscaler takes over: the operator must leave the Deployment's replicas alone
    doc = feed_ranker(stack)
    doc["spec"]["model"]["replicas"] = 3
    doc["spec"]["model"]["externalReplicas"] = True
    stack.apply(doc)
    stack.kubectl("scale", "deployment/feed-ranker-v1", "-n", NS, "--replicas=2")
    # a reconcile after the autoscaler's change reports its 2 replicas; the same pass applied
    # the Deployment first, so replicas still at 2 means the apply left them alone
    stack.wait_for(
        lambda: [v["replicas"] for v in status(stack, "feed-ranker").get("versions", [])] == [2],
        "status.versions at the autoscaler's 2 replicas",
    )
    stack.wait_for(lambda: ready(stack, "feed-ranker"), "Ready at the autoscaler's replicas")
    assert stack.must_get("deployment", "feed-ranker-v1")["spec"]["replicas"] == 2


# ---------------------------------------------------------------------------- canary
def canary_spec(stack: Stack, version: str | None, weight: int = 20) -> dict[str, Any]:
    doc = feed_ranker(stack)
    doc["spec"]["model"]["replicas"] = 5
    doc["spec"]["cache"]["retiredNamespaceGraceSeconds"] = 3
    if version is not None:
        doc["spec"]["canary"] = {
            "version": version,
            "uri": stack.model_uri(version),
            "weight": weight,
        }
    return doc


def test_06_canary_splits_replicas_and_cache_namespaces(stack: Stack) -> None:
    stack.apply(canary_spec(stack, "v2"))
    stack.wait_for(
        lambda: (
            namespaces(stack, "feed-ranker")
            == {namespace_for("v1"): "active", namespace_for("v2"): "active"}
        ),
        "two active cache namespaces",
    )
    stack.wait_for(lambda: ready(stack, "feed-ranker"), "Ready with the canary", 240)
    assert stack.must_get("deployment", "feed-ranker-v1")["spec"]["replicas"] == 4
    assert stack.must_get("deployment", "feed-ranker-v2")["spec"]["replicas"] == 1
    canary = condition(stack, "feed-ranker", "CanaryReady")
    assert canary is not None and canary["status"] == "True", canary
    for version in ("v1", "v2"):
        out = ok_score(stack, f"feed-ranker-{version}", f"canary-user-{version}")
        assert out["model_version"] == version
    assert stack.redis_keys(namespace_for("v1")) > 0
    assert stack.redis_keys(namespace_for("v2")) > 0
    # kube-proxy picks at random: 40 requests miss the 1-in-5 canary with p = 0.8^40 ≈ 1e-4
    versions = {ok_score(stack, "feed-ranker", f"mixed-{i}", i)["model_version"] for i in range(40)}
    assert versions == {"v1", "v2"}, "the shared Service must reach both versions"


# ---------------------------------------------------------------------------- promote
def test_07_promote_retires_and_purges_the_old_namespace(stack: Stack) -> None:
    assert stack.redis_keys(namespace_for("v1")) > 0
    doc = canary_spec(stack, None)
    doc["spec"]["model"].update(version="v2", uri=stack.model_uri("v2"))
    stack.apply(doc)
    failures: list[str] = []
    deadline = time.monotonic() + 180
    i = 0
    while time.monotonic() < deadline:  # no window in which no version answers
        resp = stack.score("feed-ranker", body(f"promo-{i % 5}", i))
        if resp.status_code != 200:
            failures.append(f"{resp.status_code} {resp.text[:200]}")
        i += 1
        if namespaces(stack, "feed-ranker").get(namespace_for("v1")) == "purged":
            break
    assert namespaces(stack, "feed-ranker").get(namespace_for("v1")) == "purged", stack.report()
    assert not failures, failures[:5]
    assert stack.redis_keys(namespace_for("v1")) == 0, "v1's cache entries must be gone from Redis"
    (job,) = stack.select("jobs", f"kvrank.io/cache-namespace={namespace_for('v1')}")
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:4] == ["cache", "purge", "--namespace", namespace_for("v1")], args
    assert stack.redis_keys(namespace_for("v2")) > 0
    stack.wait_for(
        lambda: stack.get("deployment", "feed-ranker-v1") is None, "v1 Deployment removed"
    )
    stack.wait_for(
        lambda: (
            (stack.get("deployment", "feed-ranker-v2") or {}).get("status", {}).get("readyReplicas")
            == 5
        ),
        "v2 at all 5 replicas",
        240,
    )
    assert ok_score(stack, "feed-ranker", "after-promote")["model_version"] == "v2"


# ---------------------------------------------------------------------------- abort
def test_08_abort_purges_the_canary_namespace_only(stack: Stack) -> None:
    stable = stack.must_get("deployment", "feed-ranker-v2")
    doc = canary_spec(stack, "v3")
    doc["spec"]["model"].update(version="v2", uri=stack.model_uri("v2"))
    stack.apply(doc)
    stack.wait_for(
        lambda: namespaces(stack, "feed-ranker").get(namespace_for("v3")) == "active", "v3 active"
    )
    stack.wait_for(lambda: ready(stack, "feed-ranker"), "Ready with canary v3", 240)
    assert ok_score(stack, "feed-ranker-v3", "abort-user")["model_version"] == "v3"
    assert stack.redis_keys(namespace_for("v3")) > 0
    doc = canary_spec(stack, None)
    doc["spec"]["model"].update(version="v2", uri=stack.model_uri("v2"))
    stack.apply(doc)
    stack.wait_for(
        lambda: namespaces(stack, "feed-ranker").get(namespace_for("v3")) == "purged", "v3 purged"
    )
    assert stack.redis_keys(namespace_for("v3")) == 0
    # the stable namespace is never purged (its entries only expire by their TTL)
    assert not stack.select("jobs", f"kvrank.io/cache-namespace={namespace_for('v2')}")
    after = stack.get("deployment", "feed-ranker-v2")
    assert after is not None and after["metadata"]["uid"] == stable["metadata"]["uid"]
    assert namespaces(stack, "feed-ranker").get(namespace_for("v2")) == "active"
    stack.wait_for(
        lambda: stack.get("deployment", "feed-ranker-v3") is None, "v3 Deployment removed"
    )


# ---------------------------------------------------------------------------- TTL
def test_09_ttl_converges_on_a_slow_starting_ranker_with_a_tls_only_redis(
    stack: Stack,
) -> None:
    doc = stack.adapt(example("basic.yaml"))
    doc["metadata"]["name"] = "ttl-ranker"
    doc["spec"]["model"]["replicas"] = 1
    doc["spec"]["cache"]["redis"]["tls"] = True  # certificates generated by the operator
    doc["spec"]["model"]["uri"] = stack.model_uri("v1", slow=True)
    doc["spec"]["ttl"] = {
        "mode": "auto",
        "factor": 3,
        "minSeconds": 1,
        "maxSeconds": 300,
        "intervalSeconds": 5,
        "source": stack.ttl_source(),
    }
    stack.apply(doc)
    stack.wait_for(lambda: ready(stack, "ttl-ranker"), "ttl-ranker Ready", 300)
    pod = stack.select(
        "pods", "app.kubernetes.io/instance=ttl-ranker,app.kubernetes.io/component=ranker"
    )[0]
    # its model came from a slow store: loading took longer than the liveness probe allows
    # (3 × 10 s), and the startupProbe kept the kubelet from killing it
    started = dt.datetime.fromisoformat(pod["status"]["startTime"])
    became_ready = next(
        dt.datetime.fromisoformat(c["lastTransitionTime"])
        for c in pod["status"]["conditions"]
        if c["type"] == "Ready"
    )
    liveness = pod["spec"]["containers"][0]["livenessProbe"]
    budget = liveness["periodSeconds"] * liveness["failureThreshold"]
    assert (became_ready - started).total_seconds() > budget, (started, became_ready)
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0

    stop = threading.Event()

    def drive() -> None:  # 4 users, each returning every 1.5 s (on a fixed schedule)
        next_round = time.monotonic()
        while not stop.is_set():
            for u in range(4):
                ok_score(stack, "ttl-ranker", f"ttl-user-{u}", u)
            next_round += 1.5
            stop.wait(max(0.0, next_round - time.monotonic()))

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    try:

        def converged() -> dict[str, Any] | None:
            ttl = status(stack, "ttl-ranker").get("ttl") or {}
            mean = ttl.get("meanIntervalSeconds")
            return ttl if mean and abs(mean - 1.5) <= 0.3 else None

        tuned = stack.wait_for(converged, "status.ttl from a 1.5 s mean interval", 150)
        assert tuned["source"] == stack.ttl_source()["type"]
        ttl_spec = parse_spec(stack.must_get("rkd", "ttl-ranker")["spec"]).ttl
        expected = target_ttl(tuned["meanIntervalSeconds"], ttl_spec)  # the product's formula
        assert tuned["seconds"] == pytest.approx(expected, rel=0.01), tuned
        cm = stack.must_get("configmap", "ttl-ranker-config")
        assert yaml.safe_load(cm["data"]["ranker.yaml"])["ttl"]["fixed_seconds"] == tuned["seconds"]

        def applied() -> bool:
            ttls = metric_values(stack.metrics("ttl-ranker"), "kvrank_cache_ttl_seconds")
            return bool(ttls) and all(v == pytest.approx(tuned["seconds"], rel=0.01) for v in ttls)

        stack.wait_for(applied, "the ranker's kvrank_cache_ttl_seconds at the tuned TTL", 60)
        # the same users keep coming back: nearly every request is a cache hit
        ratio = stack.wait_for(
            lambda: status(stack, "ttl-ranker").get("hitRatio"), "status.hitRatio", 60
        )
        assert 0.5 < ratio <= 1.0, ratio
        row = stack.kubectl("get", "rkd", "ttl-ranker", "-n", NS).splitlines()[1]
        assert str(tuned["seconds"]) in row and str(ratio)[:3] in row, row
        # its Redis speaks TLS only: the ranker wrote its entries over it, the operator's
        # health check reads the cluster over it, and plain text is not even answered
        assert stack.redis_keys(namespace_for("v1"), instance="ttl-ranker") > 0
        cache = condition(stack, "ttl-ranker", "CacheReady")
        assert cache and cache["status"] == "True" and cache["reason"] == "ClusterOk", cache
        (node, *_) = stack.redis_pods("ttl-ranker")
        assert "PONG" in stack.redis_cli(node, "ping")
        assert "PONG" not in stack.redis_cli(node, "ping", tls=False, check=False)
    finally:
        stop.set()
        driver.join(timeout=30)
    after = stack.select(
        "pods", "app.kubernetes.io/instance=ttl-ranker,app.kubernetes.io/component=ranker"
    )[0]
    assert after["metadata"]["uid"] == pod["metadata"]["uid"], "the pod was replaced"
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0, "the ranker restarted"


# ---------------------------------------------------------------------------- bad input
def test_10_invalid_specs_and_artifacts_are_refused_and_nothing_is_deleted(
    stack: Stack,
) -> None:
    bad = canary_spec(stack, "v3", weight=150)
    out = stack.apply(bad, check=False)
    assert out.returncode != 0
    assert "spec.canary.weight" in out.stderr and "100" in out.stderr, out.stderr
    bad = feed_ranker(stack)
    bad["spec"]["model"]["replicas"] = -1
    out = stack.apply(bad, check=False)
    assert out.returncode != 0 and "spec.model.replicas" in out.stderr, out.stderr
    # a live managed Redis Cluster is not resharded: refused at apply, with what to do instead
    reshard = feed_ranker(stack)
    reshard["spec"]["cache"]["redis"]["shards"] = 4
    out = stack.apply(reshard, check=False)
    assert out.returncode != 0 and "spec.cache.redis.shards" in out.stderr, out.stderr
    assert "no online resharding" in out.stderr and "new RankerDeployment" in out.stderr
    # a canary of the stable version: a cross-field rule, also refused at apply (the
    # operator's own check stays as a second line, see the operator's tests)
    serving = stack.must_get("deployment", "feed-ranker-v2")["metadata"]["uid"]
    wrong = canary_spec(stack, "v2")
    wrong["spec"]["model"].update(version="v2", uri=stack.model_uri("v2"))
    out = stack.apply(wrong, check=False)
    assert out.returncode != 0 and "spec.canary.version" in out.stderr, out.stderr
    assert "must differ from model.version" in out.stderr, out.stderr
    # nothing reached the operator: the same Deployment (not a re-created one) still serves
    degraded = condition(stack, "feed-ranker", "Degraded")
    assert degraded is not None and degraded["status"] == "False", degraded
    assert stack.must_get("deployment", "feed-ranker-v2")["metadata"]["uid"] == serving
    assert ok_score(stack, "feed-ranker", "still-serving")["model_version"] == "v2"
    # a canary whose artifact does not match its checksum: its pods refuse to serve it, the
    # operator says which version and why, the stable version keeps serving
    mismatch = canary_spec(stack, "v3")
    mismatch["spec"]["model"].update(version="v2", uri=stack.model_uri("v2"))
    mismatch["spec"]["canary"]["sha256"] = "0" * 64
    stack.apply(mismatch)
    failed = stack.wait_for(
        lambda: (
            (c := condition(stack, "feed-ranker", "RankersStarted"))
            and c["status"] == "False"
            and c
        ),
        "RankersStarted False for the mismatching canary",
        180,
    )
    assert failed["reason"] == "StartFailed" and "v3:" in failed["message"], failed
    assert "sha256" in failed["message"] and "expected 0000" in failed["message"], failed
    assert ok_score(stack, "feed-ranker-v2", "stable-during-bad-canary")["model_version"] == "v2"
    restore = canary_spec(stack, None)
    restore["spec"]["model"].update(version="v2", uri=stack.model_uri("v2"))
    stack.apply(restore)
    stack.wait_for(
        lambda: (c := condition(stack, "feed-ranker", "RankersStarted")) and c["status"] == "True",
        "RankersStarted True once the canary is gone",
        120,
    )
    stack.wait_for(
        lambda: stack.get("deployment", "feed-ranker-v3") is None,
        "the mismatching canary's Deployment removed",
        120,
    )


# ---------------------------------------------------------------------------- resilience
def test_11_the_standby_operator_takes_over_when_the_leader_is_killed_mid_rollout(
    stack: Stack,
) -> None:
    def both_running() -> set[str] | None:
        pods = stack.select("pods", OPERATOR_SELECTOR, OPERATOR_NS)
        names = {p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")}
        return names if len(names) == 2 else None

    pods = stack.wait_for(both_running, "two operator pods", 120)
    leader = stack.wait_for(stack.operator_leader, "an operator holds the Lease", 60)
    (standby,) = pods - {leader}
    started = dt.datetime.now(dt.UTC)
    doc = canary_spec(stack, "v3", weight=40)
    doc["spec"]["model"].update(version="v2", uri=stack.model_uri("v2"))
    stack.apply(doc)
    # the leader itself began the rollout (its own apply of v3's Deployment, not one left
    # by an earlier scenario): only then is it killed mid-rollout
    stack.wait_for(
        lambda: any(
            pod == leader and what.endswith(f" deployments {NS}/feed-ranker-v3")
            for _, pod, what in stack.operator_writes(started)
        ),
        "the leader created v3's Deployment",
        60,
    )
    killed = dt.datetime.now(dt.UTC)
    stack.kill_operator_pod(leader)  # v3's pods are still starting: the rollout is half done
    # the standby, or the leader's replacement when it observed the Lease expire first (a
    # force-deleted container may renew a little longer: both then wait out the duration)
    successor = stack.wait_for(
        lambda: (holder := stack.operator_leader()) not in (None, leader) and holder,
        "another replica leads",
        60,
    )
    stack.wait_for(
        lambda: (
            {k for k, v in namespaces(stack, "feed-ranker").items() if v == "active"}
            == {namespace_for("v2"), namespace_for("v3")}
        ),
        "both namespaces active after the operator restart",
        240,
    )
    stack.wait_for(lambda: ready(stack, "feed-ranker"), "Ready after the restart", 240)
    assert stack.must_get("deployment", "feed-ranker-v2")["spec"]["replicas"] == 3
    assert stack.must_get("deployment", "feed-ranker-v3")["spec"]["replicas"] == 2
    assert ok_score(stack, "feed-ranker-v3", "after-operator-restart")["model_version"] == "v3"
    # never two reconcilers: every write of the killed leader came before its successor's
    # first, and the replica that did not lead wrote nothing
    writes = [w for w in stack.operator_writes(started) if " leases " not in w[2]]
    writers = [pod for pod, _ in itertools.groupby(w[1] for w in writes)]
    assert writers == [leader, successor], [f"{w[0]:%T.%f} {w[1]} {w[2]}" for w in writes]
    first = next(w[0] for w in writes if w[1] == successor)
    which = "standby" if successor == standby else "replacement"
    print(f"the {which}'s first write {(first - killed).total_seconds():.1f} s after the kill")


def test_12_redis_pod_deleted_under_load_scoring_keeps_succeeding_and_the_cluster_heals(
    stack: Stack,
) -> None:
    def cache_ready() -> dict[str, Any] | None:
        return condition(stack, "feed-ranker", "CacheReady")

    stack.wait_for(lambda: (c := cache_ready()) and c["status"] == "True", "CacheReady before")
    results: list[tuple[int, str]] = []
    stop = threading.Event()

    def load() -> None:
        i = 0
        while not stop.is_set():
            resp = stack.score("feed-ranker", body(f"load-{i % 40}", i), timeout=30)
            results.append(
                (
                    resp.status_code,
                    resp.json().get("cache", "") if resp.status_code == 200 else resp.text[:200],
                )
            )
            i += 1

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        time.sleep(3)
        killed = stack.kill_redis_node()  # a master, its emptyDir and its slots gone
        killed_at = len(results)
        # the operator trusts what the nodes say, not the bootstrap Job that once succeeded
        down = stack.wait_for(
            lambda: (c := cache_ready()) and c["status"] == "False" and c,
            f"CacheReady False after deleting {killed}",
            60,
        )
        assert down["reason"] in (
            "NodesMissing",
            "NodesUnreachable",
            "SlotsUncovered",
            "NodesFailed",
            "NodesNotJoined",
            "StateNotOk",
        ), down
        healed = stack.wait_for(
            lambda: (c := cache_ready()) and c["status"] == "True" and c,
            "CacheReady True again: the re-created pod rejoined and took its slots back",
            240,
        )
        assert "16384" in healed["message"], healed
    finally:
        stop.set()
        worker.join(timeout=60)
    after_kill = results[killed_at:]
    assert len(after_kill) >= 5, f"too little traffic after the kill: {len(after_kill)}"
    errors = metric_values(stack.metrics("feed-ranker"), "kvrank_redis_errors_total")
    assert sum(errors) > 0, "the rankers never noticed the dead Redis node"
    failed = [r for r in results if r[0] != 200]
    assert not failed, f"{len(failed)}/{len(results)} requests failed: {failed[:5]}"
    # every node agrees: all slots served, no forgotten id left behind
    pods = stack.redis_pods()
    assert len(pods) == 3
    for pod in pods:
        info = stack.redis_cli(pod, "cluster", "info")
        assert "cluster_state:ok" in info and "cluster_slots_assigned:16384" in info, info
        assert "cluster_known_nodes:3" in info, info
    healing = stack.kubectl("get", "events", "-n", NS, "--field-selector", "reason=RedisHealing")
    assert "uncovered slots" in healing, healing
    # and the healed cluster is an L2 again: one stable pod stores, another one reads it (a
    # new user each second try: once every pod holds a user in L1, it never comes from L2)
    tries = itertools.count()
    stack.wait_for(
        lambda: (
            ok_score(stack, "feed-ranker-v2", f"after-heal-{next(tries) // 2}")["cache"] == "l2"
        ),
        "an L2 hit on the healed cluster",
        60,
    )


# ---------------------------------------------------------------------------- progressive
class Traffic:
    """Clients of the shared Service, from a thread: a few hot users over and over (the same
    history each time, as a user between two events), every answer or failure recorded as
    ``(status, model version, cache outcome)``."""

    def __init__(self, stack: Stack, users: int = 8, pause_s: float = 0.05) -> None:
        self.stack, self.users, self.pause_s = stack, users, pause_s
        self.results: list[tuple[int, str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        for i in itertools.count():
            if self._stop.is_set():
                return
            user = i % self.users
            try:
                resp = self.stack.score("feed-ranker", body(f"hot-{user}", user), timeout=30)
            except httpx.HTTPError as exc:
                self.results.append((0, "", f"{type(exc).__name__}: {exc}"))
                continue
            doc = resp.json() if resp.status_code == 200 else {}
            self.results.append(
                (resp.status_code, doc.get("model_version", ""), doc.get("cache", resp.text[:200]))
            )
            time.sleep(self.pause_s)

    def failures(self) -> list[tuple[int, str, str]]:
        return [r for r in self.results if r[0] != 200]


def progressive_spec(stack: Stack, stable: str, canary: str, **rollout: Any) -> dict[str, Any]:
    doc = canary_spec(stack, canary)
    doc["spec"]["model"].update(version=stable, uri=stack.model_uri(stable))
    doc["spec"]["canary"].pop("weight")
    doc["spec"]["canary"].update(rollout)
    return doc


def rollout_status(stack: Stack) -> dict[str, Any]:
    return dict(status(stack, "feed-ranker").get("canary") or {})


def event_messages(stack: Stack, reason: str) -> list[str]:
    out = stack.kubectl(
        "get", "events", "-n", NS, "--field-selector", f"reason={reason}", "-o", "json"
    )
    return [e["message"] for e in json.loads(out)["items"]]


def test_13_an_identical_canary_warms_on_shadow_traffic_and_is_promoted_step_by_step(
    stack: Stack,
) -> None:
    """v2.1 has v2's weights: its scores agree, it warms up on the mirrored requests
    before it takes real ones, and the operator promotes it through both steps."""
    doc = progressive_spec(
        stack,
        "v2",
        "v2.1",
        shadow={"sample": 0.5, "topK": 5},
        warmup={"hitRatio": 0.6, "minRequests": 30, "timeoutSeconds": 240},
        steps=[{"weight": 20, "pauseSeconds": 15}, {"weight": 40, "pauseSeconds": 15}],
        analysis={
            "scoreDelta": {"max": 1e-4, "quantile": 0.99, "minSamples": 20},
            "rankCorrelation": {"min": 0.99, "minSamples": 20},
            "errorRatio": {"max": 0.01, "minSamples": 20},
            "inconclusiveTimeoutSeconds": 120,
            "source": stack.ttl_source(),  # the run's Prometheus (kind: the pods)
        },
    )
    # a TTL longer than the scenario: what the canary's first real answers show is the
    # warm-up, not how often auto-tuned second-long TTLs expire an entry between two
    # mirrored requests of a user
    doc["spec"]["ttl"] = {"mode": "fixed", "fixedSeconds": 300}
    with Traffic(stack) as traffic:
        stack.apply(doc)
        stack.wait_for(
            lambda: rollout_status(stack).get("phase") == "Warming", "v2.1 warming up", 240
        )
        shared = stack.must_get("service", "feed-ranker")["spec"]["selector"]
        assert shared.get("kvrank.io/version") == "v2", shared  # out of the shared Service
        assert not [r for r in traffic.results if r[1] == "v2.1"], "real traffic on v2.1"
        stack.wait_for(
            lambda: rollout_status(stack).get("phase") in ("Progressing", "Promoted"),
            "v2.1 warm, joining the Service",
            240,
        )
        joined = rollout_status(stack)
        assert joined["warmHitRatio"] >= 0.6 and joined["warmRequests"] >= 30, joined
        assert stack.redis_keys(namespace_for("v2.1")) > 0, "the canary's namespace was not warmed"
        table = stack.kubectl("get", "rkd", "feed-ranker", "-n", NS)
        assert "Progressing" in table and "1/2" in table, table
        stack.wait_for(
            lambda: (stack.get("rkd", "feed-ranker") or {})["spec"]["model"]["version"] == "v2.1",
            "v2.1 promoted",
            300,
        )
        stack.wait_for(lambda: ready(stack, "feed-ranker"), "Ready on v2.1", 240)
    done = rollout_status(stack)
    assert done["phase"] == "Promoted", done
    assert "canary" not in stack.must_get("rkd", "feed-ranker")["spec"]
    checks = {c["metric"]: c for c in done["checks"]}
    assert checks["scoreDelta"]["value"] <= 1e-4, checks  # the same weights: equal scores
    assert checks["rankCorrelation"]["value"] >= 0.99, checks
    assert all(c["result"] == "pass" for c in checks.values()), checks
    served = [r for r in traffic.results if r[1] == "v2.1"]
    assert len(served) >= 5, f"v2.1 answered {len(served)} real requests"
    assert all(r[2] != "miss" for r in served[:5]), f"first real answers {served[:5]}"
    assert not traffic.failures(), traffic.failures()[:5]
    assert event_messages(stack, "CanaryWarm") and event_messages(stack, "StepPassed")
    promoted = event_messages(stack, "CanaryPromoted")
    assert promoted and "step 2/2" in promoted[-1], promoted
    assert ok_score(stack, "feed-ranker", "after-auto-promote")["model_version"] == "v2.1"


def test_14_a_drifting_canary_is_aborted_at_its_first_step_and_purged(stack: Stack) -> None:
    """v3 has other weights: the shadow comparison sees its scores drift beyond the
    threshold, the rollout aborts in step 1, the stable version is untouched."""
    stable = stack.must_get("deployment", "feed-ranker-v2-1")
    doc = progressive_spec(
        stack,
        "v2.1",
        "v3",
        shadow={"sample": 0.5},
        steps=[{"weight": 20, "pauseSeconds": 60}],
        analysis={
            "scoreDelta": {"max": 0.01, "minSamples": 10},
            "errorRatio": {"max": 0.01, "minSamples": 10},
            "source": {"type": "pods"},
        },
    )
    with Traffic(stack) as traffic:
        stack.apply(doc)
        stack.wait_for(lambda: rollout_status(stack).get("phase") == "Aborted", "v3 aborted", 240)
        stack.wait_for(
            lambda: namespaces(stack, "feed-ranker").get(namespace_for("v3")) == "purged",
            "v3 purged",
            120,
        )
    aborted = condition(stack, "feed-ranker", "CanaryAnalysis")
    assert aborted is not None and aborted["status"] == "False", aborted
    assert aborted["reason"] == "AnalysisFailed", aborted
    message = aborted["message"]
    assert "step 1/1" in message and "scoreDelta" in message and "max 0.01" in message, message
    (event,) = event_messages(stack, "RolloutAborted")
    assert "scoreDelta" in event, event
    assert stack.redis_keys(namespace_for("v3")) == 0
    stack.wait_for(
        lambda: stack.get("deployment", "feed-ranker-v3") is None, "v3 Deployment removed"
    )
    after = stack.must_get("deployment", "feed-ranker-v2-1")
    assert after["metadata"]["uid"] == stable["metadata"]["uid"]
    assert namespaces(stack, "feed-ranker").get(namespace_for("v2.1")) == "active"
    assert stack.must_get("rkd", "feed-ranker")["spec"]["model"]["version"] == "v2.1"
    assert not traffic.failures(), traffic.failures()[:5]


def test_15_a_canary_without_data_is_never_promoted(stack: Stack) -> None:
    """No verdict is not a pass: with Prometheus unreachable, and with no shadow traffic,
    the step waits, says why, and aborts after its timeout."""
    unreachable = progressive_spec(
        stack,
        "v2.1",
        "v1",
        steps=[{"weight": 20, "pauseSeconds": 5}],
        analysis={
            "errorRatio": {"max": 0.01, "minSamples": 10},
            "inconclusiveTimeoutSeconds": 20,
            "source": {"type": "prometheus", "prometheus": {"url": "http://127.0.0.1:9"}},
        },
    )
    quiet = progressive_spec(
        stack,
        "v2.1",
        "v1",
        shadow={"sample": 0.5},
        steps=[{"weight": 20, "pauseSeconds": 5}],
        analysis={
            "scoreDelta": {"max": 0.01, "minSamples": 10},
            "inconclusiveTimeoutSeconds": 20,
            "source": {"type": "pods"},
        },
    )
    removed = progressive_spec(stack, "v2.1", "v1")
    removed["spec"].pop("canary")
    for doc, why, traffic_on in (
        (unreachable, "unreachable", True),
        (quiet, "0/10 samples", False),
    ):
        stack.apply(doc)
        with Traffic(stack) if traffic_on else contextlib.nullcontext():
            waiting = stack.wait_for(
                lambda: (
                    (c := condition(stack, "feed-ranker", "CanaryAnalysis"))
                    and c["reason"] == "Inconclusive"
                    and rollout_status(stack).get("phase") == "Progressing"
                    and c
                ),
                f"an inconclusive step ({why})",
                240,
            )
            assert waiting["status"] == "False" and why in waiting["message"], waiting
            ended = stack.wait_for(
                lambda: (
                    rollout_status(stack).get("phase") in ("Aborted", "Promoted")
                    and rollout_status(stack)
                ),
                f"the rollout ended ({why})",
                120,
            )
        assert ended["phase"] == "Aborted" and ended["reason"] == "Inconclusive", ended
        assert stack.must_get("rkd", "feed-ranker")["spec"]["model"]["version"] == "v2.1"
        stack.apply(removed)  # a person removes the aborted canary; the next one starts anew
        stack.wait_for(lambda: rollout_status(stack).get("ended"), "the canary removed", 60)
    stack.wait_for(lambda: ready(stack, "feed-ranker"), "Ready without a canary", 240)


# ---------------------------------------------------------------------------- API load
OPERATOR_WRITES = {
    "rankerdeployments",
    "deployments",
    "services",
    "configmaps",
    "secrets",
    "statefulsets",
    "jobs",
    "poddisruptionbudgets",
    "networkpolicies",
}
"""What the operator writes (of those, only workload controllers also write, and only their
``/status``)."""


def test_16_an_unchanged_ranker_deployment_costs_no_api_writes(stack: Stack) -> None:
    names = ("feed-ranker", "ttl-ranker")
    for name in names:
        stack.wait_for(lambda name=name: ready(stack, name), f"{name} Ready", 240)
    # settled: the last load's hit ratio published — a ratio over the last HIT_RATIO_WINDOW
    # moves until that window has slid past the last request — and nothing moving for longer
    # than the TTL tuner's interval (30 s): then nothing may be written at all
    settle_s = prometheus_seconds(HIT_RATIO_WINDOW) + 10
    quiet: dict[str, Any] = {"status": None, "since": time.monotonic()}

    def settled() -> bool:
        now = [status(stack, n) for n in names]
        if now != quiet["status"]:
            quiet.update(status=now, since=time.monotonic())
        return time.monotonic() - quiet["since"] >= settle_s

    stack.wait_for(settled, f"both RankerDeployments' status unchanged for {settle_s} s", 400)
    before, status_before = stack.api_writes(OPERATOR_WRITES), quiet["status"]
    time.sleep(60)  # two resyncs of both RankerDeployments and the TTL tuner's measurements
    after = stack.api_writes(OPERATOR_WRITES)
    writes = {
        k: after[k] - before.get(k, 0.0)
        for k in after
        if after[k] != before.get(k, 0.0) and not (k.endswith("/status") and "ranker" not in k)
    }
    changed = [
        {k: v for k, v in now.items() if old.get(k) != v}
        for old, now in zip(status_before, [status(stack, n) for n in names], strict=True)
    ]
    assert writes == {}, f"writes in a minute of steady state: {writes}; status changes {changed}"


# ---------------------------------------------------------------------------- monitoring
def value_side(expr: str) -> str:
    """An alert's measured value: its expression up to the first comparison outside
    brackets and quotes (``rate(x[5m]) > 3 * rate(x[1h])`` → ``rate(x[5m])``)."""
    depth, quote, i = 0, "", 0
    while i < len(expr):
        ch, two = expr[i], expr[i : i + 2]
        if quote:
            i += 2 if ch == "\\" else 1
            quote = "" if ch == quote else quote
            continue
        if ch in "\"'`":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and (ch in "<>" or two in ("==", "!=")):
            return expr[:i].strip()
        i += 1
    return expr.strip()


def promql(stack: Stack, query: str) -> list[dict[str, Any]]:
    resp = httpx.get(f"{stack.prometheus_url}/api/v1/query", params={"query": query}, timeout=30)
    body = resp.json()
    assert body["status"] == "success", f"{query}: {body}"
    return list(body["data"]["result"])


def test_17_every_dashboard_panel_and_alert_query_returns_data(stack: Stack) -> None:
    """The chart's dashboard and alerts against the Prometheus that scrapes the ranker pods
    and the operator as kube-prometheus-stack's monitors would: each template variable
    offers this RankerDeployment, every panel query returns a number (no panel left empty),
    every alert's measured value returns data, and every rule evaluates without error."""
    if stack.backend != "local":
        pytest.skip("the kind backend runs no Prometheus")
    instance = "ttl-ranker"  # auto TTL from Prometheus: the operator's series for it too
    dashboard = stack.dashboard()
    started = time.monotonic()
    i = 0
    while time.monotonic() - started < 20:  # users coming back (hits) and new ones (misses)
        ok_score(stack, instance, f"dash-{i % 5}" if i % 3 else f"dash-new-{i}", i)
        i += 1
        time.sleep(0.1)
    time.sleep(3)  # the last requests scraped

    variables = {"$namespace": NS, "$instance": instance, "$__rate_interval": "1m"}

    def grafana(text: str) -> str:  # what Grafana sends once the variables are chosen
        for name in sorted(variables, key=len, reverse=True):
            text = text.replace(name, variables[name])
        assert "$" not in text, text
        return text

    for var in dashboard["templating"]["list"]:
        if var["type"] != "query":
            continue
        call = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["query"]["query"])
        assert call, var["query"]
        values = httpx.get(
            f"{stack.prometheus_url}/api/v1/label/{call[2]}/values",
            params={"match[]": grafana(call[1])},
            timeout=30,
        ).json()["data"]
        wanted = variables[f"${var['name']}"]
        assert wanted in values, f"variable {var['name']}: {values}"

    empty = []
    queries = 0
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            queries += 1
            result = promql(stack, grafana(target["expr"]))
            numbers = [float(r["value"][1]) for r in result]
            if not any(math.isfinite(v) for v in numbers):
                empty.append((panel["title"], target["refId"], target["expr"], result))
    assert queries >= 15 and empty == [], empty

    rules = stack.alert_rules()
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts) >= 8
    no_data = [a["alert"] for a in alerts if not promql(stack, value_side(a["expr"]))]
    assert no_data == [], no_data
    loaded = httpx.get(f"{stack.prometheus_url}/api/v1/rules", timeout=30).json()["data"]
    health = {
        r["name"]: (r["health"], r.get("lastError")) for g in loaded["groups"] for r in g["rules"]
    }
    assert set(health) == {a["alert"] for a in alerts}
    assert {k: v for k, v in health.items() if v[0] != "ok"} == {}


# ---------------------------------------------------------------------------- own model
def plugin_spec(stack: Stack, canary: str | None = None) -> dict[str, Any]:
    """The example plugin's RankerDeployment: its model in its own image (a derived one),
    L1 only (the plugin's Redis paths are the ranker tests' business)."""
    doc = stack.adapt(example("basic.yaml"))
    doc["metadata"]["name"] = PLUGIN
    model = doc["spec"]["model"]
    model.update(image=stack.images.plugin, replicas=2, uri=stack.model_uri("s1", model=PLUGIN))
    model.update(version="s1", resources={})
    doc["spec"]["cache"]["redis"] = {"mode": "external", "url": "redis://nowhere.invalid:6379"}
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


def plugin_pods_image(stack: Stack, version: str) -> set[str]:
    pods = stack.select("pods", f"app.kubernetes.io/instance={PLUGIN},kvrank.io/version={version}")
    return {c["image"] for p in pods for c in p["spec"]["containers"]}


def test_18_a_teams_own_model_serves_from_its_image_and_a_canary_brings_its_own_code(
    stack: Stack,
) -> None:
    stack.apply(plugin_spec(stack))
    stack.wait_for(lambda: ready(stack, PLUGIN), "the plugin model Ready", 300)
    assert plugin_pods_image(stack, "s1") == {stack.images.plugin}
    body, expected = plugin_request(stack, "s1", "plugin-user")
    first = stack.score(PLUGIN, body).json()
    assert first["model_version"] == "s1" and first["cache"] == "miss", first
    assert (torch.tensor(first["scores"]) - expected).abs().max() <= 1e-5
    again = [stack.score(PLUGIN, body).json()["cache"] for _ in range(6)]
    assert "l1" in again, again  # two pods, no shared L2 here: each hits once it has the user
    bad = {**body, "candidates": {**body["candidates"], "genre": [99] * 6}}
    resp = stack.score(PLUGIN, bad)
    assert resp.status_code == 422 and resp.json()["field"] == "candidates.genre", resp.text
    # a canary with its code in an image of its own, in a cache namespace of its own
    stack.apply(plugin_spec(stack, canary="s2"))
    stack.wait_for(
        lambda: namespaces(stack, PLUGIN) == {"v-s1": "active", "v-s2": "active"},
        "the plugin canary's own cache namespace",
    )
    stack.wait_for(lambda: ready(stack, PLUGIN), "Ready with the plugin canary", 300)
    assert plugin_pods_image(stack, "s2") == {stack.images.plugin_canary}
    body, expected = plugin_request(stack, "s2", "canary-user")
    doc = stack.score(f"{PLUGIN}-s2", body).json()
    assert doc["model_version"] == "s2" and doc["cache"] == "miss", doc
    assert (torch.tensor(doc["scores"]) - expected).abs().max() <= 1e-5
    # a listwise canary (candidates see the slate): its pods refuse it, naming the check
    stack.apply(plugin_spec(stack, canary="s3"))
    failed = stack.wait_for(
        lambda: (c := condition(stack, PLUGIN, "RankersStarted")) and c["status"] == "False" and c,
        "RankersStarted False for the listwise canary",
        240,
    )
    assert "s3:" in failed["message"] and "candidates_independent" in failed["message"], failed
    assert stack.score(f"{PLUGIN}-s1", plugin_request(stack, "s1", "still")[0]).status_code == 200


# ---------------------------------------------------------------------------- delete
def test_19_delete_removes_everything_it_created(stack: Stack) -> None:
    for name in ("feed-ranker", "ttl-ranker", PLUGIN):
        stack.kubectl("delete", "rkd", name, "-n", NS, "--wait=false")
    for name in ("feed-ranker", "ttl-ranker", PLUGIN):
        stack.wait_for(lambda name=name: stack.get("rkd", name) is None, f"rkd/{name} gone")
    for name in ("feed-ranker", "ttl-ranker", PLUGIN):
        selector = f"app.kubernetes.io/instance={name}"
        for kind in ("deployments", "services", "configmaps", "pdb", "jobs", "statefulsets"):
            stack.wait_for(
                lambda kind=kind, selector=selector: not stack.select(kind, selector),
                f"{kind} of {name} gone",
            )
        stack.wait_for(
            lambda selector=selector: not stack.select("pods", selector), f"pods of {name} gone"
        )
    assert not stack.endpoints("feed-ranker")


# ---------------------------------------------------------------------------- uninstall
def test_20_uninstalling_the_operator_leaves_no_ranker_deployment_stuck(stack: Stack) -> None:
    doc = stack.adapt(example("basic.yaml"))
    doc["metadata"]["name"] = "left-behind"
    doc["spec"]["model"]["replicas"] = 1
    doc["spec"]["cache"]["redis"] = {"mode": "external", "url": "redis://nowhere.invalid:6379"}
    stack.apply(doc)
    finalizer = "kopf.zalando.org/KopfFinalizerMarker"
    stack.wait_for(
        lambda: (
            finalizer in (stack.must_get("rkd", "left-behind")["metadata"].get("finalizers") or [])
            and stack.get("deployment", "left-behind-v1")
        ),
        "the operator managing left-behind",
    )
    # helm's pre-delete hook stops the operator, then takes its finalizer off
    stack.uninstall_operator()
    assert not stack.select("pods", OPERATOR_SELECTOR, OPERATOR_NS)
    assert not stack.must_get("rkd", "left-behind")["metadata"].get("finalizers")
    assert stack.get("deployment", "left-behind-v1") is not None  # still there, unmanaged
    stack.kubectl("delete", "rkd", "left-behind", "-n", NS, "--timeout=60s")
    stack.wait_for(
        lambda: stack.get("deployment", "left-behind-v1") is None,
        "left-behind's Deployment garbage-collected",
    )
