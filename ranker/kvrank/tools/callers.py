"""How a load generator sends a scoring request by each protocol a ranker speaks.

A request's bodies are encoded before the clock starts (:func:`encode`); a :class:`Caller`
then sends them and reads what every answer says: its status, cache outcome and ETag.

- ``json``: ``/v1/score`` with the whole history;
- ``json-ref``: the same, but by reference (``If-Match`` with the ETag its last answer
  named, candidates only) when the user's history is the one it sent last — whole otherwise
  and again whole after a 412, as a caller that remembers its users' last ETag does;
- ``v2-http``: the Open Inference Protocol's ``infer`` with binary tensors (what
  ``tritonclient.http`` sends by default);
- ``v2-grpc``: its ``ModelInfer`` with raw contents (what ``tritonclient.grpc`` sends), on
  the rankers' gRPC ports.

A gRPC refusal is recorded under the HTTP status its code stands for
(:data:`kvrank.server.oip_grpc.HTTP_EQUIVALENT`), so every protocol's summary reads alike.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import aiohttp
import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb

from kvrank.admission import TIMEOUT_HEADER
from kvrank.metrics import INFER_METHOD
from kvrank.model.contract import FeatureSpec
from kvrank.server.oip import HEADER_LENGTH, pack_strings, tensors
from kvrank.server.oip_grpc import HTTP_EQUIVALENT
from kvrank_common import MAX_TIMEOUT_MS

PROTOCOLS = ("json", "json-ref", "v2-http", "v2-grpc")
GRPC_PROTOCOLS = ("v2-grpc",)
"""Protocols sent to the rankers' gRPC ports (``host:port``) rather than their URLs."""
WAIT_S = MAX_TIMEOUT_MS / 1e3
"""How long a caller waits for an answer; it tells the server so (``x-kvrank-timeout-ms``,
or the gRPC deadline), or a pod would shed by its default deadline requests this caller
still waits for — on a loaded machine, errors the workload did not cause."""
JSON_HEADERS = {"content-type": "application/json", TIMEOUT_HEADER: str(MAX_TIMEOUT_MS)}
MODEL_NAME = "ranker"
"""The name ``kvrank serve`` serves its model under by default (``/v2/models/ranker``)."""


@dataclass(frozen=True)
class Encoded:
    """A request's bodies by one protocol, encoded before the clock starts."""

    whole: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    """Headers the whole body needs beyond the caller's own (the binary header length)."""
    by_reference: bytes = b""
    history: bytes = b""
    """``json-ref``: a digest of everything but the candidates (has the history changed)."""


def encode(body: dict[str, Any], protocol: str, spec: FeatureSpec | None = None) -> Encoded:
    """``body`` (a ``/v1/score`` body) as ``protocol`` sends it; v2 needs the model's
    features (``spec``) to name its tensors."""
    if protocol in ("json", "json-ref"):
        whole = json.dumps(body).encode()
        if protocol == "json":
            return Encoded(whole)
        rest = {k: v for k, v in body.items() if k != "candidates"}
        ref = {"user_id": body.get("user_id"), "candidates": body.get("candidates")}
        digest = hashlib.blake2b(json.dumps(rest).encode(), digest_size=16).digest()
        return Encoded(whole, by_reference=json.dumps(ref).encode(), history=digest)
    if spec is None:
        raise ValueError(f"{protocol} needs the model's features to name its tensors")
    arrays = tensors(spec, body)
    if protocol == "v2-grpc":
        return Encoded(grpc_request(arrays))
    if protocol == "v2-http":
        whole, headers = http_request(arrays)
        return Encoded(whole, headers)
    raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, not {protocol!r}")


def http_request(
    arrays: list[tuple[str, str, np.ndarray]], outputs: tuple[str, ...] = ("scores",)
) -> tuple[bytes, dict[str, str]]:
    """A v2 HTTP body of the ``(name, datatype, values)`` tensors as binary data, asking
    for ``outputs`` as binary data too, and the header that says where its JSON ends."""
    inputs, blobs = [], []
    for name, kind, array in arrays:
        blob = raw_contents(kind, array)
        params = {"binary_data_size": len(blob)}
        inputs.append(
            {"name": name, "datatype": kind, "shape": list(array.shape), "parameters": params}
        )
        blobs.append(blob)
    wanted = [{"name": n, "parameters": {"binary_data": True}} for n in outputs]
    head = json.dumps({"inputs": inputs, "outputs": wanted}).encode()
    return head + b"".join(blobs), {HEADER_LENGTH: str(len(head))}


