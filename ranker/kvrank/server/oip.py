"""A scoring request and its answer as Open Inference Protocol (v2) tensors — what KServe,
Triton and Seldon speak, and what ``tritonclient`` sends — over HTTP, with the binary tensor
extension. Pure: bytes in, the model's inputs out, and back; no HTTP framework here.

Each column of the model's :class:`FeatureSpec` is one input tensor named as the JSON body
names the field: ``events.<column>`` (INT64 ``[n]`` or FP32 ``[n, width]``), each user
column by its name (INT64 or FP32 ``[width]``) and ``candidates.<column>`` (``[C]`` or
``[C, width]``); ``user_id`` is BYTES ``[1]``, and the optional ``seq_hash`` (BYTES ``[1]``)
sends the history by reference in place of the sequence and user tensors, the optional
``events_since`` (BYTES ``[1]``) a hash whose history the ``events.*`` tensors continue (the
user tensors left out). The one output is
``scores`` (FP32 ``[C]``, input order). A tensor's values come as JSON ``data`` or, with
``parameters.binary_data_size``, from the bytes after the JSON header
(``Inference-Header-Content-Length``), little-endian, in input order. Every problem is an
:class:`~kvrank.errors.InputError` naming the input.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kvrank.cache import SEQ_HASH_PATTERN
from kvrank.errors import HeaderError, InputError
from kvrank.model.contract import CandidateInput, Column, FeatureSpec, UserInput
from kvrank.service import ModelInputs

HEADER_LENGTH = "inference-header-content-length"
"""The binary extension's header: how many bytes of the body are the JSON header."""
IF_MATCH = "If-Match"
OUTPUT = "scores"
USER_ID = "user_id"
SEQ_HASH = "seq_hash"
EVENTS_SINCE = "events_since"
"""The optional input naming the hash whose history the ``events.*`` inputs continue."""
_DTYPES: dict[str, np.dtype[Any]] = {"INT64": np.dtype("<i8"), "FP32": np.dtype("<f4")}
_USER_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
_SEQ_HASH = re.compile(SEQ_HASH_PATTERN)


def _columns(spec: FeatureSpec) -> list[tuple[str, Column, str]]:
    """Every model input: (tensor name, column, group: ``events``, ``user``, ``candidates``)."""
    return [
        *((f"events.{c.name}", c, "events") for c in spec.sequence),
        *((c.name, c, "user") for c in spec.user),
        *((f"candidates.{c.name}", c, "candidates") for c in spec.candidate),
    ]


def _shape(col: Column, group: str) -> list[int]:
    if group == "user":
        return [col.per_row]
    return [-1] if col.kind == "id" else [-1, col.per_row]


def input_metadata(spec: FeatureSpec) -> list[dict[str, Any]]:
    """The model metadata's ``inputs`` (``-1``: as many as the request has)."""
    tensors: list[dict[str, Any]] = [{"name": USER_ID, "datatype": "BYTES", "shape": [1]}]
    for optional in (SEQ_HASH, EVENTS_SINCE):
        tensors.append({"name": optional, "datatype": "BYTES", "shape": [1], "optional": True})
    for name, col, group in _columns(spec):
        dtype = "INT64" if col.kind == "id" else "FP32"
        tensors.append({"name": name, "datatype": dtype, "shape": _shape(col, group)})
    return tensors


OUTPUTS = [{"name": OUTPUT, "datatype": "FP32", "shape": [-1]}]


@dataclass(frozen=True)
class InferRequest:
    """A decoded inference request: the JSON header and each input's values."""

    header: dict[str, Any]
    values: dict[str, np.ndarray | list[bytes]]

    @property
    def binary_output(self) -> bool:
        """Whether the caller asked for ``scores`` as binary data."""
        params = self.header.get("parameters") or {}
        if params.get("binary_data_output") is True:
            return True
        for out in self.header.get("outputs") or ():
            if isinstance(out, dict) and out.get("name") == OUTPUT:
                return (out.get("parameters") or {}).get("binary_data") is True
        return False


def decode(raw: bytes, header_length: str | None) -> InferRequest:
    """The request body (with its binary part when ``header_length`` is given)."""
    size = len(raw)
    if header_length is not None:
        if not header_length.isdigit() or int(header_length) > len(raw):
            raise InputError(HEADER_LENGTH, f"must be a byte count within the body ({len(raw)})")
        size = int(header_length)
    try:
        header = json.loads(raw[:size])
    except (ValueError, RecursionError) as exc:
        raise InputError("body", f"the JSON header does not parse: {exc}") from None
    return from_parts(header, memoryview(raw)[size:])


