"""The kubelet's probes on their own thread (``probe_port``): readiness follows the pod's
state, liveness the event loop's progress, and neither waits behind busy Python work."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import httpx

from kvrank.server.config import ServerConfig
from kvrank.server.probes import ProbeServer
from kvrank.server.state import AppState
from kvrank_common import PROBE_TIMEOUT_S


def test_readiness_follows_the_pod_and_liveness_the_event_loops_progress() -> None:
    state = AppState(ServerConfig())
    # the loop's ticks are set by hand: "alive" is a tick within 5 s, "wedged" one 60 s old
    # (a tighter bound would fail a test process that a loaded machine pauses for a while)
    probes = ProbeServer(state, "127.0.0.1", 0, stall_s=5).start()
    url = f"http://127.0.0.1:{probes.port}"
    try:
        for path in ("/readyz", "/healthz"):  # loading: the startup probe waits
            assert httpx.get(f"{url}{path}", timeout=2).status_code == 503
        state.ready, state.serving_since = True, time.monotonic()
        state.loop_seen = time.monotonic()
        assert httpx.get(f"{url}/readyz", timeout=2).json() == {"status": "ready"}
        assert httpx.get(f"{url}/healthz", timeout=2).status_code == 200
        state.ready = False  # draining: out of the Service, still alive
        assert httpx.get(f"{url}/readyz", timeout=2).status_code == 503
        assert httpx.get(f"{url}/healthz", timeout=2).status_code == 200
        state.loop_seen -= 60.0  # no tick for a minute: the loop is wedged
        stalled = httpx.get(f"{url}/healthz", timeout=2)
        assert stalled.status_code == 503 and "stalled" in stalled.json()["status"]
        assert httpx.get(f"{url}/metrics", timeout=2).status_code == 404
    finally:
        probes.stop()


def test_a_probe_is_answered_while_python_work_saturates_the_process() -> None:
    """Two threads spinning in Python (an event loop and a model thread under a spike): the
    probe thread still gets the interpreter within its switch interval."""
    state = AppState(ServerConfig(), ready=True)
    probes = ProbeServer(state, "127.0.0.1", 0, stall_s=10).start()
    stop = threading.Event()

    def spin() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    busy = [threading.Thread(target=spin, daemon=True) for _ in range(2)]
    for t in busy:
        t.start()
    try:
        took = []
        with httpx.Client(timeout=5) as client:
            for _ in range(10):
                t0 = time.perf_counter()
                assert client.get(f"http://127.0.0.1:{probes.port}/readyz").status_code == 200
                took.append(time.perf_counter() - t0)
        # the kubelet's probe timeout (the one the operator renders) is what a late answer
        # fails; the probe thread waits for the interpreter a switch interval (5 ms) at a
        # time, so even a busy machine leaves it far inside that
        assert max(took) < PROBE_TIMEOUT_S, took
    finally:
        stop.set()
        probes.stop()


def test_a_pod_with_fronts_is_alive_once_all_its_processes_are_and_ready_until_it_drains() -> None:
    """The probes of an engine and two fronts (``fronts: 2``), as the parent answers them:
    the startup probe (``/healthz``, the only one the kubelet sends until it passes) sees
    the pod start without a readiness probe first; one stale process's loop fails it."""
    from kvrank.engine.pod import PodView, Shared

    now = time.monotonic()
    shared = Shared(threading.Event(), SimpleNamespace(value=0), [now] * 3, threading.Event())
    probes = ProbeServer(PodView(shared, fronts=2), "127.0.0.1", 0, stall_s=5).start()
    url = f"http://127.0.0.1:{probes.port}"

    def status(path: str) -> int:
        return httpx.get(f"{url}{path}", timeout=2).status_code

    try:
        shared.engine_ready.set()
        shared.fronts_ready.value = 1  # one front still starting
        assert (status("/healthz"), status("/readyz")) == (503, 503)
        shared.fronts_ready.value = 2
        shared.beats[:] = [time.monotonic()] * 3
        assert status("/healthz") == 200  # no /readyz asked before
        assert status("/readyz") == 200
        shared.draining.set()
        assert (status("/healthz"), status("/readyz")) == (200, 503)
        shared.beats[2] -= 60.0  # one front's loop has not ticked for a minute
        assert status("/healthz") == 503
    finally:
        probes.stop()
