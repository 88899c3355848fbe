"""The hit path's achieved throughput is set against the right datasheet peak."""

from __future__ import annotations

import pytest
import torch

from kvrank.bench.peak import gpu_peak_tflops, matmul_math, throughput


@pytest.mark.parametrize(
    ("name", "math", "peak"),
    [
        ("NVIDIA H200", "bf16", 989.5),
        ("NVIDIA H200 NVL", "bf16", 835.5),  # the PCIe card, not the SXM one
        ("NVIDIA H100 80GB HBM3", "fp32", 67.0),
        ("NVIDIA H100 PCIe", "tf32", 378.0),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156.0),
        ("NVIDIA L4", "fp16", 121.0),
        ("NVIDIA L40S", "fp16", 362.0),  # not mistaken for an L4
    ],
)
def test_known_gpus_get_their_dense_peak(name: str, math: str, peak: float) -> None:
    assert gpu_peak_tflops(name, math) == peak


def test_an_unknown_device_has_no_peak_rather_than_a_guess() -> None:
    assert gpu_peak_tflops("Tesla T4", "fp32") is None


def test_fp32_matmuls_count_against_tf32_only_when_torch_allows_it() -> None:
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert matmul_math("fp32") == "fp32"
        torch.backends.cuda.matmul.allow_tf32 = True
        assert matmul_math("fp32") == "tf32"
        assert matmul_math("bf16") == "bf16"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_cpu_throughput_is_reported_without_a_peak() -> None:
    tp = throughput(0.2, "cpu", "fp32")
    assert tp["achieved_tflops"] == 0.2 and tp["device_name"] == "cpu"
    assert tp["peak_tflops"] is None and tp["fraction_of_peak"] is None
