"""``make kube-score``: kube-score (built from its Go module) over the rendered chart and what
the operator renders for every example. A new CRITICAL finding is reported naming its object
and check and fails the run; a check on the ignore list is not reported; an ignore entry
without a reason is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = ROOT / "scripts" / "kube_score_lint.py"
BAD = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: rootish, namespace: prod}
spec:
  selector: {matchLabels: {app: rootish}}
  template:
    metadata: {labels: {app: rootish}}
    spec:
      containers:
        - name: app
          image: example.invalid/app:1.0
          securityContext: {runAsUser: 0, runAsGroup: 0}
"""


@pytest.fixture(scope="module")
def tools() -> list[str]:
    bins = {}
    for name, script in (("kube-score", "scripts/build-kube-score.sh"),
                         ("helm", "e2e/localkube/build.sh")):  # fmt: skip
        out = subprocess.run(["bash", str(ROOT / script)], capture_output=True, text=True,
                             check=True)  # fmt: skip
        bins[name] = str(Path(out.stdout.strip().splitlines()[-1]) / name)
    return ["--kube-score", bins["kube-score"], "--helm", bins["helm"]]


def lint(tools: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(LINT), *tools, *args], capture_output=True, text=True
    )


def test_a_new_critical_finding_fails_naming_its_object_and_check(tools, tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    out = lint(tools, str(bad))
    assert out.returncode == 1, out.stdout + out.stderr
    rows = [r for r in out.stdout.splitlines() if "Deployment rootish" in r]  # runs as root
    assert any(
        r.startswith("CRITICAL") and " container-security-context-user-group-id " in r for r in rows
    ), rows


def test_the_shipped_manifests_have_no_critical_finding_outside_the_ignore_list(tools) -> None:
    out = lint(tools)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 CRITICAL" in out.stdout and not out.stdout.startswith("CRITICAL")


def test_an_ignored_check_is_not_reported_and_each_ignore_says_why(tools, tmp_path) -> None:
    ignore = tmp_path / "ignore.yaml"
    ignore.write_text("- check: container-image-pull-policy\n  reason: a test\n")
    out = lint(tools, "--ignore", str(ignore))
    assert out.returncode == 1 and "kube-score:" in out.stdout, out.stderr
    assert " container-image-pull-policy " not in out.stdout
    # the repo's own list (and its --ignore-container-cpu-limit) is not in force
    assert any(
        r.startswith("CRITICAL") and " container-resources " in r and "CPU limit" in r
        for r in out.stdout.splitlines()
    ), out.stdout
    ignore.write_text("- check: container-image-pull-policy\n  reason: ''\n")
    refused = lint(tools, "--ignore", str(ignore))
    assert (
        refused.returncode != 0 and "'container-image-pull-policy' has no reason" in refused.stderr
    )


@pytest.mark.slow
def test_an_ignore_with_only_holds_for_the_manifests_it_names(tools, tmp_path) -> None:
    """The OpenShift values leave uids to the platform (the check is off there alone): the
    same finding in any other manifest still fails."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    ignore = tmp_path / "ignore.yaml"
    repo = (Path(LINT).parents[1] / "lint" / "kube-score-ignore.yaml").read_text()
    for only, reported in (("[bad]", False), ("[chart-openshift-values]", True)):
        ignore.write_text(repo.replace("only: [chart-openshift-values]", f"only: {only}"))
        out = lint(tools, "--ignore", str(ignore), str(bad))
        rows = [r for r in out.stdout.splitlines() if "Deployment rootish" in r]
        found = any(" container-security-context-user-group-id " in r for r in rows)
        assert found is reported, (only, out.stdout)
