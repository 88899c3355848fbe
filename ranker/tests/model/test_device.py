"""Which device a ranker computes on: ``auto`` by default (CUDA when torch sees a GPU), and
a pod told to use CUDA without one exits saying so instead of computing on the CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvrank.errors import DeviceError
from kvrank.model.artifact import save_model
from kvrank.model.device import L1_BYTES_ELSEWHERE, L1_DEVICE_SHARE, l1_budget, resolve_device
from kvrank.server.config import ServerConfig, load_config
from kvrank.server.wiring import build_service


def test_auto_is_the_default_and_picks_the_cpu_on_a_machine_without_a_gpu() -> None:
    assert ServerConfig.model_construct().device == "auto"
    assert torch.cuda.is_available() is False  # this machine: the CPU build runs on CPUs
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("name", ["cuda", "cuda:0"])
def test_cuda_without_a_gpu_is_an_error_that_says_so(name: str) -> None:
    with pytest.raises(DeviceError, match="torch sees no CUDA device"):
        resolve_device(name)


def test_an_unknown_device_is_refused() -> None:
    with pytest.raises(DeviceError, match="not a torch device"):
        resolve_device("gpu")
    with pytest.raises(DeviceError, match="only cpu and cuda"):
        resolve_device("meta")


def test_kvrank_serve_told_to_use_cuda_here_exits_with_the_reason(
    factory, tiny_cfg, tmp_path
) -> None:
    artifact_dir = save_model(factory.model(tiny_cfg), tmp_path / "m")
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "kvrank"), "serve", "--model", str(artifact_dir)],
        env={"PATH": "/usr/bin:/bin", "KVRANK_DEVICE": "cuda"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "device 'cuda' was requested but torch sees no CUDA device" in proc.stderr


def test_cuda_graphs_are_refused_on_a_device_without_cuda_naming_the_setting(
    factory, tiny_cfg, tmp_path
) -> None:
    """A config asking for CUDA graphs on a CPU fails at load, saying which setting needs
    what — never a server that silently scores without them."""
    artifact_dir = save_model(factory.model(tiny_cfg), tmp_path / "m")
    cfg = load_config({"model_dir": str(artifact_dir), "device": "cpu", "cuda_graphs": True})
    with pytest.raises(DeviceError, match="cuda_graphs=true needs a CUDA device; this server"):
        build_service(cfg)


def test_an_unset_l1_takes_a_share_of_the_gpus_free_memory_and_a_fixed_budget_elsewhere() -> None:
    """The GPU's free memory is what CUDA reports (this machine has none: it is handed in)."""
    gib = 2**30
    budget, why = l1_budget(None, torch.device("cuda:0"), free_bytes=lambda _: 120 * gib)
    assert budget == int(120 * gib * L1_DEVICE_SHARE) and "120.0 GiB free on cuda:0" in why
    assert l1_budget(None, torch.device("cpu")) == (L1_BYTES_ELSEWHERE, "the default on cpu")
    for device in ("cpu", "cuda"):  # a budget that is set is kept, 0 (no L1) included
        for configured in (0, 3 * gib):
            assert l1_budget(configured, torch.device(device), lambda _: gib)[0] == configured
