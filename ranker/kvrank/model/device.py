"""Which torch device a ranker computes on: ``auto`` is CUDA when torch sees a GPU, else the
CPU; an explicit ``cuda`` where there is none is an error, never a silent CPU fallback. And
how much of it the device cache (L1) may take when the config does not say."""

from __future__ import annotations

from collections.abc import Callable

import torch

from kvrank.errors import DeviceError


def resolve_device(name: str) -> torch.device:
    """The device ``name`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``) stands for here."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise DeviceError(
            f"device {name!r} is not a torch device (auto, cpu, cuda, cuda:N)"
        ) from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(
                f"device {name!r} was requested but torch sees no CUDA device"
                f" (torch {torch.__version__}, built for CUDA {torch.version.cuda});"
                " give the pod a GPU (nvidia.com/gpu) or set device: auto"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(
                f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) visible"
            )
    elif device.type != "cpu":
        raise DeviceError(f"device {name!r}: only cpu and cuda are supported")
    return device


L1_DEVICE_SHARE = 0.5
"""Share of a GPU's free memory (once the model is loaded) L1 takes when unset: the rest is
for the activations of batched passes and the allocator's slack."""
L1_BYTES_ELSEWHERE = 512 * 2**20
"""L1 when unset on a CPU, where it shares the process's memory with everything else (the
operator sizes pods' memory from it): room for ~58 bf16 entries of the production-size
model (9.2 MB)."""


def l1_budget(
    configured: int | None,
    device: torch.device,
    free_bytes: Callable[[torch.device], int] | None = None,
) -> tuple[int, str]:
    """L1's byte budget on ``device`` and how it was chosen: ``configured`` when set, else
    :data:`L1_DEVICE_SHARE` of a GPU's free memory (``free_bytes``: CUDA's own count by
    default; call after the model is loaded), else :data:`L1_BYTES_ELSEWHERE`."""
    if configured is not None:
        return configured, "l1_bytes"
    if device.type != "cuda":
        return L1_BYTES_ELSEWHERE, f"the default on {device.type}"
    free = (free_bytes or _cuda_free)(device)
    return int(free * L1_DEVICE_SHARE), (
        f"{L1_DEVICE_SHARE:.0%} of the {free / 2**30:.1f} GiB free on {device} after loading"
    )


def _cuda_free(device: torch.device) -> int:
    return int(torch.cuda.mem_get_info(device)[0])
