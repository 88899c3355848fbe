"""What crosses between a front and the engine: tensors exactly as sent, every error a
caller may hear rebuilt as the same exception (so every protocol maps it as it always has),
and nothing but the declared messages accepted."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
import torch

from kvrank.engine import wire
from kvrank.errors import (
    Abandoned,
    HistoryRequired,
    IncompatibleKVError,
    InputError,
    NonFiniteScores,
    Overloaded,
)
from kvrank.model.config import TINY
from kvrank.model.onetrans import build


@pytest.mark.parametrize(
    "tensor",
    [
        torch.arange(12, dtype=torch.int64).reshape(3, 4),
        torch.randn(5, 3, generator=torch.Generator().manual_seed(0)),
        torch.tensor([2**62, 0, 7], dtype=torch.int64),
        torch.empty(0, 4),
    ],
)
def test_a_tensor_crosses_bit_for_bit(tensor: torch.Tensor) -> None:
    crossed = wire.Array.of(tensor).tensor()
    assert crossed.dtype == tensor.dtype and torch.equal(crossed, tensor)


def test_a_dtype_a_request_never_has_is_refused() -> None:
    with pytest.raises(ValueError, match="does not cross"):
        wire.Array("object", (1,), b"\0" * 8).tensor()


@pytest.mark.parametrize(
    "error",
    [
        Overloaded("deadline", "an estimated 900 ms wait exceed 0.25 of 1000 ms", 3),
        Abandoned("disconnected", "encode", object()),
        HistoryRequired("If-Match", "ab" * 16, "the entry under 'x' does not extend"),
        HistoryRequired("seq_hash", "cd" * 16),
        InputError("events.item_ids", "must have at most 32 events"),
        IncompatibleKVError("made by model v0"),
        NonFiniteScores("v1"),
    ],
)
def test_an_error_is_heard_in_the_front_as_raised_in_the_engine(error: Exception) -> None:
    failed = roundtrip(wire.failure(7, error, wire.Load(0.1, 0.01, 3, None)))
    assert isinstance(failed, wire.Failed) and failed.id == 7
    rebuilt = wire.error(failed)
    assert str(rebuilt) == str(error)
    if isinstance(error, NonFiniteScores):
        assert isinstance(rebuilt, wire.EngineError)  # a 500, as it is in one process
        return
    assert type(rebuilt) is type(error)
    for attr in ("reason", "retry_after_s", "stage", "field", "problem", "seq_hash"):
        assert getattr(rebuilt, attr, None) == getattr(error, attr, None), attr


def test_an_unexpected_error_names_its_type() -> None:
    rebuilt = wire.error(roundtrip(wire.failure(1, KeyError("k"), None)))
    assert isinstance(rebuilt, wire.EngineError) and "KeyError" in str(rebuilt)


def roundtrip(message: msgspec.Struct) -> wire.FromEngine:
    return msgspec.msgpack.Decoder(wire.FromEngine).decode(msgspec.msgpack.encode(message))


def test_the_hello_carries_the_models_features_whole() -> None:
    model = build(TINY.model_dump(), "v1")
    hello = wire.Hello("v1", "cpu", model.features, model.fingerprint(), 2**20)
    back = wire.hello_of(msgspec.msgpack.decode(msgspec.msgpack.encode(hello)))
    assert back == hello and back.features == model.features


def test_frames_cross_a_stream_and_a_stranger_is_refused() -> None:
    async def scenario() -> None:
        reader = asyncio.StreamReader()
        sent = wire.Ask(3, "hello")
        reader.feed_data(frame(msgspec.msgpack.encode(sent)))
        assert await wire.to_engine(reader) == sent
        reader.feed_data(frame(msgspec.msgpack.encode({"type": "exec", "code": "rm -rf /"})))
        with pytest.raises(msgspec.ValidationError):
            await wire.to_engine(reader)
        reader.feed_data((wire.MAX_FRAME + 1).to_bytes(4, "little"))
        with pytest.raises(ValueError, match="exceeds"):
            await wire.to_engine(reader)

    asyncio.run(scenario())


def frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "little") + body
