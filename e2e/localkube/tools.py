"""The interface of a test cluster: start/stop, logs, kubectl, helm, ServiceAccount
kubeconfigs.

A backend sets ``kubeconfig`` (the admin's), ``workdir``, and the two binaries, and
implements ``start``, ``stop`` and ``logs``; everything else here is then the same for the
local control plane and kind.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

AUDIT_POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "userGroups": ["system:serviceaccounts:kube-system"]},
        {
            "level": "Metadata",
            "verbs": ["create", "update", "patch", "delete", "deletecollection"],
            "userGroups": ["system:serviceaccounts"],
        },
        {"level": "None"},
    ],
}
"""What the test clusters' API servers audit: every write by a workload's ServiceAccount
(the operator's among them; not the control plane's own controllers), at ``Metadata`` level
— who, from which pod, what, when."""


class Cluster:
    kubeconfig: Path
    workdir: Path
    kubectl_bin: str = "kubectl"
    helm_bin: str = "helm"

    def start(self, timeout: float = 300.0) -> Cluster:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def logs(self, lines: int = 30) -> str:
        """The tail of every component's log (for failure reports)."""
        raise NotImplementedError

    def audit_events(self) -> list[dict[str, Any]]:
        """The API server's audit log so far (see :data:`AUDIT_POLICY`), oldest first."""
        return [json.loads(line) for line in self._audit_log().splitlines() if line.strip()]

    def _audit_log(self) -> str:
        raise NotImplementedError

    def kubectl(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        check: bool = True,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        cmd = [
            self.kubectl_bin,
            f"--kubeconfig={kubeconfig or self.kubeconfig}",
            # discovery cached with the cluster, not in ~/.kube (ports differ every run)
            f"--cache-dir={self.workdir / 'kube-cache'}",
            *args,
        ]
        return _run(cmd, "kubectl", args, check, input=input, timeout=120)

    def kubectl_plugin(
        self, plugin: str, *args: str, path: Path, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """``kubectl PLUGIN ARGS`` as a user's shell runs it: kubectl finds the executable
        ``kubectl-PLUGIN`` on ``PATH`` (``path`` first), and the plugin reads this cluster's
        kubeconfig from ``KUBECONFIG`` (kubectl passes it none of its own flags)."""
        env = {
            **os.environ,
            "PATH": f"{path}{os.pathsep}{os.environ.get('PATH', '')}",
            "KUBECONFIG": str(self.kubeconfig),
        }
        cmd = [self.kubectl_bin, plugin, *args]
        return _run(cmd, f"kubectl {plugin}", args, check, env=env, timeout=120)

    def wait_established(self, crd: str, timeout_s: float = 60.0) -> None:
        """Until the CRD named ``crd`` is Established. (``kubectl wait`` fails at once, not
        waiting, when it looks before the API server has written the CRD's first
        conditions: a large schema takes it long enough.)"""
        established = '{.status.conditions[?(@.type=="Established")].status}'
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.kubectl("get", f"crd/{crd}", "-o", f"jsonpath={established}", check=False)
            if got.stdout.strip() == "True":
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"crd/{crd} not Established after {timeout_s:.0f}s: {got}")
            time.sleep(0.2)

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "HELM_CACHE_HOME": str(self.workdir / "helm/cache"),
            "HELM_CONFIG_HOME": str(self.workdir / "helm/config"),
            "HELM_DATA_HOME": str(self.workdir / "helm/data"),
        }
        return _run([self.helm_bin, *args], "helm", args, check, env=env, timeout=600)

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
