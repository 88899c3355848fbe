"""``make release``: the wheels, the chart package and their checksums for the checked-out
commit — built twice, byte-identical; the chart archive lints as the chart does; the wheels
hold the committed sources only (never a stale ``build/`` folder's)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helm_chart import helm

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def release(out: Path) -> dict[str, str]:
    """``scripts/release.sh`` into ``out``: file name → sha256, as SHA256SUMS says."""
    from localkube.local import binaries

    env = {**os.environ, "PY": sys.executable, "HELM": str(binaries() / "helm")}
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
