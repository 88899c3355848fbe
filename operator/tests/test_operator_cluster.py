"""The operator against a real API server, with exactly the RBAC the chart grants.

Installs the chart's CRD, ServiceAccount and ClusterRole, runs ``kvrank-operator run`` as a
local process with that ServiceAccount's token, and drives RankerDeployments through
create, canary, promotion, abort, invalid specs and deletion (pods are kwok-simulated)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [pytest.mark.kube, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kvrank-operator"
NS = "rk-test"


OPERATOR_LOG: list[Path] = []


def wait_for(cond: Callable[[], Any], what: str, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.5)
    tail = "\n".join(OPERATOR_LOG[0].read_text().splitlines()[-40:]) if OPERATOR_LOG else ""
    raise AssertionError(
        f"timed out after {timeout:.0f}s waiting for {what}\n--- operator log ---\n{tail}"
    )


def start_operator(kubeconfig: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                str(Path(sys.executable).parent / "kvrank-operator"),
                "run",
                "--kubeconfig",
                str(kubeconfig),
                "--metrics-port",
                "0",
                "--liveness-port",
                "0",
                # kwok's pods are not real: their Redis cannot be reached (nor may it be)
                "--no-redis-health",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ},
        )


@pytest.fixture(scope="module")
def operator_process(cluster, tmp_path_factory) -> Iterator[dict[str, Any]]:
    cluster.apply_chart_without_workloads(
        CHART, "kvrank", "kvrank-system", "--kube-version", "1.37.2"
    )
    cluster.kubectl("create", "namespace", NS, check=False)
    kubeconfig = cluster.service_account_kubeconfig("kvrank-system", "kvrank-kvrank-operator")
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    state = {"proc": start_operator(kubeconfig, log), "kubeconfig": kubeconfig, "log": log}
    OPERATOR_LOG[:] = [log]
    yield state
    state["proc"].terminate()
    state["proc"].wait(timeout=30)


def get(cluster, kind: str, name: str, ns: str = NS) -> dict | None:
    out = cluster.kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def apply(cluster, doc: dict, check: bool = True) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(doc), check=check)


def rkd(name: str, spec: dict) -> dict:
    return {
        "apiVersion": "kvrank.io/v1alpha1",
        "kind": "RankerDeployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


def condition(obj: dict | None, ctype: str) -> dict | None:
    for c in ((obj or {}).get("status") or {}).get("conditions", []):
        if c["type"] == ctype:
            return c
    return None


def ready(cluster, name: str) -> bool:
    c = condition(get(cluster, "rkd", name), "Ready")
    return bool(c and c["status"] == "True")


def namespaces(cluster, name: str) -> dict[str, str]:
    st = (get(cluster, "rkd", name) or {}).get("status") or {}
    return {e["namespace"]: e["state"] for e in st.get("cacheNamespaces", [])}


def test_basic_example_creates_owned_objects_and_becomes_ready(cluster, operator_process):
    doc = yaml.safe_load((ROOT / "examples" / "basic.yaml").read_text())
    apply(cluster, doc)
    wait_for(lambda: ready(cluster, "feed-ranker"), "feed-ranker Ready", 120)
    uid = get(cluster, "rkd", "feed-ranker")["metadata"]["uid"]
    for kind, name in [
        ("deployment", "feed-ranker-v1"),
        ("service", "feed-ranker"),
        ("service", "feed-ranker-v1"),
        ("configmap", "feed-ranker-config"),
        ("pdb", "feed-ranker"),
        ("statefulset", "feed-ranker-redis"),
        ("secret", "feed-ranker-redis-auth"),
        ("job", "feed-ranker-redis-bootstrap"),
        ("networkpolicy", "feed-ranker-redis"),
    ]:
        obj = get(cluster, kind, name)
        assert obj is not None, f"{kind}/{name} missing"
        assert obj["metadata"]["ownerReferences"][0]["uid"] == uid, f"{kind}/{name} not owned"
    dep = get(cluster, "deployment", "feed-ranker-v1")
    assert dep["status"]["readyReplicas"] == 2
    status = get(cluster, "rkd", "feed-ranker")["status"]
    assert condition(get(cluster, "rkd", "feed-ranker"), "CacheReady")["status"] == "True"
    assert status["cacheNamespaces"][0]["namespace"] == "v-v1"
    table = cluster.kubectl("get", "rkd", "-n", NS).stdout
    for column in ("READY", "VERSION", "CANARY", "WEIGHT", "TTL", "HIT-RATIO", "AGE"):
        assert column in table
    assert "2/2" in table


def test_canary_promote_and_abort(cluster, operator_process):
    spec = {
        "model": {"version": "v1", "uri": "/m/v1", "replicas": 4},
        "cache": {
            "redis": {"mode": "external", "url": "redis://redis.example:6379"},
            "retiredNamespaceGraceSeconds": 2,
        },
    }
    apply(cluster, rkd("promo", spec))
    wait_for(lambda: ready(cluster, "promo"), "promo Ready")
    spec["canary"] = {"version": "v2", "uri": "/m/v2", "weight": 25}
    apply(cluster, rkd("promo", spec))
    wait_for(
        lambda: namespaces(cluster, "promo") == {"v-v1": "active", "v-v2": "active"},
        "two active namespaces",
    )
    wait_for(lambda: ready(cluster, "promo"), "promo Ready with canary")
    assert get(cluster, "deployment", "promo-v1")["spec"]["replicas"] == 3
    assert get(cluster, "deployment", "promo-v2")["spec"]["replicas"] == 1
    assert condition(get(cluster, "rkd", "promo"), "CanaryReady")["status"] == "True"
    # promote: v2 becomes stable, v1's namespace is retired then purged by a Job
    spec["model"].update(version="v2", uri="/m/v2")
    del spec["canary"]
    apply(cluster, rkd("promo", spec))
    wait_for(
        lambda: namespaces(cluster, "promo").get("v-v1") in ("retired", "purging", "purged"),
        "v1 retired",
    )
    wait_for(lambda: namespaces(cluster, "promo").get("v-v1") == "purged", "v1 purged")
    wait_for(lambda: get(cluster, "deployment", "promo-v1") is None, "v1 Deployment removed")
    assert get(cluster, "deployment", "promo-v2")["spec"]["replicas"] == 4
    jobs = json.loads(
        cluster.kubectl(
            "get", "jobs", "-n", NS, "-l", "kvrank.io/cache-namespace=v-v1", "-o", "json"
        ).stdout
    )
    args = jobs["items"][0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:4] == ["cache", "purge", "--namespace", "v-v1"]
    # abort: a canary removed without promotion is purged at once
    spec["canary"] = {"version": "v3", "uri": "/m/v3", "weight": 50}
    apply(cluster, rkd("promo", spec))
    wait_for(lambda: namespaces(cluster, "promo").get("v-v3") == "active", "v3 active")
    del spec["canary"]
    apply(cluster, rkd("promo", spec))
    wait_for(lambda: namespaces(cluster, "promo").get("v-v3") == "purged", "v3 purged")
    assert namespaces(cluster, "promo")["v-v2"] == "active"
    wait_for(lambda: ready(cluster, "promo"), "promo Ready after abort")


def test_invalid_specs_are_rejected_or_reported_and_nothing_is_deleted(cluster, operator_process):
    bad = apply(
        cluster,
        rkd(
            "bad",
            {
                "model": {"version": "v1", "uri": "/m"},
                "canary": {"version": "v2", "uri": "/m2", "weight": 150},
            },
        ),
        check=False,
    )
    assert bad.returncode != 0 and "spec.canary.weight" in bad.stderr
    spec = {
        "model": {"version": "v1", "uri": "/m/v1", "replicas": 1},
        "cache": {"redis": {"mode": "external", "url": "redis://r:6379"}},
    }
    apply(cluster, rkd("semantic", spec))
    wait_for(lambda: ready(cluster, "semantic"), "semantic Ready")
    spec["canary"] = {"version": "v1", "uri": "/m/other"}
    apply(cluster, rkd("semantic", spec))

    def degraded() -> dict | None:
        c = condition(get(cluster, "rkd", "semantic"), "Degraded")
        return c if c and c["status"] == "True" else None

    c = wait_for(degraded, "Degraded condition")
    assert "spec.canary.version" in c["message"] and "equals model.version" in c["message"]
    assert get(cluster, "deployment", "semantic-v1") is not None
    events = cluster.kubectl(
        "get", "events", "-n", NS, "--field-selector", "involvedObject.name=semantic", "-o", "json"
    ).stdout
    assert "InvalidSpec" in events


def test_scale_subresource_drives_replicas(cluster, operator_process):
    spec = {
        "model": {"version": "v1", "uri": "/m/v1", "replicas": 1},
        "cache": {"redis": {"mode": "external", "url": "redis://r:6379"}},
    }
    apply(cluster, rkd("scaled", spec))
    wait_for(lambda: ready(cluster, "scaled"), "scaled Ready")
    cluster.kubectl("scale", "rkd/scaled", "-n", NS, "--replicas=3")
    wait_for(
        lambda: (
            (get(cluster, "deployment", "scaled-v1") or {}).get("spec", {}).get("replicas") == 3
        ),
        "Deployment scaled to 3",
    )
    scale = json.loads(
        cluster.kubectl(
            "get",
            "--raw",
            f"/apis/kvrank.io/v1alpha1/namespaces/{NS}/rankerdeployments/scaled/scale",
        ).stdout
    )
    assert scale["spec"]["replicas"] == 3


def test_operator_killed_mid_rollout_converges_after_restart(cluster, operator_process):
    spec = {
        "model": {"version": "v1", "uri": "/m/v1", "replicas": 2},
        "cache": {
            "redis": {"mode": "external", "url": "redis://r:6379"},
            "retiredNamespaceGraceSeconds": 1,
        },
    }
    apply(cluster, rkd("restart", spec))
    wait_for(lambda: ready(cluster, "restart"), "restart Ready")
    operator_process["proc"].kill()  # no chance to clean up
    operator_process["proc"].wait(timeout=30)
    spec["canary"] = {"version": "v2", "uri": "/m/v2", "weight": 50}
    apply(cluster, rkd("restart", spec))
    time.sleep(2)
    assert get(cluster, "deployment", "restart-v2") is None  # nobody reconciled meanwhile
    operator_process["proc"] = start_operator(
        operator_process["kubeconfig"], operator_process["log"]
    )
    wait_for(
        lambda: namespaces(cluster, "restart") == {"v-v1": "active", "v-v2": "active"},
        "canary picked up after restart",
    )
    wait_for(lambda: ready(cluster, "restart"), "restart Ready after restart")
    assert get(cluster, "deployment", "restart-v2")["spec"]["replicas"] == 1


def test_delete_removes_everything(cluster, operator_process):
    spec = {
        "model": {"version": "v1", "uri": "/m/v1", "replicas": 1},
        "cache": {"redis": {"mode": "external", "url": "redis://r:6379"}},
    }
    apply(cluster, rkd("gone", spec))
    wait_for(lambda: ready(cluster, "gone"), "gone Ready")
    cluster.kubectl("delete", "rkd", "gone", "-n", NS)
    wait_for(
        lambda: (
            get(cluster, "deployment", "gone-v1") is None
            and get(cluster, "configmap", "gone-config") is None
            and get(cluster, "service", "gone") is None
        ),
        "owned objects garbage-collected",
    )


def test_ttl_converges_from_a_real_rankers_metrics_via_prometheus(
    cluster, operator_process, tmp_path
):
    """A real `kvrank serve` sees users return every ~1.5 s; a real Prometheus scrapes it;
    the operator must publish clamp(mean × 3, min, max) in status.ttl and the ConfigMap."""
    import asyncio
    import shutil
    import socket

    import httpx

    from kvrank.model.artifact import save_model
    from kvrank.model.config import ModelConfig
    from kvrank.model.ranker import RankerModel
    from kvrank.tools.workload import Workload, WorkloadSettings

    def port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    cfg = ModelConfig(
        d_model=16,
        n_heads=2,
        n_layers=1,
        max_events=8,
        ns_tokens=1,
        cand_tokens=2,
        emb_dim=4,
        item_buckets=100,
        profile_buckets=50,
    )
    save_model(RankerModel(cfg, "v1"), tmp_path / "model")
    ranker_port, prom_port = port(), port()
    procs = [
        subprocess.Popen(
            [
                str(Path(sys.executable).parent / "kvrank"),
                "serve",
                "--model",
                str(tmp_path / "model"),
                "--port",
                str(ranker_port),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
    ]
    (tmp_path / "prom.yml").write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "ranker",
                        "static_configs": [
                            {
                                "targets": [f"127.0.0.1:{ranker_port}"],
                                # what the usual Kubernetes pod relabelling produces
                                "labels": {"kubernetes_namespace": NS, "instance_name": "tuned"},
                            }
                        ],
                    }
                ],
            }
        )
    )
    procs.append(
        subprocess.Popen(
            [
                shutil.which("prometheus") or "prometheus",
                f"--config.file={tmp_path / 'prom.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
    )
    try:
        url = f"http://127.0.0.1:{ranker_port}"
        wait_for(
            lambda: httpx.get(f"{url}/readyz", timeout=1).status_code == 200 if _up(url) else False,
            "ranker ready",
            60,
        )
        bodies = [
            r.body for r in Workload(cfg, WorkloadSettings(users=4, candidates=3)).requests(8)
        ]

        async def drive() -> None:  # 4 users, each returning every 1.5 s
            async with httpx.AsyncClient(timeout=10) as client:
                for _ in range(8):
                    for i in range(4):
                        body = {**bodies[i], "user_id": f"u{i}"}
                        assert (await client.post(f"{url}/v1/score", json=body)).status_code == 200
                    await asyncio.sleep(1.5)

        asyncio.run(drive())
        spec = {
            "model": {"version": "v1", "uri": "/m/v1", "replicas": 1},
            "cache": {"redis": {"mode": "external", "url": "redis://r:6379"}},
            "ttl": {
                "mode": "auto",
                "factor": 3,
                "minSeconds": 1,
                "maxSeconds": 300,
                "intervalSeconds": 5,
                "source": {
                    "type": "prometheus",
                    "prometheus": {"url": f"http://127.0.0.1:{prom_port}"},
                },
            },
        }
        apply(cluster, rkd("tuned", spec))

        def ttl() -> dict | None:
            return ((get(cluster, "rkd", "tuned") or {}).get("status") or {}).get("ttl")

        status_ttl = wait_for(ttl, "status.ttl published", 120)
        assert status_ttl["source"] == "prometheus"
        assert status_ttl["meanIntervalSeconds"] == pytest.approx(1.5, rel=0.25)
        assert status_ttl["seconds"] == pytest.approx(4.5, rel=0.25)
        ratio = wait_for(
            lambda: ((get(cluster, "rkd", "tuned") or {}).get("status") or {}).get("hitRatio"),
            "status.hitRatio",
            60,
        )
        assert 0.5 < ratio <= 1.0  # 4 users, 8 requests each: all but the first are hits
        cm = get(cluster, "configmap", "tuned-config")
        ranker_cfg = yaml.safe_load(cm["data"]["ranker.yaml"])
        assert ranker_cfg["ttl"]["fixed_seconds"] == status_ttl["seconds"]
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=20)


def _up(url: str) -> bool:
    import httpx

    try:
        httpx.get(f"{url}/healthz", timeout=1)
        return True
    except httpx.HTTPError:
        return False


def test_autoscaler_owned_replicas_are_left_alone(cluster, operator_process):
    spec = {
        "model": {"version": "v1", "uri": "/m/v1", "replicas": 1, "externalReplicas": True},
        "cache": {"redis": {"mode": "external", "url": "redis://r:6379"}},
    }
    apply(cluster, rkd("hpa", spec))
    wait_for(lambda: get(cluster, "deployment", "hpa-v1"), "hpa-v1 created")
    # what an HPA does: scale the Deployment itself
    cluster.kubectl("scale", "deployment/hpa-v1", "-n", NS, "--replicas=3")
    wait_for(lambda: ready(cluster, "hpa"), "hpa Ready at the autoscaler's 3 replicas")
    time.sleep(6)  # at least one resync
    assert get(cluster, "deployment", "hpa-v1")["spec"]["replicas"] == 3
    versions = get(cluster, "rkd", "hpa")["status"]["versions"]
    assert versions[0]["replicas"] == 3 and versions[0]["readyReplicas"] == 3
