"""Test clusters with one interface: a local control plane (no Docker) or kind.

``cluster_from_env()`` picks the backend from ``KVRANK_CLUSTER`` (``local`` by default,
``kind`` where Docker and kind exist). Both give an admin ``kubeconfig``, ``kubectl``,
``helm``, ``service_account_kubeconfig`` and ``logs`` for failure reports.
"""

from __future__ import annotations

import os
from pathlib import Path

from localkube.kind import KindCluster
from localkube.local import LocalCluster
from localkube.tools import Cluster


def cluster_from_env(workdir: Path) -> Cluster:
    backend = os.environ.get("KVRANK_CLUSTER", "local")
    if backend == "local":
        return LocalCluster(workdir)
    if backend == "kind":
        return KindCluster(workdir)
    raise ValueError(f"KVRANK_CLUSTER={backend!r}: expected 'local' or 'kind'")


__all__ = ["Cluster", "KindCluster", "LocalCluster", "cluster_from_env"]
