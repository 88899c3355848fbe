"""A real node for the local cluster: kubelet + containerd + runc, kube-proxy, DNS, policies.

Started by :class:`~localkube.local.LocalCluster` when it runs with ``real_node=True``, after
the control plane, every component inside the node's network namespace
(:mod:`localkube.network`):

- containerd v2 on its own socket, root and state (never dockerd's), runc as its runtime,
  the Debian CNI plugins (bridge ``cni0``, host-local IPAM, portmap) and ``ipMasq: false``;
  the pause image imported from a static build of Kubernetes' ``build/pause``;
- the kubelet (cgroupfs on cgroup v1, its own cgroup root, TLS serving cert signed by the
  cluster CA, Webhook authn/z so ``kubectl logs/exec`` work through the API server);
- kube-proxy (iptables mode) so ClusterIPs work for pods and for the host;
- CoreDNS serving ``cluster.local`` only (no forwarding) behind the ``kube-dns`` Service;
- kube-router in firewall-only mode, enforcing NetworkPolicies with iptables and ipsets;
- a fake extended resource ``nvidia.com/gpu`` on the node, so GPU-requesting pods schedule.

The containerd root (image content and snapshots) lives under ``$KVRANK_CACHE`` and is
reused across runs; everything else lives in the cluster's work directory. :meth:`stop`
removes every pod first, then the processes, the mounts and the node's cgroups.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localkube import pki
from localkube.images import PAUSE_IMAGE, NodeImages, pause_archive
from localkube.network import BRIDGE, NODE_IP, POD_CIDR, POD_GATEWAY, POD_SUPERNET, NodeNetwork
from localkube.processes import Supervisor, free_port

NODE_NAME = "kvrank-node"
CLUSTER_DNS = "10.96.0.10"
CGROUP_ROOT = "kvrank-node"
CNI_BIN_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
FAKE_GPUS = 16
NODE_BUILD_SCRIPT = Path(__file__).with_name("build-node.sh")
CONTAINERD_CONFIG = """\
version = 3
root = "{root}"
state = "{state}"

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[metrics]
  address = ""

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  # no CAP_SYS_RESOURCE on this machine: runc must not try to lower oom_score_adj
  restrict_oom_score_adj = true
  # pods' network namespaces under the state dir (not /run/netns): removed with the node
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{cni_conf}"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{pause}"
"""


def node_binaries() -> Path:
    """The node's binaries: ``$KVRANK_NODE_BIN`` or built/reused by ``build-node.sh`` now."""
    env = os.environ.get("KVRANK_NODE_BIN")
    if env:
        return Path(env)
    out = subprocess.run(
        ["bash", str(NODE_BUILD_SCRIPT)], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"building the node binaries failed:\n{out.stderr[-4000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


def containerd_root() -> Path:
    cache = Path(os.environ.get("KVRANK_CACHE", Path.home() / ".cache" / "kvrank"))
    return cache / "containerd"


@dataclass
class NodeContext:
    """What the node needs from the control plane that started it."""

    workdir: Path
    kube_bin: Path
    server: str
    ca: pki.CertificateAuthority
    network: NodeNetwork
    supervisor: Supervisor
    admin_kubeconfig: Path


class RealNode:
    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self.bin = node_binaries()
        self.dir = ctx.workdir / "node"
        self.state = self.dir / "containerd-state"
        self.socket = self.dir / "containerd.sock"
        self.root = containerd_root()
        self.images = NodeImages(self.bin / "ctr", self.socket)

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._cgroups()
        self._start_containerd(timeout)
        self._remove_stale_pods()
        self.images.import_archive(
            pause_archive(self.bin / "pause", self.dir / "pause.tar"), pin=True
        )
        self._start_kubelet()
        self._start_kube_proxy()
        self._start_dns()
        self._start_kube_router()

    def after_registered(self) -> None:
        """Once the Node object exists: advertise the fake GPUs."""
        patch = [
            {"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": str(FAKE_GPUS)},
            {"op": "add", "path": "/status/allocatable/nvidia.com~1gpu", "value": str(FAKE_GPUS)},
        ]
        self._kubectl(
            "patch",
            "node",
            NODE_NAME,
            "--subresource=status",
            "--type=json",
            "-p",
            json.dumps(patch),
        )

    def stop(self) -> None:
        """Pods first (graceful), then the node's processes, its mounts and cgroups."""
        self.ctx.supervisor.stop_named("kubelet")
        if self.socket.exists():
            for verb in ("stopp", "rmp"):
                subprocess.run(
                    [
                        str(self.bin / "crictl"),
                        f"--runtime-endpoint=unix://{self.socket}",
                        "--timeout=30s",
                        verb,
                        "--all",
                    ],
                    capture_output=True,
                    check=False,
                    timeout=120,
                )
        self.ctx.supervisor.stop_named("containerd")
        cleanup(self.ctx.workdir)

    # ------------------------------------------------------------------ containerd
    def _start_containerd(self, timeout: float) -> None:
        path = self.dir / "containerd.toml"
        path.write_text(
            CONTAINERD_CONFIG.format(
                root=self.root,
                state=self.state,
                socket=self.socket,
                runc=self.bin / "runc",
                cni_bin=CNI_BIN_DIR,
                cni_conf=self._cni_conf(),
                pause=PAUSE_IMAGE,
            )
        )
        env = {"PATH": f"{self.bin}:{os.environ.get('PATH', '')}"}
        self.ctx.supervisor.start(
            "containerd",
            self.ctx.network.wrap([str(self.bin / "containerd"), f"--config={path}"]),
            env=env,
        )
        deadline = time.monotonic() + timeout
        while not self.socket.exists():
            self.ctx.supervisor.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError("containerd did not open its socket")
            time.sleep(0.2)

    def _cni_conf(self) -> Path:
        conf_dir = self.dir / "cni"
        conf_dir.mkdir(parents=True, exist_ok=True)
        conf = {
            "cniVersion": "1.0.0",
            "name": "kvrank",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,  # nothing is translated towards the outside
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_CIDR, "gateway": POD_GATEWAY}]],
                        "routes": [
                            {"dst": POD_SUPERNET},
                            {"dst": "10.96.0.0/12"},
                            {"dst": f"{NODE_IP}/32"},
                        ],
                        "dataDir": str(self.dir / "ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
        (conf_dir / "10-kvrank.conflist").write_text(json.dumps(conf, indent=2))
        return conf_dir

    def _remove_stale_pods(self) -> None:
        """A crashed run's sandboxes are still in the reused containerd root."""
        subprocess.run(
            [
                str(self.bin / "crictl"),
                f"--runtime-endpoint=unix://{self.socket}",
                "rmp",
                "--all",
                "--force",
            ],
            capture_output=True,
            check=False,
            timeout=120,
        )

    # ------------------------------------------------------------------ kubelet
    def _start_kubelet(self) -> None:
        ca = self.ctx.ca
        client = ca.issue("kubelet-client", f"system:node:{NODE_NAME}", "system:nodes")
        kubeconfig = self._kubeconfig("kubelet", client)
        path = self.dir / "kubelet.yaml"
        path.write_text(yaml.safe_dump(self._kubelet_config()))
        self.ctx.supervisor.start(
            "kubelet",
            self.ctx.network.wrap(
                [
                    str(self.ctx.kube_bin / "kubelet"),
                    f"--config={path}",
                    f"--kubeconfig={kubeconfig}",
                    f"--root-dir={self.dir / 'kubelet'}",
                    f"--cert-dir={self.dir / 'kubelet-pki'}",
                    f"--hostname-override={NODE_NAME}",
                    f"--node-ip={NODE_IP}",
                    "--node-labels=nvidia.com/gpu.present=true",
                    "--v=1",
                ]
            ),
            env={"PATH": f"{self.bin}:{CNI_BIN_DIR}:{os.environ.get('PATH', '')}"},
        )

    def _kubelet_config(self) -> dict[str, Any]:
        """The kubelet's KubeletConfiguration: serving on the node's address with its own
        certificate, webhook authentication and authorization, cgroupfs on v1, the cluster's
        DNS, and no image garbage collection (images are imported, never pulled)."""
        ca = self.ctx.ca
        serving = ca.issue("kubelet", NODE_NAME, hosts=(NODE_IP, NODE_NAME))
        resolv = self.dir / "resolv.conf"
        resolv.write_text(f"nameserver {CLUSTER_DNS}\n")
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": NODE_IP,
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "tlsCertFile": str(serving.cert),
            "tlsPrivateKeyFile": str(serving.key),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(ca.pair.cert)},
            },
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{CGROUP_ROOT}",
            "failCgroupV1": False,  # this machine has cgroup v1 only
            "failSwapOn": False,
            "clusterDomain": "cluster.local",
            "clusterDNS": [CLUSTER_DNS],
            "resolvConf": str(resolv),
            "podCIDR": POD_CIDR,
            "maxPods": 60,
            "serializeImagePulls": False,
            # images are imported, never pulled: nothing may garbage-collect them
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
            },
            "nodeStatusUpdateFrequency": "4s",
            "syncFrequency": "5s",  # ConfigMap volumes follow the operator within seconds
            "shutdownGracePeriod": "0s",
            "enableServer": True,
        }

    def _cgroups(self) -> None:
        """The kubelet's cgroup root in every v1 hierarchy (removed by :func:`cleanup`)."""
        for hierarchy in _hierarchies():
            (hierarchy / CGROUP_ROOT).mkdir(exist_ok=True)

    # ------------------------------------------------------------------ kube-proxy
    def _start_kube_proxy(self) -> None:
        pair = self.ctx.ca.issue("kube-proxy", "system:kube-proxy")
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "clientConnection": {"kubeconfig": str(self._kubeconfig("kube-proxy", pair))},
            "clusterCIDR": POD_SUPERNET,
            "hostnameOverride": NODE_NAME,
            "bindAddress": "127.0.0.1",
            "healthzBindAddress": f"127.0.0.1:{free_port()}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
            "conntrack": {"maxPerCore": 0},  # leave the conntrack table size alone
            "iptables": {"masqueradeAll": False, "syncPeriod": "10s"},
        }
        path = self.dir / "kube-proxy.yaml"
        path.write_text(yaml.safe_dump(config))
        self.ctx.supervisor.start(
            "kube-proxy",
            self.ctx.network.wrap([str(self.ctx.kube_bin / "kube-proxy"), f"--config={path}"]),
        )

    # ------------------------------------------------------------------ DNS
    def _start_dns(self) -> None:
        """CoreDNS for cluster.local only, behind the kube-dns Service at ``CLUSTER_DNS``."""
        corefile = self.dir / "Corefile"
        corefile.write_text(
            f".:53 {{\n  bind {POD_GATEWAY}\n  errors\n"
            f"  kubernetes cluster.local in-addr.arpa ip6.arpa {{\n"
            f"    kubeconfig {self.ctx.admin_kubeconfig}\n"
            "    pods insecure\n    ttl 5\n  }\n"
            "  cache 5\n}\n"
        )
        self.ctx.supervisor.start(
            "coredns",
            self.ctx.network.wrap([str(self.bin / "coredns"), f"-conf={corefile}"]),
        )
        ports = [
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
        ]
        docs: list[dict[str, Any]] = [
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {
                    "name": "kube-dns",
                    "namespace": "kube-system",
                    "labels": {"k8s-app": "kube-dns"},
                },
                "spec": {"clusterIP": CLUSTER_DNS, "ports": ports},
            },
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": "kube-dns-node",
                    "namespace": "kube-system",
                    "labels": {"kubernetes.io/service-name": "kube-dns"},
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [POD_GATEWAY], "conditions": {"ready": True}}],
                "ports": ports,
            },
        ]
        self._kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}),
        )

    # ------------------------------------------------------------------ NetworkPolicy
    def _start_kube_router(self) -> None:
        self.ctx.supervisor.start(
            "kube-router",
            self.ctx.network.wrap(
                [
                    str(self.bin / "kube-router"),
                    f"--kubeconfig={self.ctx.admin_kubeconfig}",
                    f"--hostname-override={NODE_NAME}",
                    "--run-firewall=true",
                    "--run-router=false",
                    "--run-service-proxy=false",
                    "--enable-cni=false",
                    "--enable-ipv4=true",
                    "--enable-ipv6=false",
                    "--metrics-port=0",
                    f"--health-port={free_port()}",
                    "--iptables-sync-period=5s",
                    "--v=1",
                ]
            ),
        )

    # ------------------------------------------------------------------ helpers
    def _kubeconfig(self, name: str, pair: pki.KeyPair) -> Path:
        user = {"client-certificate": str(pair.cert), "client-key": str(pair.key)}
        doc = pki.kubeconfig_doc(self.ctx.server, self.ctx.ca.pair.cert, user, name)
        path = self.dir / f"{name}.kubeconfig"
        path.write_text(yaml.safe_dump(doc))
        return path

    def _kubectl(self, *args: str, input: str | None = None) -> str:
        out = subprocess.run(
            [
                str(self.ctx.kube_bin / "kubectl"),
                f"--kubeconfig={self.ctx.admin_kubeconfig}",
                *args,
            ],
            input=input,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        if out.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {out.stderr.strip()}")
        return out.stdout


def cleanup(workdir: Path) -> None:
    """What outlives the node's processes: container shims (they outlive containerd by
    design; ours are on our socket), the containers in the node's cgroups, the mounts under
    the work directory and the containerd root. Safe to run more than once."""
    socket = workdir / "node" / "containerd.sock"
    for pid in _pids_matching(str(socket)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for hierarchy in _hierarchies():
        root = hierarchy / CGROUP_ROOT
        if not root.exists():
            continue
        for procs in root.rglob("cgroup.procs"):
            for member in procs.read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(member), signal.SIGKILL)
        for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            _rmdir_retry(d)
        _rmdir_retry(root)
    unmount_below(workdir)
    unmount_below(containerd_root())


def _hierarchies() -> list[Path]:
    return [h for h in Path("/sys/fs/cgroup").iterdir() if h.is_dir() and h.name != "unified"]


def unmount_below(folder: Path) -> None:
    """Mounts the kubelet and containerd leave under ``folder`` (deepest first)."""
    prefix = f"{folder.resolve()}/"
    targets = [
        line.split()[1]
        for line in Path("/proc/self/mounts").read_text().splitlines()
        if line.split()[1].startswith(prefix)
    ]
    for target in sorted(targets, key=len, reverse=True):
        subprocess.run(["umount", "--lazy", target], capture_output=True, check=False)


def _pids_matching(needle: str) -> list[int]:
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if needle in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode():
                out.append(int(proc.name))
    return out


def _rmdir_retry(path: Path) -> None:
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
