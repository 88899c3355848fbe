"""What crosses between a front and the engine: typed messages, msgpack-encoded, each frame
prefixed by its length, over a Unix stream socket (one connection per front).

A front sends a :data:`ToEngine` message and, for those with an ``id``, gets one
:data:`FromEngine` message back with the same ``id``; notes (:class:`Shed`, :class:`Leave`)
get none. Tensors cross as :class:`Array` (dtype, shape and the raw little-endian bytes):
a hit's candidates are a few kilobytes, and nothing is pickled, ever. Both sides import
this module and nothing else of each other.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Mapping
from typing import Any, Literal

import msgspec
import numpy as np
import torch

from kvrank.errors import (
    Abandoned,
    HistoryRequired,
    IncompatibleKVError,
    InputError,
    KvrankError,
    NonFiniteScores,
    Overloaded,
)
from kvrank.model.contract import FeatureSpec

MAX_FRAME = 256 << 20
"""The largest message either side accepts (a request body is bounded far below it)."""
_LENGTH = struct.Struct("<I")
DTYPES = frozenset({"int64", "float32", "float16"})
"""The dtypes that cross: requests' ids and dense values, and scores."""


class Array(msgspec.Struct, array_like=True, frozen=True):
    dtype: str
    shape: tuple[int, ...]
    data: bytes

    @classmethod
    def of(cls, tensor: torch.Tensor) -> Array:
        values = tensor.detach().cpu().contiguous().numpy()
        return cls(str(values.dtype), tuple(values.shape), values.tobytes())

    def tensor(self) -> torch.Tensor:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} does not cross the wire")
        values = np.frombuffer(self.data, dtype=self.dtype).reshape(self.shape)
        return torch.from_numpy(values.copy())


def arrays(columns: Mapping[str, torch.Tensor]) -> dict[str, Array]:
    return {name: Array.of(t) for name, t in columns.items()}


def tensors(columns: Mapping[str, Array]) -> dict[str, torch.Tensor]:
    return {name: a.tensor() for name, a in columns.items()}


class Load(msgspec.Struct, array_like=True, frozen=True):
    """The engine's admission state when it answered: what a front screens new requests
    with (its own view is the latest answer's)."""

    wait_s: float
    cost_s: float
    inflight: int
    patience_s: float | None
    """How long callers that send no deadline wait, as the engine learned it."""


# ---- front → engine ----


class Score(msgspec.Struct, tag="score", frozen=True):
    """A scoring request: the history whole (``events`` and ``user``), by reference
    (``seq_hash``) or as the events after one (``since`` and ``events``)."""

    id: int
    user_id: str
    candidates: dict[str, Array]
    at: float
    """When the caller stops waiting, on :func:`time.monotonic`'s clock (the host's)."""
    started: float
    share: float | None
    stated: bool
    protocol: str
    events: dict[str, Array] | None = None
    user: dict[str, Array] | None = None
    seq_hash: str | None = None
    since: str | None = None
    field: str = "seq_hash"
    """Where the hash came from (what a 412 names)."""
    hashed: str | None = None
    """A whole history's sequence hash, as the front computed it after checking the input
    (the engine does neither again)."""


class Prefetch(msgspec.Struct, tag="prefetch", frozen=True):
    id: int
    user_id: str
    events: dict[str, Array]
    user: dict[str, Array]


class Invalidate(msgspec.Struct, tag="invalidate", frozen=True):
    id: int
    user_id: str


class Ask(msgspec.Struct, tag="ask", frozen=True):
    """``hello``: what the front serves (:class:`Hello`); ``metrics``: the engine's
    scrape-time metrics as exposition text; ``ttl``: the TTL policy and value in force."""

    id: int
    what: Literal["hello", "metrics", "ttl"]


class Leave(msgspec.Struct, tag="leave", frozen=True):
    """The caller of request ``id`` hung up: its work still queued is dropped."""

    id: int


class Shed(msgspec.Struct, tag="shed", frozen=True):
    """A front refused a request on its headers (counted with the engine's)."""

    reason: str


class Left(msgspec.Struct, tag="left", frozen=True):
    """A caller hung up before its request reached the engine (counted with the engine's)."""


Call = Score | Prefetch | Invalidate | Ask
"""What the engine answers."""
ToEngine = Call | Leave | Shed | Left


# ---- engine → front ----


