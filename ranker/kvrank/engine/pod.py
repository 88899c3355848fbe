"""The processes of one pod with fronts (``fronts: N``): this one supervises, answers the
kubelet's probes and forwards signals; an engine process serves the model; N front
processes serve HTTP (and gRPC) on the same ports.

Start: the engine loads, checks and warms the model and listens on its socket, then the
fronts start, each connecting to it; the pod is ready once all are (``probe_port``).
A model the engine refuses ends the pod as a single process does (exit 3, the reason the
last line). SIGTERM drains as a single process does: the fronts answer ``/readyz`` 503 for
``drain_delay_s``, then finish what is in flight; the engine stops after the last front.
Any process that dies on its own ends the pod, so the kubelet restarts it whole.

Metrics: every process writes its counters and histograms to files in ``run_dir``
(prometheus_client's multiprocess mode); a scrape of any front adds them up and appends
the engine's scrape-time state (cache, admission, its process).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.context import SpawnContext, SpawnProcess
from pathlib import Path
from types import FrameType
from typing import Any

import uvloop

from kvrank.errors import KvrankError
from kvrank.server import logs
from kvrank.server.config import ServerConfig

log = logging.getLogger("kvrank.server")
SOCKET = "engine.sock"
METRICS = "metrics"
START_POLL_S = 0.2


@dataclass
class Shared:
    """What the pod's processes tell the supervisor (shared memory)."""

    engine_ready: Any  # multiprocessing.Event
    fronts_ready: Any  # multiprocessing.Value("i"): fronts started
    beats: Any  # multiprocessing.Array("d"): each process's last loop tick, engine first
    draining: Any  # multiprocessing.Event

    @classmethod
    def make(cls, ctx: SpawnContext, fronts: int) -> Shared:
        now = time.monotonic()
        beats = ctx.Array("d", [now] * (1 + fronts))
        return cls(ctx.Event(), ctx.Value("i", 0), beats, ctx.Event())


class PodView:
    """The pod's processes as the probes see them (:class:`~kvrank.server.probes.Probed`)."""

    def __init__(self, shared: Shared, fronts: int) -> None:
        self.shared, self.fronts = shared, fronts
        self._since: float | None = None

    @property
    def serving_since(self) -> float | None:
        """When the engine and every front had first started (``None``: not yet)."""
        s = self.shared
        if self._since is None and s.engine_ready.is_set() and s.fronts_ready.value >= self.fronts:
            self._since = time.monotonic()
        return self._since

    @property
    def ready(self) -> bool:
        return self.serving_since is not None and not self.shared.draining.is_set()

    @property
    def loop_seen(self) -> float:
        """The stalest process's last tick: one wedged loop is a pod to restart."""
        return float(min(self.shared.beats[:]))


def serve_pod(cfg: ServerConfig) -> None:
    """Run the pod's processes until it drains or one of them dies (the exit status: 0
    after a drain, 1 when a process died, 3 when the engine refused the model)."""
    from kvrank.server.probes import ProbeServer
    from kvrank.server.process import PROBE_STALL_S, STARTUP_FAILED

    logs.configure(cfg.log)
    run_dir = Path(cfg.run_dir or tempfile.mkdtemp(prefix="kvrank-pod-"))
    metrics_dir = run_dir / METRICS
    shutil.rmtree(metrics_dir, ignore_errors=True)
    metrics_dir.mkdir(parents=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)  # the children's, inherited
    with contextlib.suppress(FileNotFoundError):
        os.unlink(run_dir / SOCKET)
    pod = Pod(cfg, str(run_dir / SOCKET))
    probes = None
    if cfg.probe_port is not None:
        probes = ProbeServer(
            PodView(pod.shared, cfg.fronts), cfg.host, cfg.probe_port, PROBE_STALL_S
        )
        probes.start()
    try:
        if not pod.start_engine():
            raise SystemExit(pod.engine.exitcode or STARTUP_FAILED)
        pod.start_fronts()
        raise SystemExit(pod.supervise())
    finally:
        if probes is not None:
            probes.stop()
        for child in multiprocessing.active_children():
            child.kill()  # only a pod ending on a death leaves any: nothing is served now
            child.join()
        if cfg.run_dir is None:
            shutil.rmtree(run_dir, ignore_errors=True)


