"""Repository-wide pytest plugins: the Kubernetes cluster fixture lives in e2e/localkube.

``--lane``: ``make test`` runs the suite as two pytest processes side by side: the tests that
need the cluster or the Docker engine (one of each per process; they are built and started
once and then waited on, mostly) and everything else (CPU-bound). A test's lane is decided
by the fixtures it uses, so a new test lands in the right one without a marker to forget.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["localkube.fixtures"]

CLUSTER_LANE_FIXTURES = frozenset({"cluster", "docker", "images"})
"""A test that uses one of these (directly or through another fixture) is in the cluster lane."""


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