class Scored(msgspec.Struct, tag="scored", frozen=True):
    id: int
    scores: Array
    logits: Array
    outcome: str
    timings_ms: dict[str, float]
    seq_hash: str | None
    events: int | None
    load: Load


class Answer(msgspec.Struct, tag="answer", frozen=True):
    id: int
    value: Any


class Failed(msgspec.Struct, tag="failed", frozen=True):
    """A request the engine refused or could not serve: the error, rebuilt in the front as
    the same exception (:func:`error`), so every protocol maps it as it always has."""

    id: int
    kind: str
    message: str
    load: Load | None = None
    field: str | None = None
    problem: str | None = None
    reason: str | None = None
    stage: str | None = None
    retry_after_s: int = 1
    seq_hash: str | None = None


FromEngine = Scored | Answer | Failed


class Hello(msgspec.Struct, frozen=True):
    """What a front needs of the loaded model to parse requests and answer probes."""

    model_version: str
    device: str
    features: FeatureSpec
    fingerprint: str
    """The model's cache identity, which every sequence hash starts from."""
    l1_budget_bytes: int


KNOWN_ERRORS = (Overloaded, Abandoned, HistoryRequired, InputError, IncompatibleKVError)
"""What a request may meet in the engine and its caller hears as such (anything else is a
bug, logged there)."""


def failure(call_id: int, exc: BaseException, load: Load | None) -> Failed:
    """``exc`` as a :class:`Failed` (an unexpected one as ``internal``, its type named)."""

    def failed(kind: str, **fields: Any) -> Failed:
        return Failed(call_id, kind, str(exc), load, **fields)

    match exc:
        case Overloaded():
            return failed("overloaded", reason=exc.reason, retry_after_s=exc.retry_after_s)
        case Abandoned():
            return failed("abandoned", reason=exc.reason, stage=exc.stage)
        case HistoryRequired():
            return failed("history", field=exc.field, seq_hash=exc.seq_hash, problem=exc.why)
        case InputError():
            return failed("input", field=exc.field, problem=exc.problem)
        case IncompatibleKVError():
            return failed("incompatible")
        case NonFiniteScores():
            return failed("non_finite")
    return Failed(call_id, "internal", f"{type(exc).__name__}: {exc}", load)


def error(failed: Failed) -> KvrankError:
    """The exception a :class:`Failed` stands for."""
    match failed.kind:
        case "overloaded":
            return Overloaded(failed.reason or "deadline", _why(failed), failed.retry_after_s)
        case "abandoned":
            return Abandoned(failed.reason or "deadline", failed.stage or "admitted", None)
        case "history":
            field, seq_hash = failed.field or "seq_hash", failed.seq_hash or ""
            return HistoryRequired(field, seq_hash, failed.problem)
        case "input":
            return InputError(failed.field or "body", failed.problem or failed.message)
        case "incompatible":
            return IncompatibleKVError(failed.message)
    return EngineError(failed.message)


def _why(failed: Failed) -> str:
    return failed.message.removeprefix("overloaded: ")


class EngineError(KvrankError, RuntimeError):
    """The engine could not serve a request (an unexpected error there, or the engine is
    gone): a 500, the message naming why."""


_encoder = msgspec.msgpack.Encoder()
_to_engine = msgspec.msgpack.Decoder(ToEngine)
_from_engine = msgspec.msgpack.Decoder(FromEngine)


def hello_of(value: Any) -> Hello:
    return msgspec.convert(value, Hello)


def send(writer: asyncio.StreamWriter, message: msgspec.Struct) -> None:
    """Queue ``message`` on ``writer`` (the transport writes it without waiting)."""
    body = _encoder.encode(message)
    writer.write(_LENGTH.pack(len(body)) + body)


async def _frame(reader: asyncio.StreamReader) -> bytes:
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if length > MAX_FRAME:
        raise ValueError(f"a frame of {length} bytes exceeds {MAX_FRAME}")
    return await reader.readexactly(length)


async def to_engine(reader: asyncio.StreamReader) -> ToEngine:
    """The next message a front sent (``IncompleteReadError`` once it has gone)."""
    return _to_engine.decode(await _frame(reader))


async def from_engine(reader: asyncio.StreamReader) -> FromEngine:
    """The next message the engine sent (``IncompleteReadError`` once it has gone)."""
    return _from_engine.decode(await _frame(reader))
