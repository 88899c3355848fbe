"""Packaging and command line: what a user sees after `pip install` and `make`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)


def test_operator_is_still_the_standard_library() -> None:
    out = run(
        sys.executable,
        "-c",
        "import operator, kvrank, kvrank_operator; print(operator.__file__);"
        " print(operator.itemgetter(1)([0, 7]))",
    )
    assert out.returncode == 0, out.stderr
    path, value = out.stdout.split()
    assert "site-packages" not in path and path.endswith("operator.py")
    assert value == "7"


@pytest.mark.parametrize(
    ("script", "commands"),
    [
        (
            "kvrank",
            [
                "serve",
                "bench",
                "train",
                "demo",
                "loadtest",
                "shadowtest",
                "cache",
                "example-request",
                "check-model",
            ],
        ),
        ("kvrank-operator", ["run", "version"]),
        ("kubectl-rkd", ["status", "watch", "promote", "abort", "pause", "resume"]),
    ],
)
def test_help_lists_commands(script: str, commands: list[str]) -> None:
    out = run(str(BIN / script), "--help")
    assert out.returncode == 0, out.stderr
    for cmd in commands:
        assert f" {cmd} " in out.stdout, f"{cmd} missing from {script} --help"


def test_bad_bench_profile_is_rejected() -> None:
    out = run(str(BIN / "kvrank"), "bench", "--profile", "huge")
    assert out.returncode != 0
    assert "profile must be one of" in out.stderr


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["loadtest", "--scenario", "storm"], "--scenario"),
        (["loadtest", "--profile", "huge"], "--profile"),
        (["loadtest", "--arrival", "weekly"], "--arrival"),
        (["loadtest", "--workload", "netflix"], "--workload"),
        (["train", "--data", "netflix"], "--data"),
        (["train", "--profile", "huge"], "--profile"),
    ],
)
def test_a_bad_choice_is_refused_naming_its_option_before_anything_runs(
    args: list[str], named: str
) -> None:
    out = run(str(BIN / "kvrank"), *args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert named in out.stderr and "Traceback" not in out.stderr


def test_serve_without_an_artifact_says_what_is_missing(tmp_path) -> None:
    out = run(str(BIN / "kvrank"), "serve", "--model", str(tmp_path / "nope"))
    assert out.returncode == 2
    assert "no model artifact" in out.stderr and "Traceback" not in out.stderr


def test_serve_with_an_out_of_range_setting_names_it(tmp_path) -> None:
    import os

    env = {**os.environ, "KVRANK_LOCK_WAIT_MS": "5000"}
    out = subprocess.run(
        [str(BIN / "kvrank"), "serve"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert out.returncode == 2
    assert "lock_wait_ms" in out.stderr and "1000" in out.stderr


def test_the_version_is_printed_and_the_declared_license_ships() -> None:
    import importlib.metadata

    out = run(str(BIN / "kvrank"), "--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"kvrank {importlib.metadata.version('kvrank')}"
    assert importlib.metadata.metadata("kvrank")["License-Expression"] == "Apache-2.0"
    assert "Apache License" in (Path(__file__).parents[2] / "LICENSE").read_text()


def test_one_version_names_the_packages_the_images_and_the_chart() -> None:
    import importlib.metadata
    import tomllib

    import yaml

    import kvrank
    import kvrank_operator
    from kvrank_operator.spec import DEFAULT_IMAGE, ROUTER_IMAGE

    root = Path(__file__).parents[2]
    declared = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    assert importlib.metadata.version("kvrank") == declared
    assert kvrank.__version__ == kvrank_operator.__version__ == declared
    # the images the operator runs by default, and the tag `make images` gives them
    assert DEFAULT_IMAGE.endswith(f":{declared}") and ROUTER_IMAGE.endswith(f":{declared}")
    rule = "print-tag:\n\t@echo $(IMAGE_TAG)"
    tag = run("make", "-s", "-C", str(root), "--eval", rule, "print-tag")
    assert tag.stdout.strip() == declared, tag.stderr
    chart = yaml.safe_load((root / "charts" / "kvrank-operator" / "Chart.yaml").read_text())
    assert chart["appVersion"] == declared  # the operator image's default tag
    # the quickstart names the image `make images` builds, and the README says so
    quickstart = yaml.safe_load((root / "examples" / "quickstart.yaml").read_text())
    image = quickstart["spec"]["model"]["image"]
    assert image == f"ghcr.io/kvrank/ranker-quickstart:{declared}"
    assert image in (root / "README.md").read_text()


@pytest.mark.parametrize(
    ("blocked", "module", "argv", "extra"),
    [
        ("torch", "kvrank.cli", ["kvrank", "example-request", "/nowhere"], "kvrank[ranker]"),
        ("kubernetes", "kvrank_operator.cli",
         ["kvrank-operator", "render", "-f", "examples/basic.yaml"], "kvrank[operator]"),
        ("kubernetes", "kvrank_operator.kubectl", ["kubectl-rkd", "status", "x"],
         "kvrank[operator]"),
    ],
)  # fmt: skip
def test_a_command_whose_extra_is_not_installed_names_it(
    blocked: str, module: str, argv: list[str], extra: str
) -> None:
    """As in a base install (``pip install kvrank``): the library is absent."""
    code = (
        f"import sys; sys.modules[{blocked!r}] = None; sys.argv = {argv!r}\n"
        f"from {module} import main; main()"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False,
        cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert blocked in out.stderr and extra in out.stderr and "Traceback" not in out.stderr