def from_parts(header: object, binary: memoryview) -> InferRequest:
    """A request from its JSON header and the binary data after it (the gRPC service
    builds both from its message)."""
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        raise InputError("inputs", "the request must be a JSON object with a list of inputs")
    values: dict[str, np.ndarray | list[bytes]] = {}
    for i, tensor in enumerate(header["inputs"]):
        name, array, used = _tensor(tensor, i, binary)
        if name in values:
            raise InputError(name, "sent twice")
        values[name], binary = array, binary[used:]
    if len(binary):
        raise InputError(HEADER_LENGTH, f"{len(binary)} bytes after the last binary input")
    return InferRequest(header, values)


def _tensor(
    tensor: object, i: int, binary: memoryview
) -> tuple[str, np.ndarray | list[bytes], int]:
    """One input: its name, values and how many binary bytes it took."""
    if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
        raise InputError(f"inputs[{i}]", "must be an object with a name")
    name, datatype, shape = tensor["name"], tensor.get("datatype"), tensor.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise InputError(name, "shape must be a list of non-negative integers")
    count = math.prod(shape)
    size = (tensor.get("parameters") or {}).get("binary_data_size")
    if datatype == "BYTES":
        strings = _strings(name, tensor.get("data"), binary, size)
        if len(strings) != count:
            raise InputError(name, f"has {len(strings)} elements; its shape {shape} holds {count}")
        return name, strings, size or 0
    if datatype not in _DTYPES:
        raise InputError(name, f"datatype {datatype!r}: this model takes INT64, FP32 or BYTES")
    dtype = _DTYPES[str(datatype)]
    if size is not None:
        if not isinstance(size, int) or size != count * dtype.itemsize or size > len(binary):
            raise InputError(name, f"binary_data_size must be {count * dtype.itemsize} bytes")
        return name, np.frombuffer(binary[:size], dtype).reshape(shape), size
    return name, _from_json(name, tensor.get("data"), dtype, shape, count), 0


def _from_json(
    name: str, data: object, dtype: np.dtype[Any], shape: list[int], count: int
) -> np.ndarray:
    try:
        array = np.asarray(data)
    except ValueError:
        raise InputError(name, "data is not a list of numbers of one shape") from None
    if array.dtype.kind not in ("iu" if dtype.kind == "i" else "iuf") or array.size != count:
        what = "integers" if dtype.kind == "i" else "numbers"
        raise InputError(name, f"data must be {count} {what} (shape {shape})")
    return array.astype(dtype).reshape(shape)


def _strings(name: str, data: object, binary: memoryview, size: object) -> list[bytes]:
    """BYTES elements: JSON strings, or length-prefixed (uint32) byte strings."""
    if size is None:
        if not isinstance(data, list) or not all(isinstance(s, str) for s in data):
            raise InputError(name, "data must be a list of strings")
        return [s.encode() for s in data]
    if not isinstance(size, int) or not 0 <= size <= len(binary):
        raise InputError(name, "binary_data_size is outside the binary data")
    out, at, chunk = [], 0, bytes(binary[:size])
    while at < size:
        n = int.from_bytes(chunk[at : at + 4], "little") if at + 4 <= size else -1
        if n < 0 or at + 4 + n > size:
            raise InputError(name, "a BYTES element runs past its binary_data_size")
        out.append(chunk[at + 4 : at + 4 + n])
        at += 4 + n
    return out


def pack_strings(items: Iterable[bytes]) -> bytes:
    """BYTES elements as the binary extension carries them: each one's length (uint32,
    little-endian), then its bytes."""
    return b"".join(len(b).to_bytes(4, "little") + b for b in items)


