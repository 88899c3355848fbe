"""The Docker engine that builds the product's images for the tests, and the built images.

The engine is the one ``docker info`` reaches. Where none runs and this is root with
``dockerd`` installed (``make services`` installs docker.io), :func:`private_engine` starts
one: its own socket, no bridge (builds use the host network), layers kept under
``$KVRANK_CACHE/docker`` so the next run reuses them. The base image is the upstream
``python:3.11-slim`` where it can be pulled, otherwise the stand-in
``images/local-python-base.sh`` builds from the Debian archive. The image tests run the
images with ``docker run``; the real node imports them into its containerd.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localkube.node import unmount_below
from localkube.processes import die_with_parent

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
    redis: str
    plugin: str
    """The example plugin's ranker image (a team's derived image)."""
    plugin_canary: str
    """The same plugin built again as another image: what a canary brings its code in."""
    router: str
    """The bundled router (stock Envoy)."""
    quickstart: str
    """The ranker with the quickstart model inside, under the name ``examples/quickstart.yaml``
    gives it (that file is applied as it is)."""
    examples: tuple[str, ...] = ()
    """Every other image the examples name (ranker images, ``oci://`` model images), under
    those names: the examples are applied as they are."""

    def all(self) -> tuple[str, ...]:
        return (
            self.ranker,
            self.operator,
            self.redis,
            self.plugin,
            self.plugin_canary,
            self.router,
            self.quickstart,
            *self.examples,
        )


@contextlib.contextmanager
def engine(run: Path) -> Iterator[Docker]:
    """The ambient engine, or a private ``dockerd`` for the duration of the block."""
    ambient = Docker(dict(os.environ))
    if ambient("info", check=False).returncode == 0:
        yield ambient
        return
    dockerd = shutil.which("dockerd")
    if dockerd is None or os.geteuid() != 0:
        raise RuntimeError(
            "building the images needs a Docker engine: `docker info` failed and there is no"
            " dockerd to start as root (`make services` installs docker.io)"
        )
    data = Path(os.environ.get("KVRANK_CACHE", Path.home() / ".cache" / "kvrank")) / "docker"
    data.mkdir(parents=True, exist_ok=True)
    run.mkdir(parents=True, exist_ok=True)
    with (data.parent / "docker.lock").open("w") as lock, (run / "dockerd.log").open("wb") as log:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one daemon per data root
        sock = run / "docker.sock"
        proc = subprocess.Popen(
            [
                dockerd,
                f"--data-root={data}",
                f"--exec-root={run / 'exec'}",
                f"--pidfile={run / 'dockerd.pid'}",
                f"--host=unix://{sock}",
                "--bridge=none",
                "--iptables=false",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )
        docker = Docker({**os.environ, "DOCKER_HOST": f"unix://{sock}"})
        try:
            deadline = time.monotonic() + 60
            while docker("info", check=False).returncode != 0:
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = (run / "dockerd.log").read_text()[-4000:]
                    raise RuntimeError(f"dockerd did not start:\n{tail}")
                time.sleep(0.5)
            yield docker
        finally:
            proc.terminate()  # stops its containerd and any container left running
            proc.wait(timeout=60)
            # dockerd leaves its network-namespace mount in the exec root
            unmount_below(run)


def build_images(docker: Docker) -> Images:
    """The product's images, built from this working tree by the Makefile's own target."""
    base = python_base(docker)
    build_step(
        [
            "make",
            "--no-print-directory",
            "images",
            f"IMAGE_TAG={TAG}",
            f"PYTHON_IMAGE={base}",
            "DOCKER_BUILD_FLAGS=--network=host",
        ],
        docker.env,
        2400,
    )
    ranker, plugin = f"ghcr.io/kvrank/ranker:{TAG}", f"ghcr.io/kvrank/ranker-sasrec:{TAG}"
    canary = f"{plugin}-canary"
    build_step(
        [
            "docker",
            "build",
            "--network=host",
            f"--build-arg=RANKER_IMAGE={ranker}",
            "--build-arg=RELEASE=canary",
            f"--tag={canary}",
            "examples/sasrec",
        ],
        docker.env,
        600,
    )
    named = example_images()
    for ref in named:  # the product's images under the release tag the examples give them
        if docker("image", "inspect", ref, check=False).returncode != 0:
            docker("tag", f"{ref.rsplit(':', 1)[0]}:{TAG}", ref)
    prune_old_stages(docker)
    (quickstart,) = (ref for ref in named if "/ranker-quickstart:" in ref)
    return Images(
        ranker,
        f"ghcr.io/kvrank/operator:{TAG}",
        f"ghcr.io/kvrank/redis:{TAG}",
        plugin,
        canary,
        f"ghcr.io/kvrank/router:{TAG}",
        quickstart,
        tuple(ref for ref in named if ref != quickstart),
    )


def example_images() -> tuple[str, ...]:
    """Every image the examples name: a RankerDeployment's ``model.image``/``canary.image``
    (a ranker image, e.g. the quickstart's) and the model images of its ``oci://`` URIs, and
    the containers' and image volumes' images of the objects beside them
    (``examples/model-store``) — ``make images`` builds each under its release tag or its
    own."""
    refs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "image" and isinstance(value, str):
                    refs.append(value)
                elif key == "reference" and isinstance(value, str):
                    refs.append(value)  # an image volume's
                elif key == "uri" and isinstance(value, str) and value.startswith("oci://"):
                    refs.append(value.removeprefix("oci://"))
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    for path in sorted((ROOT / "examples").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            walk(doc)
    return tuple(dict.fromkeys(refs))


def prune_old_stages(docker: Docker) -> None:
    """Remove the untagged kvrank images (build stages) of every build but the last.

    Each build leaves a ``wheel`` stage per image untagged; in a reused data root they pile
    up at gigabytes each (a dependency change adds a new torch layer). The last build's stay:
    they are the next build's cache, so an unchanged tree builds the same image ids (and the
    node imports nothing again).
    """
    listed = docker(
        "images",
        "--quiet",
        "--no-trunc",
        "--filter",
        "dangling=true",
        "--filter",
        "label=org.opencontainers.image.vendor=kvrank",
    ).stdout.split()  # newest first
    seen: set[str] = set()
    for image in dict.fromkeys(listed):
        title = docker(
            "image",
            "inspect",
            "--format",
            '{{index .Config.Labels "org.opencontainers.image.title"}}',
            image,
            check=False,
        ).stdout.strip()
        if title not in seen:
            seen.add(title)  # the newest of this image's stages: the next build's cache
            continue
        docker("image", "rm", image, check=False)  # one still in use by another stays


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
