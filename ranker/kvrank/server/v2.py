"""The Open Inference Protocol (v2) routes on the scoring port: health, server and model
metadata, and ``infer`` with JSON or binary tensors (:mod:`kvrank.server.oip`).

An inference request is a scoring request in other clothes: the same admission and deadline
(``x-kvrank-timeout-ms``), the same routing-header rule, the same checks of every input
(an error names the input), the same cache and the history by reference (the ``seq_hash``
input, or ``If-Match``: 412 ``history_required`` when no tier holds it). The answer's
``parameters`` carry the cache outcome, the ``seq_hash`` (also the ``ETag``) and the number
of events, as ``/v1/score``'s body does. The model is served under ``model_name`` at its
artifact's version; another name or version is a 404.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from kvrank import __version__
from kvrank.errors import InputError
from kvrank.metrics import INFER_ROUTES
from kvrank.server import oip
from kvrank.server.edge import PlainRoute, error_body
from kvrank.server.routes import caller_watched, model_refusal, routed_user, screen
from kvrank.server.schemas import IF_MATCH, etag, if_match
from kvrank.server.state import AppState, app_state

PREFIX = "/v2"
router = APIRouter(prefix=PREFIX)
inference = APIRouter(prefix=PREFIX, route_class=PlainRoute)
"""``infer``: an endpoint that takes the request alone (its path's name and version read from
it), which the edge calls directly, as it does ``/v1/score``."""


State = Annotated[AppState, Depends(app_state)]


@router.get("")
async def server_metadata() -> dict[str, Any]:
    return {"name": "kvrank", "version": __version__, "extensions": ["binary_tensor_data"]}


@router.get("/health/live")
async def live() -> Response:
    return Response(status_code=200)


@router.get("/health/ready")
async def ready(state: State) -> Response:
    return Response(status_code=200 if state.ready else 503)


def _unknown(state: AppState, name: str, version: str | None) -> JSONResponse | None:
    """The answer for a model this pod does not serve (``None``: it does)."""
    refusal = model_refusal(state, name, version)
    return None if refusal is None else JSONResponse({"error": refusal[1]}, refusal[0])


@router.get("/models/{name}")
@router.get("/models/{name}/versions/{version}")
async def model_metadata(state: State, name: str, version: str | None = None) -> Response:
    refusal = _unknown(state, name, version)
    if refusal is not None:
        return refusal
    svc = state.started
    doc = {
        "name": name,
        "versions": [svc.model.version],
        "platform": "kvrank",
        "inputs": oip.input_metadata(svc.features),
        "outputs": oip.OUTPUTS,
    }
    return JSONResponse(doc)


@router.get("/models/{name}/ready")
@router.get("/models/{name}/versions/{version}/ready")
async def model_ready(state: State, name: str, version: str | None = None) -> Response:
    return _unknown(state, name, version) or Response(status_code=200)


@inference.post(INFER_ROUTES[0].removeprefix(PREFIX))
@inference.post(INFER_ROUTES[1].removeprefix(PREFIX))
async def infer(request: Request) -> Response:
    state: AppState = request.app.state.kvrank
    name: str = request.path_params["name"]
    version: str | None = request.path_params.get("version")
    refusal = _unknown(state, name, version)
    if refusal is not None:
        return refusal
    deadline = screen(state, dict(request.scope["headers"]))
    svc = state.started
    try:
        req = oip.decode(await request.body(), request.headers.get(oip.HEADER_LENGTH))
        inputs = oip.model_inputs(req, svc.features, if_match(request.headers.get(IF_MATCH)))
        access = routed_user(request, state, inputs.user_id, "the user_id input")
        async with caller_watched(request, svc, deadline):
            result = await svc.score(inputs, deadline, "v2-http")
    except InputError as exc:
        # the protocol's error answer: 400, the message naming the input (what clients show);
        # the service checks every input, as it does a /v1/score body's
        body = error_body(str(exc), request.state.request_id, exc.field)
        return JSONResponse(body, status_code=400)
    access.cache, access.candidates = result.outcome.value, len(result.scores)
    answer = {
        "model_name": name,
        "model_version": svc.model.version,
        "id": req.header.get("id", request.state.request_id),
        "parameters": {
            "cache": result.outcome.value,
            "seq_hash": result.seq_hash,
            "events": result.events,
        },
    }
    content, head = oip.encode_answer(answer, result.scores.cpu().numpy(), req.binary_output)
    headers = {"ETag": etag(result.seq_hash)} if result.seq_hash else {}
    if head is not None:
        headers[oip.HEADER_LENGTH] = str(head)
        return Response(content, media_type="application/octet-stream", headers=headers)
    return Response(content, media_type="application/json", headers=headers)
