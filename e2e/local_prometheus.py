"""Debian's Prometheus beside the local cluster, finding pods as kube-prometheus-stack would.

Debian's Prometheus is built without ``kubernetes_sd_configs``: :class:`PodTargets` lists the
pods through the API server (with Prometheus' own ServiceAccount, so its RBAC is exercised as
in a cluster) and writes what kube-prometheus-stack makes of kvrank's monitors as a
``file_sd`` file; :func:`start_prometheus` runs the server in the node's network namespace
with the chart's alert rules.
"""

from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from chart import OPERATOR_NS, OPERATOR_SELECTOR, RELEASE, alert_rules
from localkube.local import LocalCluster
from localkube.network import POD_GATEWAY
from localkube.processes import free_port, wait_for

from kvrank_operator.manifests import PodMonitoring, pod_monitor
from kvrank_operator.manifests.ranker import COMPONENT_META


@dataclass
class Prometheus:
    """A running Prometheus: where pods reach it, and the discovery feeding it."""

    url: str
    discovery: PodTargets

    def stop(self, cluster: LocalCluster) -> None:
        """The discovery loop and the server (stopping one never started is a no-op)."""
        self.discovery.stop()
        cluster.supervisor.stop_named("prometheus")


def start_prometheus(cluster: LocalCluster, workdir: Path, ns: str) -> Prometheus:
    """Prometheus in the node's network namespace (pods reach it at the bridge address),
    scraping the pods that :class:`PodTargets` lists through the API server (the rankers
    in ``ns``, the operator in its own). On failure nothing it started is left running."""
    kubectl = cluster.kubectl
    kubectl("create", "serviceaccount", "prometheus", "-n", ns)
    for where in (ns, OPERATOR_NS):  # the rankers and the operator: pods, read-only
        kubectl("create", "role", "prometheus", "-n", where, "--verb=get,list,watch",
                "--resource=pods")  # fmt: skip
        kubectl("create", "rolebinding", "prometheus", "-n", where, "--role=prometheus",
                f"--serviceaccount={ns}:prometheus")  # fmt: skip
    workdir.mkdir(parents=True, exist_ok=True)
    kubeconfig = cluster.service_account_kubeconfig(ns, "prometheus", 4 * 3600)
    discovery = PodTargets(kubeconfig, workdir / "targets.json", ns)
    discovery.start()
    prometheus = Prometheus("", discovery)
    try:
        prometheus.url = _run_server(cluster, workdir, discovery.out)
    except BaseException:
        prometheus.stop(cluster)
        raise
    return prometheus


def _run_server(cluster: LocalCluster, workdir: Path, targets: Path) -> str:
    """The server with the chart's alert rules, scraping ``targets``; its URL once ready."""
    rules = workdir / "rules.yaml"
    rules.write_text(yaml.safe_dump(alert_rules(cluster)))
    conf = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {
                "job_name": "kvrank",
                "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
            }
        ],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(conf))
    port = free_port()
    assert cluster.network is not None
    command = [
        "prometheus",
        f"--config.file={workdir / 'prometheus.yml'}",
        f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address={POD_GATEWAY}:{port}",
    ]
    cluster.supervisor.start("prometheus", cluster.network.wrap(command))
    url = f"http://{POD_GATEWAY}:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/-/ready", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, "Prometheus ready", 60, lambda: cluster.logs(40))
    return url


