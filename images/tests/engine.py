"""The Docker engine the image tests talk to, and how they find a base image."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM_BASE = "python:3.11-slim"
TAG = "test"


class Docker:
    """The ``docker`` CLI, pointed at one engine."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def __call__(
        self, *args: str, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            ["docker", *args], capture_output=True, text=True, env=self.env, timeout=timeout
        )
        if check and out.returncode != 0:
            raise AssertionError(
                f"docker {' '.join(args)} exited {out.returncode}:\n{out.stderr[-4000:]}"
            )
        return out

    def inspect(self, ref: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self("inspect", ref).stdout)[0]
        return doc


@dataclass(frozen=True)
class Images:
    ranker: str
    operator: str


def python_base(docker: Docker) -> str:
    """``python:3.11-slim`` if the engine has or can pull it, else the local stand-in."""
    if docker("image", "inspect", UPSTREAM_BASE, check=False).returncode == 0:
        return UPSTREAM_BASE
    if docker("pull", UPSTREAM_BASE, check=False, timeout=600).returncode == 0:
        return UPSTREAM_BASE
    script = str(ROOT / "images" / "local-python-base.sh")
    return build_step(["bash", script], docker.env, 900).strip().splitlines()[-1]


def build_step(cmd: list[str], env: dict[str, str], timeout: float) -> str:
    """Run ``cmd`` from the repository root; its stdout, or an error showing both streams."""
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=timeout)
    if out.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        )
    return out.stdout
