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
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
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
from kvrank.errors import ArtifactError, IncompatibleKVError, InputError
from kvrank.metrics import Metrics
from kvrank.model.artifact import load_model, resolve_artifact
from kvrank.runner import model_thread
from kvrank.server import logs
from kvrank.server.config import ServerConfig, read_file, redis_password
from kvrank.server.edge import BodyTooLarge, Edge, error_body
from kvrank.server.schemas import InvalidateResponse, ScoreRequest, ScoreResponse
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


def build_service(cfg: ServerConfig) -> RankingService:
    """Everything a server needs; runs on the model thread (see :mod:`kvrank.runner`)."""
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    local = resolve_artifact(cfg.model_dir, Path(cfg.model_cache_dir), cfg.model_sha256)
    model = load_model(local, cfg.device)
    if cfg.model_version is not None and model.version != cfg.model_version:
        raise ArtifactError(
            f"the artifact at {cfg.model_dir} is model version {model.version!r},"
            f" expected model_version={cfg.model_version!r}"
        )
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
        model.cfg.fingerprint(),
        cfg.device,
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
    metrics = Metrics(model.version, cfg.namespace)
    metrics.registry.register(CacheCollector(cache))
    return RankingService(model, cache, settings, metrics)


async def _warm_up(service: RankingService) -> None:
    """One encode and one score, and the L2 connection (a Redis Cluster client discovers its
    slots on first use), so the first real request does not pay for lazy init and does not
    miss L2 because discovery overran the per-operation timeout."""
    from kvrank.model.inputs import Candidates, Events, UserFeatures

    cfg = service.model.cfg
    ev = Events(
        torch.zeros(1, dtype=torch.int64),
        torch.zeros(1, dtype=torch.int64),
        torch.zeros(1, dtype=torch.int64),
        torch.zeros(1, dtype=torch.int64),
        torch.zeros(1, cfg.event_dense),
    )
    user = UserFeatures(
        ev,
        torch.zeros(cfg.profile_fields, dtype=torch.int64),
        torch.zeros(cfg.context_fields, dtype=torch.int64),
        torch.zeros(cfg.user_dense),
    )
    cands = Candidates(
        torch.zeros(2, dtype=torch.int64),
        torch.zeros(2, dtype=torch.int64),
        torch.zeros(2, cfg.cand_dense),
    )
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
            state.service = await loop.run_in_executor(model_thread(), build_service, cfg)
        if cfg.config_file:
            with contextlib.suppress(OSError):
                state.config_mtime = Path(cfg.config_file).stat().st_mtime
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
    async def score(body: ScoreRequest, request: Request) -> Response:
        svc = _service(state)
        request.state.user = user_hash(body.user_id)
        cfg_m = svc.model.cfg
        user, cands = body.to_features(cfg_m.event_dense, cfg_m.cand_dense)
        result = await svc.score(body.user_id, user, cands)
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
        return JSONResponse({"status": "ready", "model_version": _service(state).model.version})

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
