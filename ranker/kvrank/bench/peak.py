"""How close a measured path comes to its accelerator's peak arithmetic throughput.

Peaks are NVIDIA's datasheet figures for dense math (the "with sparsity" figures are twice
these and do not apply: no kernel here uses structured sparsity), at boost clock, per the
math a model's matmuls run in: plain FP32 on CUDA cores, TF32 on tensor cores when torch
is allowed to run fp32 matmuls that way, BF16/FP16 on tensor cores. CPUs get no peak: what
a virtual machine's vCPUs can reach is not published, so only the achieved figure is
reported there.
"""

from __future__ import annotations

import torch

from kvrank.model.config import ComputeDType

GPU_PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # name fragment (as in torch.cuda.get_device_name) -> math -> dense TFLOP/s
    "H200 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    "H200": {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5},  # SXM
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    "H100 PCIe": {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5},
    "H100": {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5},  # SXM
    "A100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
    "L40S": {"fp32": 91.6, "tf32": 183.0, "bf16": 362.0, "fp16": 362.0},
    "L4": {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0},
}


def matmul_math(compute_dtype: ComputeDType) -> str:
    """The math an fp32/bf16/fp16 model's matmuls run in on an NVIDIA GPU."""
    if compute_dtype != "fp32":
        return compute_dtype
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"


def gpu_peak_tflops(device_name: str, math: str) -> float | None:
    """Datasheet peak of the GPU named ``device_name`` for ``math``; None when unknown."""
    for fragment in sorted(GPU_PEAK_TFLOPS, key=len, reverse=True):  # "H200 NVL" before "H200"
        if fragment in device_name:
            return GPU_PEAK_TFLOPS[fragment].get(math)
    return None


def throughput(
    achieved_tflops: float, device: str, compute_dtype: ComputeDType
) -> dict[str, object]:
    """``achieved_tflops`` on ``device``, against the device's peak if known."""
    math = matmul_math(compute_dtype) if device == "cuda" else compute_dtype
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    peak = gpu_peak_tflops(name, math) if device == "cuda" else None
    return {
        "achieved_tflops": achieved_tflops,
        "device_name": name,
        "math": math,
        "peak_tflops": peak,
        "fraction_of_peak": achieved_tflops / peak if peak else None,
    }
