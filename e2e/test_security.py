"""Security and bad input: only a ranker's pods reach its Redis, only pods labelled for it a
ranker's admin port, no other pod the operator; every pod runs under Pod
Security ``restricted`` with no secret on a command line, and an invalid spec or artifact is
refused with the field and the limit while what serves keeps serving."""

from __future__ import annotations

import json

import pytest
from chart import OPERATOR_NS
from rankers import Ranker, Rankers
from release import OperatorRelease
from stack import NS, Stack

pytestmark = [pytest.mark.kube, pytest.mark.slow, pytest.mark.e2e]


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


def test_network_policies_let_only_rankers_reach_redis_and_only_admins_the_admin_port(
    stack: Stack, rankers: Rankers, operator: OperatorRelease
) -> None:
    ranker = rankers.create("netpol")
    redis_ip = stack.must_get("pod", f"{ranker.name}-redis-0")["status"]["podIP"]
    pod = ranker.pods(version="v1")[0]
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
        # an unlabelled pod scores (the ranker's port is open to all) but reaches neither
        # Redis, nor the rankers' admin port, nor the operator
        ranker_ip = pod["status"]["podIP"]
        assert connect_from(stack, "outsider", ranker_ip, 8080) == "connected"
        assert connect_from(stack, "outsider", redis_ip, 6379) != "connected"
        assert connect_from(stack, pod["metadata"]["name"], redis_ip, 6379) == "connected"
        admin = f"http://{ranker_ip}:8081/admin/config"
        assert connect_from(stack, "outsider", ranker_ip, 8081) != "connected"
        operator_ip = operator.pods()[0]["status"]["podIP"]
        for port in (8000, 8081):  # metrics, health
            assert connect_from(stack, "outsider", operator_ip, port) != "connected", port
        # labelled for it, the same pod reaches the admin port (the policy follows the label);
        # admin actions never go through the scoring Service
        stack.kubectl("label", "pod", "-n", NS, "outsider", "kvrank.io/ranker-admin=true")
        stack.wait_for(
            lambda: http_status_from(stack, "outsider", admin) == "200",
            "the admin port open to a pod labelled kvrank.io/ranker-admin",
            timeout=60,
        )
        scoring = f"http://{ranker.name}.{NS}.svc:8080/admin/config"
        assert http_status_from(stack, "outsider", scoring) == "404"
    finally:
        stack.kubectl("delete", "pod", "-n", NS, "outsider", "--wait=false", check=False)


def test_every_pod_is_admitted_under_restricted_pod_security(
    stack: Stack, rankers: Rankers, operator: OperatorRelease
) -> None:
    for ns in (NS, OPERATOR_NS):
        doc = json.loads(stack.kubectl("get", "namespace", ns, "-o", "json"))
        labels = doc["metadata"]["labels"]
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
    ranker = rankers.create("restricted")
    ranker.wait_condition("CacheReady", timeout=180)
    pods = stack.select("pods", f"app.kubernetes.io/instance={ranker.name}")
    components = {p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods}
    assert {"ranker", "redis", "redis-bootstrap"} <= components, components
    running = operator.pods()
    assert running and running[0]["status"]["phase"] == "Running"
    # the managed Redis password is in no process's command line on the node (any local
    # user can read those): redis-server includes it from a memory-backed file, redis-cli
    # (probes, bootstrap) reads it from REDISCLI_AUTH
    passwords = (ranker.redis_password(), ranker.redis_password("ranker"))
    lines = stack.command_lines()
    assert any("redis-server" in line for line in lines), "no redis-server process seen"
    assert not [line for line in lines if any(p in line for p in passwords)]
    _assert_the_rankers_redis_user_is_confined(ranker)


def _assert_the_rankers_redis_user_is_confined(ranker: Ranker) -> None:
    """The rankers (and purge Jobs) authenticate as an ACL user the operator set on every
    node: their own deployment's keys and the commands they send, nothing else."""
    own = ranker.cache_namespace("v1")
    commands = [
        (("set", f"kvrank:{own}:u:h", "x"), True),
        (("get", f"kvrank-head:{own}:u"), True),
        (("get", "kvrank:someone-else.v1:u:h"), False),
        (("flushall",), False),
        (("config", "set", "dir", "/tmp"), False),
        (("keys", "*"), False),
    ]
    for pod in ranker.redis_pods():
        for command, allowed in commands:
            answer = ranker.redis_cli(pod, "acl", "dryrun", "ranker", *command, check=False)
            assert (answer.strip() == "OK") == allowed, (pod, command, answer)
            assert allowed or "no permissions" in answer, (pod, command, answer)


def test_invalid_specs_and_artifacts_are_refused_and_nothing_is_deleted(
    stack: Stack, rankers: Rankers
) -> None:
    """The model comes from S3 here (the store's keys from a Secret, the weights pinned by
    their sha256): served, and a canary whose weights do not match refused."""
    ranker = rankers.new("refuses")
    good = stack.from_s3(ranker.spec(), f"{ranker.name}-s3")
    ranker.apply(good)
    ranker.wait_ready("from S3", timeout=300)
    assert ranker.must_get()["spec"]["model"]["uri"] == "s3://models/feed-ranker/v1"
    out = ranker.apply(ranker.with_canary(good, "v3", weight=150), check=False)
    assert out.returncode != 0
    assert "spec.canary.weight" in out.stderr and "100" in out.stderr, out.stderr
    out = ranker.apply(ranker.spec(replicas=-1), check=False)
    assert out.returncode != 0 and "spec.model.replicas" in out.stderr, out.stderr
    # a live managed Redis Cluster is not resharded: refused at apply, with what to do instead
    reshard = ranker.spec()
    reshard["spec"]["cache"]["redis"]["shards"] = 4
    out = ranker.apply(reshard, check=False)
    assert out.returncode != 0 and "spec.cache.redis.shards" in out.stderr, out.stderr
    assert "no online resharding" in out.stderr and "new RankerDeployment" in out.stderr
    # a canary of the stable version: a cross-field rule, also refused at apply (the
    # operator's own check stays as a second line, see the operator's tests)
    serving = ranker.must_deployment("v1")["metadata"]["uid"]
    out = ranker.apply(ranker.with_canary(good, "v1"), check=False)
    assert out.returncode != 0 and "spec.canary.version" in out.stderr, out.stderr
    assert "must differ from model.version" in out.stderr, out.stderr
    # nothing reached the operator: the same Deployment (not a re-created one) still serves
    degraded = ranker.condition("Degraded")
    assert degraded is not None and degraded["status"] == "False", degraded
    assert ranker.must_deployment("v1")["metadata"]["uid"] == serving
    assert ranker.score("still-serving")["model_version"] == "v1"
    # a canary whose artifact does not match its checksum: its pods refuse to serve it, the
    # operator says which version and why, the stable version keeps serving
    mismatch = stack.from_s3(ranker.with_canary(good, "v3"), f"{ranker.name}-s3")
    mismatch["spec"]["canary"]["sha256"] = "0" * 64
    ranker.apply(mismatch)
    failed = ranker.wait_condition("RankersStarted", "False", 180)
    assert failed["reason"] == "StartFailed" and "v3:" in failed["message"], failed
    assert "sha256" in failed["message"] and "expected 0000" in failed["message"], failed
    assert "s3://models/feed-ranker/v3" in failed["message"], failed
    assert ranker.score("stable-during-bad-canary", version="v1")["model_version"] == "v1"
    ranker.apply(good)
    ranker.wait_condition("RankersStarted", "True", 120)
    ranker.wait_gone("v3")
