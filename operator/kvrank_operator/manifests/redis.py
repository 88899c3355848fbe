"""The managed Redis Cluster's objects: config, auth Secret, headless Service, StatefulSet,
the bootstrap Job that forms the cluster once, its NetworkPolicy and PodDisruptionBudget.
Pure: the typed spec (and the passwords the caller generated) in, plain dicts out."""

from __future__ import annotations

from typing import Any

from kvrank_common import PROBE_TIMEOUT_S, RANKER_REDIS_USER
from kvrank_operator.certs import CA_FILE, CERT_FILE, KEY_FILE
from kvrank_operator.manifests.common import (
    BOOTSTRAP_RESOURCES,
    NO_API_TOKEN,
    REDIS_PORT,
    TLS_CA_FILE,
    TLS_DIR,
    image_tag,
    labels,
    redis_name,
    restricted_container,
    restricted_pod,
    selector,
    tls_ca_mount,
    tls_secret_name,
    with_defaults,
)
from kvrank_operator.spec import RankerSpec, RedisSpec, parse_quantity

REDIS_UID = 10001
"""The user Redis runs as (kvrank's redis image's; any redis image runs under it: the data
folder is an emptyDir or volume the pod's fsGroup owns)."""
REDIS_CPU = "100m"
"""Requested unless ``resources`` name a CPU amount: a node's share for a cache server."""
LOG_HEADROOM = 256 * 2**20
OPERATOR_POD_LABEL = "kvrank.io/operator"
"""On the chart's operator pods: Redis admits them (they read every node's cluster state)."""
AUTH_DIR = "/run/redis-auth"
"""A memory-backed emptyDir where the password becomes a config file redis-server includes:
never on a command line (``/proc/*/cmdline`` is world-readable on the node), never on disk."""
START_REDIS = (
    "umask 077\n"
    f'printf \'requirepass "%s"\\nmasterauth "%s"\\n\' "$REDIS_PASSWORD" "$REDIS_PASSWORD"'
    f" > {AUTH_DIR}/auth.conf\n"
    "exec redis-server /conf/redis.conf\n"
)
"""The password is written by the shell's builtin ``printf``: no process sees it in argv."""


def redis_cli(tls_ca: str | None) -> str:
    """The ``redis-cli`` command line, over TLS verified against ``tls_ca`` when given."""
    return f"redis-cli --tls --cacert {tls_ca}" if tls_ca else "redis-cli"


def bootstrap_script(replicas_per_shard: int, tls_ca: str | None = None) -> str:
    """Forms the managed Redis Cluster from ``$NODES`` (``host:port`` …), idempotently: waits
    for every node, does nothing when all 16384 slots are assigned, refuses to re-create
    over a node that holds data, then ``redis-cli --cluster create`` and waits until every
    node reports ``cluster_state:ok`` (the Job's success means the cluster is usable).
    ``tls_ca``: the nodes speak TLS only, signed by this CA."""
    cli = redis_cli(tls_ca)
    return (
        # redis-cli reads the password from REDISCLI_AUTH: it never shows in a process list
        'set -eu\nexport REDISCLI_AUTH="$REDIS_PASSWORD"\n'
        f'for h in $NODES; do until {cli} -h "${{h%:*}}" -p "${{h##*:}}" ping; do sleep 2;'
        " done; done\n"
        'first="${NODES%% *}"\n'
        f'if {cli} -h "${{first%:*}}" -p "${{first##*:}}" cluster info'
        ' | grep -q "cluster_slots_assigned:16384"; then\n'
        '  echo "cluster already formed: nothing to do"; exit 0; fi\n'
        "for h in $NODES; do\n"
        f'  keys=$({cli} -h "${{h%:*}}" -p "${{h##*:}}" dbsize)\n'
        '  if [ "$keys" != "0" ]; then\n'
        '    echo "node $h holds $keys keys: refusing to re-create"; exit 1; fi\n'
        "done\n"
        f"{cli} --cluster create $NODES --cluster-replicas {replicas_per_shard}"
        " --cluster-yes\n"
        # done means usable: every node has agreed on the new configuration
        "for h in $NODES; do\n"
        f'  until {cli} -h "${{h%:*}}" -p "${{h##*:}}" cluster info'
        ' | grep -q "cluster_state:ok"; do sleep 1; done; done\n'
        'echo "cluster formed"\n'
    )


def tls_dns_names(instance: str, namespace: str) -> list[str]:
    """What the nodes' certificate names: every pod behind the headless Service."""
    headless = f"{redis_name(instance)}-headless.{namespace}.svc"
    return [f"*.{headless}", f"*.{headless}.cluster.local", headless]


