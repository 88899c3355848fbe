"""The managed Redis Cluster's bootstrap Job script, run for real against redis-servers.

The script the operator puts in the bootstrap Job is executed with ``sh`` against six
password-protected cluster-mode redis-server processes (3 shards × 1 replica), with the
Job's environment (``NODES``, ``REDIS_PASSWORD``): it must form the cluster with every slot
covered, be a no-op when run again, and refuse to re-create over nodes that hold data.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis_nodes import run_bootstrap

from kvrank.tools.processes import RedisServer, free_port_pair
from kvrank_operator.manifests import bootstrap_script, managed_redis
from kvrank_operator.spec import parse_spec

pytestmark = pytest.mark.redis
PASSWORD = "s3cret-bootstrap"


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[RedisServer]]:
    started: list[RedisServer] = []
    try:
        for i in range(6):
            server = RedisServer(
                free_port_pair(), tmp_path / f"n{i}", cluster=True, password=PASSWORD
            )
            started.append(server.start())
        yield started
    finally:
        for s in started:
            s.stop()


def run_job(script: str, nodes: list[RedisServer]) -> subprocess.CompletedProcess[str]:
    return run_bootstrap(script, nodes, PASSWORD)


def test_the_jobs_script_is_the_one_tested_here() -> None:
    spec = parse_spec({"model": {"version": "v1", "uri": "/m"}, "cache": {"redis": {}}})
    job = next(o for o in managed_redis(spec, "feed", "prod", ("pw", "rpw")) if o["kind"] == "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["sh", "-c", bootstrap_script(1)]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODES"]["value"].split() == [
        f"feed-redis-{i}.feed-redis-headless.prod.svc:6379" for i in range(6)
    ]
    assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "feed-redis-auth"


def test_bootstrap_forms_the_cluster_once(nodes: list[RedisServer]) -> None:
    first = run_job(bootstrap_script(1), nodes)
    assert first.returncode == 0, first.stdout + first.stderr
    for n in nodes:  # the Job ends only once every node agrees the cluster is up
        info = n.cli("cluster", "info").stdout
        assert "cluster_state:ok" in info and "cluster_slots_assigned:16384" in info, info
        assert "cluster_size:3" in info, info
    roles = [n.cli("role").stdout.split()[0] for n in nodes]
    assert sorted(roles) == ["master"] * 3 + ["slave"] * 3
    nodes[0].cli("-c", "set", "k", "v")
    again = run_job(bootstrap_script(1), nodes)
    assert again.returncode == 0 and "already formed: nothing to do" in again.stdout
    assert nodes[0].cli("-c", "get", "k").stdout.strip() == "v"


def test_bootstrap_refuses_to_recreate_over_data(nodes: list[RedisServer]) -> None:
    # a node that already holds data (e.g. a lost nodes.conf): never wipe it by re-creating
    slot = nodes[3].cli("cluster", "keyslot", "kept").stdout.strip()
    nodes[3].cli("cluster", "addslots", slot)
    nodes[3].cli("config", "set", "cluster-require-full-coverage", "no")
    deadline = time.monotonic() + 10  # the node re-evaluates its cluster state on its cron
    while nodes[3].cli("set", "kept", "1").stdout.strip() != "OK":
        assert time.monotonic() < deadline, "could not write a key to the lone node"
        time.sleep(0.1)
    out = run_job(bootstrap_script(1), nodes)
    assert out.returncode != 0
    assert "refusing to re-create" in out.stdout
