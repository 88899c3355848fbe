"""Fixtures of the end-to-end scenarios, one file per feature (``test_<feature>.py``).

- ``stack`` (session): the cluster's backend with this tree's images, the two restricted
  namespaces, the artifact store and (local backend) Prometheus.
- ``release`` (session) / ``operator``: the operator's Helm release; ``operator`` installs
  this tree's chart when no release is deployed, so any scenario runs alone
  (``pytest e2e -k <name>``).
- ``rankers``: RankerDeployments a scenario creates under names of its own, deleted after it
  with everything they own.

Scenarios are independent and run in file order, except where the order is the point: the
install/upgrade scenario (``lifecycle("first")``) starts on a cluster without kvrank, and
the uninstall scenario (``lifecycle("last")``) removes the operator under every other one.
Scenarios marked ``quiet_host`` (see the root conftest) run just before the last one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from localkube import Cluster
from localkube.engine import Docker, Images
from rankers import Rankers
from release import OperatorRelease
from stack import Stack, stack_for

LIFECYCLE = {"first": 0, "last": 3}
QUIET = 2


@pytest.fixture(scope="session")
def stack(
    tmp_path_factory: pytest.TempPathFactory, cluster: Cluster, docker: Docker, images: Images
) -> Iterator[Stack]:
    s = stack_for(cluster, tmp_path_factory.mktemp("e2e"), docker, images)
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="session")
def release(stack: Stack) -> OperatorRelease:
    return OperatorRelease(stack)


@pytest.fixture
def operator(release: OperatorRelease) -> OperatorRelease:
    release.ensure()
    return release


@pytest.fixture
def rankers(stack: Stack, operator: OperatorRelease) -> Iterator[Rankers]:
    made = Rankers(stack)
    try:
        yield made
    finally:
        made.delete_all()


def _rank(item: pytest.Item) -> int:
    marker = item.get_closest_marker("lifecycle")
    if marker:
        return LIFECYCLE[marker.args[0]]
    return QUIET if item.get_closest_marker("quiet_host") else 1


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The end-to-end scenarios in one block (where the first of them was), the lifecycle
    ones first and last in it, the ``quiet_host`` ones just before the last."""
    scenarios = [item for item in items if item.get_closest_marker("e2e")]
    if not scenarios:
        return
    at = items.index(scenarios[0])
    rest = [item for item in items if not item.get_closest_marker("e2e")]
    items[:] = rest[:at] + sorted(scenarios, key=_rank) + rest[at:]
