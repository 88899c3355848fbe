"""The ``kvrank-operator run`` process against the session's real API server: it takes its
Lease, answers its liveness probe, reconciles a RankerDeployment in its namespace and
counts what happens to it in its metrics (an aborted canary, a TTL source it cannot read),
writes JSON lines only, and hands the Lease back when it is stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from localkube.images import PAUSE_IMAGE

from kvrank.tools.processes import free_port, scrape

pytestmark = pytest.mark.kube


def holder(cluster, namespace: str, lease: str) -> str:  # type: ignore[no-untyped-def]
    out = cluster.kubectl(
        "get",
        "lease",
        lease,
        "-n",
        namespace,
        "-o",
        "jsonpath={.spec.holderIdentity}",
        check=False,
    )
    return str(out.stdout) if out.returncode == 0 else ""


def ranker_deployment(ns: str) -> dict[str, Any]:
    """A canary rollout whose pods never serve (the pause image) and whose TTL source
    cannot be reached: what the operator decides does not need them."""
    return {
        "apiVersion": "kvrank.io/v1alpha1",
        "kind": "RankerDeployment",
        "metadata": {"name": "feed", "namespace": ns},
        "spec": {
            "model": {"version": "v1", "uri": "/models/v1", "image": PAUSE_IMAGE, "replicas": 1},
            "canary": {"version": "v2", "uri": "/models/v2", "weight": 50},
            "cache": {"redis": {"mode": "external", "url": "redis://nowhere.invalid:6379"}},
            "ttl": {
                "mode": "auto",
                "source": {"type": "prometheus", "prometheus": {"url": "http://127.0.0.1:9"}},
            },
        },
    }


def wait(what: str, cond: Callable[[], Any], log: Path, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        assert time.monotonic() < deadline, f"{what}: {log.read_text()[-3000:]}"
        time.sleep(0.5)
    return value


def test_the_operator_leads_reconciles_counts_and_hands_its_lease_back(
    cluster, tmp_path: Path
) -> None:
    ns = f"op-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)
    port, metrics_port, log = free_port(), free_port(), tmp_path / "operator.log"
    metrics = f"http://127.0.0.1:{metrics_port}"
    cmd = [
        str(Path(sys.executable).parent / "kvrank-operator"),
        "run",
        f"--kubeconfig={cluster.kubeconfig}",
        f"--namespace={ns}",  # this test's namespace only: nothing else is reconciled
        f"--metrics-port={metrics_port}",
        f"--liveness-port={port}",
        "--lease=kvrank-operator",
        f"--lease-namespace={ns}",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        deadline = time.monotonic() + 60
        healthy = False
        while time.monotonic() < deadline and not healthy:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                healthy = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).is_success
            except httpx.HTTPError:
                time.sleep(0.3)
        assert healthy, log.read_text()[-3000:]
        assert holder(cluster, ns, "kvrank-operator").startswith(os.uname().nodename)

        def status() -> dict[str, Any]:
            out = cluster.kubectl("get", "rkd", "feed", "-n", ns, "-o", "json", check=False)
            return dict(json.loads(out.stdout).get("status") or {}) if out.returncode == 0 else {}

        cluster.kubectl("apply", "-f", "-", input=json.dumps(ranker_deployment(ns)))
        wait(
            "both cache namespaces active",
            lambda: (
                {e["namespace"] for e in status().get("cacheNamespaces", [])} == {"v-v1", "v-v2"}
            ),
            log,
        )
        cluster.kubectl(
            "patch", "rkd", "feed", "-n", ns, "--type=json", "-p",
            '[{"op": "remove", "path": "/spec/canary"}]',
        )  # fmt: skip
        labels = {"rankerdeployment_namespace": ns, "rankerdeployment": "feed"}
        wait(
            "the aborted canary counted",
            lambda: (
                scrape(metrics, "kvrank_operator_events_total", reason="CanaryAborted", **labels)
                == 1
            ),
            log,
        )
        ttl = next(c for c in status()["conditions"] if c["type"] == "TTLSource")
        assert (ttl["status"], ttl["reason"]) == ("False", "PrometheusUnreachable"), ttl
        assert scrape(metrics, "kvrank_operator_ttl_source_ok", **labels) == 0
        cluster.kubectl("delete", "rkd", "feed", "-n", ns)  # while the operator runs
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    lines = [json.loads(ln) for ln in log.read_text().splitlines() if ln.strip()]
    messages = [ln["message"] for ln in lines]
    assert any(m.startswith("leading as ") for m in messages), messages
    assert all({"message", "severity", "timestamp"} <= ln.keys() for ln in lines), lines[:3]
    assert holder(cluster, ns, "kvrank-operator") == ""  # handed back: no wait for expiry
    cluster.kubectl("delete", "namespace", ns, "--wait=false")
