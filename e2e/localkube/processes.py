"""Child processes of a local cluster: started with their logs in files, stopped for sure.

Each child runs in its own session (so a signal reaches its whole group) and, when
``tie_to_parent`` is set, asks the kernel to kill it if the Python process that started it
dies (``PR_SET_PDEATHSIG``) — a crashed test run leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvrank.tools.processes import free_port, wait_for

__all__ = ["Component", "Supervisor", "alive", "free_port", "tail", "wait_for"]

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class Component:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class Supervisor:
    """Starts components in order and stops them in reverse order."""

    log_dir: Path
    tie_to_parent: bool = True
    components: list[Component] = field(default_factory=list)

    def start(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> Component:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"{name}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent if self.tie_to_parent else None,
                env={**os.environ, **(env or {})},
            )
        comp = Component(name, proc, log)
        self.components.append(comp)
        return comp

    def check_alive(self) -> None:
        for c in self.components:
            if c.proc.poll() is not None:
                raise RuntimeError(
                    f"{c.name} exited with code {c.proc.returncode}; last log lines:\n"
                    + tail(c.log)
                )

    def stop(self, timeout: float = 10.0) -> None:
        for c in reversed(self.components):
            _terminate(c.proc.pid, c.proc, timeout)
        self.components.clear()

    def stop_named(self, name: str, timeout: float = 10.0) -> None:
        """Stop one component now (the node stops its kubelet before its pods)."""
        for c in [c for c in self.components if c.name == name]:
            _terminate(c.proc.pid, c.proc, timeout)
            self.components.remove(c)

    def pids(self) -> list[int]:
        return [c.proc.pid for c in self.components]


def _terminate(pid: int, proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            break
        if proc is None and not alive(pid):
            break
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    if proc is not None:
        proc.wait(timeout=5)


def alive(pid: int) -> bool:
    """Whether a process with this id exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def kill_groups(pids: Sequence[int], timeout: float = 10.0) -> None:
    """Stop process groups recorded by an earlier (detached) run."""
    for pid in reversed(list(pids)):
        _terminate(pid, None, timeout)


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"
