"""``make release``: the wheels, the chart package and their checksums for the checked-out
commit — built twice, byte-identical; the chart archive lints as the chart does; the wheels
hold the committed sources only (never a stale ``build/`` folder's). After a push of the
images (``make push-images``' file of digests), the chart runs each image by its digest."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml
from helm_chart import helm

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def release(out: Path, **env_vars: str) -> dict[str, str]:
    """``scripts/release.sh`` into ``out``: file name → sha256, as SHA256SUMS says."""
    from localkube.local import binaries

    env = {**os.environ, "PY": sys.executable, "HELM": str(binaries() / "helm"), **env_vars}
    subprocess.run(["bash", "scripts/release.sh", str(out)], cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=600)  # fmt: skip
    sums = (out / "SHA256SUMS").read_text().splitlines()
    return {name: digest for digest, name in (line.split() for line in sums)}


def test_a_release_is_byte_identical_each_time_and_holds_the_committed_sources(
    tmp_path: Path,
) -> None:
    first, second = release(tmp_path / "a"), release(tmp_path / "b")
    assert first == second
    wheels = sorted(n for n in first if n.endswith(".whl"))
    (chart,) = (n for n in first if n.endswith(".tgz"))
    assert [w.split("-")[0] for w in wheels] == ["kvrank", "kvrank_sasrec"]
    assert chart.startswith("kvrank-operator-")

    lint = helm("lint", "--strict", "--kube-version", "1.37.2", str(tmp_path / "a" / chart))
    assert lint.returncode == 0, lint.stdout + lint.stderr

    committed = set(
        subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                       check=True).stdout.split()
    )  # fmt: skip
    with zipfile.ZipFile(tmp_path / "a" / wheels[0]) as wheel:
        modules = [n for n in wheel.namelist() if n.endswith(".py")]
    packages = {"kvrank": "ranker/", "kvrank_common": "ranker/", "kvrank_operator": "operator/"}
    assert {m.split("/")[0] for m in modules} == set(packages)
    stray = [m for m in modules if packages[m.split("/")[0]] + m not in committed]
    assert not stray, f"in the wheel but not in the commit: {stray[:5]}"


def pushed(names: list[str], registry: str = "registry.example/kvrank") -> str:
    """A file as ``make push-images`` writes it: each name with a digest of its own."""
    lines = [
        f"{n} {registry}/{n.split(':')[0]}@sha256:{hashlib.sha256(n.encode()).hexdigest()}"
        for n in names
    ]
    return "\n".join(lines) + "\n"


def test_a_release_after_a_push_runs_every_image_by_its_digest(tmp_path: Path) -> None:
    images = tmp_path / "images.txt"
    names = ["ranker", "operator", "redis", "router", "ranker-sasrec", "ranker-quickstart"]
    names += ["feed-ranker-model:v1", "feed-ranker-model:v2", "sasrec-model:s1"]  # the examples'
    images.write_text(pushed(names))
    env = {"RELEASE_IMAGES": str(images), "IMAGE_TAG": "9.8.7"}
    first, second = release(tmp_path / "a", **env), release(tmp_path / "b", **env)
    assert first == second  # still byte-identical
    assert (tmp_path / "a" / "images.txt").read_text() == "".join(
        sorted(pushed(names).splitlines(True))
    )
    (chart,) = (tmp_path / "a" / n for n in first if n.endswith(".tgz"))

    digest = {
        n: ref.split("@")[1]
        for n, ref in (line.split() for line in images.read_text().splitlines())
    }
    rendered = helm("template", "kvrank", str(chart), "--kube-version", "1.37.2")
    assert rendered.returncode == 0, rendered.stderr
    (operator,) = (
        d for d in yaml.safe_load_all(rendered.stdout) if d and d["kind"] == "Deployment"
    )
    container = operator["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"registry.example/kvrank/operator:9.8.7@{digest['operator']}"
    for name in ("ranker", "redis", "router"):  # what the operator runs where a spec names none
        ref = f"registry.example/kvrank/{name}:9.8.7@{digest[name]}"
        assert f"--{name}-image={ref}" in container["args"], container["args"]

    # only the pinned lines changed: the values' comments (helm show values) are the chart's
    with tarfile.open(chart) as archive:
        values = archive.extractfile("kvrank-operator/values.yaml").read().decode()  # type: ignore[union-attr]
    source = (ROOT / "charts" / "kvrank-operator" / "values.yaml").read_text()
    changed = [
        (a, b) for a, b in zip(source.splitlines(), values.splitlines(), strict=True) if a != b
    ]
    assert len(changed) == 4 * 3, changed  # repository, tag and digest of four images
    assert all(a.split(":")[0] == b.split(":")[0] for a, b in changed), changed


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("router registry.example/kvrank/router:1.0", "is not 'NAME REPOSITORY@sha256:<64 hex>'"),
        ("router registry.example/kvrank/router@sha256:abc", "is not 'NAME REPOSITORY@sha256"),
        (pushed(["dashboard"]).strip(), "the chart runs no image named 'dashboard'"),
    ],
)
def test_a_file_of_digests_that_is_not_a_push_is_refused_naming_its_line(
    tmp_path: Path, line: str, error: str
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text((ROOT / "charts" / "kvrank-operator" / "values.yaml").read_text())
    images = tmp_path / "images.txt"
    images.write_text(pushed(["operator"]) + line + "\n")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "pin_images.py"), str(values),
                          str(images), "1.0"], capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 1
    assert "line 2:" in out.stderr and error in out.stderr, out.stderr
    assert values.read_text() == (ROOT / "charts" / "kvrank-operator" / "values.yaml").read_text()