def managed_redis(
    spec: RankerSpec,
    instance: str,
    namespace: str,
    passwords: tuple[str, str],
    tls: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """ConfigMap + auth Secrets (+ TLS Secret) + headless Service + StatefulSet + bootstrap
    Job + NetworkPolicy + PDB, in the order they are applied. ``passwords``: the ``default``
    user's (the operator's and the bootstrap Job's) and the rankers' ACL user's (the
    operator sets that user on every node once the cluster has formed). ``tls``: freshly
    generated material for the TLS Secret (used when TLS is on without a Secret of the
    user's)."""
    r, name = spec.cache.redis, redis_name(instance)
    rl, uid = selector(instance, "redis"), spec.ids(REDIS_UID)
    meta_labels = labels(instance, "redis", image_tag(r.image))

    def obj(api: str, kind: str, suffix: str = "", **body: Any) -> dict[str, Any]:
        meta = {"name": name + suffix, "namespace": namespace, "labels": meta_labels}
        return {"apiVersion": api, "kind": kind, "metadata": meta, **body}

    generated_tls = []
    if r.tls and not r.tls_secret:
        assert tls is not None, "managed Redis with TLS needs generated material"
        generated_tls.append(obj("v1", "Secret", "-tls", type="kubernetes.io/tls", stringData=tls))
    return [
        obj("v1", "ConfigMap", "-conf", data={"redis.conf": _redis_conf(r)}),
        obj("v1", "Secret", "-auth", type="Opaque", stringData={"password": passwords[0]}),
        obj(
            "v1",
            "Secret",
            "-ranker-auth",
            type="Opaque",
            stringData={"username": RANKER_REDIS_USER, "password": passwords[1]},
        ),
        *generated_tls,
        obj("v1", "Service", "-headless", spec=_headless_service(rl)),
        obj("apps/v1", "StatefulSet", spec=_sts(r, instance, rl, uid)),
        _bootstrap_job(
            r, instance, namespace, obj("batch/v1", "Job", "-bootstrap")["metadata"], uid
        ),
        obj(
            "networking.k8s.io/v1",
            "NetworkPolicy",
            spec=_network_policy(instance, rl, spec.operator_namespace),
        ),
        obj(
            "policy/v1",
            "PodDisruptionBudget",
            spec={"maxUnavailable": 1, "selector": {"matchLabels": rl}},
        ),
    ]


def _headless_service(selector: dict[str, str]) -> dict[str, Any]:
    """Stable DNS names for the nodes, ready or not (a forming cluster needs them all)."""
    return {
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        "selector": selector,
        "ports": [
            {"name": "redis", "port": REDIS_PORT},
            {"name": "bus", "port": REDIS_PORT + 10000},
        ],
    }


def _nodes(r: RedisSpec) -> int:
    return r.shards * (1 + r.replicas_per_shard)


def _redis_conf(r: RedisSpec) -> str:
    return (
        f"include {AUTH_DIR}/auth.conf\n"
        "cluster-enabled yes\ncluster-config-file /data/nodes.conf\n"
        "cluster-node-timeout 5000\nappendonly "
        + ("yes" if r.persistence else "no")
        + f"\nmaxmemory {parse_quantity(r.memory) * 9 // 10}\nmaxmemory-policy allkeys-lru\n"
        + (tls_conf(TLS_DIR) if r.tls else "")
    )


def tls_conf(directory: str) -> str:
    """TLS only, on the usual ports: clients, replication and the cluster bus. Clients prove
    themselves with the password, not with a certificate."""
    return (
        f"port 0\ntls-port {REDIS_PORT}\n"
        f"tls-cert-file {directory}/{CERT_FILE}\ntls-key-file {directory}/{KEY_FILE}\n"
        f"tls-ca-cert-file {directory}/{CA_FILE}\n"
        "tls-auth-clients no\ntls-replication yes\ntls-cluster yes\n"
    )


def _auth_env(name: str) -> list[dict[str, Any]]:
    secret = {"secretKeyRef": {"name": f"{name}-auth", "key": "password"}}
    return [{"name": "REDIS_PASSWORD", "valueFrom": secret}]


def _sts(r: RedisSpec, instance: str, rl: dict[str, str], uid: int | None) -> dict[str, Any]:
    """Parallel start (the bootstrap Job waits for all); emptyDir data unless persistent.
    The pods carry the selecting labels only: a label added to the template would restart
    every Redis node (and drop its keys) when the operator is upgraded."""
    name = redis_name(instance)
    tls_secret = tls_secret_name(instance, r)
    # group-readable: the key file belongs to root, the pod's fsGroup is redis's group
    tls = [{"name": "tls", "secret": {"secretName": tls_secret, "defaultMode": 0o440}}]
    sts: dict[str, Any] = {
        "serviceName": f"{name}-headless",
        "replicas": _nodes(r),
        "podManagementPolicy": "Parallel",
        "selector": {"matchLabels": rl},
        "template": {
            "metadata": {"labels": rl},
            "spec": {
                **NO_API_TOKEN,
                "securityContext": restricted_pod(uid, fs_group=uid),
                "containers": [_redis_container(r, name)],
                # a shard and its replica on one node, or in one zone, would fail together
                "topologySpreadConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": key,
                        "whenUnsatisfiable": "ScheduleAnyway",
                        "labelSelector": {"matchLabels": rl},
                    }
                    for key in ("kubernetes.io/hostname", "topology.kubernetes.io/zone")
                ],
                **{k: v for k, v in _scheduling(r).items() if v},
                "volumes": [
                    {"name": "conf", "configMap": {"name": f"{name}-conf"}},
                    {"name": "auth", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                    *(tls if tls_secret else []),
                    *([] if r.persistence else [{"name": "data", "emptyDir": {}}]),
                ],
            },
        },
    }
    if r.persistence:
        claim = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": r.memory}}}
        sts["volumeClaimTemplates"] = [{"metadata": {"name": "data"}, "spec": claim}]
    return sts


