"""kubectl, helm and ServiceAccount kubeconfigs for any cluster backend.

A backend sets ``kubeconfig`` (the admin's), ``workdir``, and the two binaries; everything
here is then the same for the local control plane and kind.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml


class ClusterTools:
    kubeconfig: Path
    workdir: Path
    kubectl_bin: str = "kubectl"
    helm_bin: str = "helm"

    def kubectl(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        check: bool = True,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        cmd = [self.kubectl_bin, f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        return _run(cmd, "kubectl", args, check, input=input, timeout=120)

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "HELM_CACHE_HOME": str(self.workdir / "helm/cache"),
            "HELM_CONFIG_HOME": str(self.workdir / "helm/config"),
            "HELM_DATA_HOME": str(self.workdir / "helm/data"),
        }
        return _run([self.helm_bin, *args], "helm", args, check, env=env, timeout=600)

    def apply_chart_without_workloads(
        self, chart: Path, release: str, namespace: str, *helm_args: str
    ) -> list[dict[str, Any]]:
        """``helm template`` ``chart`` and apply all but its Deployments (tests run those
        themselves: as a process, or as a container); wait until its CRDs are Established.
        Returns every rendered document, Deployments included."""
        rendered = self.helm(
            "template",
            release,
            str(chart),
            "--namespace",
            namespace,
            "--include-crds",
            *helm_args,
        ).stdout
        docs = [d for d in yaml.safe_load_all(rendered) if d]
        rest = [d for d in docs if d["kind"] != "Deployment"]
        self.kubectl("create", "namespace", namespace, check=False)
        self.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": rest}),
        )
        for crd in (d for d in docs if d["kind"] == "CustomResourceDefinition"):
            name = crd["metadata"]["name"]
            self.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{name}")
        return docs

    def service_account_kubeconfig(self, namespace: str, name: str, duration_s: int = 3600) -> Path:
        """Mint a token for ``namespace/name`` (TokenRequest) and write a kubeconfig for it:
        the admin kubeconfig's cluster, with that token as the only user."""
        token = self.kubectl(
            "create", "token", name, "-n", namespace, f"--duration={duration_s}s"
        ).stdout.strip()
        doc = yaml.safe_load(self.kubeconfig.read_text())
        user = f"{namespace}-{name}"
        doc["users"] = [{"name": user, "user": {"token": token}}]
        for ctx in doc["contexts"]:
            ctx["context"]["user"] = user
        path = self.workdir / f"sa-{namespace}-{name}.kubeconfig"
        path.write_text(yaml.safe_dump(doc))
        return path


def _run(
    cmd: list[str], tool: str, args: tuple[str, ...], check: bool, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    out: subprocess.CompletedProcess[str] = subprocess.run(  # type: ignore[call-overload]
        cmd, capture_output=True, text=True, check=False, **kwargs
    )
    if check and out.returncode != 0:
        raise RuntimeError(f"{tool} {' '.join(args)} failed: {out.stderr.strip()}")
    return out