def model_inputs(req: InferRequest, spec: FeatureSpec, if_match: str | None) -> ModelInputs:
    """The request's tensors as the model's inputs (``InputError`` naming the input);
    ``if_match``: the sequence hash of an ``If-Match`` header, if one came."""
    values = dict(req.values)
    user_id = _one_string(values.pop(USER_ID, None), USER_ID, _USER_ID)
    seq_hash, seq_hash_from = if_match, IF_MATCH
    if SEQ_HASH in values:
        sent = _one_string(values.pop(SEQ_HASH), SEQ_HASH, _SEQ_HASH)
        if if_match is not None and if_match != sent:
            raise HeaderError(IF_MATCH, "names another seq_hash than the seq_hash input")
        seq_hash, seq_hash_from = sent, SEQ_HASH
    since = None
    if EVENTS_SINCE in values:
        since = _one_string(values.pop(EVENTS_SINCE), EVENTS_SINCE, _SEQ_HASH)
        if seq_hash is not None:
            raise InputError(seq_hash_from, f"must be left out when {EVENTS_SINCE} is sent")
    groups: dict[str, dict[str, torch.Tensor]] = {"events": {}, "user": {}, "candidates": {}}
    named_by = seq_hash_from if seq_hash is not None else EVENTS_SINCE
    for name, col, group in _columns(spec):
        if (seq_hash is not None and group != "candidates") or (since and group == "user"):
            if name in values:
                raise InputError(name, f"must be left out when {named_by} names the history")
            continue
        array = values.pop(name, None)
        if array is None:
            raise InputError(name, "missing")
        if not isinstance(array, np.ndarray):
            raise InputError(name, "must be INT64 or FP32, not BYTES")
        groups[group][col.name] = torch.from_numpy(np.array(array))  # writable, owned
    if values:
        raise InputError(next(iter(values)), "not an input of this model")
    _within_limits(spec, groups)
    cands = CandidateInput(groups["candidates"])
    if since is not None:
        return ModelInputs(user_id, None, EVENTS_SINCE, None, cands, since, groups["events"])
    user = None if seq_hash else UserInput(groups["events"], groups["user"])
    return ModelInputs(user_id, seq_hash, seq_hash_from, user, cands)


def _within_limits(spec: FeatureSpec, groups: dict[str, dict[str, torch.Tensor]]) -> None:
    for group, limit in (("events", spec.max_request_events), ("candidates", spec.max_candidates)):
        cols = spec.sequence if group == "events" else spec.candidate
        first = groups[group].get(cols[0].name)
        if first is not None and first.ndim and first.shape[0] > limit:
            raise InputError(
                f"{group}.{cols[0].name}", f"has {first.shape[0]} rows; at most {limit}"
            )


def _one_string(value: object, name: str, pattern: re.Pattern[str]) -> str:
    if value is None:
        raise InputError(name, "missing")
    if not isinstance(value, list) or len(value) != 1:
        raise InputError(name, "must be BYTES of shape [1]")
    try:
        text = bytes(value[0]).decode()
    except UnicodeDecodeError:
        raise InputError(name, "is not UTF-8") from None
    if not pattern.fullmatch(text):  # "$" alone would take a trailing newline
        raise InputError(name, f"must match {pattern.pattern}")
    return text


def encode_answer(
    header: dict[str, Any], scores: Sequence[float] | np.ndarray, binary: bool
) -> tuple[bytes, int | None]:
    """The answer's body, and its JSON header's length when ``scores`` go as binary."""
    data = np.asarray(scores, dtype="<f4")
    output: dict[str, Any] = {"name": OUTPUT, "datatype": "FP32", "shape": [int(data.size)]}
    if not binary:
        output["data"] = data.tolist()
        return json.dumps({**header, "outputs": [output]}).encode(), None
    output["parameters"] = {"binary_data_size": int(data.nbytes)}
    head = json.dumps({**header, "outputs": [output]}).encode()
    return head + data.tobytes(), len(head)


def tensors(
    spec: FeatureSpec,
    body: dict[str, Any],
    seq_hash: str | None = None,
    dense: type[np.floating[Any]] = np.float32,
) -> list[tuple[str, str, np.ndarray]]:
    """The v2 input tensors ``(name, datatype, values)`` of a ``/v1/score`` body; with
    ``seq_hash``, the history by reference (the candidates only). ``dense``: the dtype FP32
    values are held in (``float64`` keeps a body's decimals as it wrote them)."""
    out = [(USER_ID, "BYTES", np.array([body["user_id"].encode()], dtype=object))]
    if seq_hash is not None:
        out.append((SEQ_HASH, "BYTES", np.array([seq_hash.encode()], dtype=object)))
    for name, col, group in _columns(spec):
        if seq_hash is not None and group != "candidates":
            continue
        values = body[col.name] if group == "user" else body[group][col.name]
        array = np.asarray(values, dtype=np.int64 if col.kind == "id" else dense)
        if group != "user" and col.kind == "dense":
            array = array.reshape(-1, col.per_row)
        out.append((name, "INT64" if col.kind == "id" else "FP32", array))
    return out


def json_request(
    spec: FeatureSpec, body: dict[str, Any], seq_hash: str | None = None
) -> dict[str, Any]:
    """The v2 inference request (JSON tensors) of a ``/v1/score`` body; with ``seq_hash``,
    the history by reference (the candidates only)."""
    inputs = []
    for name, datatype, array in tensors(spec, body, seq_hash, dense=np.float64):
        data = [v.decode() for v in array] if datatype == "BYTES" else array.ravel().tolist()
        inputs.append(
            {"name": name, "datatype": datatype, "shape": list(array.shape), "data": data}
        )
    return {"inputs": inputs}