def _scheduling(r: RedisSpec) -> dict[str, Any]:
    return {"nodeSelector": r.node_selector, "tolerations": r.tolerations, "affinity": r.affinity}


def _redis_container(r: RedisSpec, name: str) -> dict[str, Any]:
    ca = TLS_CA_FILE if r.tls else None
    ping = f'REDISCLI_AUTH="$REDIS_PASSWORD" {redis_cli(ca)} ping'
    tls = [{"name": "tls", "mountPath": TLS_DIR, "readOnly": True}] if r.tls else []
    return {
        "name": "redis",
        "image": r.image,
        "command": ["sh", "-c", START_REDIS],
        "env": _auth_env(name),
        "ports": [
            {"name": "redis", "containerPort": REDIS_PORT},
            {"name": "bus", "containerPort": REDIS_PORT + 10000},
        ],
        "resources": redis_resources(r),
        "readinessProbe": {
            "exec": {"command": ["sh", "-c", ping]},
            "periodSeconds": 5,
            "timeoutSeconds": PROBE_TIMEOUT_S,
        },
        "volumeMounts": [
            {"name": "conf", "mountPath": "/conf"},
            {"name": "auth", "mountPath": AUTH_DIR},
            *tls,
            {"name": "data", "mountPath": "/data"},
        ],
        "securityContext": restricted_container(),
    }


def redis_resources(r: RedisSpec) -> dict[str, Any]:
    """Memory requested and limited to ``memory`` unless ``resources`` say otherwise; a CPU
    request and the ephemeral storage it writes (its log, ``nodes.conf`` and, without
    persistence, a replica's full-sync RDB: up to ``memory``) unless set."""
    base = r.resources or {"requests": {"memory": r.memory}, "limits": {"memory": r.memory}}
    storage = f"{(parse_quantity(r.memory) + LOG_HEADROOM) // 2**20}Mi"
    return with_defaults(
        base, {"cpu": REDIS_CPU, "ephemeral-storage": "64Mi"}, {"ephemeral-storage": storage}
    )


def _bootstrap_job(
    r: RedisSpec, instance: str, namespace: str, metadata: dict[str, Any], uid: int | None
) -> dict[str, Any]:
    """Forms the cluster once, over the headless Service's per-pod DNS names."""
    name = redis_name(instance)
    hosts = " ".join(
        f"{name}-{i}.{name}-headless.{namespace}.svc:{REDIS_PORT}" for i in range(_nodes(r))
    )
    ca = tls_ca_mount(instance, r)
    container: dict[str, Any] = {
        "name": "bootstrap",
        "image": r.image,
        "env": [*_auth_env(name), {"name": "NODES", "value": hosts}],
        "command": [
            "sh",
            "-c",
            bootstrap_script(r.replicas_per_shard, TLS_CA_FILE if ca else None),
        ],
        "resources": BOOTSTRAP_RESOURCES,
        "securityContext": restricted_container(),
    }
    if ca:
        container["volumeMounts"] = [ca[1]]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": 20,
            "template": {
                "metadata": {"labels": labels(instance, "redis-bootstrap")},
                "spec": {
                    "restartPolicy": "OnFailure",
                    **NO_API_TOKEN,
                    "securityContext": restricted_pod(uid),
                    "containers": [container],
                    **({"volumes": [ca[0]]} if ca else {}),
                },
            },
        },
    }


def _network_policy(
    instance: str, rl: dict[str, str], operator_namespace: str | None
) -> dict[str, Any]:
    """Redis answers only this instance's rankers, its own nodes, its Jobs and the operator
    (from its own namespace when known: a pod labelled as the operator elsewhere is not it)."""
    peers: list[dict[str, Any]] = [
        {
            "podSelector": {
                "matchLabels": {
                    "app.kubernetes.io/instance": instance,
                    "app.kubernetes.io/component": c,
                }
            }
        }
        for c in ("ranker", "redis", "redis-bootstrap", "purge")
    ]
    operator = {"matchLabels": {OPERATOR_POD_LABEL: "true"}}  # the chart's operator pods
    where: dict[str, Any] = {}
    if operator_namespace:
        where = {"matchLabels": {"kubernetes.io/metadata.name": operator_namespace}}
    peers.append({"namespaceSelector": where, "podSelector": operator})
    return {
        "podSelector": {"matchLabels": rl},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": peers, "ports": [{"port": REDIS_PORT}, {"port": REDIS_PORT + 10000}]}],
    }
