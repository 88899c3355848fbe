"""Repository-wide pytest plugins: the Kubernetes cluster fixture lives in e2e/localkube.

``--lane``: ``make test`` runs the suite as two pytest processes side by side: the tests that
need the cluster or the Docker engine (one of each per process; they are built and started
once and then waited on, mostly) and everything else (CPU-bound). A test's lane is decided
by the fixtures it uses, so a new test lands in the right one without a marker to forget.

``quiet_host``: a cluster test that measures what a pod does with the CPU it was given (a
spike on a half-core pod, a canary warming under load) waits, in ``make test``, until the
rest lane has ended: with the CPU-bound lane beside it, the node's pods do not get the CPU
their limits promise on a two-core machine, and the figures would measure the neighbour.
The e2e conftest runs such scenarios late, so the wait is usually none.
"""

from __future__ import annotations

import fcntl
import os
import time

import pytest

pytest_plugins = ["localkube.fixtures"]

CLUSTER_LANE_FIXTURES = frozenset({"cluster", "docker", "images"})
"""A test that uses one of these (directly or through another fixture) is in the cluster lane."""

CPU_LANE_LOCK = "KVRANK_CPU_LANE_LOCK"
"""A file the rest lane holds locked while it runs (``make test`` names one for both lanes)."""
QUIET_WAIT_S = 45 * 60
"""How long a ``quiet_host`` test waits for the rest lane before it runs anyway."""
_HELD = pytest.StashKey[int]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--lane",
        choices=("cluster", "rest"),
        help="run only the tests that use the cluster or Docker (cluster), or only the others",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    lane = config.getoption("lane")
    if lane is None:
        return
    keep, drop = [], []
    for item in items:
        on_cluster = bool(CLUSTER_LANE_FIXTURES & set(getattr(item, "fixturenames", ())))
        (keep if on_cluster == (lane == "cluster") else drop).append(item)
    items[:] = keep
    config.hook.pytest_deselected(items=drop)


def pytest_configure(config: pytest.Config) -> None:
    path = os.environ.get(CPU_LANE_LOCK)
    if path and config.getoption("lane") == "rest":
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when this process exits, however it ends
        config.stash[_HELD] = fd


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    path = os.environ.get(CPU_LANE_LOCK)
    if not path or item.get_closest_marker("quiet_host") is None:
        return
    if item.config.getoption("lane") != "cluster":
        return
    waited = _wait_unlocked(path, QUIET_WAIT_S)
    if waited >= 1:
        reporter = item.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"{item.nodeid}: waited {waited:.0f} s for the rest lane to end")


def _wait_unlocked(path: str, timeout_s: float) -> float:
    """Seconds waited until nobody holds ``path`` exclusively (at most ``timeout_s``)."""
    start = time.monotonic()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        while time.monotonic() - start < timeout_s:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                time.sleep(1)
                continue
            fcntl.flock(fd, fcntl.LOCK_UN)
            break
    finally:
        os.close(fd)
    return time.monotonic() - start
