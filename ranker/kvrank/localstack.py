"""A local serving stack for the demo and the load test: redis-server + ranker processes.

Starts a private ``redis-server`` on a free loopback port when the binary is installed
(otherwise the stack runs L1-only and says so), and any number of ``kvrank serve``
processes; everything is stopped on exit, even on errors.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LocalStack:
    workdir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    redis_url: str | None = None
    _exit: ExitStack = field(default_factory=ExitStack)

    def __enter__(self) -> LocalStack:
        self.workdir.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, *exc: object) -> None:
        for p in reversed(self.procs):
            p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._exit.close()

    def start_redis(self) -> str | None:
        binary = shutil.which("redis-server")
        if binary is None:
            return None
        port = free_port()
        log = self._exit.enter_context((self.workdir / "redis.log").open("wb"))
        self.procs.append(
            subprocess.Popen(
                [
                    binary,
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(self.workdir),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        self.redis_url = f"redis://127.0.0.1:{port}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return self.redis_url
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def start_ranker(self, model: Path, *args: str) -> str:
        port = free_port()
        log = self._exit.enter_context((self.workdir / f"ranker-{port}.log").open("wb"))
        cmd = [
            str(Path(sys.executable).parent / "kvrank"),
            "serve",
            "--model",
            str(model),
            "--port",
            str(port),
            *args,
        ]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"ranker exited: {(self.workdir / f'ranker-{port}.log')}")
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"ranker on {port} did not become ready")
