"""The two backends the end-to-end scenarios run on, behind one interface.

- :class:`LocalStack` (``KVRANK_E2E_BACKEND=local``, the default; runs in ``make test``): a
  local control plane whose only node is a :class:`~localkube.proclet.ProcessNode`, so the
  operator pod installed by ``helm install`` and every ranker and purge-Job pod run as real
  local processes; a real Redis Cluster (redis-server processes) used through the
  external-Redis mode; a real Prometheus that discovers the ranker pods through the API
  server (``kubernetes_sd_configs``) and is the operator's TTL source.
- :class:`KindStack` (``KVRANK_E2E_BACKEND=kind``; ``make e2e-kind``): a kind cluster, the
  two images built and loaded, the chart installed, managed Redis, traffic through
  ``kubectl port-forward``.

A scenario only talks to the stack: install the operator, adapt a RankerDeployment to the
backend (model volume, images, Redis), send scoring requests through a Service, count a
cache namespace's keys in Redis, kill the operator or a Redis node, read a ranker's metrics.
"""

from __future__ import annotations

import functools
import http.server
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import redis
import yaml
from localkube.kind import MODELS_MOUNT, KindCluster
from localkube.local import LocalCluster
from localkube.processes import die_with_parent, free_port
from localkube.proclet import ProcessNode

from kvrank.localstack import RedisCluster, free_port_pair, start_redis_cluster
from kvrank.model.artifact import save_model
from kvrank.model.config import ModelConfig
from kvrank.model.ranker import RankerModel

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "kvrank-operator"
NS = "kvrank-e2e"
OPERATOR_NS = "kvrank-system"
RELEASE = "kvrank"
OPERATOR_SELECTOR = "app.kubernetes.io/name=kvrank-operator"
RANKER_IMAGE = "ghcr.io/kvrank/ranker"
OPERATOR_IMAGE = "ghcr.io/kvrank/operator"
MODEL_CONFIG = ModelConfig(
    d_model=16,
    n_heads=2,
    n_layers=2,
    max_events=16,
    ns_tokens=1,
    cand_tokens=2,
    emb_dim=4,
    item_buckets=1000,
    profile_buckets=100,
)
"""A small model: the scenarios test serving and operations, not ranking quality."""


def write_models(root: Path, versions: tuple[str, ...] = ("v1", "v2", "v3")) -> Path:
    """``root/feed-ranker/<version>`` artifacts, one seed per version (different scores)."""
    import torch

    for i, version in enumerate(versions):
        target = root / "feed-ranker" / version
        if (target / "config.json").exists():
            continue
        torch.manual_seed(i)
        save_model(RankerModel(MODEL_CONFIG, version), target)
    return root


