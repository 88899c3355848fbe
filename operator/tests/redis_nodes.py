"""Run the managed Redis bootstrap Job's script against local redis-server processes."""

from __future__ import annotations

import os
import subprocess

from kvrank.tools.processes import RedisServer


def run_bootstrap(
    script: str, nodes: list[RedisServer], password: str
) -> subprocess.CompletedProcess[str]:
    """``sh -c script`` with the Job's environment (``NODES``, ``REDIS_PASSWORD``)."""
    env = {
        "PATH": os.environ["PATH"],
        "REDIS_PASSWORD": password,
        "NODES": " ".join(f"127.0.0.1:{n.port}" for n in nodes),
    }
    return subprocess.run(
        ["sh", "-c", script], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def addrs(nodes: list[RedisServer]) -> list[str]:
    """``ip:port`` of each node, as the operator's health check takes them."""
    return [f"127.0.0.1:{n.port}" for n in nodes]
