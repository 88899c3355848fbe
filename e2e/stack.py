"""The two backends the end-to-end scenarios run on, behind one interface.

Both run the product as a user would: the images ``make images`` builds, the operator
installed by ``helm install`` and running in-cluster, ranker pods created by the operator,
a managed Redis Cluster formed by its bootstrap Job, model artifacts fetched by URL from an
artifact-store pod (Pod Security ``restricted`` forbids hostPath volumes), and the test
namespaces labelled ``pod-security.kubernetes.io/enforce: restricted``.

- :class:`LocalStack` (``KVRANK_CLUSTER=local``, the default; runs in ``make test``):
  the local cluster with its real node (kubelet + containerd + runc, kube-proxy, CoreDNS,
  kube-router); the images imported into the node's containerd; traffic to Service
  ClusterIPs through kube-proxy, metrics straight from pod IPs; a real Prometheus (Debian's)
  in the node's network namespace is the operator's TTL source.
- :class:`KindStack` (``KVRANK_CLUSTER=kind``; ``make e2e-kind``): a kind cluster, the
  same images loaded with ``kind load``, traffic through ``kubectl port-forward``.

A scenario talks to the stack (kubectl, waits, Services, metrics) through the operator's
release (``release.py``) and its own RankerDeployments (``rankers.py``). The models the stack
serves and their store are ``artifacts.py``'s; the local backend's Prometheus is
``local_prometheus.py``'s.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from artifacts import (
    ARTIFACTS,
    ARTIFACTS_PORT,
    S3_BUCKET,
    SLOW_PREFIX,
    artifact_store,
    write_models,
)
from chart import OPERATOR_NS, OPERATOR_SELECTOR, RELEASE
from local_prometheus import Prometheus, start_prometheus
from localkube.engine import Docker, Images
from localkube.images import PAUSE_IMAGE
from localkube.kind import KindCluster
from localkube.local import LocalCluster
from localkube.network import POD_GATEWAY
from localkube.processes import free_port, wait_for
from localkube.tools import Cluster
from object_stores import S3

from kvrank.admission import TIMEOUT_HEADER
from kvrank.model.artifact import artifact_sha256
from kvrank.tools.processes import free_port_pair, samples

ROOT = Path(__file__).resolve().parent.parent
NS = "kvrank-e2e"
REDIS_SELECTOR = "app.kubernetes.io/component=redis"
REDIS_TLS_DIR = "/run/redis-tls"
"""Where a managed Redis pod with ``tls: true`` has its certificates."""
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}


class Stack:
    """What both backends share: the operator, images, Redis, Services, failure reports."""

    cluster: Cluster
    backend: str
    install_timeout_s = 300

    def __init__(self, workdir: Path, docker: Docker, images: Images, cluster: Cluster) -> None:
        self.workdir = workdir
        self.docker = docker
        self.images = images
        self.cluster = cluster
        self.models = write_models(workdir / "models")
        self._rr = itertools.count()
        self._routes: dict[str, tuple[float, list[str]]] = {}

    # ------------------------------------------------------------------ setup
    def start(self) -> Stack:
        """Load the images into the (started) cluster, then the namespaces."""
        raise NotImplementedError

    def stop(self) -> None:
        """Remove what :meth:`start` and the tests made; the cluster stays up."""
        self.cluster.helm("uninstall", RELEASE, "--namespace", OPERATOR_NS, check=False)
        for ns in (NS, OPERATOR_NS):  # the cluster outlives the stack: no need to wait
            self.kubectl("delete", "namespace", ns, "--wait=false", check=False)

    def prepare_namespaces(self) -> None:
        """Both namespaces admit only ``restricted`` pods; then the artifact store."""
        for ns in (NS, OPERATOR_NS):
            self.kubectl("create", "namespace", ns)
            self.kubectl("label", "namespace", ns, *(f"{k}={v}" for k, v in RESTRICTED.items()))
        docs = artifact_store(self.models, self.images.ranker)
        self.kubectl(  # server-side: the files are too large for the client-side annotation
            "apply",
            "--server-side",
            "-n",
            NS,
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}),
        )
        self.kubectl("rollout", "status", "-n", NS, f"deployment/{ARTIFACTS}", "--timeout=300s")

    # ------------------------------------------------------------------ the operator
    def operator_log(self, lines: int = 60) -> str:
        out = self.cluster.kubectl(
            "logs", "-n", OPERATOR_NS, "-l", OPERATOR_SELECTOR, f"--tail={lines}", check=False
        )
        return out.stdout or out.stderr

    # ------------------------------------------------------------------ the RankerDeployment
    def model_uri(self, version: str, slow: bool = False, model: str = "feed-ranker") -> str:
        """Where ``version``'s artifact is served; ``slow`` answers take ``SLOW_DELAY_S`` each."""
        prefix = SLOW_PREFIX if slow else ""
        return f"http://{ARTIFACTS}.{NS}.svc:{ARTIFACTS_PORT}{prefix}/{model}/{version}"

    def artifact_sha256(self, version: str, model: str = "feed-ranker") -> str:
        """The SHA-256 of ``version``'s artifact (what ``model.sha256`` pins)."""
        return artifact_sha256(self.models / model / version)

    def adapt(self, doc: dict[str, Any], artifact: bool = True) -> dict[str, Any]:
        """This run's images, the artifact store's URL (``artifact=False``: the example's
        own ``uri`` and ``volume``), a managed 3-master Redis Cluster, pods sized for a
        2-core node."""
        doc = json.loads(json.dumps(doc))
        spec = doc["spec"]
        spec["model"]["image"] = self.images.ranker
        if artifact:
            spec["model"]["uri"] = self.model_uri(spec["model"]["version"])
            spec["model"].pop("volume", None)
        # the node's GPUs are a fake extended resource (GPU-requesting pods schedule, as on a
        # GPU node); told they have one, rankers would exit for want of CUDA: they use the CPU
        spec["model"]["env"] = [{"name": "KVRANK_DEVICE", "value": "cpu"}]
        # the examples size pods for a GPU node (cores, GiB); this node has 2 cores for all
        # the pods of a run, so only the GPU is kept (the storage defaults still apply)
        gpu = (spec["model"].get("resources") or {}).get("limits", {}).get("nvidia.com/gpu")
        spec["model"]["resources"] = {"limits": {"nvidia.com/gpu": gpu}} if gpu else {}
        cache = spec.setdefault("cache", {})
        cache["l1Bytes"] = 64 * 2**20
        # fp32 K/V: scores are then checked against the full forward pass at 1e-5 (bf16 and
        # INT8 K/V and their tolerances are the ranker tests' and the benchmarks' business)
        cache["kvDtype"] = "fp32"
        cache["redis"] = {
            "mode": "managed",
            "shards": 3,
            "replicasPerShard": 0,
            "memory": "256Mi",
            "image": self.images.redis,
            # a token CPU request: a run's Redis pods must all fit the node's 2 cores
            "resources": {
                "requests": {"cpu": "10m", "memory": "256Mi"},
                "limits": {"memory": "256Mi"},
            },
        }
        return doc

    def ttl_source(self) -> dict[str, Any]:
        return {"type": "pods"}

    def storage_for(self, claim: str) -> str:
        """The cluster's storage for a claim an example makes (this cluster has no
        provisioner): a PersistentVolume pre-bound to ``claim`` in the run's namespace, over an
        empty folder of the node's that any pod's user may write. Returns its name (the
        caller deletes it)."""
        folder = self.workdir / "volumes" / claim
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o777)
        pv = f"{NS}-{claim}"
        self.apply_cluster(
            {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
             "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                      "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                      "hostPath": {"path": str(folder), "type": "Directory"},
                      "claimRef": {"namespace": NS, "name": claim}}}
        )  # fmt: skip
        return pv

    def apply_cluster(self, doc: dict[str, Any]) -> None:
        """A cluster-scoped object (removed with the cluster)."""
        self.cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))

    def s3_endpoint(self) -> str:
        """Where pods reach the S3-compatible store holding the artifacts (bucket
        :data:`S3_BUCKET`, the same files as the artifact store)."""
        raise NotImplementedError(f"no S3 store on the {self.backend} backend")

    def from_s3(self, doc: dict[str, Any], secret: str) -> dict[str, Any]:
        """``doc`` with its model (and canary) fetched from the S3 store: ``s3://`` URIs,
        the weights' sha256 pinned, and the store's endpoint and credentials in the pods'
        env (the keys from the Secret ``secret``, created here)."""
        env = S3.env(self.s3_endpoint())
        keys = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
        self.apply(
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret},
             "stringData": {k: env.pop(k) for k in keys}}
        )  # fmt: skip
        doc = json.loads(json.dumps(doc))
        spec = doc["spec"]
        for part in (spec["model"], spec.get("canary")):
            if part is not None:
                path = Path("feed-ranker") / part["version"]
                part["uri"] = f"s3://{S3_BUCKET}/{path}"
                part["sha256"] = self.artifact_sha256(part["version"])
        spec["model"]["env"] = [  # once: the same doc again must not change the pods
            *(e for e in spec["model"].get("env", []) if not e["name"].startswith("AWS_")),
            *({"name": k, "value": v} for k, v in env.items()),
            *({"name": k, "valueFrom": {"secretKeyRef": {"name": secret, "key": k}}} for k in keys),
        ]
        return doc

    # ------------------------------------------------------------------ kubectl
    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> str:
        return self.cluster.kubectl(*args, check=check, input=input).stdout

    def rkd(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``kubectl rkd ARGS -n NS``: kubectl runs kvrank's plugin (the ``kubectl-rkd``
        console script, found on PATH as a user's shell would find it)."""
        venv = Path(sys.executable).parent
        return self.cluster.kubectl_plugin("rkd", *args, "-n", NS, path=venv, check=check)

    def must_get(self, kind: str, name: str, ns: str = NS) -> dict[str, Any]:
        """An object that must exist now (fails with the stack's report when it does not)."""
        obj = self.get(kind, name, ns)
        if obj is None:
            raise AssertionError(f"{kind}/{name} not found in {ns}\n{self.report()}")
        return obj

    def get(self, kind: str, name: str, ns: str = NS) -> dict[str, Any] | None:
        out = self.cluster.kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
        return json.loads(out.stdout) if out.returncode == 0 else None

    def select(self, kind: str, selector: str, ns: str = NS) -> list[dict[str, Any]]:
        out = self.kubectl("get", kind, "-n", ns, "-l", selector, "-o", "json")
        return list(json.loads(out)["items"])

    def apply(self, doc: dict[str, Any], check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl(
            "apply", "-n", NS, "-f", "-", input=json.dumps(doc), check=check
        )

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
                    "get", "events", "-A", "--sort-by=.lastTimestamp", check=False
                ).splitlines()[-30:]
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
        slices = self.select("endpointslices", f"kubernetes.io/service-name={service}")
        out = []
        for s in slices:
            port = next((p["port"] for p in s.get("ports") or [] if p.get("name") == "http"), None)
            for ep in s.get("endpoints") or []:
                if port and (ep.get("conditions") or {}).get("ready"):
                    out += [f"{ip}:{port}" for ip in ep["addresses"]]
        return sorted(out)

    def base_urls(self, service: str) -> list[str]:
        """Where a client sends requests for ``service``."""
        raise NotImplementedError

    def grpc_address(self, service: str) -> str:
        """``host:port`` where a gRPC client reaches ``service``'s ``grpc`` port."""
        raise NotImplementedError

    def pod_urls(self, service: str) -> list[str]:
        """One URL per ready pod behind ``service`` (for per-pod metrics)."""
        return self.base_urls(service)

    def routes(self, service: str) -> list[str]:
        """``base_urls`` as a proxy sees them: refreshed at most every second."""
        cached = self._routes.get(service)
        if cached is None or time.monotonic() - cached[0] > 1.0:
            cached = (time.monotonic(), self.base_urls(service))
            self._routes[service] = cached
        return cached[1]

    def score(
        self,
        service: str,
        body: dict[str, Any],
        timeout: float = 30.0,
        headers: dict[str, str] | None = None,
        path: str = "/v1/score",
    ) -> httpx.Response:
        """One request through the Service (``path``: another endpoint, ``/v1/prefetch``),
        the caller stating the deadline it waits for (``timeout``) as every ranking caller
        should: the server's 5 s default is not what these callers wait. The client waits a
        few seconds more than it states, so a request past its deadline ends with the
        server's own answer (a 504 that says where the time went), not a bare read timeout."""
        headers = {TIMEOUT_HEADER: str(int(timeout * 1000)), **(headers or {})}
        urls = self.routes(service)
        if not urls:
            raise AssertionError(f"service {service} has no ready endpoints\n{self.report()}")
        url = urls[next(self._rr) % len(urls)]
        return httpx.post(f"{url}{path}", json=body, timeout=timeout + 5, headers=headers)

    def metrics(self, service: str) -> list[str]:
        """The ``/metrics`` text of every ready pod behind ``service``."""
        return [httpx.get(f"{u}/metrics", timeout=10).text for u in self.pod_urls(service)]

    def command_lines(self) -> list[str]:
        """Every process command line on the cluster's nodes (what any node user can read)."""
        raise NotImplementedError


# ====================================================================== local
class LocalStack(Stack):
    backend = "local"
    cluster: LocalCluster

    def __init__(
        self, workdir: Path, docker: Docker, images: Images, cluster: LocalCluster
    ) -> None:
        super().__init__(workdir, docker, images, cluster)
        self.prometheus: Prometheus | None = None
        self.s3_url = ""

    def start(self) -> LocalStack:
        try:
            node = self.cluster.node
            assert node is not None
            node.images.import_from_docker(["docker"], self.docker.env, self.images.all())
            node.images.prune(keep={*self.images.all(), PAUSE_IMAGE})
            node.images.name_by_id(self.images.examples)  # their model images back volumes
            self.prepare_namespaces()
            self.prometheus = start_prometheus(self.cluster, self.workdir / "prometheus", NS)
            self._start_s3()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.prometheus is not None:
            self.prometheus.stop(self.cluster)
        self.cluster.supervisor.stop_named("s3")
        super().stop()

    def s3_endpoint(self) -> str:
        return self.s3_url

    def _start_s3(self) -> None:
        """The S3 store (gofakes3) in the node's network namespace, serving the artifact
        folder as the bucket :data:`S3_BUCKET`."""
        port = free_port()
        assert self.cluster.network is not None
        command = S3.command(self.models, S3_BUCKET, POD_GATEWAY, port)
        self.cluster.supervisor.start("s3", self.cluster.network.wrap(command))
        self.s3_url = f"http://{POD_GATEWAY}:{port}"
        wait_for(
            lambda: S3.up(self.s3_url, S3_BUCKET),
            "the S3 store up",
            60,
            lambda: self.cluster.logs(40),
        )

    def ttl_source(self) -> dict[str, Any]:
        return {"type": "prometheus", "prometheus": {"url": self.prometheus_url}}

    @property
    def prometheus_url(self) -> str:
        """Where pods (and the tests) reach the run's Prometheus."""
        assert self.prometheus is not None, "Prometheus is not started"
        return self.prometheus.url

    def command_lines(self) -> list[str]:
        """The node is this machine: its ``/proc`` holds every container's processes."""
        lines = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                lines.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue  # the process ended meanwhile
        return lines

    def base_urls(self, service: str) -> list[str]:
        """The Service's ClusterIP: kube-proxy picks the pod, as for any client in the cluster."""
        if not self.endpoints(service):
            return []
        svc = self.get("service", service)
        assert svc is not None, f"no service {service}"
        port = svc["spec"]["ports"][0]["port"]
        return [f"http://{svc['spec']['clusterIP']}:{port}"]

    def pod_urls(self, service: str) -> list[str]:
        return [f"http://{ep}" for ep in self.endpoints(service)]

    def grpc_address(self, service: str) -> str:
        svc = self.get("service", service)
        assert svc is not None, f"no service {service}"
        (port,) = [p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc"]
        return f"{svc['spec']['clusterIP']}:{port}"


# ====================================================================== kind
class KindStack(Stack):
    backend = "kind"
    cluster: KindCluster

    def __init__(self, workdir: Path, docker: Docker, images: Images, cluster: KindCluster) -> None:
        super().__init__(workdir, docker, images, cluster)
        self.forwards: dict[str, tuple[subprocess.Popen[bytes], str]] = {}

    def start(self) -> KindStack:
        try:
            self.cluster.advertise_gpus(8)
            for ref in self.images.all():
                self.cluster.load_image(ref)
            self.prepare_namespaces()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for proc, _ in self.forwards.values():
            proc.terminate()
        super().stop()

    def command_lines(self) -> list[str]:
        nodes = subprocess.run(
            ["kind", "get", "nodes", "--name", self.cluster.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        script = "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done"
        return [
            line
            for node in nodes
            for line in subprocess.run(
                ["docker", "exec", node, "sh", "-c", script], capture_output=True, text=True
            ).stdout.splitlines()
        ]

    def base_urls(self, service: str) -> list[str]:
        if not self.endpoints(service):
            return []
        return [f"http://{self._forward(service, 8080)}"]

    def grpc_address(self, service: str) -> str:
        return self._forward(service, 8001)

    def _forward(self, service: str, port: int) -> str:
        """``127.0.0.1:<local>`` forwarded to ``service``'s ``port`` (kept while it runs)."""
        key = f"{service}:{port}"
        if key not in self.forwards or self.forwards[key][0].poll() is not None:
            local = free_port_pair()
            proc = subprocess.Popen(
                [
                    self.cluster.kubectl_bin,
                    f"--kubeconfig={self.cluster.kubeconfig}",
                    "port-forward",
                    "-n",
                    NS,
                    f"svc/{service}",
                    f"{local}:{port}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.forwards[key] = (proc, f"127.0.0.1:{local}")
            time.sleep(2)
        return self.forwards[key][1]


def stack_for(cluster: Cluster, workdir: Path, docker: Docker, images: Images) -> Stack:
    """The stack of the session's cluster backend (``KVRANK_CLUSTER``: local or kind)."""
    if isinstance(cluster, LocalCluster):
        return LocalStack(workdir, docker, images, cluster)
    if isinstance(cluster, KindCluster):
        return KindStack(workdir, docker, images, cluster)
    raise TypeError(f"no e2e stack for {type(cluster).__name__}")


def metric_values(texts: list[str], name: str, **labels: str) -> list[float]:
    """Every sample called ``name`` (with ``labels``) in Prometheus text expositions."""
    return [value for text in texts for value in samples(text, name, **labels)]
