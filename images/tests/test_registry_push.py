"""``make push-images`` against a real registry: Debian's ``docker-registry`` (the CNCF
distribution server that registries such as ghcr.io and Harbor speak the protocol of), on
loopback. The digest it records for each image is the registry's own for the manifest it
stored, and the image comes back by that digest alone: what a chart pinned by ``make
release`` pulls."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from localkube.engine import ROOT, Docker, Images

from kvrank.tools.processes import free_port, wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]
MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
    )
)


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    """``127.0.0.1:<port>`` of a registry storing under ``tmp_path`` (no auth, loopback only;
    Docker pushes to 127.0.0.0/8 over plain HTTP without being told to)."""
    port = free_port()
    config = tmp_path / "registry.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "version": 0.1,
                "storage": {"filesystem": {"rootdirectory": str(tmp_path / "blobs")}},
                "http": {"addr": f"127.0.0.1:{port}"},
            }
        )
    )
    with (tmp_path / "registry.log").open("w") as log:
        proc = subprocess.Popen(
            ["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
    try:

        def answers() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=2).status_code == 200
            except httpx.HTTPError:
                return proc.poll() is not None  # ended: fail below, with its log

        wait_for(answers, "the registry to answer", 30)
        assert proc.poll() is None, (tmp_path / "registry.log").read_text()
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_each_pushed_image_is_recorded_by_the_registrys_digest_and_pulls_back_by_it(
    docker: Docker, images: Images, registry: str, tmp_path: Path
) -> None:
    repo = f"{registry}/kvrank"
    built = {"router": images.router, "redis": images.redis}  # the two small ones
    for name, ref in built.items():
        docker("tag", ref, f"{repo}/{name}:1.0")
    recorded = tmp_path / "release-images.txt"
    push = subprocess.run(
        ["bash", str(ROOT / "scripts" / "push-images.sh"), repo, "1.0", str(recorded), *built],
        capture_output=True, text=True, env=docker.env, timeout=600,
    )  # fmt: skip
    assert push.returncode == 0, push.stderr
    lines = dict(line.split(" ", 1) for line in recorded.read_text().splitlines())
    assert sorted(lines) == sorted(built)
    try:
        for name, ref in lines.items():
            repository, digest = ref.split("@")
            assert repository == f"{repo}/{name}"
            stored = httpx.head(
                f"http://{registry}/v2/kvrank/{name}/manifests/1.0",
                headers={"Accept": MANIFEST_TYPES},
            )
            assert stored.status_code == 200, stored.text
            assert stored.headers["Docker-Content-Digest"] == digest
            # its references to the registry gone from the engine (the image stays under
            # the tag it was built with), it comes back by the digest alone
            docker("rmi", f"{repo}/{name}:1.0")
            docker("rmi", ref, check=False)
            assert docker("image", "inspect", ref, check=False).returncode != 0
            docker("pull", ref, timeout=300)
            assert docker.inspect(ref)["Id"] == docker.inspect(built[name])["Id"]
    finally:
        for ref in lines.values():
            docker("rmi", ref, check=False)
        for name in built:
            docker("rmi", f"{repo}/{name}:1.0", check=False)


def test_a_push_of_an_image_never_built_fails_naming_it(
    docker: Docker, registry: str, tmp_path: Path
) -> None:
    recorded = tmp_path / "release-images.txt"
    push = subprocess.run(
        ["bash", str(ROOT / "scripts" / "push-images.sh"), f"{registry}/kvrank", "0.0.0",
         str(recorded), "router"],
        capture_output=True, text=True, env=docker.env, timeout=60,
    )  # fmt: skip
    assert push.returncode == 1
    assert f"no local image {registry}/kvrank/router:0.0.0" in push.stderr
    assert not recorded.exists()  # nothing for `make release` to pin
