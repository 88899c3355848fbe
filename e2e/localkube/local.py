"""A real Kubernetes cluster of one real node, as child processes under one directory.

etcd, kube-apiserver (TLS, Node+RBAC authorization with NodeRestriction, service-account
signing), kube-controller-manager and kube-scheduler run inside the node's own network
namespace (:mod:`localkube.network`), and a :class:`~localkube.node.RealNode` (kubelet,
containerd, runc, kube-proxy, CoreDNS, kube-router) runs the pods as containers. One such
cluster per machine: it owns the pod and Service ranges.

Binaries come from ``build.sh`` (see :func:`binaries`).
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localkube import pki
from localkube.network import NODE_IP, NodeNetwork
from localkube.node import NODE_NAME, NodeContext, RealNode
from localkube.pki import kubeconfig_doc
from localkube.processes import Supervisor, free_port, tail, wait_for
from localkube.tools import AUDIT_POLICY, Cluster

BUILD_SCRIPT = Path(__file__).with_name("build.sh")
SERVICE_CIDR = "10.96.0.0/16"


def binaries() -> Path:
    """The directory with the pinned binaries: ``$KVRANK_KUBE_BIN`` or built/reused now."""
    env = os.environ.get("KVRANK_KUBE_BIN")
    if env:
        return Path(env)
    out = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"building the control-plane binaries failed:\n{out.stderr[-4000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


@dataclass
class LocalCluster(Cluster):
    """Start with :meth:`start`, stop with :meth:`stop`; ``kubeconfig`` is the admin's."""

    workdir: Path
    tie_to_parent: bool = True

    def __post_init__(self) -> None:
        self.bin = binaries()
        self.kubectl_bin = str(self.bin / "kubectl")
        self.helm_bin = str(self.bin / "helm")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.pki_dir = self.workdir / "pki"
        self.log_dir = self.workdir / "logs"
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.audit_log = self.workdir / "audit.log"
        self.supervisor = Supervisor(self.log_dir, self.tie_to_parent)
        self.api_port = 0
        self.server = ""
        self.network = NodeNetwork()
        self.node: RealNode | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 60.0) -> LocalCluster:
        started = time.monotonic()
        try:
            self._start_components(timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def stop(self) -> None:
        if self.node is not None:
            self.node.stop()
        self.supervisor.stop()
        self.network.teardown()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def logs(self, lines: int = 30) -> str:
        """The last lines of every component's log (for failing tests)."""
        parts = []
        for log in sorted(self.log_dir.glob("*.log")):
            parts.append(f"----- {log.name} -----\n{tail(log, lines)}")
        return "\n".join(parts)

    def _audit_log(self) -> str:
        return self.audit_log.read_text() if self.audit_log.exists() else ""

    # ------------------------------------------------------------------ internals
    def _audit_policy(self) -> Path:
        path = self.workdir / "audit-policy.yaml"
        path.write_text(yaml.safe_dump(AUDIT_POLICY))
        return path

    def _client_kubeconfig(self, name: str, pair: pki.KeyPair) -> Path:
        path = self.workdir / f"{name}.kubeconfig"
        user = {"client-certificate": str(pair.cert), "client-key": str(pair.key)}
        doc = kubeconfig_doc(self.server, self.pki_dir / "ca.crt", user, name)
        path.write_text(yaml.safe_dump(doc))
        return path

    def _wrap(self, argv: list[str]) -> list[str]:
        return self.network.wrap(argv)

    def _start_components(self, timeout: float) -> None:
        self.network.setup()
        ca = pki.CertificateAuthority(self.pki_dir)
        sa = pki.service_account_keys(self.pki_dir)
        admin = ca.issue("admin", "localkube-admin", "system:masters")
        self._start_apiserver(ca, sa, self._start_etcd())
        self._client_kubeconfig("admin", admin).rename(self.kubeconfig)
        self._wait_ready(admin, timeout)
        self._start_controllers(ca, sa)
        self._start_real_node(ca, timeout)

    def _start_etcd(self) -> str:
        """etcd on loopback in the node's namespace; returns its client URL."""
        etcd_port, peer_port = free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        self.supervisor.start(
            "etcd",
            self._wrap(
                [
                    str(self.bin / "etcd"),
                    "--name=localkube",
                    f"--data-dir={self.workdir / 'etcd'}",
                    f"--listen-client-urls={etcd_url}",
                    f"--advertise-client-urls={etcd_url}",
                    f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                    f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                    f"--initial-cluster=localkube=http://127.0.0.1:{peer_port}",
                    "--listen-metrics-urls=",
                    "--log-level=warn",
                    "--quota-backend-bytes=1073741824",
                ]
            ),
        )
        return etcd_url

    def _start_apiserver(
        self, ca: pki.CertificateAuthority, sa: pki.KeyPair, etcd_url: str
    ) -> None:
        """kube-apiserver on the node's address (Node and RBAC authorization, the audit log),
        serving with a certificate for its in-cluster names."""
        serving = ca.issue(
            "apiserver",
            "kube-apiserver",
            hosts=(
                "127.0.0.1",
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "10.96.0.1",
                NODE_IP,
            ),
        )
        self.api_port = free_port()
        self.server = f"https://{NODE_IP}:{self.api_port}"
        kubelet_client = ca.issue("apiserver-kubelet-client", "kube-apiserver", "system:masters")
        # the node's namespace has no uplink: listening on all of its addresses is safe
        mode = [
            "--bind-address=0.0.0.0",
            f"--advertise-address={NODE_IP}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            f"--kubelet-client-certificate={kubelet_client.cert}",
            f"--kubelet-client-key={kubelet_client.key}",
            f"--kubelet-certificate-authority={ca.pair.cert}",
            "--kubelet-preferred-address-types=InternalIP",
        ]
        self.supervisor.start(
            "kube-apiserver",
            self._wrap(
                [
                    str(self.bin / "kube-apiserver"),
                    f"--etcd-servers={etcd_url}",
                    *mode,
                    f"--secure-port={self.api_port}",
                    f"--cert-dir={self.pki_dir}",
                    f"--tls-cert-file={serving.cert}",
                    f"--tls-private-key-file={serving.key}",
                    f"--client-ca-file={ca.pair.cert}",
                    f"--service-account-key-file={sa.cert}",
                    f"--service-account-signing-key-file={sa.key}",
                    "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                    "--api-audiences=https://kubernetes.default.svc.cluster.local",
                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                    "--allow-privileged=true",
                    "--enable-priority-and-fairness=false",
                    "--profiling=false",
                    f"--audit-policy-file={self._audit_policy()}",
                    f"--audit-log-path={self.audit_log}",
                    "--audit-log-format=json",
                ]
            ),
        )

    def _start_controllers(self, ca: pki.CertificateAuthority, sa: pki.KeyPair) -> None:
        """kube-controller-manager and kube-scheduler, each with its own client certificate."""
        cm = ca.issue("controller-manager", "system:kube-controller-manager")
        sched = ca.issue("scheduler", "system:kube-scheduler")
        self.supervisor.start(
            "kube-controller-manager",
            self._wrap(
                [
                    str(self.bin / "kube-controller-manager"),
                    f"--kubeconfig={self._client_kubeconfig('controller-manager', cm)}",
                    "--leader-elect=false",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={free_port()}",
                    f"--service-account-private-key-file={sa.key}",
                    f"--root-ca-file={ca.pair.cert}",
                    "--use-service-account-credentials=true",
                    f"--cert-dir={self.workdir / 'cm-certs'}",
                    "--controllers=*,-nodeipam",
                ]
            ),
        )
        self.supervisor.start(
            "kube-scheduler",
            self._wrap(
                [
                    str(self.bin / "kube-scheduler"),
                    f"--kubeconfig={self._client_kubeconfig('scheduler', sched)}",
                    "--leader-elect=false",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={free_port()}",
                    f"--cert-dir={self.workdir / 'sched-certs'}",
                ]
            ),
        )

    def _start_real_node(self, ca: pki.CertificateAuthority, timeout: float) -> None:
        self.node = RealNode(
            NodeContext(
                workdir=self.workdir,
                kube_bin=self.bin,
                server=self.server,
                ca=ca,
                network=self.network,
                supervisor=self.supervisor,
                admin_kubeconfig=self.kubeconfig,
            )
        )
        self.node.start(timeout)
        self._wait_for(
            lambda: self._node_ready(NODE_NAME) and self._default_sa(),
            f"node {NODE_NAME} Ready and the default ServiceAccount",
            timeout,
        )
        self.node.after_registered()

    def _node_ready(self, name: str) -> bool:
        out = self.kubectl("get", "node", name, "-o", "json", check=False)
        if out.returncode != 0:
            return False
        conditions = json.loads(out.stdout).get("status", {}).get("conditions", [])
        taints = json.loads(out.stdout).get("spec", {}).get("taints") or []
        return not taints and any(
            c["type"] == "Ready" and c["status"] == "True" for c in conditions
        )

    def _ssl(self, pair: pki.KeyPair) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki_dir / "ca.crt"))
        ctx.load_cert_chain(str(pair.cert), str(pair.key))
        return ctx

    def _wait_ready(self, admin: pki.KeyPair, timeout: float) -> None:
        ctx = self._ssl(admin)

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"{self.server}/readyz", context=ctx, timeout=2) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        self._wait_for(ready, "kube-apiserver /readyz", timeout)

    def _wait_for(self, cond: Any, what: str, timeout: float) -> None:
        def alive_and(cond: Any = cond) -> Any:
            self.supervisor.check_alive()
            return cond()

        wait_for(alive_and, f"local cluster: {what}", timeout, self.logs, interval=0.2)

    def _default_sa(self) -> bool:
        return (
            self.kubectl(
                "get", "serviceaccount", "default", "-n", "default", check=False
            ).returncode
            == 0
        )
