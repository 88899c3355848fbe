"""Day-2 of a managed Redis Cluster, for real: a node comes back empty and the cluster heals.

Cluster-mode redis-server processes stand in for the StatefulSet's pods. A pod deleted with
its ``emptyDir`` comes back as an empty node under a new id: here the same node is killed,
its ``nodes.conf`` removed and started again. The operator's :func:`check_and_heal`, called
repeatedly as the reconciler does, must report the outage (never "ok" while slots are
uncovered) and bring the cluster back to every slot served, with the stale id forgotten.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import redis
from redis.exceptions import NoPermissionError
from redis_nodes import addrs, run_bootstrap

from kvrank.tools.processes import RedisServer, free_port_pair
from kvrank_common import RANKER_REDIS_USER, acl_rules
from kvrank_operator.manifests import bootstrap_script
from kvrank_operator.redis_cluster import AclUser, Health, check_and_heal, parse_nodes

pytestmark = pytest.mark.redis
PASSWORD = "s3cret-day2"


def start_nodes(tmp_path: Path, count: int) -> list[RedisServer]:
    return [
        RedisServer(free_port_pair(), tmp_path / f"n{i}", cluster=True, password=PASSWORD).start()
        for i in range(count)
    ]


@pytest.fixture
def nodes(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[RedisServer]]:
    started = start_nodes(tmp_path, request.param)
    try:
        yield started
    finally:
        for s in started:
            s.stop()


def heal_until_ok(
    nodes: list[RedisServer], replicas: int, timeout: float = 60, users: Sequence[AclUser] = ()
) -> list[Health]:
    """What the operator's resync does: check (and heal a step) every second until ok."""
    seen: list[Health] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        health = check_and_heal(addrs(nodes), PASSWORD, len(nodes), replicas, None, users)
        seen.append(health)
        if health.ok:
            return seen
        time.sleep(1)
    raise AssertionError(f"not healed in {timeout}s: {[(h.reason, h.actions) for h in seen]}")


def restart_empty(node: RedisServer) -> str:
    """Kill a node and bring it back without its nodes.conf and at a new address: a pod
    re-created by its StatefulSet, on a fresh emptyDir, with a new pod IP."""
    old_id = node.cli("cluster", "myid").stdout.strip()
    node.stop()
    shutil.rmtree(node.workdir)
    node.port = free_port_pair()
    node.start()
    assert node.cli("cluster", "myid").stdout.strip() != old_id
    return old_id


@pytest.mark.parametrize("nodes", [3], indirect=True)
def test_a_master_back_empty_takes_its_slots_back(nodes: list[RedisServer]) -> None:
    assert run_bootstrap(bootstrap_script(0), nodes, PASSWORD).returncode == 0
    assert check_and_heal(addrs(nodes), PASSWORD, 3, 0).ok
    old_id = restart_empty(nodes[2])

    seen = heal_until_ok(nodes, replicas=0)

    assert not seen[0].ok and seen[0].reason in ("SlotsUncovered", "NodesNotJoined"), seen[0]
    actions = [a for h in seen for a in h.actions]
    assert any("introduced" in a for a in actions), actions
    assert any(f"forgot node {old_id[:8]}" in a for a in actions), actions
    assert any("uncovered slots" in a for a in actions), actions
    for n in nodes:
        info = n.cli("cluster", "info").stdout
        assert "cluster_state:ok" in info and "cluster_slots_assigned:16384" in info, info
        known = parse_nodes(n.cli("cluster", "nodes").stdout)
        assert old_id not in {p.node_id for p in known}
        assert len(known) == 3
    assert nodes[0].cli("-c", "set", "after-heal", "1").stdout.strip() == "OK"


