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

import yaml

from localkube.tools import AUDIT_POLICY, Cluster

KIND_CONFIG = Path(__file__).resolve().parent.parent / "kind-config.yaml"
AUDIT_DIR = "/etc/kubernetes/audit"
"""On the control-plane node: the audit policy and log (the API server pod mounts it)."""


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
                str(self._config()),
                "--kubeconfig",
                str(self.kubeconfig),
                f"--wait={int(timeout)}s",
            ],
            check=True,
            timeout=timeout + 60,
        )
        return self

    def _config(self) -> Path:
        """``kind-config.yaml`` with the API server auditing (:data:`AUDIT_POLICY`), as in
        kind's auditing guide: the policy mounted into the control-plane node, the log on
        it."""
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        doc = yaml.safe_load(KIND_CONFIG.read_text())
        control_plane = next(n for n in doc["nodes"] if n["role"] == "control-plane")
        control_plane["extraMounts"] = [
            {"hostPath": str(policy), "containerPath": AUDIT_DIR + "/policy.yaml", "readOnly": True}
        ]
        control_plane["kubeadmConfigPatches"] = [
            yaml.safe_dump(
                {
                    "kind": "ClusterConfiguration",
                    "apiServer": {
                        "extraArgs": {
                            "audit-policy-file": AUDIT_DIR + "/policy.yaml",
                            "audit-log-path": AUDIT_DIR + "/audit.log",
                        },
                        "extraVolumes": [
                            {
                                "name": "audit",
                                "hostPath": AUDIT_DIR,
                                "mountPath": AUDIT_DIR,
                                "readOnly": False,
                                "pathType": "DirectoryOrCreate",
                            }
                        ],
                    },
                }
            )
        ]
        path = self.workdir / "kind-config.yaml"
        path.write_text(yaml.safe_dump(doc))
        return path

    def _audit_log(self) -> str:
        out = subprocess.run(
            ["docker", "exec", f"{self.name}-control-plane", "cat", AUDIT_DIR + "/audit.log"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout

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
        # named by its id too, as a pull names it: an image volume's image is looked up so
        image_id = subprocess.run(
            ["docker", "image", "inspect", "-f", "{{.Id}}", image],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        listed = ["kind", "get", "nodes", "--name", self.name]
        nodes = subprocess.run(listed, capture_output=True, text=True, check=True).stdout.split()
        for node in nodes:
            subprocess.run(
                ["docker", "exec", node, "ctr", "-n", "k8s.io", "images", "tag", "--force",
                 image, image_id],
                capture_output=True, check=True,
            )  # fmt: skip

    def logs(self, lines: int = 30) -> str:
        out = self.kubectl("get", "events", "-A", "--sort-by=.lastTimestamp", check=False)
        return "\n".join(out.stdout.splitlines()[-lines:])
