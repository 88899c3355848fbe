"""Running ``kvrank-operator run`` against the session's API server, as the operator-process
and gateway tests do: the process (:func:`operator`), a RankerDeployment's status and
conditions, and what a failed wait shows."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from api_server import install_crds

from kvrank.tools.processes import free_port, wait_for


def tail_of(log: Path) -> Callable[[], str]:
    """What a failed wait shows: the end of the operator's log."""
    return lambda: log.read_text()[-3000:]


@dataclass
class Operator:
    metrics: str
    log: Path


@contextlib.contextmanager
def operator(cluster, ns: str, workdir: Path, *flags: str) -> Iterator[Operator]:  # type: ignore[no-untyped-def]
    """``kvrank-operator run`` for namespace ``ns`` only, healthy, stopped with SIGTERM; the
    RankerDeployment CRD Established first (a test run alone must not rely on another test
    having installed it)."""
    install_crds(cluster, [], [], ours=True)
    port, metrics_port, log = free_port(), free_port(), workdir / "operator.log"
    cmd = [
        str(Path(sys.executable).parent / "kvrank-operator"),
        "run",
        f"--kubeconfig={cluster.kubeconfig}",
        f"--namespace={ns}",  # this test's namespace only: nothing else is reconciled
        f"--metrics-port={metrics_port}",
        f"--liveness-port={port}",
        "--lease=kvrank-operator",
        f"--lease-namespace={ns}",
        *flags,
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))

    def healthy() -> bool:
        assert proc.poll() is None, log.read_text()[-3000:]  # it exited: say why at once
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).is_success
        except httpx.HTTPError:
            return False

    try:
        wait_for(healthy, "the operator's /healthz", 60, tail_of(log))
        yield Operator(f"http://127.0.0.1:{metrics_port}", log)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def rkd_status(cluster, ns: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    out = cluster.kubectl("get", "rkd", "feed", "-n", ns, "-o", "json", check=False)
    return dict(json.loads(out.stdout).get("status") or {}) if out.returncode == 0 else {}


def condition(status: dict[str, Any], ctype: str) -> tuple[str, str] | None:
    for c in status.get("conditions", []):
        if c["type"] == ctype:
            return c["status"], c["reason"]
    return None
