"""The same cluster interface on kind, for machines with Docker and kind.

Creates a uniquely named kind cluster (config in ``e2e/kind-config.yaml``), writes its admin
kubeconfig into the work directory, and deletes the cluster on :meth:`stop`. kubectl and
helm are taken from ``PATH``.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from localkube.tools import ClusterTools

KIND_CONFIG = Path(__file__).resolve().parent.parent / "kind-config.yaml"
MODELS_MOUNT = Path("/tmp/kvrank-e2e-models")
"""The host folder ``kind-config.yaml`` mounts into every worker at ``/kvrank-models``."""


@dataclass
class KindCluster(ClusterTools):
    workdir: Path
    name: str = field(default_factory=lambda: f"kvrank-{uuid.uuid4().hex[:6]}")

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        for tool in ("kind", "kubectl", "helm", "docker"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"a kind cluster needs '{tool}' on PATH")

    def start(self, timeout: float = 300.0) -> KindCluster:
        MODELS_MOUNT.mkdir(parents=True, exist_ok=True)  # kind-config.yaml mounts it
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

    def load_image(self, image: str) -> None:
        subprocess.run(["kind", "load", "docker-image", image, "--name", self.name], check=True)

    def logs(self, lines: int = 30) -> str:
        out = self.kubectl("get", "events", "-A", "--sort-by=.lastTimestamp", check=False)
        return "\n".join(out.stdout.splitlines()[-lines:])
