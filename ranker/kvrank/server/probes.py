"""The kubelet's probes, answered on a thread of their own (``probe_port``), never behind
scoring work.

Under a spike the event loop is the pod's busiest part: it accepts, reads and sheds
hundreds of requests a second while the model thread computes. A probe answered by that
loop waits with them — seen on the real node at 4× a half-CPU pod's capacity: the
readiness probe's 1 s timeout passed, the kubelet took the pod out of its Service, and its
load moved onto the others (the flapping that turns one saturated pod into a cascade).
Here a small threaded HTTP server answers:

- ``/readyz``: 200 once the model is loaded and warm, until the pod drains (``ready``) —
  a saturated pod stays ready: it sheds what it cannot serve in time (503 + Retry-After)
  and the router or caller retries elsewhere, where taking it out would move *all* its
  users at once;
- ``/healthz``: 503 while the model loads (as the app's own, which answers only once it
  has started: the startup probe still bounds a hung load), then 200 while the event loop
  makes progress — a tick within ``stall_s`` (it ticks every :data:`TICK_S`): a loop that
  is slow under load still ticks, a wedged one does not, and that is what a restart is for.

The app's own ``/healthz`` and ``/readyz`` on the serving port stay, for local use.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
import time
from typing import Protocol

from kvrank.server.state import AppState

TICK_S = 0.5


async def tick(state: AppState) -> None:
    """Runs for the server's life on the event loop: the progress ``/healthz`` reads."""
    while True:
        state.loop_seen = time.monotonic()
        if state.beat is not None:
            state.beat(state.loop_seen)
        await asyncio.sleep(TICK_S)


class Probed(Protocol):
    """What the probes read: an app's state, or a pod's processes together."""

    @property
    def ready(self) -> bool: ...
    @property
    def serving_since(self) -> float | None: ...
    @property
    def loop_seen(self) -> float: ...


class ProbeServer:
    """``/healthz`` and ``/readyz`` on ``host:port``, served by a daemon thread."""

    def __init__(self, state: Probed, host: str, port: int, stall_s: float) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/readyz":
                    ok, doc = state.ready, {"status": "ready" if state.ready else "not ready"}
                elif self.path == "/healthz" and state.serving_since is None:
                    ok, doc = False, {"status": "starting"}
                elif self.path == "/healthz":
                    stalled = time.monotonic() - state.loop_seen
                    ok = stalled < stall_s
                    doc = {"status": "ok" if ok else f"event loop stalled {stalled:.1f}s"}
                else:
                    self.send_error(404)
                    return
                body = json.dumps(doc).encode()
                self.send_response(200 if ok else 503)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:  # probes are not access lines
                pass

        self._server = http.server.ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="kvrank-probes", daemon=True
        )

    def start(self) -> ProbeServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
