"""Fixtures for the image tests: a Docker engine, and both images built by ``make images``.

The engine is the one ``docker info`` reaches. Where none runs and this is root with
``dockerd`` installed (``make services`` installs docker.io), the session starts a private
daemon: its own socket, no bridge (builds and containers use the host network, as pods
with ``hostNetwork`` would), layers kept under ``$KVRANK_CACHE/docker`` so the next run
reuses them. The base image is the upstream ``python:3.11-slim`` where it can be pulled,
otherwise the stand-in ``images/local-python-base.sh`` builds from the Debian archive.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine import TAG, Docker, Images, build_step, python_base
from localkube.processes import die_with_parent


@pytest.fixture(scope="session")
def docker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Docker]:
    ambient = Docker(dict(os.environ))
    if ambient("info", check=False).returncode == 0:
        yield ambient
        return
    dockerd = shutil.which("dockerd")
    if dockerd is None or os.geteuid() != 0:
        pytest.fail(
            "the image tests need a Docker engine: `docker info` failed and there is no"
            " dockerd to start as root (`make services` installs docker.io)"
        )
    run = tmp_path_factory.mktemp("dockerd")
    data = Path(os.environ.get("KVRANK_CACHE", Path.home() / ".cache" / "kvrank")) / "docker"
    data.mkdir(parents=True, exist_ok=True)
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
        engine = Docker({**os.environ, "DOCKER_HOST": f"unix://{sock}"})
        try:
            deadline = time.monotonic() + 60
            while engine("info", check=False).returncode != 0:
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = (run / "dockerd.log").read_text()[-4000:]
                    raise RuntimeError(f"dockerd did not start:\n{tail}")
                time.sleep(0.5)
            yield engine
        finally:
            proc.terminate()  # stops its containerd and any container left running
            proc.wait(timeout=60)
            unmount_below(run)


def unmount_below(folder: Path) -> None:
    """dockerd leaves its network-namespace mount in the exec root; pytest could not
    delete the folder."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        target = line.split()[1]
        if target.startswith(f"{folder}/"):
            subprocess.run(["umount", "--lazy", target], check=False)


@pytest.fixture(scope="session")
def images(docker: Docker) -> Images:
    """Both images, built from this working tree by the Makefile's own target."""
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
    # kvrank images that this build untagged would pile up (gigabytes each) in a reused data
    # root; the dependency layers under the new tags stay as cache
    docker("image", "prune", "--force", "--filter", "label=org.opencontainers.image.vendor=kvrank")
    return Images(f"ghcr.io/kvrank/ranker:{TAG}", f"ghcr.io/kvrank/operator:{TAG}")