def _prometheus_name(label: str) -> str:
    """A Kubernetes label as prometheus-operator spells it in a target label."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector's ``matchLabels`` and ``In`` expressions, as the API server reads them."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In", expr
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


class PodTargets:
    """Prometheus pod discovery through the API server, written as a ``file_sd`` file.

    Debian's Prometheus is built without ``kubernetes_sd_configs``; this writes what
    kube-prometheus-stack makes of kvrank's monitors. The operator's PodMonitor (its
    ``podTargetLabels: [app.kubernetes.io/instance, kvrank.io/version]``): every Running
    ranker pod annotated ``prometheus.io/scrape: "true"`` at ``podIP:prometheus.io/port``,
    with the target labels ``namespace``, ``pod``, ``container``, ``endpoint``, ``job`` and
    the two pod labels in Prometheus' spelling. The chart's ServiceMonitor: every operator
    pod at its ``metrics`` port, labelled ``namespace``, ``pod``, ``container``,
    ``endpoint``, ``service`` and ``job`` (the Service's name). It lists pods with
    Prometheus' own ServiceAccount token, so its RBAC is exercised as in a cluster.
    """

    def __init__(self, kubeconfig: Path, out: Path, ns: str) -> None:
        from kubernetes import client, config

        self.api = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
        self.out = out
        self.ns = ns
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self.write()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self.write()
            except Exception:
                continue

    def write(self) -> None:
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.targets()))
        os.replace(tmp, self.out)

    def targets(self) -> list[dict[str, Any]]:
        return self.ranker_targets() + self.operator_targets()

    def _running(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        pods = self.api.list_namespaced_pod(namespace, label_selector=selector).to_dict()
        return [
            p
            for p in pods["items"]
            if (p.get("status") or {}).get("phase") == "Running"
            and p["status"].get("pod_ip")
            and not p["metadata"].get("deletion_timestamp")
        ]

    def ranker_targets(self) -> list[dict[str, Any]]:
        """What the operator's own PodMonitor (its builder, not a copy) selects and labels:
        each pod it selects, at the port of each endpoint whose ``keep`` relabeling the pod's
        component passes (ranker pods at ``/metrics``, router pods at Envoy's statistics)."""
        out = []
        for pod in self._running(self.ns):
            meta = pod["metadata"]
            labels = meta.get("labels") or {}
            instance = labels.get("app.kubernetes.io/instance")
            if not instance:
                continue
            monitor = pod_monitor(instance, self.ns, PodMonitoring())["spec"]
            if not _selects(monitor["selector"], labels):
                continue
            # a port of any container, as prometheus-operator matches it (behind a queue
            # proxy the pod's http port is the proxy container's)
            ports = {
                p["name"]: (p["container_port"], c["name"])
                for c in pod["spec"]["containers"]
                for p in c.get("ports") or []
            }
            copied = {_prometheus_name(k): labels.get(k, "") for k in monitor["podTargetLabels"]}
            for endpoint in monitor["podMetricsEndpoints"]:
                (keep,) = endpoint["relabelings"]
                assert keep["sourceLabels"] == [COMPONENT_META] and keep["action"] == "keep"
                component = labels.get("app.kubernetes.io/component", "")
                if not re.fullmatch(keep["regex"], component) or endpoint["port"] not in ports:
                    continue
                out.append(
                    {
                        "targets": [f"{pod['status']['pod_ip']}:{ports[endpoint['port']][0]}"],
                        "labels": {
                            "__metrics_path__": endpoint["path"],
                            "namespace": meta["namespace"],
                            "pod": meta["name"],
                            "container": ports[endpoint["port"]][1],
                            "endpoint": endpoint["port"],
                            "job": f"{meta['namespace']}/{instance}",
                            **copied,
                        },
                    }
                )
        return out

    def operator_targets(self) -> list[dict[str, Any]]:
        out = []
        for pod in self._running(OPERATOR_NS, OPERATOR_SELECTOR):
            meta, container = pod["metadata"], pod["spec"]["containers"][0]
            port = next(p["container_port"] for p in container["ports"] if p["name"] == "metrics")
            service = f"{RELEASE}-kvrank-operator"
            out.append(
                {
                    "targets": [f"{pod['status']['pod_ip']}:{port}"],
                    "labels": {
                        "namespace": meta["namespace"],
                        "pod": meta["name"],
                        "container": container["name"],
                        "endpoint": "metrics",
                        "service": service,
                        "job": service,
                    },
                }
            )
        return out
