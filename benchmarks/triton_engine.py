"""kvrank's scoring engine as a Triton Python-backend model, for the front benchmark.

Triton's front (its C++ HTTP/gRPC servers) and dynamic batcher hand the model a list of
requests; each is scored by the same :class:`~kvrank.service.RankingService` that ``kvrank
serve`` runs — L1, admission, and continuous batching: the list's requests, and those still
queued when a pass starts, share the model's passes. The service's event loop runs in a
thread of the backend's stub process; ``execute`` reads the tensors in the stub's thread and
waits for the scores.

The inputs are those ``kvrank serve`` takes over v2 (:func:`kvrank.server.oip.input_metadata`),
each with the leading batch dimension of 1 that a batching Triton model needs, and the user
id as UINT8 bytes: this Triton build's Python backend reads BYTES tensors (and writes numpy
outputs) through numpy 1.x's ABI, which numpy 2 breaks, so every tensor crosses through
DLPack. The outputs: ``scores`` (FP32) and ``cache`` (the outcome's name as UINT8 bytes:
the backend's responses carry no parameters).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch
from torch.utils import dlpack

from kvrank.server.config import ServerConfig
from kvrank.server.oip import USER_ID, InferRequest, input_metadata, model_inputs
from kvrank.server.wiring import build_service
from kvrank.service import ModelInputs

OUTCOME = "cache"
"""The output naming each answer's cache outcome (``l1``, ``miss``, …)."""


def triton_inputs(spec_inputs: list[dict[str, Any]]) -> list[tuple[str, str, list[int]]]:
    """``(name, Triton data type, dims)`` of each required input (without the batch
    dimension), from the v2 metadata ``kvrank serve`` publishes."""
    kinds = {"INT64": "TYPE_INT64", "FP32": "TYPE_FP32", "BYTES": "TYPE_UINT8"}
    out = []
    for tensor in spec_inputs:
        if tensor.get("optional"):
            continue
        dims = [-1] if tensor["datatype"] == "BYTES" else tensor["shape"]
        out.append((tensor["name"], kinds[tensor["datatype"]], dims))
    return out


class Engine:
    """A ranking service of ``settings`` (``ServerConfig`` fields) behind Triton's batcher."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.service = build_service(ServerConfig.model_validate(settings))
        asyncio.run_coroutine_threadsafe(self.service.warm_up(), self.loop).result()
        self.names = [n for n, _, _ in triton_inputs(input_metadata(self.service.features))]

    def execute(self, pb: Any, requests: list[Any]) -> list[Any]:
        """One response per request, in order (an input error answers its request only)."""
        pending: list[Future[Any] | Exception] = []
        for request in requests:
            try:
                inputs = self._inputs(pb, request)
            except Exception as exc:  # the request's answer, below
                pending.append(exc)
                continue
            work = self.service.score(inputs, None, "v2-http")
            pending.append(asyncio.run_coroutine_threadsafe(work, self.loop))
        return [self._response(pb, item) for item in pending]

    def _inputs(self, pb: Any, request: Any) -> ModelInputs:
        values: dict[str, np.ndarray | list[bytes]] = {}
        for name in self.names:
            tensor = pb.get_input_tensor_by_name(request, name)
            if tensor is not None:  # missing: model_inputs names it
                values[name] = dlpack.from_dlpack(tensor.to_dlpack()).numpy()[0]
        user = values.pop(USER_ID, None)
        if user is not None:
            values[USER_ID] = [bytes(np.asarray(user, dtype=np.uint8))]
        return model_inputs(InferRequest({}, values), self.service.features, None)

    def _response(self, pb: Any, item: Future[Any] | Exception) -> Any:
        try:
            if isinstance(item, Exception):
                raise item
            result = item.result()
        except Exception as exc:  # Triton's error answer for this request
            return pb.InferenceResponse(error=pb.TritonError(f"{type(exc).__name__}: {exc}"))
        scores = result.scores.detach().to(torch.float32).reshape(1, -1).contiguous()
        outcome = torch.tensor(list(result.outcome.value.encode()), dtype=torch.uint8)
        to_dlpack = dlpack.to_dlpack  # type: ignore[attr-defined]
        return pb.InferenceResponse(
            [
                pb.Tensor.from_dlpack("scores", to_dlpack(scores)),
                pb.Tensor.from_dlpack(OUTCOME, to_dlpack(outcome.reshape(1, -1))),
            ]
        )

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.service.close(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
