"""The test cluster is a real Kubernetes: its node runs pods and Jobs as containers, and
CRDs with status, RBAC, garbage collection and Helm behave as on any cluster. The pods here
run the node's own pause image (already in its containerd, nothing is pulled)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml
from localkube.images import PAUSE_IMAGE
from localkube.processes import wait_for

pytestmark = pytest.mark.kube


def get(cluster, *args: str) -> dict:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def apply(cluster, doc: dict | str, kubeconfig: Path | None = None, check: bool = True):
    text = doc if isinstance(doc, str) else json.dumps(doc)
    return cluster.kubectl("apply", "-f", "-", input=text, kubeconfig=kubeconfig, check=check)


RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def pause(name: str, *args: str, gpus: int = 0) -> dict:
    container = {
        "name": name,
        "image": PAUSE_IMAGE,
        "imagePullPolicy": "Never",
        "args": list(args),
        "securityContext": RESTRICTED_CONTAINER,
    }
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return container


def test_the_node_is_ready_and_advertises_gpus(cluster) -> None:
    (node,) = get(cluster, "nodes")["items"]
    assert int(node["status"]["allocatable"]["nvidia.com/gpu"]) > 0
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True"
    assert not node["spec"].get("taints"), node["spec"]


def test_deployment_pods_run_on_the_node(cluster) -> None:
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
                    "spec": {"containers": [pause("web", gpus=1)]},
                },
            },
        },
    )

    def ready() -> bool:
        d = get(cluster, "deployment", "web", "-n", "lk-deploy")
        return d.get("status", {}).get("readyReplicas") == 2

    wait_for(ready, "deployment web to have 2 ready replicas", 120)
    pods = get(cluster, "pods", "-n", "lk-deploy")["items"]
    assert all(p["status"]["phase"] == "Running" for p in pods)
    assert all(p["status"]["podIP"].startswith("10.244.") for p in pods)  # the bridge's range
    assert all(p["status"]["containerStatuses"][0]["started"] for p in pods)


def test_job_runs_to_completion(cluster) -> None:
    cluster.kubectl("create", "namespace", "lk-job")
    apply(
        cluster,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "once", "namespace": "lk-job"},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [pause("once", "-v")],  # prints its version, exits 0
                    }
                },
            },
        },
    )

    def complete() -> bool:
        job = get(cluster, "job", "once", "-n", "lk-job")
        return job.get("status", {}).get("succeeded") == 1

    wait_for(complete, "job once to succeed", 120)
    logs = cluster.kubectl("logs", "-n", "lk-job", "job/once").stdout
    assert logs.startswith("pause.c"), logs


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

    wait_for(established, "CRD widgets to be Established", 60)
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

    wait_for(collected, "the owned ConfigMap to be garbage-collected", 60)


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
