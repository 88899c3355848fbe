"""Of several operator replicas exactly one leads, on a Lease of the session's real API
server: a follower takes over when the leader hands the Lease back or stops renewing it, and
never before the old leader has stopped."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from kvrank.tools.processes import free_port
from kvrank_operator.kube import load_client
from kvrank_operator.leader import Election, ElectionSettings, FollowerHealth
from kvrank_operator.metrics import OperatorMetrics

pytestmark = pytest.mark.kube

FAST = {"lease_duration_s": 5, "renew_deadline_s": 3, "retry_period_s": 1}
"""Seconds, not client-go's 15/10/2: the same rules, a quicker test."""


@pytest.fixture
def stops() -> dict[str, float]:
    """When each replica would have ended its process (identity → monotonic time)."""
    return {}


@pytest.fixture
def replicas(cluster, stops: dict[str, float]) -> Iterator[list[Election]]:  # type: ignore[no-untyped-def]
    api = load_client(str(cluster.kubeconfig))
    lease = f"op-{uuid.uuid4().hex[:6]}"

    def replica(identity: str) -> Election:
        def lost(why: str) -> None:  # the process would end here; the thread ends instead
            stops[identity] = time.monotonic()

        settings = ElectionSettings(lease, "default", identity=identity, **FAST)
        return Election(settings, api, on_lost=lost)

    made = [replica(f"replica-{i}") for i in range(2)]
    yield made
    for e in made:
        e._lock.closed = True  # the threads are daemons; they must stop writing
    cluster.kubectl("delete", "lease", lease, "-n", "default", check=False)


def holder(cluster, name: str) -> str:  # type: ignore[no-untyped-def]
    out = cluster.kubectl(
        "get", "lease", name, "-n", "default", "-o", "jsonpath={.spec.holderIdentity}"
    )
    return str(out.stdout)


def first_elected(replicas: list[Election], timeout: float) -> Election | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in replicas:
            if e.elected.is_set():
                return e
        time.sleep(0.05)
    return None


def test_one_replica_leads_and_the_other_takes_over_when_it_hands_the_lease_back(
    cluster, replicas: list[Election], stops: dict[str, float]
) -> None:
    for e in replicas:
        e.start()
    first = first_elected(replicas, 15)
    assert first is not None, "nobody leads"
    second = next(e for e in replicas if e is not first)
    assert not second.elected.wait(FAST["lease_duration_s"] + 2), "two replicas lead"
    assert holder(cluster, first.settings.lease) == first.settings.identity

    handed = time.monotonic()
    first.release()
    assert second.elected.wait(FAST["retry_period_s"] + 3), "nobody took the Lease handed back"
    assert time.monotonic() - handed < FAST["lease_duration_s"], "waited for the Lease to expire"
    assert holder(cluster, first.settings.lease) == second.settings.identity
    assert second.settings.identity not in stops


def test_a_leader_that_cannot_renew_stops_before_anyone_else_leads(
    cluster, replicas: list[Election], stops: dict[str, float]
) -> None:
    for e in replicas:
        e.start()
    first = first_elected(replicas, 15)
    assert first is not None
    second = next(e for e in replicas if e is not first)
    first._lock.closed = True  # its renewals fail from now on, as with a partitioned pod
    assert second.elected.wait(FAST["lease_duration_s"] + FAST["renew_deadline_s"] + 5)
    took_over = time.monotonic()
    assert first.settings.identity in stops, "the old leader kept running"
    assert stops[first.settings.identity] < took_over
    assert second.settings.identity not in stops


def test_a_follower_answers_its_health_probe_while_its_election_runs(
    replicas: list[Election], stops: dict[str, float]
) -> None:
    follower = replicas[0]
    port = free_port()
    with FollowerHealth(port, follower):
        url = f"http://127.0.0.1:{port}/healthz"
        assert httpx.get(url).status_code == 503  # no election running yet
        follower.start()
        assert httpx.get(url).status_code == 200
    # the port is free again for kopf's liveness endpoint
    with FollowerHealth(port, follower):
        pass


def test_leading_is_a_metric(cluster) -> None:  # type: ignore[no-untyped-def]
    """Each replica's own registry says whether it leads (the one its process serves)."""
    metrics = OperatorMetrics.create()
    lease = f"op-{uuid.uuid4().hex[:6]}"
    settings = ElectionSettings(lease, "default", identity="replica-m", **FAST)
    lost: list[str] = []  # by default a replica that loses its Lease ends the process
    election = Election(
        settings, load_client(str(cluster.kubeconfig)), on_lost=lost.append, metrics=metrics
    )
    try:
        assert metrics.registry.get_sample_value("kvrank_operator_leader") == 0
        election.start()
        assert election.elected.wait(15)
        assert metrics.registry.get_sample_value("kvrank_operator_leader") == 1
        election.release()
        assert metrics.registry.get_sample_value("kvrank_operator_leader") == 0
    finally:
        election._lock.closed = True  # the thread is a daemon; it must stop writing
        cluster.kubectl("delete", "lease", lease, "-n", "default", check=False)
