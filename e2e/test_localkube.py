"""The test control plane is a real Kubernetes: scheduling, Jobs, CRDs with status, RBAC,
garbage collection and Helm all behave as they do on a real cluster."""

from __future__ import annotations

import json
import subprocess
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.kube


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def get(cluster, *args: str) -> dict:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def apply(cluster, doc: dict | str, kubeconfig: Path | None = None, check: bool = True):
    text = doc if isinstance(doc, str) else json.dumps(doc)
    return cluster.kubectl("apply", "-f", "-", input=text, kubeconfig=kubeconfig, check=check)


def test_nodes_include_a_gpu_node(cluster) -> None:
    nodes = get(cluster, "nodes")["items"]
    gpus = [n for n in nodes if "nvidia.com/gpu" in n["status"]["allocatable"]]
    assert len(nodes) >= 3 and len(gpus) == 1
    assert all(
        c["status"] == "True"
        for n in nodes
        for c in n["status"]["conditions"]
        if c["type"] == "Ready"
    )


def test_deployment_pods_become_ready_on_fake_nodes(cluster) -> None:
    cluster.kubectl("create", "namespace", "lk-deploy")
    apply(
        cluster,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "lk-deploy"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {
                        "containers": [
                            {
                                "name": "web",
                                "image": "example.invalid/web:1",
                                "resources": {"limits": {"nvidia.com/gpu": "1"}},
                            }
                        ]
                    },
                },
            },
        },
    )

    def ready() -> bool:
        d = get(cluster, "deployment", "web", "-n", "lk-deploy")
        return d.get("status", {}).get("readyReplicas") == 2

    wait_for(ready, "deployment web to have 2 ready replicas")
    pods = get(cluster, "pods", "-n", "lk-deploy")["items"]
    assert {p["spec"]["nodeName"] for p in pods} == {"kwok-gpu-0"}  # the only GPU node
    assert all(p["status"]["phase"] == "Running" for p in pods)


def test_job_completes(cluster) -> None:
    cluster.kubectl("create", "namespace", "lk-job")
    cluster.kubectl(
        "create", "job", "once", "-n", "lk-job", "--image=example.invalid/j:1", "--", "true"
    )

    def complete() -> bool:
        job = get(cluster, "job", "once", "-n", "lk-job")
        return job.get("status", {}).get("succeeded") == 1

    wait_for(complete, "job once to succeed")


CRD = textwrap.dedent("""
    apiVersion: apiextensions.k8s.io/v1
    kind: CustomResourceDefinition
    metadata: {name: widgets.lk.example.com}
    spec:
      group: lk.example.com
      scope: Namespaced
      names: {plural: widgets, singular: widget, kind: Widget}
      versions:
        - name: v1
          served: true
          storage: true
          subresources: {status: {}}
          schema:
            openAPIV3Schema:
              type: object
              properties:
                spec:
                  type: object
                  required: [size]
                  properties: {size: {type: integer, minimum: 1}}
                status:
                  type: object
                  properties: {phase: {type: string}}
""")


def test_crd_established_and_status_subresource_round_trips(cluster) -> None:
    apply(cluster, CRD)

    def established() -> bool:
        crd = get(cluster, "crd", "widgets.lk.example.com")
        return any(
            c["type"] == "Established" and c["status"] == "True"
            for c in crd.get("status", {}).get("conditions", [])
        )

    wait_for(established, "CRD widgets to be Established")
    apply(
        cluster,
        {
            "apiVersion": "lk.example.com/v1",
            "kind": "Widget",
            "metadata": {"name": "w", "namespace": "default"},
            "spec": {"size": 3},
        },
    )
    cluster.kubectl(
        "patch",
        "widget",
        "w",
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status": {"phase": "Ready"}}',
    )
    w = get(cluster, "widget", "w")
    assert w["spec"] == {"size": 3} and w["status"] == {"phase": "Ready"}
    bad = apply(
        cluster,
        {
            "apiVersion": "lk.example.com/v1",
            "kind": "Widget",
            "metadata": {"name": "bad", "namespace": "default"},
            "spec": {"size": 0},
        },
        check=False,
    )
    assert bad.returncode != 0 and "spec.size" in bad.stderr  # schema validation is real


def test_rbac_denies_a_service_account_without_permission(cluster) -> None:
    cluster.kubectl("create", "namespace", "lk-rbac")
    cluster.kubectl("create", "serviceaccount", "nobody", "-n", "lk-rbac")
    cluster.kubectl("create", "serviceaccount", "reader", "-n", "lk-rbac")
    cluster.kubectl(
        "create", "role", "read-cm", "-n", "lk-rbac", "--verb=get,list", "--resource=configmaps"
    )
    cluster.kubectl(
        "create",
        "rolebinding",
        "read-cm",
        "-n",
        "lk-rbac",
        "--role=read-cm",
        "--serviceaccount=lk-rbac:reader",
    )
    nobody = cluster.service_account_kubeconfig("lk-rbac", "nobody")
    reader = cluster.service_account_kubeconfig("lk-rbac", "reader")
    denied = cluster.kubectl("get", "configmaps", "-n", "lk-rbac", kubeconfig=nobody, check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()
    allowed = cluster.kubectl("get", "configmaps", "-n", "lk-rbac", kubeconfig=reader)
    assert allowed.returncode == 0
    write = cluster.kubectl(
        "create", "configmap", "x", "-n", "lk-rbac", kubeconfig=reader, check=False
    )
    assert write.returncode != 0 and "forbidden" in write.stderr.lower()


def test_deleting_an_owner_garbage_collects_owned_objects(cluster) -> None:
    cluster.kubectl("create", "namespace", "lk-gc")
    cluster.kubectl("create", "configmap", "owner", "-n", "lk-gc")
    uid = get(cluster, "configmap", "owner", "-n", "lk-gc")["metadata"]["uid"]
    apply(
        cluster,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "owned",
                "namespace": "lk-gc",
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}
                ],
            },
        },
    )
    cluster.kubectl("delete", "configmap", "owner", "-n", "lk-gc")

    def collected() -> bool:
        out = cluster.kubectl("get", "configmap", "owned", "-n", "lk-gc", check=False)
        return out.returncode != 0 and "NotFound" in out.stderr

    wait_for(collected, "the owned ConfigMap to be garbage-collected")


def test_helm_template_and_install(cluster, tmp_path: Path) -> None:
    chart = tmp_path / "hello"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: hello\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("greeting: hi\n")
    (chart / "templates/cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-cm\n"
        "data:\n  greeting: {{ .Values.greeting | quote }}\n"
    )
    rendered = yaml.safe_load(
        cluster.helm("template", "demo", str(chart), "--set", "greeting=hello").stdout
    )
    assert rendered["data"]["greeting"] == "hello"
    cluster.kubectl("create", "namespace", "lk-helm")
    cluster.helm("install", "demo", str(chart), "-n", "lk-helm", "--wait", "--timeout=60s")
    cm = get(cluster, "configmap", "demo-cm", "-n", "lk-helm")
    assert cm["data"]["greeting"] == "hi"
    cluster.helm("uninstall", "demo", "-n", "lk-helm")


def test_no_component_outlives_the_cluster(tmp_path: Path) -> None:
    """A second cluster next to the session's: starts on its own ports, leaves nothing."""
    from localkube.local import LocalCluster

    with LocalCluster(tmp_path / "second") as second:
        pids = second.supervisor.pids()
        assert second.kubectl("get", "nodes").returncode == 0
        assert second.startup_seconds < 30
    for pid in pids:
        assert subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode != 0
