"""The FastAPI application, assembled from its parts.

The app owns the service's lifetime: build it (:mod:`~kvrank.server.wiring`, on the model
thread), warm it up, start the shadow mirror and the config reloader
(:mod:`~kvrank.server.reload`), then report ready; on shutdown the reverse. Routes live in
:mod:`~kvrank.server.routes`, error mapping in :mod:`~kvrank.server.errors`, what every
request passes through (request id, body limit, admin port, access line) in
:mod:`~kvrank.server.edge`; a scoring request shed on its headers is answered before the
app by the HTTP protocol (:mod:`~kvrank.server.protocol`, what ``kvrank serve`` runs). A
test hands in a ready-made service instead of a model directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import FastAPI

from kvrank.admission import watch_loop_lag
from kvrank.errors import KvrankError
from kvrank.runner import model_thread
from kvrank.server import errors, oip_grpc, probes, routes, v2
from kvrank.server.config import ServerConfig
from kvrank.server.edge import Edge, PlainRoute, Screener
from kvrank.server.openapi import openapi
from kvrank.server.reload import remember_mtime, watch_config
from kvrank.server.schemas import prefetch_model, request_model, strict_body
from kvrank.server.shadow import ShadowMirror
from kvrank.server.state import AppState
from kvrank.server.wiring import build_service
from kvrank.service import Service


def create_app(
    cfg: ServerConfig,
    service: Service | None = None,
    connect: Callable[[], Awaitable[Service]] | None = None,
) -> FastAPI:
    """The app of ``service``; else of the one ``connect`` gets at startup (a front's, see
    :mod:`kvrank.engine`); else of one built from ``cfg`` at startup."""
    state = AppState(cfg, service, connect)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with _running(state):
            yield

    app = FastAPI(title="kvrank ranker", version="1", lifespan=lifespan)
    app.state.kvrank = state
    app.openapi = lambda: openapi(app, state)  # type: ignore[method-assign]
    screener = Screener(
        port=cfg.port,
        admin_port=cfg.admin_port,
        max_body_bytes=cfg.max_body_bytes,
        observe=lambda route, code: (
            state.service.metrics.observe_response(route, code) if state.service else None
        ),
        screen=lambda headers: routes.screen(state, headers),
    )
    app.state.screener = screener  # the HTTP protocol's too (kvrank.server.protocol)
    scoring = (*routes.scoring.routes, *v2.inference.routes)
    direct = [route for route in scoring if isinstance(route, PlainRoute)]
    app.add_middleware(Edge, screener=screener, direct=direct)
    errors.install(app)
    app.include_router(routes.scoring)
    app.include_router(routes.router)
    app.include_router(v2.router)
    app.include_router(v2.inference)
    return app


@contextlib.asynccontextmanager
async def _running(state: AppState) -> AsyncIterator[None]:
    """From a built, warmed-up service to ready; on exit, drained and closed."""
    ticker = asyncio.create_task(probes.tick(state))  # liveness, from loading on
    if state.service is None and state.connect is not None:
        state.service = await state.connect()
    if state.service is None:
        try:  # on the model thread: loading runs torch too (see kvrank.runner)
            loop = asyncio.get_running_loop()
            state.service = await loop.run_in_executor(model_thread(), build_service, state.cfg)
        except KvrankError as exc:  # a refused model: the process says why as it exits
            state.startup_error = str(exc)
            raise
    service = state.service
    remember_mtime(state)
    state.request_model = request_model(service.features)
    state.prefetch_model = prefetch_model(service.features)
    state.request_strict = strict_body(service.features)
    state.prefetch_strict = strict_body(service.features, prefetch=True)
    await service.warm_up()
    state.shadow_config = state.cfg.shadow
    state.shadow = ShadowMirror(
        state.shadow_in_force,
        service.metrics.registry,
        {"model_version": service.model.version, "cache_namespace": state.cfg.namespace},
        own_version=service.model.version,
    )
    state.shadow.start()
    grpc_server = None
    if state.cfg.grpc_port is not None:
        grpc_server = await oip_grpc.start(state, state.cfg.host, state.cfg.grpc_port)
    state.ready = True
    state.serving_since = time.monotonic()
    watcher = asyncio.create_task(watch_config(state))
    lag = asyncio.create_task(watch_loop_lag(service.admission))
    try:
        yield
    finally:
        state.ready = False
        if grpc_server is not None:  # calls in flight finish within the shutdown grace
            await grpc_server.stop(state.cfg.shutdown_grace_s)
        watcher.cancel()
        lag.cancel()
        ticker.cancel()
        await state.prefetches.stop()
        await state.shadow.stop()
        await service.close()
