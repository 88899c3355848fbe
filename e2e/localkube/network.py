"""The real node's network: its own network namespace, fenced off from the machine's uplink.

Everything of the cluster runs inside one network namespace that this run creates
(``kvrank-node``): the control plane, kubelet, containerd, kube-proxy, CoreDNS, kube-router
and the pods' namespaces behind its bridge. The namespace has no default route, so nothing
in it can reach beyond the machine. The host only gets a veth pair into it and routes for
the pod and Service ranges through that veth, so tests reach pods and ClusterIPs; every
other address of those ranges (and of the node's link) is a blackhole route, and a
``KVRANK-FENCE`` chain drops forwarding from them to any other interface, so no packet to a
pod, a Service or an unknown 10.x address can leave through the external interface even
while a component is still starting. :meth:`NodeNetwork.teardown` removes the namespace,
the routes and the chain: the host's routes and iptables are as they were.

It must not touch anything it did not create: an address range already routed on the host
is an error, not something to take over.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

NETNS = "kvrank-node"
HOST_VETH = "kvrank-host"
NODE_VETH = "eth0"
LINK_CIDR = "10.243.0.0/30"
HOST_IP = "10.243.0.1"
NODE_IP = "10.243.0.2"
"""The node's InternalIP: the API server, the kubelet and every node component listen here."""
POD_CIDR = "10.244.0.0/24"
POD_GATEWAY = "10.244.0.1"
POD_SUPERNET = "10.244.0.0/16"
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_SUPERNET = "10.96.0.0/12"
BRIDGE = "cni0"
FENCE_CHAIN = "KVRANK-FENCE"
FENCED = (LINK_CIDR, POD_SUPERNET, SERVICE_SUPERNET)
"""Sources whose packets may never be forwarded off the veth."""


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr.strip()}")
    return out


@dataclass
class NodeNetwork:
    """Create with :meth:`setup`, remove with :meth:`teardown` (idempotent, also after a
    crashed run that left the namespace behind)."""

    netns: str = NETNS

    @property
    def netns_path(self) -> Path:
        return Path("/run/netns") / self.netns

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the node's network namespace (and nothing else: it keeps the
        host's mount namespace, so kubelet's and containerd's mounts see each other)."""
        return ["nsenter", f"--net={self.netns_path}", "--", *argv]

    def inside(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run(*self.wrap(argv), check=check)

    # ------------------------------------------------------------------ lifecycle
    def setup(self) -> None:
        self.teardown()  # what a crashed run may have left
        self._check_ranges_free()
        self._fence()  # first: nothing may leave even while the rest is being built
        run("ip", "netns", "add", self.netns)
        run("ip", "link", "add", HOST_VETH, "type", "veth", "peer", "name", "kvrank-peer")
        run("ip", "link", "set", "kvrank-peer", "netns", self.netns)
        run("ip", "addr", "add", f"{HOST_IP}/30", "dev", HOST_VETH)
        run("ip", "link", "set", HOST_VETH, "up")
        self.inside("ip", "link", "set", "kvrank-peer", "name", NODE_VETH)
        self.inside("ip", "addr", "add", f"{NODE_IP}/30", "dev", NODE_VETH)
        self.inside("ip", "link", "set", NODE_VETH, "up")
        self.inside("ip", "link", "set", "lo", "up")
        # the pods' bridge exists before any pod: the CNI bridge plugin adopts it
        self.inside("ip", "link", "add", BRIDGE, "type", "bridge")
        self.inside("ip", "addr", "add", f"{POD_GATEWAY}/24", "dev", BRIDGE)
        self.inside("ip", "link", "set", BRIDGE, "up")
        # inside the namespace only: pods reach the API server and each other through it
        for key, value in (
            ("net.ipv4.ip_forward", "1"),
            ("net.bridge.bridge-nf-call-iptables", "1"),
            ("net.ipv4.conf.all.route_localnet", "1"),
        ):
            self.inside("sysctl", "-qw", f"{key}={value}")
        for cidr in (POD_SUPERNET, SERVICE_SUPERNET):
            self.inside("ip", "route", "add", "blackhole", cidr)
        # the host's requests reach pods from the node's bridge address: pods get no route
        # to the host at all
        self.inside(
            "iptables",
            "-w",
            "-t",
            "nat",
            "-A",
            "POSTROUTING",
            "-s",
            f"{HOST_IP}/32",
            "-o",
            BRIDGE,
            "-j",
            "MASQUERADE",
        )
        # the host reaches pods and ClusterIPs through the node; the rest of the ranges nowhere
        for cidr in (POD_CIDR, SERVICE_CIDR):
            run("ip", "route", "add", cidr, "via", NODE_IP, "dev", HOST_VETH)
        for cidr in (POD_SUPERNET, SERVICE_SUPERNET):
            run("ip", "route", "add", "blackhole", cidr)

    def teardown(self) -> None:
        if self.netns_path.exists():
            run("ip", "netns", "delete", self.netns, check=False)  # its veth peer goes too
        run("ip", "link", "delete", HOST_VETH, check=False)
        for cidr in (POD_CIDR, SERVICE_CIDR):
            run("ip", "route", "delete", cidr, "via", NODE_IP, check=False)
        for cidr in (POD_SUPERNET, SERVICE_SUPERNET):
            run("ip", "route", "delete", "blackhole", cidr, check=False)
        self._unfence()

    # ------------------------------------------------------------------ internals
    def _check_ranges_free(self) -> None:
        routes = run("ip", "-4", "route", "show").stdout
        for cidr in (LINK_CIDR, POD_SUPERNET, SERVICE_SUPERNET, POD_CIDR, SERVICE_CIDR):
            if any(line.split()[:1] == [cidr] for line in routes.splitlines()):
                raise RuntimeError(
                    f"{cidr} is already routed on this machine; the local node needs it free:\n"
                    f"{routes}"
                )

    def _fence(self) -> None:
        run("iptables", "-w", "-N", FENCE_CHAIN)
        for cidr in FENCED:
            run("iptables", "-w", "-A", FENCE_CHAIN, "-s", cidr, "!", "-o", HOST_VETH, "-j", "DROP")
            run("iptables", "-w", "-A", FENCE_CHAIN, "-d", cidr, "!", "-o", HOST_VETH, "-j", "DROP")
        run("iptables", "-w", "-I", "FORWARD", "1", "-j", FENCE_CHAIN)

    def _unfence(self) -> None:
        with contextlib.suppress(RuntimeError):
            while True:
                run("iptables", "-w", "-D", "FORWARD", "-j", FENCE_CHAIN)
        run("iptables", "-w", "-F", FENCE_CHAIN, check=False)
        run("iptables", "-w", "-X", FENCE_CHAIN, check=False)


def host_snapshot() -> str:
    """The host's network namespaces, links, routes and iptables rules (no counters), to
    compare before and after a run."""
    parts = [
        run("ip", "netns", "list").stdout,
        run("ip", "-br", "link").stdout,
        run("ip", "-4", "route", "show", "table", "all").stdout,
    ]
    for table in ("filter", "nat", "mangle", "raw"):
        parts.append(run("iptables", "-w", "-t", table, "-S").stdout)
    return "".join(parts)
