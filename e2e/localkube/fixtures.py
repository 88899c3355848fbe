"""pytest fixtures for tests that need Kubernetes or the product's images (registered from
the root conftest).

- ``cluster``: one cluster per test session, shared by the end-to-end scenarios and the
  cluster harness's own tests; ``KVRANK_CLUSTER`` picks the backend (``local``, a real
  node, by default; ``kind`` where Docker exists). The local one must leave the host's
  network namespaces, links, routes and iptables exactly as it found them.
- ``docker`` / ``images``: a Docker engine and the images ``make images`` builds from this
  tree, shared by the image tests and the end-to-end suite's real node.

When a test that used the cluster fails, the tail of every component's log is attached to
the report, so a failure explains itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from localkube import Cluster, LocalCluster, cluster_from_env
from localkube.engine import Docker, Images, build_images, engine
from localkube.network import host_snapshot
from localkube.processes import alive


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir: Path = tmp_path_factory.mktemp("cluster")
    c = cluster_from_env(workdir)
    before = host_snapshot() if isinstance(c, LocalCluster) else ""
    c.start(timeout=300)
    pids = c.supervisor.pids() if isinstance(c, LocalCluster) else []
    try:
        yield c
    finally:
        c.stop()
    if isinstance(c, LocalCluster):  # no process, namespace, route or rule outlives it
        assert [p for p in pids if alive(p)] == []
        assert host_snapshot() == before


@pytest.fixture(scope="session")
def docker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Docker]:
    with engine(tmp_path_factory.mktemp("dockerd")) as d:
        yield d


@pytest.fixture(scope="session")
def images(docker: Docker) -> Images:
    return build_images(docker)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    report = yield
    if report.failed and "cluster" in getattr(item, "fixturenames", ()):
        c = item.funcargs.get("cluster")  # type: ignore[attr-defined]
        if c is not None:
            report.sections.append(("control-plane logs", c.logs()))
    return report
