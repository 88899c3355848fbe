"""The two images, built by ``make images`` and run the way Kubernetes would run them.

Each container runs under the securityContext, env, volumes and args of the manifest that
ships it: the operator under the chart's Deployment (in-cluster ServiceAccount token, against
a real API server), the ranker under the Deployment the operator builds (read-only root
filesystem, uid 10001, a real Redis as L2). Scores from the container must equal the model's
full forward pass computed here.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest
import torch
import yaml
from localkube.engine import ROOT, Docker, Images
from pod_container import docker_run_args
from stack import MODEL_CONFIG, wait_for, write_models

from kvrank.data.synthetic import SyntheticWorld
from kvrank.localstack import RedisServer, free_port
from kvrank.model.artifact import load_model
from kvrank.workload import request_body
from kvrank_operator import manifests
from kvrank_operator.spec import parse_spec

pytestmark = [pytest.mark.docker, pytest.mark.slow]
CHART = ROOT / "charts" / "kvrank-operator"
NS = "img-test"
OPERATOR_NS = "kvimg-system"


@contextlib.contextmanager
def container(docker: Docker, args: list[str]) -> Iterator[str]:
    """Start a container from ``docker run -d`` args; always removed, logs shown on failure."""
    name = args[args.index("--name") + 1]
    docker(*args)
    try:
        yield name
    except BaseException:
        print(logs_of(docker, name)())
        raise
    finally:
        docker("rm", "-f", name, check=False)


def logs_of(docker: Docker, name: str) -> Callable[[], str]:
    def logs() -> str:
        out = docker("logs", name, check=False)
        return f"--- docker logs {name} ---\n{(out.stdout + out.stderr)[-6000:]}"

    return logs


def running(docker: Docker, name: str) -> bool:
    """True while the container runs; an exited container fails the test with its logs."""
    state = docker.inspect(name)["State"]
    if not state["Running"]:
        raise AssertionError(f"{name} exited ({state['ExitCode']})\n{logs_of(docker, name)()}")
    return True


def answers(url: str) -> bool:
    """``GET url`` is 200 (not yet listening counts as no)."""
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def stop(docker: Docker, name: str) -> tuple[int, float]:
    """``docker stop`` with the pod's 30 s grace: (exit code, seconds it took)."""
    t0 = time.monotonic()
    docker("stop", "--time", "30", name, timeout=60)
    return int(docker.inspect(name)["State"]["ExitCode"]), time.monotonic() - t0


def test_images_run_as_a_numeric_non_root_user(docker: Docker, images: Images) -> None:
    for ref in (images.ranker, images.operator):
        config = docker.inspect(ref)["Config"]
        assert config["User"] == "10001", ref  # numeric: runAsNonRoot can verify it
        ident = docker("run", "--rm", "--entrypoint", "id", ref).stdout
        assert ident.startswith("uid=10001("), ident


def test_ranker_image_carries_a_cuda_build_of_torch(docker: Docker, images: Images) -> None:
    probe = (
        "import json, torch; print(json.dumps({'cuda': torch.version.cuda,"
        " 'cudnn': torch.backends.cudnn.version(), 'built': torch.backends.cuda.is_built()}))"
    )
    out = docker("run", "--rm", "--entrypoint", "python", images.ranker, "-c", probe).stdout
    found = json.loads(out.strip().splitlines()[-1])
    assert found["built"] and found["cuda"] and found["cudnn"], found
    env = dict(e.split("=", 1) for e in docker.inspect(images.ranker)["Config"]["Env"])
    assert "compute" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")
    assert "NVIDIA_VISIBLE_DEVICES" not in env  # the device plugin sets it per allocation


def test_operator_image_prints_the_charts_crd(docker: Docker, images: Images) -> None:
    out = docker("run", "--rm", "--read-only", "--cap-drop", "ALL", images.operator, "crd")
    crd = CHART / "crds" / "rankerdeployments.yaml"
    assert yaml.safe_load(out.stdout) == yaml.safe_load(crd.read_text())


