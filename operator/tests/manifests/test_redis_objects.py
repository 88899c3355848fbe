"""The managed Redis Cluster's objects: nodes, bootstrap Job, password and TLS handling."""

from __future__ import annotations

import json

from spec_fragments import example, first_container

from kvrank_operator import manifests as m
from kvrank_operator.spec import parse_quantity, parse_spec


def test_managed_redis_objects() -> None:
    spec = parse_spec(example("basic.yaml"))
    made = m.managed_redis(spec, "feed", "prod", ("s3cret", "r4nker"))
    objs = {o["kind"]: o for o in made}
    assert objs["StatefulSet"]["spec"]["replicas"] == 6  # 3 shards × (1 + 1 replica)
    secrets = {o["metadata"]["name"]: o["stringData"] for o in made if o["kind"] == "Secret"}
    # the default user's (the operator's) apart from the rankers' ACL user's
    assert secrets == {
        "feed-redis-auth": {"password": "s3cret"},
        "feed-redis-ranker-auth": {"username": "ranker", "password": "r4nker"},
    }
    script = objs["Job"]["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert "cluster_slots_assigned:16384" in script and "refusing to re-create" in script
    assert "--cluster-replicas 1" in script
    allowed = [
        f.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component")
        for f in objs["NetworkPolicy"]["spec"]["ingress"][0]["from"]
    ]
    assert "ranker" in allowed and "redis" in allowed
    assert objs["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1


def test_redis_requests_cpu_and_storage_unless_its_resources_say_otherwise() -> None:
    spec = parse_spec(example("basic.yaml"))
    sts = next(
        o
        for o in m.managed_redis(spec, "feed", "prod", ("pw", "rpw"))
        if o["kind"] == "StatefulSet"
    )
    res = first_container(sts)["resources"]
    memory = spec.cache.redis.memory
    assert res["requests"] == {"memory": memory, "cpu": "100m", "ephemeral-storage": "64Mi"}
    assert res["limits"]["memory"] == memory and res["limits"]["ephemeral-storage"].endswith("Mi")
    # a replica's full sync writes up to the data set (memory) to disk, plus logs
    assert int(res["limits"]["ephemeral-storage"][:-2]) * 2**20 > parse_quantity(memory)
    own = {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}}
    spec = parse_spec({**example("basic.yaml"), "cache": {"redis": {"resources": own}}})
    sts = next(
        o
        for o in m.managed_redis(spec, "feed", "prod", ("pw", "rpw"))
        if o["kind"] == "StatefulSet"
    )
    assert first_container(sts)["resources"]["requests"]["cpu"] == "2"
    # uid and gid above 10000 (clear of the host's users), any redis image runs under them
    security = sts["spec"]["template"]["spec"]["securityContext"]
    assert security["runAsUser"] > 10000 and security["runAsGroup"] > 10000


def test_managed_redis_spreads_over_nodes_and_zones_and_takes_scheduling_knobs() -> None:
    doc = example("basic.yaml")
    doc["cache"]["redis"].update(
        resources={"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"memory": "2Gi"}},
        nodeSelector={"pool": "cache"},
        tolerations=[{"key": "cache", "operator": "Exists", "effect": "NoSchedule"}],
    )
    objs = {o["kind"]: o for o in m.managed_redis(parse_spec(doc), "feed", "prod", ("pw", "rpw"))}
    pod = objs["StatefulSet"]["spec"]["template"]["spec"]
    spread = {c["topologyKey"]: c for c in pod["topologySpreadConstraints"]}
    assert spread.keys() == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    # preferred, not required: a one-zone (or one-node) cluster still schedules them
    assert {c["whenUnsatisfiable"] for c in spread.values()} == {"ScheduleAnyway"}
    assert pod["nodeSelector"] == {"pool": "cache"} and pod["tolerations"][0]["key"] == "cache"
    assert "affinity" not in pod
    assert pod["containers"][0]["resources"]["requests"]["cpu"] == "500m"
    basic = parse_spec(example("basic.yaml"))
    default = {o["kind"]: o for o in m.managed_redis(basic, "f", "p", ("x", "y"))}
    limits = default["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert limits["limits"]["memory"] == limits["requests"]["memory"]


def test_the_redis_password_is_on_no_command_line() -> None:
    basic = parse_spec(example("basic.yaml"))
    objs = {o["kind"]: o for o in m.managed_redis(basic, "f", "p", ("pw", "rpw"))}
    sts_pod = objs["StatefulSet"]["spec"]["template"]["spec"]
    job_pod = objs["Job"]["spec"]["template"]["spec"]
    for container in (*sts_pod["containers"], *job_pod["containers"]):
        text = json.dumps({k: container.get(k) for k in ("command", "args", "readinessProbe")})
        assert "--requirepass" not in text and "-a " not in text, text
    auth = next(v for v in sts_pod["volumes"] if v["name"] == "auth")
    assert auth["emptyDir"]["medium"] == "Memory"  # the password file never touches a disk
    assert "include /run/redis-auth/auth.conf" in objs["ConfigMap"]["data"]["redis.conf"]


def test_managed_tls_with_a_secret_of_ones_own_generates_none() -> None:
    spec = parse_spec(
        {
            "model": {"version": "v1", "uri": "/m"},
            "cache": {"redis": {"mode": "managed", "tls": True, "tlsSecretName": "from-cm"}},
        }
    )
    objs = m.managed_redis(spec, "feed", "prod", ("pw", "rpw"))
    assert not [o for o in objs if o["kind"] == "Secret" and o["metadata"]["name"].endswith("-tls")]
    pod = next(o for o in objs if o["kind"] == "StatefulSet")["spec"]["template"]["spec"]
    assert {"name": "tls", "secret": {"secretName": "from-cm", "defaultMode": 0o440}} in pod[
        "volumes"
    ]
    dep = m.deployment(spec, "feed", "prod", "v1", "/m", 1, "stable")
    volumes = dep["spec"]["template"]["spec"]["volumes"]
    assert {
        "name": "redis-tls",
        "secret": {"secretName": "from-cm", "items": [{"key": "ca.crt", "path": "ca.crt"}]},
    } in volumes
