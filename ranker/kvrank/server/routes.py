"""The HTTP routes: ``/v1/score``, ``/v1/prefetch``, health, readiness, metrics and admin.

Thin: parse the body with the loaded model's schema, call the service, answer. What the
access line records of a scoring request goes into one typed
:class:`~kvrank.server.edge.AccessRecord`; errors are raised, never answered here
(:mod:`kvrank.server.errors` maps them).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError

from kvrank.admission import TIMEOUT_HEADER, Deadline
from kvrank.errors import HeaderError, RoutingKeyError
from kvrank.metrics import PREFETCH_ROUTE, SCORE_ROUTE
from kvrank.server.edge import AccessRecord, Headers, PlainRoute
from kvrank.server.schemas import (
    IF_MATCH,
    USER_ID_MAX,
    USER_ID_PATTERN,
    InvalidateResponse,
    PrefetchResponse,
    ScoreResponse,
    StrictBody,
    by_reference,
    etag,
    if_match,
    to_candidates,
    to_events_since,
    to_user,
)
from kvrank.server.shadow import SHADOW_HEADER
from kvrank.server.state import AppState, app_state
from kvrank.service import ModelInputs, Service
from kvrank_common import MAX_TIMEOUT_MS

router = APIRouter()
State = Annotated[AppState, Depends(app_state)]


scoring = APIRouter(route_class=PlainRoute)
"""``/v1/score`` and ``/v1/prefetch``: endpoints that take the request alone."""


def _parse(model: type[BaseModel], strict: StrictBody | None, raw: bytes) -> Any:
    """The body, by the loaded model's schema (see kvrank.server.openapi): the strict
    decoder takes it when it can, the pydantic model otherwise (it accepts what only its lax
    mode does, or names the field and the limit)."""
    body = strict.decode(raw) if strict is not None else None
    if body is not None:
        return body
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from exc


def check_routing_key(header: str, routed: str | None, user_id: str, sent_as: str) -> None:
    """The routing header ``header``, when sent (``routed``), names the request's user
    (``sent_as``: where the request names it)."""
    if routed is not None and routed != user_id:
        raise RoutingKeyError(header, f"must equal {sent_as} (the key a proxy routes by)")


def routed_user(request: Request, state: AppState, user_id: str, sent_as: str) -> AccessRecord:
    """The request's access record, once the routing header (when sent) names the same
    user as the request (``sent_as``: where the request names it)."""
    header = state.cfg.routing_header
    check_routing_key(header, request.headers.get(header), user_id, sent_as)
    access = AccessRecord(user=state.user_hash(user_id), model_version=state.started.model.version)
    request.state.access = access
    return access


def model_refusal(state: AppState, name: str, version: str | None) -> tuple[int, str] | None:
    """Why this pod does not serve model ``name`` at ``version`` — the HTTP status and the
    message an inference protocol answers with (``None``: it does)."""
    if not state.ready:
        return 503, "the model is not loaded yet"
    served = state.started.model.version
    if name != state.cfg.model_name or version not in (None, served):
        wanted = name if version is None else f"{name} version {version}"
        return 404, f"no model {wanted}: this pod serves {state.cfg.model_name} version {served}"
    return None


def _user_of(request: Request, state: State, body: Any) -> tuple[str, AccessRecord]:
    """The body's user id and the request's access record."""
    user_id: str = body.user_id
    return user_id, routed_user(request, state, user_id, "the body's user_id")


_TIMEOUT_KEY = TIMEOUT_HEADER.encode()


def _timeout_ms(headers: Headers) -> int | None:
    """The caller's deadline (``x-kvrank-timeout-ms``), 1 to 60,000 ms. Envoy's
    ``x-envoy-expected-rq-timeout-ms`` is not one: it is the router's own route timeout,
    set on every request it forwards."""
    raw = headers.get(_TIMEOUT_KEY)
    if raw is None:
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_TIMEOUT_MS:
        raise HeaderError(
            TIMEOUT_HEADER, f"must be a whole number of ms from 1 to {MAX_TIMEOUT_MS}"
        )
    return int(raw)


def screen(state: AppState, headers: Headers) -> Deadline | None:
    """A scoring request's deadline, counted from now (its body is part of its wait), once
    admission has let it through on what it is known by then (the edge runs this before
    routing: :data:`kvrank.server.edge.Screen`). ``None`` before the service is built: the
    route says why."""
    if state.service is None:
        return None
    deadline = state.service.deadline(_timeout_ms(headers))
    state.service.admission.screen(deadline)
    return deadline


@contextlib.asynccontextmanager
async def caller_watched(
    request: Request, svc: Service, deadline: Deadline | None
) -> AsyncIterator[None]:
    """While the block runs, a caller that disconnects marks the deadline: its work still
    queued is dropped, never computed (the ASGI server says so on ``receive``); it is
    counted (``kvrank_callers_left_total``). ``None``: the service's default deadline, made
    later, which nothing marks."""

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        if deadline is not None:
            svc.admission.caller_left(deadline)

    watcher = asyncio.create_task(watch())
    try:
        yield
    finally:
        watcher.cancel()


@scoring.post(SCORE_ROUTE, response_model=ScoreResponse)
async def score(request: Request) -> Response:
    state: AppState = request.app.state.kvrank
    svc = state.started
    deadline: Deadline = request.state.deadline  # screened by the edge
    raw = await request.body()
    body = _parse(state.request_model, state.request_strict, raw)
    user_id, access = _user_of(request, state, body)
    header = if_match(request.headers.get(IF_MATCH))
    inputs = _inputs(body, user_id, by_reference(body, svc.features, header), header, svc)
    whole = inputs.user is not None
    async with caller_watched(request, svc, deadline):
        result = await svc.score(inputs, deadline, "json")
    access.cache, access.candidates = result.outcome.value, len(result.scores)
    scores = result.scores.tolist()
    if state.shadow is not None and whole and SHADOW_HEADER not in request.headers:
        # queued, sent by the mirror's own task: the body as received, nothing serialized again
        # (a request by reference, or by events since a hash, is not mirrored: the hash
        # names an entry of this version's)
        state.shadow.offer(raw, scores)
    answer = ScoreResponse(
        request_id=request.state.request_id,
        model_version=svc.model.version,
        scores=scores,
        cache=result.outcome.value,
        timings_ms=result.timings_ms,
        seq_hash=result.seq_hash,
        events=result.events,
    )
    # serialized here, in pydantic's core: FastAPI would validate the model again
    tag = {"ETag": etag(result.seq_hash)} if result.seq_hash else None
    return Response(answer.model_dump_json(), media_type="application/json", headers=tag)


def _inputs(
    body: Any, user_id: str, seq_hash: str | None, header: str | None, svc: Service
) -> ModelInputs:
    """A scoring body as the service's inputs, by the form its history came in: whole, by
    reference (``seq_hash``; ``header``: the ``If-Match`` header's, if it came so) or as the
    events since a hash."""
    cands = to_candidates(body, svc.features)
    if body.events_since is not None:
        since, events = to_events_since(body, svc.features)
        return ModelInputs(user_id, None, "events_since.seq_hash", None, cands, since, events)
    if seq_hash is None:
        return ModelInputs(user_id, None, "seq_hash", to_user(body, svc.features), cands)
    field = IF_MATCH if header is not None else "seq_hash"
    return ModelInputs(user_id, seq_hash, field, None, cands)


@scoring.post(PREFETCH_ROUTE, status_code=202, response_model=PrefetchResponse)
async def prefetch(request: Request) -> Response:
    """The user side only: its entry is made behind the 202 (see kvrank.server.prefetch)."""
    state: AppState = request.app.state.kvrank
    svc = state.started
    body = _parse(state.prefetch_model, state.prefetch_strict, await request.body())
    user_id, access = _user_of(request, state, body)
    # bad input is the caller's to hear: offering checks it, a 422 before the 202
    accepted = state.prefetches.offer(svc, user_id, to_user(body, svc.features))
    access.cache = "prefetch" if accepted else "prefetch-dropped"
    answer = PrefetchResponse(
        request_id=request.state.request_id, status="accepted" if accepted else "dropped"
    )
    return Response(answer.model_dump_json(), status_code=202, media_type="application/json")


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(state: State) -> JSONResponse:
    if not state.ready:
        return JSONResponse({"status": "starting"}, status_code=503)
    model = state.started.model
    return JSONResponse(
        {
            "status": "ready",
            "model_version": model.version,
            "device": str(model.device),
            "l1_budget_bytes": state.started.cache.l1_budget_bytes,
        }
    )


@router.get("/metrics")
async def metrics(state: State) -> Response:
    return Response(await state.started.exposition(), media_type=CONTENT_TYPE_LATEST)


UserIdPath = Annotated[
    str, PathParam(min_length=1, max_length=USER_ID_MAX, pattern=USER_ID_PATTERN)
]
"""A user id in a path: the scoring body's rule (a ``*`` would be a pattern, not a user)."""


@router.post("/admin/invalidate/{user_id}", response_model=InvalidateResponse)
async def invalidate(user_id: UserIdPath, state: State) -> InvalidateResponse:
    removed = await state.started.invalidate_user(user_id)
    return InvalidateResponse(user_id=user_id, removed=removed)


@router.get("/admin/config")
async def effective_config(state: State) -> dict[str, Any]:
    svc = state.started
    doc = state.cfg.model_dump(mode="json")
    ttl, effective = await svc.ttl_in_force()
    doc["effective_ttl_seconds"] = effective
    doc["ttl"] = ttl.model_dump(mode="json")
    doc["shadow"] = state.shadow_in_force().model_dump(mode="json")
    return doc
