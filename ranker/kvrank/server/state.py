"""What the running app knows between requests: one :class:`AppState`, on ``app.state``.

Set by the app's lifespan (service, ready, the loaded model's request schema), changed by
the config reloader (the shadow section) and by the process on drain (``ready``). Routes
read it; nothing here does I/O.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from fastapi import Request
from pydantic import BaseModel

from kvrank.server import logs
from kvrank.server.config import ServerConfig
from kvrank.server.prefetch import Prefetches
from kvrank.server.schemas import StrictBody
from kvrank.server.shadow import ShadowConfig, ShadowMirror
from kvrank.service import Service


@dataclass
class AppState:
    cfg: ServerConfig
    service: Service | None = None
    connect: Callable[[], Awaitable[Service]] | None = None
    """How a front gets its service (the engine's, :mod:`kvrank.engine`); ``None``: built
    here from the config."""
    ready: bool = False
    watched_mtimes: dict[str, float] = field(default_factory=dict)
    """Path → mtime of the files reloaded while serving (:mod:`kvrank.server.reload`)."""
    shadow_config: ShadowConfig | None = None
    """The shadow section in force (reloaded with the file)."""
    shadow: ShadowMirror | None = None
    startup_error: str | None = None
    """Why the model was refused at start (artifact, device or a failed check)."""
    request_model: type[BaseModel] = BaseModel
    """The ``/v1/score`` body of the loaded model (set before ready)."""
    prefetch_model: type[BaseModel] = BaseModel
    """The ``/v1/prefetch`` body of the loaded model (set before ready)."""
    request_strict: StrictBody | None = None
    prefetch_strict: StrictBody | None = None
    """The same bodies as strict decoders, tried first (set before ready)."""
    prefetches: Prefetches = field(init=False)
    user_hash: logs.UserHasher = field(init=False)
    """Turns a user id into what the access line may show."""
    serving_since: float | None = None
    """When the pod first became ready (``None`` while it loads): until then the liveness
    probe fails as the app's own would, so the startup probe still bounds a hung load."""
    loop_seen: float = field(default_factory=time.monotonic)
    """When the event loop last ticked (:func:`kvrank.server.probes.tick`): the liveness
    probe's evidence that it makes progress."""
    beat: Callable[[float], None] | None = None
    """Also told of each tick (a front tells the process that answers the pod's probes)."""

    def __post_init__(self) -> None:
        self.user_hash = logs.UserHasher(self.cfg.log.user_key)
        self.prefetches = Prefetches(self.cfg.prefetch_max_inflight)

    @property
    def started(self) -> Service:
        """The service, once the lifespan has built it."""
        if self.service is None:
            raise RuntimeError("service not started")
        return self.service

    def shadow_in_force(self) -> ShadowConfig:
        return self.shadow_config or self.cfg.shadow


async def app_state(request: Request) -> AppState:
    """The app's state (a FastAPI dependency). A coroutine, though it awaits nothing:
    FastAPI runs a plain function dependency on a worker thread, one hop per request —
    under a spike a thread hand-off and two interpreter-lock switches for every shed
    answer."""
    state: AppState = request.app.state.kvrank
    return state