@pytest.mark.kube
def test_operator_image_reconciles_under_the_charts_deployment(
    docker: Docker, images: Images, cluster: Any, tmp_path: Path
) -> None:
    metrics_port = free_port()
    docs = cluster.apply_chart_without_workloads(
        CHART,
        "kvimg",
        OPERATOR_NS,
        "--kube-version",
        "1.37.2",
        "--set",
        f"metrics.port={metrics_port}",
        "--set",
        f"watchNamespaces={{{NS}}}",
    )
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    # what the kubelet gives the pod: its ServiceAccount's token, the cluster CA, the
    # namespace, and the API server's address in env
    kubeconfig = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    api_cluster = kubeconfig["clusters"][0]["cluster"]
    api = urlparse(api_cluster["server"])
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    token = cluster.kubectl("create", "token", pod["serviceAccountName"], "-n", OPERATOR_NS)
    (sa / "token").write_text(token.stdout.strip())
    (sa / "ca.crt").write_text(Path(api_cluster["certificate-authority"]).read_text())
    (sa / "namespace").write_text(OPERATOR_NS)
    cluster.kubectl("create", "namespace", NS, check=False)
    args = docker_run_args(
        pod,
        "operator",
        images.operator,
        "kvrank-test-operator",
        service_account=sa,
        env={
            "KUBERNETES_SERVICE_HOST": f"{api.hostname}",
            "KUBERNETES_SERVICE_PORT": f"{api.port}",
        },
    )
    with container(docker, args) as name:

        def logs() -> str:
            objects = cluster.kubectl("get", "rkd,deploy,pods", "-n", NS, "-o", "wide", check=False)
            return f"{objects.stdout}{objects.stderr}\n{logs_of(docker, name)()}"

        doc = yaml.safe_load((ROOT / "examples" / "basic.yaml").read_text())
        doc["metadata"]["namespace"] = NS
        # what is under test is the operator image, not GPU scheduling: the shared test
        # cluster's GPUs may all be taken by other tests' rankers
        doc["spec"]["model"].pop("resources")
        cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))

        def ready() -> bool:
            out = cluster.kubectl("get", "rkd", "feed-ranker", "-n", NS, "-o", "json")
            conds = (json.loads(out.stdout).get("status") or {}).get("conditions", [])
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

        wait_for(lambda: running(docker, name) and ready(), "feed-ranker Ready", 120, logs)
        ranker = json.loads(
            cluster.kubectl("get", "deployment", "feed-ranker-v1", "-n", NS, "-o", "json").stdout
        )
        assert ranker["spec"]["template"]["spec"]["containers"][0]["image"] == (
            "ghcr.io/kvrank/ranker:0.1.0"
        )
        # the chart's liveness probe and metrics port answer from inside the container
        assert httpx.get("http://127.0.0.1:8081/healthz", timeout=5).status_code == 200
        text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
        assert "kvrank_operator_reconciles_total" in text
        cluster.kubectl("delete", "rkd", "feed-ranker", "-n", NS, "--wait=false")
        wait_for(
            lambda: cluster.kubectl("get", "rkd", "feed-ranker", "-n", NS, check=False).returncode,
            "feed-ranker deleted",
            60,
            logs,
        )
        code, took = stop(docker, name)
        assert code == 0 and took < 30, (code, took, logs())


@pytest.mark.redis
def test_ranker_image_serves_under_the_operators_pod_spec(
    docker: Docker, images: Images, tmp_path: Path
) -> None:
    models = write_models(tmp_path / "models", ("v1",))
    models.chmod(0o755)
    redis = RedisServer(free_port(), tmp_path / "redis").start()
    try:
        ports = [free_port(), free_port()]
        spec = parse_spec(
            {
                "model": {
                    "version": "v1",
                    "uri": "/models/feed-ranker/v1",
                    "volume": {"hostPath": {"path": str(models)}},
                },
                "cache": {
                    # fp32 K/V: the scores must then equal the full forward pass exactly
                    "kvDtype": "fp32",
                    "redis": {"mode": "external", "url": redis.url, "cluster": False},
                },
            }
        )
        config = tmp_path / "config"
        config.mkdir()
        config_map = manifests.config_map(spec, "img", "default", None)
        for key, value in config_map["data"].items():
            (config / key).write_text(value)
        pod = manifests.deployment(spec, "img", "default", "v1", spec.model.uri, 1, "stable")
        pod = pod["spec"]["template"]["spec"]

        world = SyntheticWorld(MODEL_CONFIG, 0)
        user = world.user(3, n_events=10).features
        cands, _, _ = world.candidates(world.user(3), 20, seed=1)
        body = request_body("alice", user, cands)
        model = load_model(models / "feed-ranker" / "v1")
        expected = model.forward_full(user, cands).sigmoid()

        def start(i: int) -> list[str]:
            return docker_run_args(
                pod,
                "ranker",
                images.ranker,
                f"kvrank-test-ranker-{i}",
                host_dirs={"config": config},
                env={"KVRANK_PORT": str(ports[i])},  # host network: one port per "pod"
            )

        with container(docker, start(0)) as first, container(docker, start(1)) as second:
            seen = []
            for name, port in ((first, ports[0]), (second, ports[1])):
                url = f"http://127.0.0.1:{port}"
                wait_for(
                    lambda url=url, name=name: running(docker, name) and answers(f"{url}/readyz"),
                    f"{name} /readyz",
                    180,
                    logs_of(docker, name),
                )
                for _ in range(2):
                    doc = httpx.post(f"{url}/v1/score", json=body, timeout=30).json()
                    assert torch.allclose(torch.tensor(doc["scores"]), expected, atol=1e-5)
                    seen.append(doc["cache"])
            # first pod: computes, then its L1; second pod: the first one's entry from
            # Redis (with the operator's config file), then its own L1
            assert seen == ["miss", "l1", "l2", "l1"]
            # one entry, in the cache namespace and model version the operator set in env
            (entry,) = redis.cli("keys", "kvrank:*").stdout.split()
            assert entry.startswith("kvrank:v-v1:v1:alice:"), entry
            code, took = stop(docker, first)  # SIGTERM: drain, then exit cleanly
            assert code == 0 and took < 30, (code, took, logs_of(docker, first)())
    finally:
        redis.stop()
