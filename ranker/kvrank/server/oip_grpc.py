"""The Open Inference Protocol (v2) over gRPC: the standard
``inference.GRPCInferenceService`` (``ServerLive``, ``ServerReady``, ``ModelReady``,
``ServerMetadata``, ``ModelMetadata``, ``ModelInfer``) on ``grpc_port``, in the serving
process's event loop, beside the HTTP routes.

The messages are the protocol's own, as the Triton client library generates them
(``tritonclient.grpc.service_pb2``), so ``tritonclient.grpc`` and any KServe v2 client call
kvrank unchanged. A ``ModelInfer`` is the HTTP ``infer`` in other clothes: its tensors
(``raw_input_contents``, or typed ``contents``) become the same request
(:func:`kvrank.server.oip.from_parts`), with the same inputs, checks, admission, cache,
history by reference (the ``seq_hash`` input) and answer parameters. The caller's gRPC
deadline is the request's deadline; a caller that cancels costs no model work still queued.
Errors are status codes, the message naming the input as the HTTP answer does:

- a bad input, or the routing header (metadata) naming another user → ``INVALID_ARGUMENT``;
- a history by reference that no tier holds → ``FAILED_PRECONDITION`` (``history_required``);
- shed by admission control → ``RESOURCE_EXHAUSTED``; dropped past its deadline →
  ``DEADLINE_EXCEEDED``; another model or version → ``NOT_FOUND``; not loaded →
  ``UNAVAILABLE``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from kvrank import __version__
from kvrank.admission import Deadline
from kvrank.errors import (
    Abandoned,
    HistoryRequired,
    IncompatibleKVError,
    InputError,
    NonFiniteScores,
    Overloaded,
)
from kvrank.metrics import INFER_METHOD
from kvrank.server import oip
from kvrank.server.edge import AccessRecord, access_line
from kvrank.server.routes import check_routing_key, model_refusal
from kvrank.server.state import AppState
from kvrank.service import ScoreResult, Service
from kvrank_common import MAX_TIMEOUT_MS

_CONTENTS = {"INT64": "int64_contents", "FP32": "fp32_contents"}
HTTP_EQUIVALENT = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.FAILED_PRECONDITION: 412,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 503,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.INTERNAL: 500,
}
"""The status an access line and ``kvrank_http_responses`` record for a gRPC status."""
_GRPC_STATUS = {404: grpc.StatusCode.NOT_FOUND, 503: grpc.StatusCode.UNAVAILABLE}
"""The gRPC status of a model refusal's HTTP status."""


class Refused(Exception):
    """An RPC answered with ``code`` and ``message``."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """The v2 gRPC service of one serving process."""

    def __init__(self, state: AppState) -> None:
        self.state = state

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.state.ready)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return pb.ServerMetadataResponse(
            name="kvrank", version=__version__, extensions=["binary_tensor_data"]
        )

    async def ModelReady(self, request: Any, context: Any) -> Any:
        ready = self.state.ready and self._refusal(request.name, request.version) is None
        return pb.ModelReadyResponse(ready=ready)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        refusal = self._refusal(request.name, request.version)
        if refusal is not None:
            await context.abort(refusal.code, str(refusal))
        svc = self.state.started
        return pb.ModelMetadataResponse(
            name=request.name,
            versions=[svc.model.version],
            platform="kvrank",
            inputs=[_tensor_metadata(t) for t in oip.input_metadata(svc.features)],
            outputs=[_tensor_metadata(t) for t in oip.OUTPUTS],
        )

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        started = time.perf_counter()
        request_id = request.id or uuid.uuid4().hex
        access = AccessRecord()
        code = grpc.StatusCode.OK
        try:
            return await self._infer(request, context, access)
        except Refused as exc:
            code = exc.code
            await context.abort(exc.code, str(exc))
        finally:
            if context.cancelled() and code is grpc.StatusCode.OK:
                code = grpc.StatusCode.CANCELLED
            status = HTTP_EQUIVALENT.get(code, 500)
            if self.state.service is not None:
                self.state.service.metrics.observe_response(INFER_METHOD, status)
            shed = code is grpc.StatusCode.RESOURCE_EXHAUSTED
            access_line(request_id, status, started, access, shed, route=INFER_METHOD)

    async def _infer(self, request: Any, context: Any, access: AccessRecord) -> Any:
        refusal = self._refusal(request.model_name, request.model_version)
        if refusal is not None:
            raise refusal
        svc = self.state.started
        try:
            deadline = self._deadline(svc, context)
            req = oip.from_parts(*_parts(request))
            inputs = oip.model_inputs(req, svc.features, None)
            self._routed(context, inputs.user_id)
            access.user = self.state.user_hash(inputs.user_id)
            access.model_version = svc.model.version
            result = await svc.score(inputs, deadline, "v2-grpc")
        except InputError as exc:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        except HistoryRequired as exc:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from None
        except Overloaded as exc:
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)) from None
        except Abandoned as exc:
            left = exc.reason == "disconnected"
            code = grpc.StatusCode.CANCELLED if left else grpc.StatusCode.DEADLINE_EXCEEDED
            raise Refused(code, str(exc)) from None
        except IncompatibleKVError as exc:
            raise Refused(grpc.StatusCode.ABORTED, str(exc)) from None
        except NonFiniteScores as exc:
            raise Refused(grpc.StatusCode.INTERNAL, str(exc)) from None
        access.cache, access.candidates = result.outcome.value, len(result.scores)
        return _answer(request, svc, result)

    def _refusal(self, name: str, version: str) -> Refused | None:
        """Why this pod does not serve model ``name`` at ``version`` (``None``: it does)."""
        refusal = model_refusal(self.state, name, version or None)
        if refusal is None:
            return None
        status, message = refusal
        return Refused(_GRPC_STATUS[status], message)

    def _deadline(self, svc: Service, context: Any) -> Deadline:
        """The caller's gRPC deadline (else the configured default), admitted on what is
        known so far; a caller that cancels marks it, so its queued work is dropped."""
        left = context.time_remaining()
        timeout_ms = None if left is None else min(max(int(left * 1e3), 1), MAX_TIMEOUT_MS)
        deadline = svc.deadline(timeout_ms)
        svc.admission.screen(deadline)

        def left_us(_: Any) -> None:
            if context.cancelled():
                svc.admission.caller_left(deadline)

        context.add_done_callback(left_us)
        return deadline

    def _routed(self, context: Any, user_id: str) -> None:
        """The routing header, when the caller's metadata carries it, names the same user."""
        header = self.state.cfg.routing_header
        metadata = dict(context.invocation_metadata() or ())
        check_routing_key(header, metadata.get(header.lower()), user_id, "the user_id input")


