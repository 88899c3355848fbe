"""``UserKV``: the cached user-side Keys/Values, their INT8 form and their byte format.

A ``UserKV`` holds, per cached layer, the K/V rows ``[rows, heads, head_dim]`` a model's
candidates attend to (K and V may differ in heads and width; they share the rows), plus
named extra tensors a model keeps for itself (the built-in ranker keeps the inputs of its
non-sequential tokens there, so that ``extend_user`` can recompute their rows). Models build
one with :meth:`UserKV.build`; kvrank owns everything after that. Storage dtype is fp32,
bf16, fp16 or int8; int8 is symmetric with per-channel scales for K and per-token scales for
V (as in KIVI) and is dequantised on use; extras keep their own dtype.

Bytes are safetensors (no pickle); metadata carries the model fingerprint, version and
lengths. Reading them copies nothing: on the CPU each tensor is a read-only view on the
received buffer (the bytes Redis returned), elsewhere it takes one copy to the device. This
module never decides whether an entry is fresh: that is the cache's job.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from safetensors.torch import save as st_save
from torch import Tensor

from kvrank.errors import CorruptEntryError
from kvrank.model.config import KVDType

FORMAT_VERSION = "2"
READABLE_FORMATS = ("1", "2")
"""Format 1 kept its one extra tensor as ``ns_input``; it reads as ``extras["ns_input"]``."""

TORCH_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "int8": torch.int8,
}
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "I8": torch.int8,
    "I32": torch.int32,
    "I64": torch.int64,
}
"""The safetensors dtypes a ``UserKV`` is read with (K/V, INT8 scales, a model's extras)."""
MAX_TENSORS_HEADER_BYTES = 1 << 20
"""The safetensors header of an entry (names, dtypes, shapes, offsets, our JSON): kilobytes."""


@dataclass(frozen=True)
class LayerKV:
    """K/V rows of one layer, ``[rows, heads, head_dim]``, in the storage dtype."""

    k: Tensor
    v: Tensor
    k_scale: Tensor | None = None  # fp32 [heads, head_dim] — int8 only, per channel
    v_scale: Tensor | None = None  # fp32 [rows] — int8 only, per token

    @property
    def nbytes(self) -> int:
        parts = [self.k, self.v, self.k_scale, self.v_scale]
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    def to(self, device: torch.device | str) -> LayerKV:
        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device)

        return LayerKV(self.k.to(device), self.v.to(device), move(self.k_scale), move(self.v_scale))

    def pinned(self) -> LayerKV:
        """In page-locked host memory (a copy to a CUDA device is then one DMA)."""

        def pin(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.pin_memory()

        return LayerKV(
            self.k.pin_memory(), self.v.pin_memory(), pin(self.k_scale), pin(self.v_scale)
        )

    def dequantize(self, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """K and V in the compute dtype."""
        if self.k_scale is None or self.v_scale is None:
            return self.k.to(dtype), self.v.to(dtype)
        k = self.k.to(torch.float32) * self.k_scale
        v = self.v.to(torch.float32) * self.v_scale[:, None, None]
        return k.to(dtype), v.to(dtype)


def quantize_layer(k: Tensor, v: Tensor, kv_dtype: KVDType) -> LayerKV:
    """Store ``k``/``v`` (``[rows, heads, head_dim]``) in ``kv_dtype``."""
    if kv_dtype != "int8":
        target = TORCH_DTYPES[kv_dtype]
        return LayerKV(k.detach().to(target), v.detach().to(target))
    k32, v32 = k.detach().float(), v.detach().float()
    # K outliers live in channels, V magnitudes vary by token: scale each accordingly.
    k_scale = k32.abs().amax(dim=0).clamp_min(1e-8) / 127.0
    v_scale = v32.abs().amax(dim=(1, 2)).clamp_min(1e-8) / 127.0
    kq = torch.round(k32 / k_scale).clamp(-127, 127).to(torch.int8)
    vq = torch.round(v32 / v_scale[:, None, None]).clamp(-127, 127).to(torch.int8)
    return LayerKV(kq, vq, k_scale, v_scale)


@dataclass(frozen=True)
class UserKV:
    """Everything a model needs to score candidates for one user without re-encoding."""

    model_version: str
    fingerprint: str
    kv_dtype: KVDType
    length: int  # real user-sequence events in the window (<= the model's window)
    increments: int  # extend_user calls since the last full encode
    layers: dict[int, LayerKV]
    extras: dict[str, Tensor] = field(default_factory=dict)
    """Named tensors the model keeps with the state (never quantised)."""
    meta: dict[str, str] = field(default_factory=dict)
    chain_state: bytes = b""
    """Where the hash chain naming this state's history stands after its events (kvrank's
    :class:`~kvrank.cache.ChainState`, as bytes): what extends that name with later events
    without the old ones. Empty: unknown (a state extended that way is refused)."""

    @staticmethod
    def build(
        *,
        model_version: str,
        fingerprint: str,
        kv: dict[int, tuple[Tensor, Tensor]],
        length: int,
        kv_dtype: KVDType,
        increments: int = 0,
        extras: dict[str, Tensor] | None = None,
    ) -> UserKV:
        """The state of per-layer ``(k, v)`` (each ``[rows, heads, head_dim]``) stored in
        ``kv_dtype``: what a model's ``encode_user`` returns."""
        return UserKV(
            model_version=model_version,
            fingerprint=fingerprint,
            kv_dtype=kv_dtype,
            length=length,
            increments=increments,
            layers={i: quantize_layer(k, v, kv_dtype) for i, (k, v) in kv.items()},
            extras={name: t.detach() for name, t in (extras or {}).items()},
        )

    @property
    def nbytes(self) -> int:
        """Bytes of every tensor held, scales and extras included."""
        return sum(lk.nbytes for lk in self.layers.values()) + sum(
            t.numel() * t.element_size() for t in self.extras.values()
        )

    @property
    def device(self) -> torch.device:
        for lk in self.layers.values():
            return lk.k.device
        return torch.device("cpu")

    def to(self, device: torch.device | str) -> UserKV:
        return replace(
            self,
            layers={i: lk.to(device) for i, lk in self.layers.items()},
            extras={name: t.to(device) for name, t in self.extras.items()},
        )

    def pinned(self) -> UserKV:
        """On the host, in page-locked memory (needs CUDA)."""
        host = self.to("cpu")
        return replace(
            host,
            layers={i: lk.pinned() for i, lk in host.layers.items()},
            extras={name: t.pin_memory() for name, t in host.extras.items()},
        )

    def to_bytes(self) -> bytes:
        """Pickle-free serialisation: safetensors with a JSON header in its metadata."""
        tensors: dict[str, Tensor] = {
            f"x.{name}": t.contiguous().cpu() for name, t in self.extras.items()
        }
        for i, lk in self.layers.items():
            tensors[f"l{i}.k"] = lk.k.contiguous().cpu()
            tensors[f"l{i}.v"] = lk.v.contiguous().cpu()
            if lk.k_scale is not None and lk.v_scale is not None:
                tensors[f"l{i}.k_scale"] = lk.k_scale.contiguous().cpu()
                tensors[f"l{i}.v_scale"] = lk.v_scale.contiguous().cpu()
        header = {
            "format": FORMAT_VERSION,
            "model_version": self.model_version,
            "fingerprint": self.fingerprint,
            "kv_dtype": self.kv_dtype,
            "length": self.length,
            "increments": self.increments,
            "layers": sorted(self.layers),
            "extras": sorted(self.extras),
            "meta": self.meta,
            "chain_state": self.chain_state.hex(),
        }
        return st_save(tensors, metadata={"kvrank": json.dumps(header)})

    @staticmethod
    def from_bytes(data: bytes | memoryview, device: torch.device | str = "cpu") -> UserKV:
        """Parse :meth:`to_bytes` output without copying it (the tensors keep ``data``
        alive); any inconsistency raises ``CorruptEntryError``."""
        try:
            tensors, metadata = _view_safetensors(memoryview(data))
            header = json_object(metadata["kvrank"])
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise CorruptEntryError(f"unreadable K/V payload: {exc!r}") from exc
        try:
            if header["format"] not in READABLE_FORMATS:
                raise CorruptEntryError(f"format {header['format']!r} != {FORMAT_VERSION}")
            kv_dtype = header["kv_dtype"]
            if kv_dtype not in TORCH_DTYPES:
                raise CorruptEntryError(f"unknown kv_dtype {kv_dtype!r}")
            layers = {}
            for i in header["layers"]:
                lk = LayerKV(
                    tensors[f"l{i}.k"],
                    tensors[f"l{i}.v"],
                    tensors.get(f"l{i}.k_scale"),
                    tensors.get(f"l{i}.v_scale"),
                )
                _check_layer(lk, kv_dtype, i)
                layers[int(i)] = lk.to(device)
            if header["format"] == "1":
                extras = {"ns_input": tensors["ns_input"].to(device)}
            else:
                extras = {str(n): tensors[f"x.{n}"].to(device) for n in header["extras"]}
            return UserKV(
                model_version=str(header["model_version"]),
                fingerprint=str(header["fingerprint"]),
                kv_dtype=kv_dtype,
                length=int(header["length"]),
                increments=int(header["increments"]),
                layers=layers,
                extras=extras,
                meta={str(k): str(v) for k, v in header.get("meta", {}).items()},
                chain_state=_chain_state(header.get("chain_state", "")),
            )
        except CorruptEntryError:
            raise
        except Exception as exc:  # bytes from a cache: whatever they break is a corrupt entry
            raise CorruptEntryError(f"inconsistent K/V payload: {exc!r}") from exc


MAX_CHAIN_STATE_BYTES = 1 << 20
"""A chain state holds fewer than 64 events and the user's columns: far below this."""


def _chain_state(text: object) -> bytes:
    if not isinstance(text, str) or len(text) > 2 * MAX_CHAIN_STATE_BYTES:
        raise CorruptEntryError("chain_state is not a bounded hex string")
    return bytes.fromhex(text)


def _view_safetensors(buf: memoryview) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The tensors of a safetensors blob as views on ``buf`` (no copy), and its
    ``__metadata__``. Every offset, size and dtype is checked against the buffer first."""
    if len(buf) < 8:
        raise ValueError("payload shorter than its length prefix")
    size = int.from_bytes(buf[:8], "little")
    if size > min(len(buf) - 8, MAX_TENSORS_HEADER_BYTES):
        raise ValueError(f"header length {size} exceeds the payload or the bound")
    header = json_object(bytes(buf[8 : 8 + size]))
    if not isinstance(header.get("__metadata__"), dict):
        raise ValueError("no metadata")
    base, data_len = 8 + size, len(buf) - 8 - size
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = SAFETENSORS_DTYPES[info["dtype"]]
        shape = [int(d) for d in info["shape"]]
        if any(d < 0 for d in shape):
            raise ValueError(f"tensor {name}: negative dimension in {shape}")
        start, end = (int(o) for o in info["data_offsets"])
        count = math.prod(shape)
        if not 0 <= start <= end <= data_len or end - start != count * dtype.itemsize:
            raise ValueError(f"tensor {name}: offsets {start}..{end} do not fit {shape} {dtype}")
        if count == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
            continue
        with warnings.catch_warnings():  # read-only by design: nothing writes into K/V
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            flat = torch.frombuffer(buf, dtype=dtype, count=count, offset=base + start)
        tensors[name] = flat.view(shape)
    return tensors, header["__metadata__"]


def json_object(raw: bytes | str) -> dict[str, Any]:
    """``raw`` parsed, which must be a JSON object (``ValueError`` otherwise). Deep nesting
    ends in ``RecursionError`` in the parser: callers reading cached bytes bound their size
    first and treat it as any other unreadable entry."""
    doc = json.loads(raw)
    if not isinstance(doc, dict):
        raise ValueError(f"JSON {type(doc).__name__} where an object belongs")
    return doc


def _check_layer(lk: LayerKV, kv_dtype: str, i: int) -> None:
    if lk.k.dim() != 3 or lk.v.dim() != 3 or lk.k.shape[0] != lk.v.shape[0]:
        raise CorruptEntryError(f"layer {i}: k {tuple(lk.k.shape)} / v {tuple(lk.v.shape)}")
    if lk.k.dtype != TORCH_DTYPES[kv_dtype] or lk.v.dtype != lk.k.dtype:
        raise CorruptEntryError(f"layer {i}: dtype {lk.k.dtype} is not {kv_dtype}")
    if (kv_dtype == "int8") != (lk.k_scale is not None and lk.v_scale is not None):
        raise CorruptEntryError(f"layer {i}: scales do not match kv_dtype {kv_dtype}")
    if (
        lk.k_scale is not None
        and lk.v_scale is not None
        and (lk.k_scale.shape != lk.k.shape[1:] or lk.v_scale.shape != lk.k.shape[:1])
    ):
        raise CorruptEntryError(f"layer {i}: scale shapes do not match K/V")
