"""Pure builders of the Kubernetes objects a ``RankerDeployment`` owns.

Every function takes the typed spec (and the resource's name/namespace) and returns plain
dicts; no API calls, no randomness except where a caller passes it in. Owner references
are added by the reconciler, which knows the owner's UID.
"""

from __future__ import annotations

import hashlib
from typing import Any

import yaml

from kvrank_operator.spec import MODELS_MOUNT, RankerSpec, namespace_for

NAME = "kvrank-ranker"
CONFIG_MOUNT = "/etc/kvrank"
CONFIG_FILE = f"{CONFIG_MOUNT}/ranker.yaml"
PASSWORD_FILE = f"{CONFIG_MOUNT}/redis/password"
MODEL_CACHE_MOUNT = "/var/cache/kvrank"
REDIS_PORT = 6379
STARTUP_BUDGET_S = 600
"""How long a ranker may take to download, load and warm up its model before the kubelet's
liveness probe may kill it (a startupProbe holds liveness off until then)."""
BOOTSTRAP_RESOURCES = {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}}
PURGE_RESOURCES = {"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}}
"""``kvrank cache purge`` runs from the ranker image and loads torch with the cache code
(about 700 MB resident, measured)."""


def restricted_pod(uid: int, fs_group: int | None = None) -> dict[str, Any]:
    """Pod-level security that Pod Security ``restricted`` admits."""
    ctx: dict[str, Any] = {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if fs_group is not None:
        ctx["fsGroup"] = fs_group
    return ctx


def restricted_container() -> dict[str, Any]:
    """Container-level security that Pod Security ``restricted`` admits (and a read-only root)."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def labels(instance: str, component: str = "ranker") -> dict[str, str]:
    return {
        "app.kubernetes.io/name": NAME,
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": "kvrank-operator",
    }


def version_labels(instance: str, version: str) -> dict[str, str]:
    return {**labels(instance), "kvrank.io/version": version}


def deployment_name(instance: str, version: str) -> str:
    return f"{instance}-{version}"[:63].rstrip("-.")


def redis_name(instance: str) -> str:
    return f"{instance}-redis"


def redis_url(spec: RankerSpec, instance: str, namespace: str) -> tuple[str, bool]:
    """The L2 endpoint rankers use, and whether it is a cluster."""
    r = spec.cache.redis
    if r.mode == "external":
        assert r.url is not None
        return r.url, r.cluster
    host = f"{redis_name(instance)}-0.{redis_name(instance)}-headless.{namespace}.svc"
    return f"redis://{host}:{REDIS_PORT}", True


def password_secret(spec: RankerSpec, instance: str) -> tuple[str, str] | None:
    r = spec.cache.redis
    if r.mode == "managed":
        return f"{redis_name(instance)}-auth", "password"
    return r.password_secret


def ranker_config(spec: RankerSpec, instance: str, namespace: str, ttl_s: float | None) -> str:
    """The ``ranker.yaml`` pods read (and hot-reload: the ``ttl`` section)."""
    url, cluster = redis_url(spec, instance, namespace)
    redis: dict[str, Any] = {"url": url, "cluster": cluster}
    if password_secret(spec, instance):
        redis["password_file"] = PASSWORD_FILE
    fixed = spec.ttl.fixed_seconds if spec.ttl.mode == "fixed" else ttl_s
    doc = {
        "l1_bytes": spec.cache.l1_bytes,
        "kv_dtype": spec.cache.kv_dtype,
        "redis": redis,
        "ttl": spec.ttl.ranker_settings(fixed),
    }
    return yaml.safe_dump(doc, sort_keys=True)


def config_map(
    spec: RankerSpec, instance: str, namespace: str, ttl_s: float | None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{instance}-config",
            "namespace": namespace,
            "labels": labels(instance),
        },
        "data": {"ranker.yaml": ranker_config(spec, instance, namespace, ttl_s)},
    }


def deployment(
    spec: RankerSpec,
    instance: str,
    namespace: str,
    version: str,
    uri: str,
    replicas: int,
    role: str,
) -> dict[str, Any]:
    sel = version_labels(instance, version)
    env = [
        {"name": "KVRANK_MODEL_DIR", "value": uri},
        {"name": "KVRANK_NAMESPACE", "value": namespace_for(version)},
        {"name": "KVRANK_MODEL_VERSION", "value": version},
        {"name": "KVRANK_CONFIG_FILE", "value": CONFIG_FILE},
        {"name": "KVRANK_MODEL_CACHE_DIR", "value": MODEL_CACHE_MOUNT},
        {"name": "KVRANK_HOST", "value": "0.0.0.0"},
        {"name": "KVRANK_PORT", "value": str(spec.port)},
        *spec.model.env,
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": f"{instance}-config"}},
        # artifacts given by URL are downloaded here (the root filesystem is read-only)
        {"name": "model-cache", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True},
        {"name": "model-cache", "mountPath": MODEL_CACHE_MOUNT},
    ]
    if spec.model.volume:
        volumes.append({"name": "models", **spec.model.volume})
        mounts.append({"name": "models", "mountPath": MODELS_MOUNT, "readOnly": True})
    secret = password_secret(spec, instance)
    if secret:
        volumes.append(
            {
                "name": "redis-auth",
                "secret": {
                    "secretName": secret[0],
                    "items": [{"key": secret[1], "path": "password"}],
                },
            }
        )
        mounts.append(
            {"name": "redis-auth", "mountPath": f"{CONFIG_MOUNT}/redis", "readOnly": True}
        )
    probe = {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5}
    pod_spec: dict[str, Any] = {
        "securityContext": restricted_pod(10001, fs_group=10001),
        "containers": [
            {
                "name": "ranker",
                "image": spec.model.image,
                "args": ["serve"],
                "ports": [{"name": "http", "containerPort": spec.port}],
                "env": env,
                "resources": spec.model.resources,
                "readinessProbe": probe,
                # download + load + warm-up may take minutes; liveness starts after it
                "startupProbe": {
                    "httpGet": {"path": "/healthz", "port": "http"},
                    "periodSeconds": 5,
                    "failureThreshold": STARTUP_BUDGET_S // 5,
                },
                "livenessProbe": {
                    "httpGet": {"path": "/healthz", "port": "http"},
                    "periodSeconds": 10,
                    "failureThreshold": 3,
                },
                "volumeMounts": mounts,
                "securityContext": restricted_container(),
            }
        ],
        "volumes": volumes,
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": sel},
            }
        ],
        "terminationGracePeriodSeconds": 30,
    }
    for key, value in (
        ("nodeSelector", spec.model.node_selector),
        ("tolerations", spec.model.tolerations),
        ("affinity", spec.model.affinity),
    ):
        if value:
            pod_spec[key] = value
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": deployment_name(instance, version),
            "namespace": namespace,
            "labels": {**sel, "kvrank.io/role": role},
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": sel},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": {
                "metadata": {
                    "labels": sel,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(spec.port),
                    },
                },
                "spec": pod_spec,
            },
        },
    }


def services(spec: RankerSpec, instance: str, namespace: str) -> list[dict[str, Any]]:
    """One Service over every version, plus one per version (for routers)."""
    port = [{"name": "http", "port": spec.port, "targetPort": "http"}]
    out = [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": instance, "namespace": namespace, "labels": labels(instance)},
            "spec": {
                "type": spec.service_type,
                "selector": {
                    "app.kubernetes.io/instance": instance,
                    "app.kubernetes.io/component": "ranker",
                },
                "ports": port,
            },
        }
    ]
    for version, _ in spec.versions():
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {
                    "name": deployment_name(instance, version),
                    "namespace": namespace,
                    "labels": version_labels(instance, version),
                },
                "spec": {
                    "type": "ClusterIP",
                    "selector": version_labels(instance, version),
                    "ports": port,
                },
            }
        )
    return out


def pod_disruption_budget(instance: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": instance, "namespace": namespace, "labels": labels(instance)},
        "spec": {
            "maxUnavailable": 1,
            "selector": {
                "matchLabels": {
                    "app.kubernetes.io/instance": instance,
                    "app.kubernetes.io/component": "ranker",
                }
            },
        },
    }


def purge_job(spec: RankerSpec, instance: str, namespace: str, cache_ns: str) -> dict[str, Any]:
    """A Job that removes one cache namespace from Redis (``kvrank cache purge``)."""
    url, cluster = redis_url(spec, instance, namespace)
    digest = hashlib.sha1(cache_ns.encode()).hexdigest()[:8]
    args = ["cache", "purge", "--namespace", cache_ns, "--redis", url]
    if cluster:
        args.append("--cluster")
    env: list[dict[str, Any]] = []
    secret = password_secret(spec, instance)
    if secret:
        env.append(
            {
                "name": "KVRANK_REDIS_PASSWORD",
                "valueFrom": {"secretKeyRef": {"name": secret[0], "key": secret[1]}},
            }
        )
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"{instance}-purge-{digest}",
            "namespace": namespace,
            "labels": {**labels(instance, "purge"), "kvrank.io/cache-namespace": cache_ns},
        },
        "spec": {
            "backoffLimit": 3,
            "ttlSecondsAfterFinished": 3600,
            "template": {
                "metadata": {"labels": labels(instance, "purge")},
                "spec": {
                    "restartPolicy": "OnFailure",
                    "securityContext": restricted_pod(10001),
                    "containers": [
                        {
                            "name": "purge",
                            "image": spec.model.image,
                            "args": args,
                            "env": env,
                            "resources": PURGE_RESOURCES,
                            "securityContext": restricted_container(),
                        }
                    ],
                },
            },
        },
    }


def bootstrap_script(replicas_per_shard: int) -> str:
    """Forms the managed Redis Cluster from ``$NODES`` (``host:port`` …), idempotently: waits
    for every node, does nothing when all 16384 slots are assigned, refuses to re-create
    over a node that holds data, then ``redis-cli --cluster create`` and waits until every
    node reports ``cluster_state:ok`` (the Job's success means the cluster is usable)."""
    return (
        'set -eu\nA="-a $REDIS_PASSWORD --no-auth-warning"\n'
        'for h in $NODES; do until redis-cli $A -h "${h%:*}" -p "${h##*:}" ping; do sleep 2;'
        " done; done\n"
        'first="${NODES%% *}"\n'
        'if redis-cli $A -h "${first%:*}" -p "${first##*:}" cluster info'
        ' | grep -q "cluster_slots_assigned:16384"; then\n'
        '  echo "cluster already formed: nothing to do"; exit 0; fi\n'
        "for h in $NODES; do\n"
        '  keys=$(redis-cli $A -h "${h%:*}" -p "${h##*:}" dbsize)\n'
        '  if [ "$keys" != "0" ]; then\n'
        '    echo "node $h holds $keys keys: refusing to re-create"; exit 1; fi\n'
        "done\n"
        f"redis-cli $A --cluster create $NODES --cluster-replicas {replicas_per_shard}"
        " --cluster-yes\n"
        # done means usable: every node has agreed on the new configuration
        "for h in $NODES; do\n"
        '  until redis-cli $A -h "${h%:*}" -p "${h##*:}" cluster info'
        ' | grep -q "cluster_state:ok"; do sleep 1; done; done\n'
        'echo "cluster formed"\n'
    )


def managed_redis(
    spec: RankerSpec, instance: str, namespace: str, password: str
) -> list[dict[str, Any]]:
    """StatefulSet + headless Service + auth Secret + bootstrap Job + NetworkPolicy + PDB."""
    r, name = spec.cache.redis, redis_name(instance)
    rl = labels(instance, "redis")
    nodes = r.shards * (1 + r.replicas_per_shard)
    conf = (
        "cluster-enabled yes\ncluster-config-file /data/nodes.conf\n"
        "cluster-node-timeout 5000\nappendonly "
        + ("yes" if r.persistence else "no")
        + f"\nmaxmemory {_bytes(r.memory) * 9 // 10}\nmaxmemory-policy allkeys-lru\n"
    )
    auth_env = [
        {
            "name": "REDIS_PASSWORD",
            "valueFrom": {"secretKeyRef": {"name": f"{name}-auth", "key": "password"}},
        }
    ]
    sts: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": namespace, "labels": rl},
        "spec": {
            "serviceName": f"{name}-headless",
            "replicas": nodes,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": rl},
            "template": {
                "metadata": {"labels": rl},
                "spec": {
                    "securityContext": restricted_pod(999, fs_group=999),
                    "containers": [
                        {
                            "name": "redis",
                            "image": r.image,
                            "command": [
                                "sh",
                                "-c",
                                "exec redis-server /conf/redis.conf"
                                ' --requirepass "$REDIS_PASSWORD" --masterauth "$REDIS_PASSWORD"',
                            ],
                            "env": auth_env,
                            "ports": [
                                {"name": "redis", "containerPort": REDIS_PORT},
                                {"name": "bus", "containerPort": REDIS_PORT + 10000},
                            ],
                            "resources": {
                                "requests": {"memory": r.memory},
                                "limits": {"memory": r.memory},
                            },
                            "readinessProbe": {
                                "exec": {
                                    "command": [
                                        "sh",
                                        "-c",
                                        'redis-cli -a "$REDIS_PASSWORD" --no-auth-warning ping',
                                    ]
                                },
                                "periodSeconds": 5,
                            },
                            "volumeMounts": [
                                {"name": "conf", "mountPath": "/conf"},
                                {"name": "data", "mountPath": "/data"},
                            ],
                            "securityContext": restricted_container(),
                        }
                    ],
                    "volumes": [
                        {"name": "conf", "configMap": {"name": f"{name}-conf"}},
                        *([] if r.persistence else [{"name": "data", "emptyDir": {}}]),
                    ],
                },
            },
        },
    }
    if r.persistence:
        sts["spec"]["volumeClaimTemplates"] = [
            {
                "metadata": {"name": "data"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": r.memory}},
                },
            }
        ]
    hosts = " ".join(
        f"{name}-{i}.{name}-headless.{namespace}.svc:{REDIS_PORT}" for i in range(nodes)
    )
    bootstrap_env = [*auth_env, {"name": "NODES", "value": hosts}]
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{name}-conf", "namespace": namespace, "labels": rl},
            "data": {"redis.conf": conf},
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": f"{name}-auth", "namespace": namespace, "labels": rl},
            "type": "Opaque",
            "stringData": {"password": password},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": f"{name}-headless", "namespace": namespace, "labels": rl},
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": rl,
                "ports": [
                    {"name": "redis", "port": REDIS_PORT},
                    {"name": "bus", "port": REDIS_PORT + 10000},
                ],
            },
        },
        sts,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": f"{name}-bootstrap", "namespace": namespace, "labels": rl},
            "spec": {
                "backoffLimit": 20,
                "template": {
                    "metadata": {"labels": labels(instance, "redis-bootstrap")},
                    "spec": {
                        "restartPolicy": "OnFailure",
                        "securityContext": restricted_pod(999),
                        "containers": [
                            {
                                "name": "bootstrap",
                                "image": r.image,
                                "env": bootstrap_env,
                                "command": ["sh", "-c", bootstrap_script(r.replicas_per_shard)],
                                "resources": BOOTSTRAP_RESOURCES,
                                "securityContext": restricted_container(),
                            }
                        ],
                    },
                },
            },
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": namespace, "labels": rl},
            "spec": {
                "podSelector": {"matchLabels": rl},
                "policyTypes": ["Ingress"],
                "ingress": [
                    {
                        "from": [
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
                        + [
                            {
                                "namespaceSelector": {},
                                "podSelector": {
                                    "matchLabels": {"app.kubernetes.io/name": "kvrank-operator"}
                                },
                            }
                        ],
                        "ports": [{"port": REDIS_PORT}, {"port": REDIS_PORT + 10000}],
                    }
                ],
            },
        },
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace, "labels": rl},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": rl}},
        },
    ]


def _bytes(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "M": 10**6, "G": 10**9}
    for suffix, mult in units.items():
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * mult)
    return int(quantity)
