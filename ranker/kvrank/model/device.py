"""Which torch device a ranker computes on: ``auto`` is CUDA when torch sees a GPU, else the
CPU; an explicit ``cuda`` where there is none is an error, never a silent CPU fallback."""

from __future__ import annotations

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