def wait_for(cond: Callable[[], Any], what: str, timeout: float, report: Callable[[], str]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{report()}")


class Stack:
    """What both backends share: kubectl helpers, Services → pod addresses, failure logs."""

    cluster: LocalCluster | KindCluster
    backend: str
    chart_values: tuple[str, ...] = ()
    """``--set`` values for ``helm install`` on this backend."""
    install_timeout_s = 120

    def __init__(self) -> None:
        self._rr = itertools.count()
        self._routes: dict[str, tuple[float, list[str]]] = {}

    # ------------------------------------------------------------------ the operator
    def install_operator(self) -> None:
        values = [arg for v in self.chart_values for arg in ("--set", v)]
        self.cluster.helm(
            "install",
            RELEASE,
            str(CHART),
            "--namespace",
            OPERATOR_NS,
            "--create-namespace",
            *values,
            "--wait",
            f"--timeout={self.install_timeout_s}s",
        )

    def kill_operator(self) -> None:
        """Delete the operator pod; its Deployment starts a new one."""
        self.kubectl("delete", "pod", "-n", OPERATOR_NS, "-l", OPERATOR_SELECTOR, "--wait=false")

    # ------------------------------------------------------------------ kubectl
    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> str:
        return self.cluster.kubectl(*args, check=check, input=input).stdout

    def get(self, kind: str, name: str, ns: str = NS) -> dict[str, Any] | None:
        out = self.cluster.kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
        return json.loads(out.stdout) if out.returncode == 0 else None

    def list(self, kind: str, selector: str, ns: str = NS) -> list[dict[str, Any]]:
        out = self.kubectl("get", kind, "-n", ns, "-l", selector, "-o", "json")
        return list(json.loads(out)["items"])

    def apply(self, doc: dict[str, Any], check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl(
            "apply", "-n", NS, "-f", "-", input=json.dumps(doc), check=check
        )

    def operator_log(self, lines: int = 60) -> str:
        out = self.cluster.kubectl(
            "logs",
            "-n",
            OPERATOR_NS,
            "-l",
            OPERATOR_SELECTOR,
            f"--tail={lines}",
            check=False,
        )
        return out.stdout or out.stderr

    def report(self) -> str:
        """Objects, Events and logs that explain a failing scenario."""
        parts = [
            "--- RankerDeployments ---",
            self.kubectl("get", "rkd", "-n", NS, "-o", "yaml", check=False)[-3000:],
            "--- pods ---",
            self.kubectl("get", "pods", "-A", "-o", "wide", check=False),
            "--- events ---",
            "\n".join(
                self.kubectl(
                    "get", "events", "-n", NS, "--sort-by=.lastTimestamp", check=False
                ).splitlines()[-25:]
            ),
            "--- operator log ---",
            self.operator_log(),
        ]
        return "\n".join(parts)

    def wait_for(self, cond: Callable[[], Any], what: str, timeout: float = 120.0) -> Any:
        return wait_for(cond, what, timeout, self.report)

    # ------------------------------------------------------------------ traffic
    def endpoints(self, service: str) -> list[str]:
        """Ready ``ip:port`` of a Service, read from its EndpointSlices."""
        slices = self.list("endpointslices", f"kubernetes.io/service-name={service}")
        out = []
        for s in slices:
            port = next((p["port"] for p in s.get("ports") or [] if p.get("name") == "http"), None)
            for ep in s.get("endpoints") or []:
                if port and (ep.get("conditions") or {}).get("ready"):
                    out += [f"{ip}:{port}" for ip in ep["addresses"]]
        return sorted(out)

    def base_urls(self, service: str) -> list[str]:
        raise NotImplementedError

    def canary_uri(self, version: str) -> str:
        """Where a canary's artifact is: a path in the model volume unless overridden."""
        return f"/models/feed-ranker/{version}"

    def routes(self, service: str) -> list[str]:
        """``base_urls`` as a proxy sees them: refreshed at most every second."""
        cached = self._routes.get(service)
        if cached is None or time.monotonic() - cached[0] > 1.0:
            cached = (time.monotonic(), self.base_urls(service))
            self._routes[service] = cached
        return cached[1]

    def score(self, service: str, body: dict[str, Any], timeout: float = 30.0) -> httpx.Response:
        """One request through the Service (round-robin over its ready endpoints)."""
        urls = self.routes(service)
        if not urls:
            raise AssertionError(f"service {service} has no ready endpoints\n{self.report()}")
        url = urls[next(self._rr) % len(urls)]
        return httpx.post(f"{url}/v1/score", json=body, timeout=timeout)

    def metrics(self, service: str) -> list[str]:
        """The ``/metrics`` text of every ready pod behind ``service``."""
        return [httpx.get(f"{u}/metrics", timeout=10).text for u in self.base_urls(service)]


# ====================================================================== local
class LocalStack(Stack):
    backend = "local"
    chart_values = ("logLevel=INFO",)

    def __init__(self, workdir: Path) -> None:
        super().__init__()
        self.workdir = workdir
        self.cluster = LocalCluster(workdir / "cluster", nodes=())
        self.node: ProcessNode | None = None
        self.redis: RedisCluster | None = None
        self.prometheus: subprocess.Popen[bytes] | None = None
        self.prometheus_url = ""
        self.discovery: PodDiscovery | None = None
        self.model_server: StaticFiles | None = None
        self.models = write_models(workdir / "models")

    def start(self) -> LocalStack:
        try:
            self.cluster.start()
            bin_dir = Path(sys.executable).parent
            self.node = ProcessNode(
                self.cluster.kubeconfig,
                self.cluster.server,
                self.cluster.pki_dir / "ca.crt",
                self.workdir / "node",
                images={
                    RANKER_IMAGE: [str(bin_dir / "kvrank")],
                    OPERATOR_IMAGE: [str(bin_dir / "kvrank-operator")],
                },
                gpus=16,  # room for a promoted canary next to the old version (max 5 + 5)
            ).start()
            self.redis = start_redis_cluster(self.workdir / "redis")
            self.model_server = StaticFiles(self.models)
            self.model_server.start()
            self.kubectl("create", "namespace", NS)
            self._start_prometheus()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.model_server is not None:
            self.model_server.stop()
        if self.discovery is not None:
            self.discovery.stop()
        if self.prometheus is not None:
            self.prometheus.terminate()
            self.prometheus.wait(timeout=30)
        if self.node is not None:
            self.node.stop()
        if self.redis is not None:
            self.redis.stop()
        self.cluster.stop()

    def adapt(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Models from a hostPath volume; L2 is the local Redis Cluster (external mode)."""
        assert self.redis is not None
        doc = json.loads(json.dumps(doc))
        spec = doc["spec"]
        spec["model"]["volume"] = {"hostPath": {"path": str(self.models), "type": "Directory"}}
        spec["model"].pop("resources", None)
        spec["model"]["resources"] = {"limits": {"nvidia.com/gpu": 1}}
        cache = spec.setdefault("cache", {})
        cache["l1Bytes"] = 64 * 2**20
        cache["redis"] = {"mode": "external", "url": self.redis.url, "cluster": True}
        return doc

    def ttl_source(self) -> dict[str, Any]:
        return {"type": "prometheus", "prometheus": {"url": self.prometheus_url}}

    def canary_uri(self, version: str) -> str:
        """Canaries come by URL here, so artifact download is exercised too."""
        assert self.model_server is not None
        return f"{self.model_server.url}/feed-ranker/{version}"

    def base_urls(self, service: str) -> list[str]:
        # kube-proxy's job: a Service resolves to its ready endpoints, reached through the
        # process node's pod network
        assert self.node is not None
        urls = []
        for ep in self.endpoints(service):
            ip, port = ep.rsplit(":", 1)
            urls.append(f"http://{self.node.address(ip)}:{port}")
        return urls

    def redis_keys(self, cache_ns: str) -> int:
        assert self.redis is not None
        total = 0
        for node in self.redis.nodes:
            if node.proc is None:
                continue
            r = redis.Redis(port=node.port)
            try:
                for pattern in (f"kvrank:{cache_ns}:*", f"kvrank-head:{cache_ns}:*"):
                    total += sum(1 for _ in r.scan_iter(match=pattern, count=500))
            finally:
                r.close()
        return total

    def kill_redis_node(self) -> Callable[[], None]:
        """Kill one master (a third of the slots go dark); returns how to bring it back."""
        assert self.redis is not None
        node = self.redis.nodes[-1]
        node.stop()

        def restore() -> None:
            node.start()
            assert self.redis is not None
            self.redis.wait_ok()

        return restore

    def operator_log(self, lines: int = 60) -> str:
        # no kubelet API here (kubectl logs): the process node has every container's log
        assert self.node is not None
        return self.node.logs(lines // 3)

    def _start_prometheus(self) -> None:
        """Prometheus discovers the ranker pods through the API server, as in a cluster."""
        rbac = [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "prometheus"}},
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "prometheus"},
                "rules": [
                    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
                ],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "prometheus"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "prometheus",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": NS}],
            },
        ]
        self.kubectl(
            "apply",
            "-n",
            NS,
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": rbac}),
        )
        kubeconfig = self.cluster.service_account_kubeconfig(NS, "prometheus", 4 * 3600)
        assert self.node is not None
        self.discovery = PodDiscovery(kubeconfig, NS, self.node.address)
        self.discovery.start()
        conf = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": "kvrank-rankers",
                    "http_sd_configs": [
                        {"url": self.discovery.targets_url, "refresh_interval": "1s"}
                    ],
                }
            ],
        }
        prom_dir = self.workdir / "prometheus"
        prom_dir.mkdir(parents=True, exist_ok=True)
        (prom_dir / "prometheus.yml").write_text(yaml.safe_dump(conf))
        port = free_port()
        log = (prom_dir / "prometheus.log").open("wb")
        self.prometheus = subprocess.Popen(
            [
                shutil.which("prometheus") or "prometheus",
                f"--config.file={prom_dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={prom_dir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )
        log.close()
        self.prometheus_url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(f"{self.prometheus_url}/-/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(
            up, "Prometheus ready", 60, lambda: (prom_dir / "prometheus.log").read_text()[-2000:]
        )


class LoopbackServer:
    """An HTTP server on a free loopback port, served from a daemon thread."""

    def __init__(self, handler: Callable[..., http.server.BaseHTTPRequestHandler]) -> None:
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> LoopbackServer:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


class StaticFiles(LoopbackServer):
    """A directory over HTTP (an artifact store for ``http://`` model URIs)."""

    def __init__(self, root: Path) -> None:
        super().__init__(functools.partial(_Quiet, directory=str(root)))


class PodDiscovery(LoopbackServer):
    """Prometheus pod discovery through the API server, served as ``http_sd``.

    Debian's Prometheus is built without ``kubernetes_sd_configs``; this answers with what
    that discovery plus the usual relabelling would give: every Running pod annotated
    ``prometheus.io/scrape: "true"`` at ``podIP:prometheus.io/port``, labelled with
    ``kubernetes_namespace``, ``instance_name`` and ``pod``. It lists pods with Prometheus'
    own ServiceAccount token, so its RBAC is exercised as in a cluster, and reaches pods
    through the process node's pod network (``address``).
    """

    def __init__(self, kubeconfig: Path, namespace: str, address: Callable[[str], str]) -> None:
        from kubernetes import client, config

        self.api = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
        self.namespace = namespace
        self.address = address
        discovery = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                data = json.dumps(discovery.targets()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(Handler)
        self.targets_url = f"{self.url}/targets"

    def targets(self) -> list[dict[str, Any]]:
        out = []
        for pod in self.api.list_namespaced_pod(self.namespace).items:
            ann = pod.metadata.annotations or {}
            if ann.get("prometheus.io/scrape") != "true" or pod.status.phase != "Running":
                continue
            if not pod.status.pod_ip or pod.metadata.deletion_timestamp:
                continue
            labels = pod.metadata.labels or {}
            out.append(
                {
                    "targets": [
                        f"{self.address(pod.status.pod_ip)}:{ann.get('prometheus.io/port', '8080')}"
                    ],
                    "labels": {
                        "kubernetes_namespace": pod.metadata.namespace,
                        "instance_name": labels.get("app.kubernetes.io/instance", ""),
                        "pod": pod.metadata.name,
                    },
                }
            )
        return out


# ====================================================================== kind
KIND_TAG = os.environ.get("KVRANK_E2E_TAG", "e2e")


class KindStack(Stack):
    backend = "kind"
    chart_values = (f"image.tag={KIND_TAG}", "image.pullPolicy=Never")
    install_timeout_s = 300

    def __init__(self, workdir: Path) -> None:
        super().__init__()
        self.workdir = workdir
        write_models(MODELS_MOUNT)
        self.cluster = KindCluster(workdir / "cluster")
        self.forwards: dict[str, tuple[subprocess.Popen[bytes], str]] = {}

    def start(self) -> KindStack:
        self.cluster.start()
        try:
            if os.environ.get("KVRANK_E2E_SKIP_BUILD") != "1":
                subprocess.run(["make", "images", f"IMAGE_TAG={KIND_TAG}"], cwd=ROOT, check=True)
            for image in (RANKER_IMAGE, OPERATOR_IMAGE):
                self.cluster.load_image(f"{image}:{KIND_TAG}")
            self.kubectl("create", "namespace", NS)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for proc, _ in self.forwards.values():
            proc.terminate()
        self.cluster.stop()

    def adapt(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Models from the node's /kvrank-models; managed Redis; the locally built image."""
        doc = json.loads(json.dumps(doc))
        spec = doc["spec"]
        spec["model"]["image"] = f"{RANKER_IMAGE}:{KIND_TAG}"
        spec["model"]["volume"] = {"hostPath": {"path": "/kvrank-models", "type": "Directory"}}
        spec["model"].pop("resources", None)  # kind nodes have no GPUs
        cache = spec.setdefault("cache", {})
        cache["l1Bytes"] = 64 * 2**20
        cache["redis"] = {"mode": "managed", "shards": 3, "replicasPerShard": 0, "memory": "256Mi"}
        return doc

    def ttl_source(self) -> dict[str, Any]:
        return {"type": "pods"}

    def base_urls(self, service: str) -> list[str]:
        if not self.endpoints(service):
            return []
        if service not in self.forwards or self.forwards[service][0].poll() is not None:
            port = free_port_pair()
            proc = subprocess.Popen(
                [
                    self.cluster.kubectl_bin,
                    f"--kubeconfig={self.cluster.kubeconfig}",
                    "port-forward",
                    "-n",
                    NS,
                    f"svc/{service}",
                    f"{port}:8080",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.forwards[service] = (proc, f"http://127.0.0.1:{port}")
            time.sleep(2)
        return [self.forwards[service][1]]

    def _redis_pods(self) -> list[str]:
        pods = self.list("pods", "app.kubernetes.io/component=redis")
        return [p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running"]

    def redis_keys(self, cache_ns: str) -> int:
        total = 0
        for pod in self._redis_pods():
            for pattern in (f"kvrank:{cache_ns}:*", f"kvrank-head:{cache_ns}:*"):
                out = self.kubectl(
                    "exec",
                    "-n",
                    NS,
                    pod,
                    "--",
                    "sh",
                    "-c",
                    'redis-cli -a "$REDIS_PASSWORD" --no-auth-warning --scan'
                    f' --pattern "{pattern}"',
                    check=False,
                )
                total += len([line for line in out.splitlines() if line.strip()])
        return total

    def kill_redis_node(self) -> Callable[[], None]:
        pod = self._redis_pods()[-1]
        self.kubectl("delete", "pod", "-n", NS, pod, "--grace-period=0", "--force")
        return lambda: None  # the StatefulSet brings it back


def stack_from_env(workdir: Path) -> LocalStack | KindStack:
    backend = os.environ.get("KVRANK_E2E_BACKEND", "local")
    if backend == "local":
        return LocalStack(workdir)
    if backend == "kind":
        return KindStack(workdir)
    raise ValueError(f"KVRANK_E2E_BACKEND={backend!r}: expected 'local' or 'kind'")


def metric_values(texts: list[str], name: str) -> list[float]:
    """Every sample of ``name`` in Prometheus text exposition."""
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", re.M)
    return [float(v) for text in texts for v in pattern.findall(text)]
