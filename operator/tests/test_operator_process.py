"""The ``kvrank-operator run`` process against the session's real API server: it takes its
Lease, answers its liveness probe, writes JSON lines only, and hands the Lease back when it
is stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from kvrank.tools.processes import free_port

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


def test_the_operator_leads_logs_json_and_hands_its_lease_back(cluster, tmp_path: Path) -> None:
    ns = f"op-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)
    port, log = free_port(), tmp_path / "operator.log"
    cmd = [
        str(Path(sys.executable).parent / "kvrank-operator"),
        "run",
        f"--kubeconfig={cluster.kubeconfig}",
        f"--namespace={ns}",  # this test's namespace only: nothing else is reconciled
        "--metrics-port=0",
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
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    lines = [json.loads(ln) for ln in log.read_text().splitlines() if ln.strip()]
    messages = [ln["message"] for ln in lines]
    assert any(m.startswith("leading as ") for m in messages), messages
    assert all({"message", "severity", "timestamp"} <= ln.keys() for ln in lines), lines[:3]
    assert holder(cluster, ns, "kvrank-operator") == ""  # handed back: no wait for expiry
    cluster.kubectl("delete", "namespace", ns, "--wait=false")
