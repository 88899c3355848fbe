"""Running the app under uvicorn with a Kubernetes-friendly shutdown.

On SIGTERM a pod is removed from its Service's endpoints *asynchronously*: kube-proxy and
load balancers keep sending it new connections for a moment. So the first SIGTERM only
starts draining: ``/readyz`` turns 503 and requests are still served for
``drain_delay_s``; then uvicorn stops accepting and finishes in-flight requests within
``shutdown_grace_s``. A second SIGTERM (or SIGINT) stops at once. ``drain_delay_s +
shutdown_grace_s`` stays below the pod's ``terminationGracePeriodSeconds`` (30 s).
"""

from __future__ import annotations

import ctypes
import gc
import logging
import socket
import threading
from collections.abc import Callable
from types import FrameType

import uvicorn
from fastapi import FastAPI

from kvrank.server import logs
from kvrank.server.app import create_app
from kvrank.server.config import ServerConfig
from kvrank.server.probes import ProbeServer
from kvrank.server.protocol import screening_protocol

log = logging.getLogger("kvrank.server")


PROBE_STALL_S = 10.0
"""``/healthz`` on the probe port fails once the event loop has not ticked for this long."""
STARTUP_FAILED = 3
"""Exit status of a server that did not start (e.g. its model was refused): uvicorn's."""


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI, drain_delay_s: float) -> None:
        super().__init__(config)
        self.app = app
        self.drain_delay_s = drain_delay_s
        self.draining = False
        self.on_started: Callable[[], None] | None = None
        """Called once the app has started and the server listens."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)  # the app's startup: model built, warmed up
        if not self.should_exit:
            settle_heap()
            if self.on_started is not None:
                self.on_started()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.draining or self.drain_delay_s <= 0:
            super().handle_exit(sig, frame)
            return
        self.draining = True
        self.app.state.kvrank.ready = False
        log.warning("signal %d: draining for %.1fs before shutdown", sig, self.drain_delay_s)
        timer = threading.Timer(self.drain_delay_s, super().handle_exit, (sig, None))
        timer.daemon = True
        timer.start()


def serve(cfg: ServerConfig) -> None:
    """One server, one app; a second listening socket when admin endpoints have their own
    port (the app tells the two apart by the port a request arrived on). With ``fronts``,
    an engine process and that many front processes (:mod:`kvrank.engine.pod`)."""
    if cfg.fronts:
        from kvrank.engine.pod import serve_pod

        serve_pod(cfg)
        return
    logs.configure(cfg.log)
    keep_freed_memory()
    app = create_app(cfg)
    ports = [cfg.port] if cfg.admin_port is None else [cfg.port, cfg.admin_port]
    sockets = [listening_socket(cfg.host, p) for p in ports]
    server = draining_server(cfg, app)
    probes = None
    if cfg.probe_port is not None:
        probes = ProbeServer(app.state.kvrank, cfg.host, cfg.probe_port, PROBE_STALL_S).start()
    try:
        run(server, sockets)
    finally:
        if probes is not None:
            probes.stop()


def run(server: DrainingServer, sockets: list[socket.socket]) -> None:
    """Serve until shut down; a server whose app did not start exits with
    :data:`STARTUP_FAILED`, its last line the reason."""
    try:
        server.run(sockets=sockets)
    except SystemExit:  # uvicorn's own exit when the app's startup failed
        if server.started:
            raise
        # the last line is what Kubernetes shows as the pod's termination message (and the
        # operator in RankersStarted): the reason, not uvicorn's "startup failed"
        reason = server.app.state.kvrank.startup_error or "the server did not start"
        log.error("kvrank serve: %s", reason)
        raise SystemExit(STARTUP_FAILED) from None


def draining_server(cfg: ServerConfig, app: FastAPI) -> DrainingServer:
    """uvicorn serving ``app`` as ``cfg`` says, draining on the first SIGTERM."""
    config = uvicorn.Config(
        app,
        host=cfg.host,
        port=cfg.port,
        log_config=None,  # keep ours: every line in one format
        access_log=False,  # the app writes its own (request id, user hash, cache outcome)
        # uvicorn's fast pair, named so a missing one fails at start rather than falling
        # back: h11 and asyncio's loop cost ~0.5 ms more a request on a small CPU; its
        # httptools protocol shedding as headers complete
        loop="uvloop",
        http=screening_protocol(app.state.screener),
        timeout_graceful_shutdown=int(cfg.shutdown_grace_s),
        timeout_keep_alive=int(cfg.keep_alive_s),
    )
    return DrainingServer(config, app, cfg.drain_delay_s)


def settle_heap() -> int:
    """Move everything alive after start-up out of the garbage collector's sight; the number
    of objects moved.

    A started server holds ~240,000 long-lived objects (torch, FastAPI, the model's
    modules) that the collector's oldest generation scanned on every full collection: under
    a spike, which allocates fast, full collections came every few seconds and each stopped
    the event loop for 60-180 ms, which set the tail of every answer — shed ones included.
    Frozen objects are never scanned (nor freed: they live as long as the process anyway),
    so a collection costs what the requests in flight allocated.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


MMAP_THRESHOLD_MAX = 32 << 20
"""glibc's ceiling for ``M_MMAP_THRESHOLD`` on 64-bit systems."""


def keep_freed_memory() -> bool:
    """Have glibc keep the memory torch frees for the next request instead of handing it
    back to the kernel. Each score allocates and frees the same megabyte-sized buffers;
    by default glibc maps the large ones afresh and unmaps them when freed, so every
    request paid 700-900 page faults (~1.5 ms of kernel time at the quick size). The
    process's heap then stays at its peak, which a server reaches within its first
    requests anyway. False where the C library is not glibc."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(
        mallopt(m_mmap_threshold, MMAP_THRESHOLD_MAX) and mallopt(m_trim_threshold, 1 << 30)
    )


def listening_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket whose accepted connections get ``TCP_NODELAY``.

    asyncio turns Nagle's algorithm off only on sockets whose protocol number is
    ``IPPROTO_TCP``, and ``socket.create_server`` leaves it 0 — so every answer (headers and
    body are written separately) waited for the client's delayed ACK: 40 ms added to each
    request after the first on a keep-alive connection. Created with the protocol named,
    and with the option set on the listener too (accepted sockets inherit it).
    """
    family, kind, proto, _, addr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(addr)
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock
