"""The FastAPI application: ``/v1/score``, health, readiness, metrics and admin endpoints.

Errors are mapped here and in :mod:`kvrank.server.edge`, nowhere else: ``InputError`` and
schema violations → 422 naming the field, ``IncompatibleKVError`` → 409, a streamed body
over the limit → 413 (here); a declared one → 413, anything else → 500 with a request id and
no stack trace (the edge). The app owns the service's lifetime (load the model, warm it
up, then report ready) and watches the config file for TTL changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, Request, Response
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from kvrank.cache import (
    AdaptiveTTL,
    CacheCollector,
    CacheSettings,
    L1Store,
    RedisSettings,
    RedisStore,
    TieredCache,
    TTLSettings,
)
from kvrank.errors import ArtifactError, IncompatibleKVError, InputError, KvrankError
from kvrank.metrics import Metrics
from kvrank.model.artifact import load_ranker, resolve_artifact
from kvrank.model.checks import CheckPlan, check_model
from kvrank.model.device import resolve_device
from kvrank.model.features import example_candidates, example_user
from kvrank.model.golden import load_golden
from kvrank.runner import model_thread
from kvrank.server import logs
from kvrank.server.config import ServerConfig, read_file, redis_password
from kvrank.server.edge import BodyTooLarge, Edge, error_body
from kvrank.server.schemas import InvalidateResponse, ScoreResponse, request_model, to_inputs
from kvrank.server.shadow import SHADOW_HEADER, ShadowConfig, ShadowMirror
from kvrank.service import RankingService, ServiceSettings

log = logging.getLogger("kvrank.server")
CONFIG_POLL_S = 1.0


@dataclass
class AppState:
    cfg: ServerConfig
    service: RankingService | None = None
    ready: bool = False
    config_mtime: float = 0.0
    shadow_config: ShadowConfig | None = None
    """The shadow section in force (reloaded with the file)."""
    shadow: ShadowMirror | None = None
    startup_error: str | None = None
    """Why the model was refused at start (artifact, device or a failed check)."""
    request_model: type[BaseModel] = BaseModel
    """The ``/v1/score`` body of the loaded model (set before ready)."""


def build_service(cfg: ServerConfig) -> RankingService:
    """Everything a server needs; runs on the model thread (see :mod:`kvrank.runner`)."""
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    device = resolve_device(cfg.device)
    local = resolve_artifact(cfg.model_dir, Path(cfg.model_cache_dir), cfg.model_sha256)
    model = load_ranker(local, device)
    if cfg.model_version is not None and model.version != cfg.model_version:
        raise ArtifactError(
            f"the artifact at {cfg.model_dir} is model version {model.version!r},"
            f" expected model_version={cfg.model_version!r}"
        )
    if cfg.kv_dtype is not None and cfg.kv_dtype not in model.kv_dtypes:
        raise ArtifactError(
            f"kv_dtype={cfg.kv_dtype!r}: this model offers {sorted(model.kv_dtypes)} only"
        )
    log.info("model %s loaded on %s (%s)", model.version, device, type(model).__name__)
    if cfg.check_model:
        plan = CheckPlan(
            thorough=False,  # the shapes that matter; `kvrank check-model` tries them all
            kv_dtypes=(cfg.kv_dtype,) if cfg.kv_dtype else (),
            score_many=cfg.microbatch_ms > 0,
            extend=cfg.incremental != "off",
            golden=load_golden(local, model.features),
        )
        report = check_model(model, plan)
        for r in report.results:
            log.info("model check %s: %s (%s)", r.name, "ok" if r.passed else "FAILED", r.detail)
        report.raise_for_failure()
    l2 = None
    if cfg.redis.url:
        l2 = RedisStore(
            RedisSettings(
                cfg.redis.url,
                cluster=cfg.redis.cluster,
                password=redis_password(cfg.redis),
                tls_ca_file=cfg.redis.tls_ca_file,
                tls_check_hostname=cfg.redis.tls_check_hostname,
                op_timeout_s=cfg.redis.op_timeout_ms / 1e3,
            )
        )
    cache_settings = CacheSettings(
        cfg.namespace,
        model.version,
        model.fingerprint(),
        str(device),
        lock_wait_s=cfg.lock_wait_ms / 1e3,
    )
    cache = TieredCache(cache_settings, L1Store(cfg.l1_bytes), l2, AdaptiveTTL(cfg.ttl))
    settings = ServiceSettings(
        kv_dtype=cfg.kv_dtype,
        incremental=cfg.incremental,
        refresh_every=cfg.refresh_every,
        cache_mode=cfg.cache_mode,
        microbatch_ms=cfg.microbatch_ms,
    )
    metrics = Metrics(model.version, cfg.namespace, device=str(device))
    metrics.registry.register(CacheCollector(cache))
    return RankingService(model, cache, settings, metrics)


async def _warm_up(service: RankingService) -> None:
    """One encode and one score, and the L2 connection (a Redis Cluster client discovers its
    slots on first use), so the first real request does not pay for lazy init and does not
    miss L2 because discovery overran the per-operation timeout."""
    gen = torch.Generator().manual_seed(0)
    user = example_user(service.features, 1, gen)
    cands = example_candidates(service.features, 2, gen)
    kv = await service.runner.run(service.model.encode_user, user)
    await service.runner.run(service.model.score, kv, cands)
    if not await service.cache.ping():
        log.warning("L2 not reachable at startup; serving from L1 until it is")


async def _watch_config(state: AppState) -> None:
    path = Path(state.cfg.config_file) if state.cfg.config_file else None
    while path is not None:
        await asyncio.sleep(CONFIG_POLL_S)
        with contextlib.suppress(OSError, ValueError):
            mtime = path.stat().st_mtime
            if mtime == state.config_mtime:
                continue
            state.config_mtime = mtime
            doc = read_file(path)
            ttl = TTLSettings.model_validate(doc.get("ttl", {}))
            state.shadow_config = ShadowConfig.model_validate(doc.get("shadow", {}))
            if state.service is not None:
                state.service.cache.ttl.settings = ttl
                log.info(
                    "config reloaded: ttl %s, shadow %s",
                    ttl.model_dump(),
                    state.shadow_config.model_dump(),
                )


def create_app(cfg: ServerConfig, service: RankingService | None = None) -> FastAPI:
    state = AppState(cfg, service)
    user_hash = logs.UserHasher(cfg.log.user_key)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if state.service is None:
            # on the model thread: loading runs torch too (see kvrank.runner)
            loop = asyncio.get_running_loop()
            try:
                state.service = await loop.run_in_executor(model_thread(), build_service, cfg)
            except KvrankError as exc:  # a refused model: the process says why as it exits
                state.startup_error = str(exc)
                raise
        if cfg.config_file:
            with contextlib.suppress(OSError):
                state.config_mtime = Path(cfg.config_file).stat().st_mtime
        state.request_model = request_model(state.service.features)
        await _warm_up(state.service)
        state.shadow_config = cfg.shadow
        state.shadow = ShadowMirror(
            lambda: state.shadow_config or cfg.shadow,
            state.service.metrics.registry,
            {"model_version": state.service.model.version, "cache_namespace": cfg.namespace},
            own_version=state.service.model.version,
        )
        state.shadow.start()
        state.ready = True
        watcher = asyncio.create_task(_watch_config(state))
        yield
        state.ready = False
        watcher.cancel()
        await state.shadow.stop()
        await state.service.close()

    app = FastAPI(title="kvrank ranker", version="1", lifespan=lifespan)
    app.state.kvrank = state
    app.openapi = lambda: _openapi(app, state)  # type: ignore[method-assign]

    app.add_middleware(
        Edge,
        port=cfg.port,
        admin_port=cfg.admin_port,
        max_body_bytes=cfg.max_body_bytes,
        observe=lambda route, code: (
            state.service.metrics.observe_response(route, code) if state.service else None
        ),
    )

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        field = ".".join(str(p) for p in first["loc"] if p != "body")
        return _error(422, field, str(first["msg"]), request, details=_safe(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if isinstance(exc, BodyTooLarge):
            return _error(413, "body", exc.detail, request)
        return await http_exception_handler(request, exc)

    @app.exception_handler(InputError)
    async def bad_input(request: Request, exc: InputError) -> JSONResponse:
        return _error(422, exc.field, exc.problem, request)

    @app.exception_handler(IncompatibleKVError)
    async def incompatible(request: Request, exc: IncompatibleKVError) -> JSONResponse:
        return _error(409, None, str(exc), request)

    @app.post("/v1/score", response_model=ScoreResponse)
    async def score(request: Request) -> Response:
        # the body's schema is the loaded model's (see _openapi): parsed here, in one pass
        svc = _service(state)
        try:
            body = state.request_model.model_validate_json(await request.body())
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from exc
        user_id: str = body.user_id  # type: ignore[attr-defined]
        request.state.user = user_hash(user_id)
        user, cands = to_inputs(body, svc.features)
        result = await svc.score(user_id, user, cands)
        request.state.cache = result.outcome.value
        request.state.candidates = len(result.scores)
        request.state.model_version = svc.model.version
        scores = result.scores.tolist()
        if state.shadow is not None and SHADOW_HEADER not in request.headers:
            # queued, sent by the mirror's own task: the body as received (read once, kept
            # by Starlette), nothing serialized again
            state.shadow.offer(await request.body(), scores)
        answer = ScoreResponse(
            request_id=request.state.request_id,
            model_version=svc.model.version,
            scores=scores,
            cache=result.outcome.value,
            timings_ms=result.timings_ms,
        )
        # serialized here, in pydantic's core: FastAPI would validate the model again
        return Response(answer.model_dump_json(), media_type="application/json")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        if not state.ready:
            return JSONResponse({"status": "starting"}, status_code=503)
        svc = _service(state)
        return JSONResponse(
            {"status": "ready", "model_version": svc.model.version, "device": str(svc.model.device)}
        )

    @app.get("/metrics")
    async def metrics() -> Response:
        svc = _service(state)
        return Response(generate_latest(svc.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/admin/invalidate/{user_id}", response_model=InvalidateResponse)
    async def invalidate(user_id: str) -> InvalidateResponse:
        svc = _service(state)
        removed = await svc.cache.invalidate_user(user_id)
        return InvalidateResponse(user_id=user_id, removed=removed)

    @app.get("/admin/config")
    async def effective_config() -> dict[str, Any]:
        svc = _service(state)
        doc = cfg.model_dump(mode="json")
        doc["effective_ttl_seconds"] = svc.cache.ttl.current()
        doc["ttl"] = svc.cache.ttl.settings.model_dump(mode="json")
        doc["shadow"] = (state.shadow_config or cfg.shadow).model_dump(mode="json")
        return doc

    return app


def _openapi(app: FastAPI, state: AppState) -> dict[str, Any]:
    """The OpenAPI document, with ``/v1/score``'s body the loaded model's request schema
    (known once the model is: until then the route is listed without it)."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    if state.service is None or state.request_model is BaseModel:
        return doc
    body = state.request_model.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas |= body.pop("$defs", {})
    schemas["ScoreRequest"] = body
    doc["paths"]["/v1/score"]["post"]["requestBody"] = {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ScoreRequest"}}},
    }
    app.openapi_schema = doc
    return doc


def _service(state: AppState) -> RankingService:
    if state.service is None:
        raise RuntimeError("service not started")
    return state.service


def _safe(errors: Any) -> list[dict[str, Any]]:
    return [{"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg"))} for e in errors]


def _error(
    status: int,
    field: str | None,
    message: str,
    request: Request,
    details: list[dict[str, Any]] | None = None,
) -> JSONResponse:
    request_id = getattr(request.state, "request_id", None)
    return JSONResponse(error_body(message, request_id, field, details), status_code=status)