@pytest.mark.slow
@pytest.mark.parametrize("nodes", [6], indirect=True)
def test_a_node_back_empty_rejoins_as_a_replica(nodes: list[RedisServer]) -> None:
    assert run_bootstrap(bootstrap_script(1), nodes, PASSWORD).returncode == 0
    deadline = time.monotonic() + 30  # a replica that never synced may not be promoted
    while any("master_link_status:down" in n.cli("info", "replication").stdout for n in nodes):
        assert time.monotonic() < deadline, "replicas did not sync"
        time.sleep(0.2)
    master = next(n for n in nodes if n.cli("role").stdout.split()[0] == "master")
    old_id = restart_empty(master)  # its replica is promoted by Redis itself

    seen = heal_until_ok(nodes, replicas=1)

    actions = [a for h in seen for a in h.actions]
    assert any("a replica of" in a for a in actions), actions
    roles = sorted(n.cli("role").stdout.split()[0] for n in nodes)
    assert roles == ["master"] * 3 + ["slave"] * 3
    for n in nodes:
        assert old_id not in n.cli("cluster", "nodes").stdout


@pytest.mark.slow
@pytest.mark.parametrize("nodes", [3], indirect=True)
def test_a_node_that_does_not_answer_is_reported_not_healed_around(
    nodes: list[RedisServer],
) -> None:
    assert run_bootstrap(bootstrap_script(0), nodes, PASSWORD).returncode == 0
    nodes[1].stop()
    health = check_and_heal(addrs(nodes), PASSWORD, 3, 0)
    assert not health.ok and health.reason == "NodesUnreachable"
    assert str(nodes[1].port) in health.message
    assert not any("forgot" in a for a in health.actions)
    missing = check_and_heal(addrs(nodes)[:2], PASSWORD, 3, 0)
    assert not missing.ok and missing.reason == "NodesMissing" and not missing.actions


@pytest.mark.parametrize("nodes", [3], indirect=True)
def test_the_rankers_acl_user_is_set_on_every_node_and_again_on_one_back_empty(
    nodes: list[RedisServer],
) -> None:
    """The rankers authenticate as an ACL user the operator sets on every node: it reads and
    writes its deployment's keys and nothing else (no other deployment's keys, no FLUSHALL,
    no CONFIG). ACLs live per node and in memory: a node back empty has none, and the next
    check sets the user there again, saying so."""
    assert run_bootstrap(bootstrap_script(0), nodes, PASSWORD).returncode == 0
    user = AclUser(RANKER_REDIS_USER, "ranker-pw", tuple(acl_rules("feed-3f9a2c81.*")))
    created = {f"created ACL user 'ranker' on {a}" for a in addrs(nodes)}
    assert set(heal_until_ok(nodes, 0, users=[user])[-1].actions) == created
    assert check_and_heal(addrs(nodes), PASSWORD, 3, 0, None, [user]).actions == []
    as_ranker = {"username": "ranker", "password": "ranker-pw", "socket_timeout": 5}
    cluster = redis.RedisCluster(host="127.0.0.1", port=nodes[0].port, **as_ranker)
    try:
        for i in range(20):  # keys over every node's slots
            cluster.set(f"kvrank:feed-3f9a2c81.v1:user-{i}:h", b"entry")
            assert cluster.get(f"kvrank:feed-3f9a2c81.v1:user-{i}:h") == b"entry"
    finally:
        cluster.close()
    for node in nodes:
        with redis.Redis(host="127.0.0.1", port=node.port, **as_ranker) as plain:
            for refused in (
                ("SET", "kvrank:ads-0b7e44d2.v1:user-1:h", "x"),  # another deployment's
                ("GET", "other:key"),
                ("FLUSHALL",),
                ("CONFIG", "GET", "dir"),
            ):
                with pytest.raises(NoPermissionError):
                    plain.execute_command(*refused)
    restart_empty(nodes[2])
    seen = heal_until_ok(nodes, 0, users=[user])
    back = f"created ACL user 'ranker' on 127.0.0.1:{nodes[2].port}"
    assert any(back in h.actions for h in seen), [h.actions for h in seen]
    with redis.Redis(host="127.0.0.1", port=nodes[2].port, **as_ranker) as restarted:
        assert restarted.ping()
