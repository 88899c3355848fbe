"""The same cluster interface on kind, for machines with Docker and kind.

Creates a uniquely named kind cluster (config in ``e2e/kind-config.yaml``), writes its admin
kubeconfig into the work directory, and deletes the cluster on :meth:`stop`. kubectl and
helm are taken from ``PATH``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from localkube.tools import Cluster

KIND_CONFIG = Path(__file__).resolve().parent.parent / "kind-config.yaml"


@dataclass
class KindCluster(Cluster):
    workdir: Path
    name: str = field(default_factory=lambda: f"kvrank-{uuid.uuid4().hex[:6]}")

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        for tool in ("kind", "kubectl", "helm", "docker"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"a kind cluster needs '{tool}' on PATH")

    def start(self, timeout: float = 300.0) -> KindCluster:
        subprocess.run(
            [
                "kind",
                "create",
                "cluster",
                "--name",
                self.name,
                "--config",
                str(KIND_CONFIG),
                "--kubeconfig",
                str(self.kubeconfig),
                f"--wait={int(timeout)}s",
            ],
            check=True,
            timeout=timeout + 60,
        )
        return self

    def stop(self) -> None:
        subprocess.run(["kind", "delete", "cluster", "--name", self.name], check=False, timeout=300)

    def __enter__(self) -> KindCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def advertise_gpus(self, count: int) -> None:
        """A fake ``nvidia.com/gpu`` extended resource on every worker (as the local node
        has), so the examples' GPU requests schedule."""
        names = self.kubectl("get", "nodes", "-o", "name").stdout.split()
        for node in names:
            if "control-plane" in node:
                continue
            for status in ("capacity", "allocatable"):
                patch = [
                    {"op": "add", "path": f"/status/{status}/nvidia.com~1gpu", "value": str(count)}
                ]
                self.kubectl(
                    "patch", node, "--subresource=status", "--type=json", "-p", json.dumps(patch)
                )

    def load_image(self, image: str) -> None:
        subprocess.run(["kind", "load", "docker-image", image, "--name", self.name], check=True)

    def logs(self, lines: int = 30) -> str:
        out = self.kubectl("get", "events", "-A", "--sort-by=.lastTimestamp", check=False)
        return "\n".join(out.stdout.splitlines()[-lines:])
