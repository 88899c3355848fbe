"""The processes of one pod with fronts (``fronts: N``): the command's own process is the
engine (model, cache, batcher, admission control) and answers the kubelet's probes; N front
processes, which it starts, serve HTTP (and gRPC) on the same ports.

Start: the engine loads, checks and warms the model and listens on its socket, then starts
the fronts, each connecting to it; the pod is ready once all are (``probe_port``). A model
the engine refuses ends the pod as a single process does (exit 3, the reason the last
line). SIGTERM drains as a single process does: the fronts answer ``/readyz`` 503 for
``drain_delay_s``, then finish what is in flight; the engine stops after the last front.
A front that dies ends the pod (exit 1), so the kubelet restarts it whole; a front whose
engine has gone exits.

Metrics: every process writes its counters and histograms to files in ``run_dir``
(prometheus_client's multiprocess mode); a scrape of any front adds them up and appends
the engine's scrape-time state (cache, admission, its process).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.context import SpawnContext, SpawnProcess
from pathlib import Path
from typing import Any

import uvloop

from kvrank.errors import KvrankError
from kvrank.server import logs
from kvrank.server.config import ServerConfig

log = logging.getLogger("kvrank.server")
SOCKET = "engine.sock"
METRICS = "metrics"
SUPERVISE_S = 0.5
"""How often the engine looks at its fronts."""
ENGINE_GONE = 1
"""A front's exit status when its engine has gone."""


@dataclass
class Shared:
    """What the pod's processes tell the engine's process, which answers the probes
    (shared memory)."""

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
    """Serve as the pod's engine, with its fronts, until it drains or a front dies (the exit
    status: 0 after a drain, 1 when a front died, 3 when the model was refused)."""
    from kvrank.server.probes import ProbeServer
    from kvrank.server.process import PROBE_STALL_S, STARTUP_FAILED, keep_freed_memory

    logs.configure(cfg.log)
    keep_freed_memory()
    run_dir = Path(cfg.run_dir or tempfile.mkdtemp(prefix="kvrank-pod-"))
    metrics_dir = run_dir / METRICS
    shutil.rmtree(metrics_dir, ignore_errors=True)
    metrics_dir.mkdir(parents=True)
    # set before the first metric is made: this process's counters go to files as well
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)  # the fronts', inherited
    _multiprocess_values()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(run_dir / SOCKET)
    pod = Pod(cfg, str(run_dir / SOCKET))
    probes = None
    if cfg.probe_port is not None:
        view = PodView(pod.shared, cfg.fronts)
        probes = ProbeServer(view, cfg.host, cfg.probe_port, PROBE_STALL_S).start()
    try:
        raise SystemExit(uvloop.run(_engine(pod)))
    except KvrankError as exc:  # a refused model: the pod's last line says why
        log.error("kvrank serve: %s", exc)
        raise SystemExit(STARTUP_FAILED) from None
    finally:
        if probes is not None:
            probes.stop()
        for child in multiprocessing.active_children():
            child.kill()  # only a pod ending on a death leaves any: nothing is served now
            child.join()
        if cfg.run_dir is None:
            shutil.rmtree(run_dir, ignore_errors=True)


def _multiprocess_values() -> None:
    """Have prometheus_client keep this process's values in the multiprocess directory
    (it chooses when first imported, which the command line did before the setting)."""
    from prometheus_client import values

    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]


class Pod:
    """This process (the engine) and its fronts."""

    def __init__(self, cfg: ServerConfig, path: str) -> None:
        self.cfg, self.path = cfg, path
        self.ctx = multiprocessing.get_context("spawn")
        self.shared = Shared.make(self.ctx, cfg.fronts)
        self.fronts: list[SpawnProcess] = []
        self.stop = asyncio.Event()
        self.status = 0
        """The exit status once :attr:`stop` is set: 0 after a drain, 1 after a death."""

    def on_signal(self, sig: int) -> None:
        """SIGTERM or SIGINT: the fronts hear it and drain as one server does (a second one
        stops them at once); the engine stops after the last (before there are any, now)."""
        self.shared.draining.set()
        for front in self.fronts:
            if front.pid is not None and front.is_alive():
                os.kill(front.pid, sig)
        if not self.fronts:
            self.stop.set()

    def start_fronts(self) -> None:
        from kvrank.server.process import listening_socket

        cfg = self.cfg
        ports = [cfg.port] if cfg.admin_port is None else [cfg.port, cfg.admin_port]
        sockets = [listening_socket(cfg.host, p) for p in ports]
        for i in range(cfg.fronts):
            args = (cfg, sockets, self.path, self.shared, i)
            front = self.ctx.Process(target=run_front, args=args, name=f"kvrank-front-{i}")
            front.start()
            self.fronts.append(front)
        for sock in sockets:
            sock.close()  # the fronts hold them

    async def supervise(self) -> None:
        """Until the fronts have drained (status 0), or one dies on its own (1): then
        :attr:`stop`."""
        while True:
            alive = [f for f in self.fronts if f.is_alive()]
            if self.shared.draining.is_set() and not alive:
                break
            if not self.shared.draining.is_set() and len(alive) < len(self.fronts):
                dead = ", ".join(f.name for f in self.fronts if not f.is_alive())
                log.error("kvrank serve: %s exited; stopping the pod", dead)
                self.status = 1
                break
            await asyncio.sleep(SUPERVISE_S)
        self.stop.set()


async def _engine(pod: Pod) -> int:
    """The engine: load, check and warm the model, listen for the fronts, start them, serve
    until :meth:`Pod.supervise` says stop; the exit status."""
    from kvrank.admission import watch_loop_lag
    from kvrank.engine.core import Engine
    from kvrank.runner import model_thread
    from kvrank.server.process import settle_heap
    from kvrank.server.reload import remember_mtime, watch_config
    from kvrank.server.state import AppState
    from kvrank.server.wiring import build_service

    cfg, loop = pod.cfg, asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, pod.on_signal, sig)
    service = await loop.run_in_executor(model_thread(), build_service, cfg)
    await service.warm_up()
    state = AppState(cfg, service)  # what the config reloader sets: TTL, secrets
    remember_mtime(state)
    server = await Engine(service).serve(pod.path)
    tasks = [
        asyncio.create_task(_beat(pod.shared, 0)),
        asyncio.create_task(watch_config(state)),
        asyncio.create_task(watch_loop_lag(service.admission)),
    ]
    pod.shared.engine_ready.set()
    log.info("engine serving on %s: pid %d", pod.path, os.getpid())
    if not pod.shared.draining.is_set():
        pod.start_fronts()
        settle_heap()
        tasks.append(asyncio.create_task(pod.supervise()))
    await pod.stop.wait()
    server.close()
    for task in tasks:
        task.cancel()
    await service.close()
    return pod.status


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
        service = await RemoteService.connect(path, cfg.admission, cfg.namespace, metrics_dir)
        # nothing can be served without it; a front must not outlive it
        service.client.on_gone = lambda: os._exit(ENGINE_GONE)
        return service

    app = create_app(cfg, connect=connect)
    state = app.state.kvrank
    state.beat = lambda now: shared.beats.__setitem__(1 + index, now)
    server = draining_server(cfg, app)
    server.on_started = lambda: _front_started(shared)
    run(server, sockets)


def _front_started(shared: Shared) -> None:
    with shared.fronts_ready.get_lock():
        shared.fronts_ready.value += 1
