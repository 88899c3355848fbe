"""The HTTP routes: ``/v1/score``, health, readiness, metrics and the admin endpoints.

Thin: parse the body with the loaded model's schema, call the service, answer. What the
access line records of a scoring request goes into one typed
:class:`~kvrank.server.edge.AccessRecord`; errors are raised, never answered here
(:mod:`kvrank.server.errors` maps them).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from kvrank.metrics import SCORE_ROUTE
from kvrank.server.edge import AccessRecord
from kvrank.server.schemas import InvalidateResponse, ScoreResponse, to_inputs
from kvrank.server.shadow import SHADOW_HEADER
from kvrank.server.state import AppState, app_state

router = APIRouter()
State = Annotated[AppState, Depends(app_state)]


@router.post(SCORE_ROUTE, response_model=ScoreResponse)
async def score(request: Request, state: State) -> Response:
    # the body's schema is the loaded model's (see kvrank.server.openapi): parsed here, once
    svc = state.started
    raw = await request.body()
    try:
        body = state.request_model.model_validate_json(raw)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from exc
    user_id: str = body.user_id  # type: ignore[attr-defined]
    access = AccessRecord(user=state.user_hash(user_id), model_version=svc.model.version)
    request.state.access = access
    user, cands = to_inputs(body, svc.features)
    result = await svc.score(user_id, user, cands)
    access.cache, access.candidates = result.outcome.value, len(result.scores)
    scores = result.scores.tolist()
    if state.shadow is not None and SHADOW_HEADER not in request.headers:
        # queued, sent by the mirror's own task: the body as received, nothing serialized again
        state.shadow.offer(raw, scores)
    answer = ScoreResponse(
        request_id=request.state.request_id,
        model_version=svc.model.version,
        scores=scores,
        cache=result.outcome.value,
        timings_ms=result.timings_ms,
    )
    # serialized here, in pydantic's core: FastAPI would validate the model again
    return Response(answer.model_dump_json(), media_type="application/json")


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(state: State) -> JSONResponse:
    if not state.ready:
        return JSONResponse({"status": "starting"}, status_code=503)
    model = state.started.model
    return JSONResponse(
        {"status": "ready", "model_version": model.version, "device": str(model.device)}
    )


@router.get("/metrics")
async def metrics(state: State) -> Response:
    registry = state.started.metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


@router.post("/admin/invalidate/{user_id}", response_model=InvalidateResponse)
async def invalidate(user_id: str, state: State) -> InvalidateResponse:
    removed = await state.started.invalidate_user(user_id)
    return InvalidateResponse(user_id=user_id, removed=removed)


@router.get("/admin/config")
async def effective_config(state: State) -> dict[str, Any]:
    svc = state.started
    doc = state.cfg.model_dump(mode="json")
    doc["effective_ttl_seconds"] = svc.current_ttl()
    doc["ttl"] = svc.ttl_settings.model_dump(mode="json")
    doc["shadow"] = state.shadow_in_force().model_dump(mode="json")
    return doc