def _parts(request: Any) -> tuple[dict[str, Any], memoryview]:
    """The HTTP form of a ``ModelInferRequest``: its JSON header and binary data. Raw
    contents (what ``tritonclient`` sends) stay bytes; typed contents become ``data``
    (BYTES ones length-prefixed binary, as over HTTP)."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise InputError(
            "raw_input_contents", f"has {len(raw)} entries for {len(request.inputs)} inputs"
        )
    inputs: list[dict[str, Any]] = []
    binary: list[bytes] = []
    for i, tensor in enumerate(request.inputs):
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        if raw:
            chunk = raw[i]
        elif tensor.datatype == "BYTES":
            chunk = oip.pack_strings(tensor.contents.bytes_contents)
        else:
            field = _CONTENTS.get(tensor.datatype)
            entry["data"] = list(getattr(tensor.contents, field)) if field else None
            inputs.append(entry)
            continue
        entry["parameters"] = {"binary_data_size": len(chunk)}
        binary.append(chunk)
        inputs.append(entry)
    return {"inputs": inputs}, memoryview(b"".join(binary))


def _answer(request: Any, svc: Service, result: ScoreResult) -> Any:
    scores = np.ascontiguousarray(result.scores.cpu().numpy(), dtype="<f4")
    params = {"cache": pb.InferParameter(string_param=result.outcome.value)}
    if result.seq_hash:
        params["seq_hash"] = pb.InferParameter(string_param=result.seq_hash)
    if result.events is not None:
        params["events"] = pb.InferParameter(int64_param=result.events)
    output = pb.ModelInferResponse.InferOutputTensor(
        name=oip.OUTPUT, datatype="FP32", shape=[len(scores)]
    )
    return pb.ModelInferResponse(
        model_name=request.model_name,
        model_version=svc.model.version,
        id=request.id,
        parameters=params,
        outputs=[output],
        raw_output_contents=[scores.tobytes()],
    )


def request_message(request: dict[str, Any], model_name: str = "ranker") -> Any:
    """A v2 JSON inference request (``{"inputs": [...]}``, values as ``data``) as the gRPC
    ``ModelInferRequest`` with typed contents, as any v2 client can send it."""
    message = pb.ModelInferRequest(model_name=model_name)
    for tensor in request["inputs"]:
        kind, data = tensor["datatype"], tensor["data"]
        field = _CONTENTS.get(kind, "bytes_contents")
        values = [v.encode() for v in data] if kind == "BYTES" else data
        message.inputs.add(
            name=tensor["name"],
            datatype=kind,
            shape=tensor["shape"],
            contents=pb.InferTensorContents(**{field: values}),
        )
    return message


def _tensor_metadata(tensor: dict[str, Any]) -> Any:
    return pb.ModelMetadataResponse.TensorMetadata(
        name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"]
    )


async def start(state: AppState, host: str, port: int) -> grpc.aio.Server:
    """The gRPC server on ``host:port``, started."""
    server = grpc.aio.server()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceService(state), server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise OSError(f"gRPC could not listen on {host}:{port}")
    await server.start()
    return server