class Pod:
    """The engine and the fronts, as this process sees them."""

    def __init__(self, cfg: ServerConfig, path: str) -> None:
        self.cfg, self.path = cfg, path
        self.ctx = multiprocessing.get_context("spawn")
        self.shared = Shared.make(self.ctx, cfg.fronts)
        self.engine = self.ctx.Process(
            target=run_engine, args=(cfg, path, self.shared), name="kvrank-engine"
        )
        self.fronts: list[SpawnProcess] = []
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        """Drain: the fronts hear it (and drain as one server does); before there are any,
        the engine stops."""
        self.shared.draining.set()
        for proc in self.fronts or [self.engine]:
            if proc.pid is not None and proc.is_alive():
                os.kill(proc.pid, signal.SIGTERM if proc is self.engine else sig)

    def start_engine(self) -> bool:
        """Start the engine and wait until it listens (``False``: it exited first)."""
        self.engine.start()
        log.info("engine started: pid %d", self.engine.pid)
        while not self.shared.engine_ready.wait(START_POLL_S):
            if not self.engine.is_alive():
                return False
        return not self.shared.draining.is_set()

    def start_fronts(self) -> None:
        from kvrank.server.process import listening_socket

        cfg = self.cfg
        ports = [cfg.port] if cfg.admin_port is None else [cfg.port, cfg.admin_port]
        sockets = [listening_socket(cfg.host, p) for p in ports]
        for i in range(cfg.fronts):
            args = (cfg, sockets, self.path, self.shared, i)
            self.fronts.append(
                self.ctx.Process(target=run_front, args=args, name=f"kvrank-front-{i}")
            )
            self.fronts[-1].start()
        for sock in sockets:
            sock.close()  # the fronts hold them

    def supervise(self) -> int:
        """Wait until the fronts have drained, then stop the engine (0); or until a process
        dies on its own (1)."""
        every = [self.engine, *self.fronts]
        while True:
            if self.shared.draining.is_set():
                if not any(f.is_alive() for f in self.fronts):
                    break
            elif not all(p.is_alive() for p in every):
                dead = ", ".join(p.name for p in every if not p.is_alive())
                log.error("kvrank serve: %s exited; stopping the pod", dead)
                return 1
            alive = [p.sentinel for p in every if p.is_alive()]
            multiprocessing.connection.wait(alive, timeout=1.0)
        self.engine.terminate()
        self.engine.join()
        return 0


# ---- the engine process ----


def run_engine(cfg: ServerConfig, path: str, shared: Shared) -> None:
    from kvrank.server.process import STARTUP_FAILED, keep_freed_memory

    logs.configure(cfg.log)
    keep_freed_memory()
    try:
        uvloop.run(_engine(cfg, path, shared))
    except KvrankError as exc:  # a refused model: the pod's last line says why
        log.error("kvrank serve: %s", exc)
        raise SystemExit(STARTUP_FAILED) from None


async def _engine(cfg: ServerConfig, path: str, shared: Shared) -> None:
    from kvrank.admission import watch_loop_lag
    from kvrank.engine.core import Engine
    from kvrank.runner import model_thread
    from kvrank.server.process import settle_heap
    from kvrank.server.reload import remember_mtime, watch_config
    from kvrank.server.state import AppState
    from kvrank.server.wiring import build_service

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)  # the supervisor's, after the fronts
    loop.add_signal_handler(signal.SIGINT, lambda: None)  # ^C reaches the fronts too: they drain
    service = await loop.run_in_executor(model_thread(), build_service, cfg)
    await service.warm_up()
    state = AppState(cfg, service)  # what the config reloader sets: TTL, secrets
    remember_mtime(state)
    server = await Engine(service).serve(path)
    settle_heap()
    tasks = [
        asyncio.create_task(_beat(shared, 0)),
        asyncio.create_task(watch_config(state)),
        asyncio.create_task(watch_loop_lag(service.admission)),
    ]
    shared.engine_ready.set()
    log.info("engine serving on %s", path)
    await stop.wait()
    server.close()
    for task in tasks:
        task.cancel()
    await service.close()


async def _beat(shared: Shared, index: int) -> None:
    from kvrank.server.probes import TICK_S

    while True:
        shared.beats[index] = time.monotonic()
        await asyncio.sleep(TICK_S)


# ---- a front process ----


def run_front(
    cfg: ServerConfig, sockets: list[socket.socket], path: str, shared: Shared, index: int
) -> None:
    from kvrank.engine.remote import RemoteService
    from kvrank.server.app import create_app
    from kvrank.server.process import draining_server, run
    from kvrank.service import Service

    logs.configure(cfg.log)
    metrics_dir = os.environ["PROMETHEUS_MULTIPROC_DIR"]

    async def connect() -> Service:
        return await RemoteService.connect(path, cfg.admission, cfg.namespace, metrics_dir)

    app = create_app(cfg, connect=connect)
    state = app.state.kvrank
    state.beat = lambda now: shared.beats.__setitem__(1 + index, now)
    server = draining_server(cfg, app)
    server.on_started = lambda: _front_started(shared)
    run(server, sockets)


def _front_started(shared: Shared) -> None:
    with shared.fronts_ready.get_lock():
        shared.fronts_ready.value += 1