def grpc_request(arrays: list[tuple[str, str, np.ndarray]], model: str = MODEL_NAME) -> bytes:
    """A ``ModelInferRequest`` of the ``(name, datatype, values)`` tensors with raw
    contents, serialized: what ``tritonclient.grpc`` sends (to ``model``)."""
    request = pb.ModelInferRequest(model_name=model)
    for name, kind, array in arrays:
        request.inputs.add(name=name, datatype=kind, shape=list(array.shape))
        request.raw_input_contents.append(raw_contents(kind, array))
    return bytes(request.SerializeToString())


def raw_contents(kind: str, array: np.ndarray) -> bytes:
    """A tensor's values as v2 binary data carries them (little-endian; BYTES
    length-prefixed)."""
    if kind == "BYTES":
        return pack_strings(array.ravel())
    return np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()


Answer = tuple[int, str, str | None]
"""What an answer says: its (HTTP) status, cache outcome (``error`` unless 200) and ETag."""


class Caller:
    """Sends encoded requests by one protocol; an async context manager that holds its
    connections (at most ``concurrency`` at once). Each call waits up to :data:`WAIT_S`
    and says so (``send_deadline``), or waits as long without saying it, as a caller that
    sends no deadline does (the pod's default deadline then applies)."""

    def __init__(self, protocol: str, concurrency: int, send_deadline: bool = True) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, not {protocol!r}")
        self.protocol, self.send_deadline = protocol, send_deadline
        self._headers = {
            k: v for k, v in JSON_HEADERS.items() if send_deadline or k != TIMEOUT_HEADER
        }
        # aiohttp, not httpx: its own cost is ~0.2 ms a request where httpx's is ~2 ms on a
        # small CPU — time the load generator would add to every latency. Idle connections
        # close before uvicorn's 5 s keep-alive does: a request sent on a connection the
        # server is closing fails without reaching it.
        connector = aiohttp.TCPConnector(limit=concurrency, keepalive_timeout=4.0)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=WAIT_S)
        )
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def __aenter__(self) -> Caller:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._session.close()
        for channel in self._channels.values():
            await channel.close()

    async def send(self, target: str, payload: bytes, headers: Mapping[str, str]) -> Answer:
        """One scoring call to ``target`` (a URL, or ``host:port`` for gRPC)."""
        if self.protocol in GRPC_PROTOCOLS:
            return await self._infer_grpc(target, payload, headers)
        if self.protocol == "v2-http":
            url = f"{target}/v2/models/{MODEL_NAME}/infer"
            sent = {**self._headers, "content-type": "application/octet-stream", **headers}
        else:
            url, sent = f"{target}/v1/score", {**self._headers, **headers}
        async with self._session.post(url, data=payload, headers=sent) as resp:
            body = await resp.read()
        if resp.status != 200:
            return resp.status, "error", None
        outcome = _outcome(body, resp.headers.get(HEADER_LENGTH))
        return resp.status, outcome, resp.headers.get("etag")

    async def _infer_grpc(self, target: str, payload: bytes, headers: Mapping[str, str]) -> Answer:
        channel = self._channels.get(target)
        if channel is None:
            channel = self._channels[target] = grpc.aio.insecure_channel(target)
        infer = channel.unary_unary(INFER_METHOD)  # bytes in, bytes out: encoded beforehand
        metadata = tuple((k.lower(), v) for k, v in headers.items())
        try:
            if self.send_deadline:  # the gRPC deadline is the caller's deadline
                raw = await infer(payload, timeout=WAIT_S, metadata=metadata)
            else:
                raw = await asyncio.wait_for(infer(payload, metadata=metadata), WAIT_S)
        except grpc.aio.AioRpcError as exc:
            return HTTP_EQUIVALENT.get(exc.code(), 500), "error", None
        answer = pb.ModelInferResponse.FromString(raw)
        return 200, answer.parameters["cache"].string_param or "error", None


def _outcome(body: bytes, header_length: str | None) -> str:
    """The cache outcome an answer names: ``/v1/score``'s ``cache`` field, or a v2 answer's
    ``parameters.cache`` (its JSON header first when the scores came binary)."""
    head = body[: int(header_length)] if header_length else body
    doc = json.loads(head)
    cache = doc.get("cache", doc.get("parameters", {}).get("cache"))
    return cache if isinstance(cache, str) else "error"
