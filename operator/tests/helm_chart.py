"""The chart as ``helm template`` renders it (the local control plane's helm, the cluster
release's Kubernetes version), and the values that turn its monitoring objects on."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "kvrank-operator"
KUBE_VERSION = "1.37.2"  # the local control plane's version


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    from localkube.local import binaries

    return subprocess.run(
        [str(binaries() / "helm"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "HELM_CACHE_HOME": "/tmp/kvrank-helm-cache"},
    )


def render(*args: str, release: str = "rel") -> list[dict]:
    out = helm(
        "template",
        release,
        str(CHART),
        "--namespace",
        "kvrank-system",
        "--kube-version",
        KUBE_VERSION,
        *args,
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


SERVED = ("--api-versions", "monitoring.coreos.com/v1")
"""What a cluster with prometheus-operator tells helm (``helm template`` has no cluster)."""


MONITORING = (
    *SERVED,
    "--set",
    "monitoring.serviceMonitor.enabled=true",
    "--set",
    "monitoring.podMonitor.enabled=true",
    "--set",
    "monitoring.rules.enabled=true",
    "--set",
    "monitoring.dashboard.enabled=true",
)
