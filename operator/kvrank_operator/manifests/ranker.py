"""The ranker's objects: its config file, one Deployment and Service per model version, the
shared Service, the PodDisruptionBudget, the PodMonitor (with kube-prometheus-stack), and
the Job that purges a retired cache namespace. Pure: the typed spec in, plain dicts out."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import yaml

from kvrank_common import PROBE_TIMEOUT_S
from kvrank_operator.manifests import queue_proxy
from kvrank_operator.manifests.common import (
    ADMIN_ACCESS_LABEL,
    ADMIN_PORT,
    CONFIG_FILE,
    CONFIG_MOUNT,
    ENTRY_SECRET_FILE,
    GRPC_PORT,
    MODEL_CACHE_MOUNT,
    NO_API_TOKEN,
    PASSWORD_FILE,
    PROBE_PORT,
    PURGE_RESOURCES,
    TLS_CA_FILE,
    deployment_name,
    entry_secret_name,
    labels,
    network_policy,
    password_secret,
    ranker_selector,
    redis_url,
    restricted_container,
    restricted_pod,
    tls_ca_mount,
    tls_secret_name,
    version_labels,
    version_selector,
    with_defaults,
)
from kvrank_operator.spec import (
    IMAGE_MODEL_DIR,
    IMAGE_SCHEME,
    MODELS_MOUNT,
    ROUTING_HEADER,
    RankerSpec,
    namespace_for,
    parse_quantity,
)

FRONTS_MAX = 8
"""Front processes a pod runs at most when the operator derives their number."""
RUN_MOUNT = "/run/kvrank"
"""Where a pod with fronts keeps the engine's socket and its processes' metrics files."""
MODEL_IMAGE_MOUNT = "/model-image"
"""Where an ``oci://`` model image is mounted (read-only; its artifact under
``IMAGE_MODEL_DIR`` there)."""
RANKER_UID = 10001
"""The ranker image's numeric user (images/ranker/Dockerfile)."""
RANKER_STORAGE = {"ephemeral-storage": "1Gi"}, {"ephemeral-storage": "8Gi"}
"""(requests, limits) unless the user sets them: a ranker writes its log and, for an artifact
given by URL, the downloaded files (config and safetensors weights; the limit also bounds the
download folder, so a model above ~7 GiB needs a larger one or a ``model.volume``)."""


def ranker_config(spec: RankerSpec, instance: str, namespace: str, ttl_s: float | None) -> str:
    """The ``ranker.yaml`` pods read (and hot-reload: the ``ttl`` section)."""
    url, cluster = redis_url(spec, instance, namespace)
    redis: dict[str, Any] = {"url": url, "cluster": cluster}
    if password_secret(spec, instance):
        redis["password_file"] = PASSWORD_FILE
    if tls_secret_name(instance, spec.cache.redis):
        # its own CA, its nodes announce pod IPs: see kvrank_operator.certs
        redis.update(tls_ca_file=TLS_CA_FILE, tls_check_hostname=False)
    fixed = spec.ttl.fixed_seconds if spec.ttl.mode == "fixed" else ttl_s
    doc: dict[str, Any] = {
        "kv_dtype": spec.cache.kv_dtype,
        "entry_secret_file": ENTRY_SECRET_FILE,
        "redis": redis,
        "ttl": spec.ttl.ranker_settings(fixed),
    }
    if spec.cache.l1_bytes is not None:  # unset: each pod sizes it from its device
        doc["l1_bytes"] = spec.cache.l1_bytes
    if spec.cache.host_bytes:  # only when set: an unchanged spec keeps an unchanged file
        doc["host_bytes"] = spec.cache.host_bytes
    if spec.routing.header != ROUTING_HEADER:  # the rankers check the header routed by
        doc["routing_header"] = spec.routing.header
    c = spec.canary
    if c is not None and c.shadow is not None and c.shadow.sample > 0:
        # every pod reads this file: the canary's own pods skip it (shadow.version)
        svc = f"{deployment_name(instance, c.version)}.{namespace}.svc"
        doc["shadow"] = {
            "url": f"http://{svc}:{spec.port}",
            "version": c.version,
            "sample": c.shadow.sample,
            "top_k": c.shadow.top_k,
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
    sha256: str | None = None,
) -> dict[str, Any]:
    """One model version's Deployment: surge-only rollouts, scrape annotations."""
    sel, meta = version_selector(instance, version), version_labels(instance, version)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": deployment_name(instance, version),
            "namespace": namespace,
            "labels": {**meta, "kvrank.io/role": role},
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
                    "labels": {**spec.model.pod.labels, **meta},
                    "annotations": {
                        **spec.model.pod.annotations,
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(spec.port),
                    },
                },
                "spec": ranker_pod(spec, instance, namespace, version, uri, sha256, role),
            },
        },
    }


def ranker_pod(
    spec: RankerSpec,
    instance: str,
    namespace: str,
    version: str,
    uri: str,
    sha256: str | None = None,
    role: str = "stable",
) -> dict[str, Any]:
    """The pod of one version (its role's image): spread over nodes, the user's scheduling
    knobs applied."""
    resources = ranker_resources(spec)
    volumes, mounts = _volumes(spec, instance, resources["limits"]["ephemeral-storage"])
    if uri.startswith(IMAGE_SCHEME):
        volumes.append(model_image_volume(uri))
        mounts.append({"name": "model-image", "mountPath": MODEL_IMAGE_MOUNT, "readOnly": True})
        uri = MODEL_IMAGE_MOUNT + IMAGE_MODEL_DIR
    knobs = spec.model.pod
    uid = spec.ids(RANKER_UID)
    security = restricted_pod(knobs.run_as_user or uid, fs_group=uid)
    if knobs.run_as_group is not None:
        security["runAsGroup"] = knobs.run_as_group
    if knobs.fs_group is not None:
        security["fsGroup"] = knobs.fs_group
    ranker = _container(
        spec,
        spec.image_of(role),
        _env(spec, instance, namespace_for(instance, namespace, version), version, uri, sha256),
        mounts,
        resources,
    )
    proxied = spec.admission.queue_proxy.enabled
    pod: dict[str, Any] = {
        "securityContext": security,
        "containers": [ranker, queue_proxy.container(spec)] if proxied else [ranker],
        "volumes": volumes,
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": version_selector(instance, version)},
            }
        ],
        "terminationGracePeriodSeconds": 30,
    }
    for key, value in (
        ("nodeSelector", spec.model.node_selector),
        ("tolerations", spec.model.tolerations),
        ("affinity", spec.model.affinity),
        ("imagePullSecrets", [{"name": n} for n in knobs.image_pull_secrets]),
        ("serviceAccountName", knobs.service_account_name),
        ("priorityClassName", knobs.priority_class_name),
        ("runtimeClassName", knobs.runtime_class_name),
    ):
        if value:
            pod[key] = value
    if not knobs.service_account_name:  # a named account may be there for its token
        pod.update(NO_API_TOKEN)
    return pod


def model_image_volume(uri: str) -> dict[str, Any]:
    """The image volume of an ``oci://`` model: pulled as a container image is (``Always``
    for ``:latest`` or no tag, else ``IfNotPresent``: the API server's default, written out
    so the desired pod states it)."""
    reference = uri.removeprefix(IMAGE_SCHEME)
    name = reference.split("@", 1)[0].rsplit("/", 1)[-1]
    tag = name.split(":", 1)[1] if ":" in name else None
    pinned = "@" in reference or tag not in (None, "latest")
    policy = "IfNotPresent" if pinned else "Always"
    return {"name": "model-image", "image": {"reference": reference, "pullPolicy": policy}}


def _env(
    spec: RankerSpec,
    instance: str,
    cache_namespace: str,
    version: str,
    uri: str,
    sha256: str | None,
) -> list[dict[str, Any]]:
    """The ranker's settings that differ per version (the rest is in the config file)."""
    checksum = [{"name": "KVRANK_MODEL_SHA256", "value": sha256}] if sha256 else []
    # a pod given a GPU computes on it, and exits saying so when it cannot see one; without
    # one the ranker's own default (auto) applies; a device the user names in model.env wins
    own = any(e.get("name") == "KVRANK_DEVICE" for e in spec.model.env)
    gpu = spec.model.requests_gpu and not own
    device = [{"name": "KVRANK_DEVICE", "value": "cuda"}] if gpu else []
    return [
        *checksum,
        *device,
        {"name": "KVRANK_MODEL_DIR", "value": uri},
        {"name": "KVRANK_NAMESPACE", "value": cache_namespace},
        {"name": "KVRANK_MODEL_VERSION", "value": version},
        # the Open Inference Protocol's model name (/v2/models/<name>): the deployment's
        {"name": "KVRANK_MODEL_NAME", "value": instance},
        {"name": "KVRANK_CONFIG_FILE", "value": CONFIG_FILE},
        {"name": "KVRANK_MODEL_CACHE_DIR", "value": MODEL_CACHE_MOUNT},
        {"name": "KVRANK_HOST", "value": "0.0.0.0"},
        {"name": "KVRANK_PORT", "value": str(_ranker_port(spec))},
        {"name": "KVRANK_ADMIN_PORT", "value": str(ADMIN_PORT)},
        {"name": "KVRANK_PROBE_PORT", "value": str(PROBE_PORT)},
        {"name": "KVRANK_GRPC_PORT", "value": str(_ranker_port(spec, grpc=True))},
        *_fronts_env(spec),
        *spec.admission.ranker_env(),
        *spec.model.env,
    ]


def fronts_for(spec: RankerSpec) -> int | None:
    """How many front processes parse requests for the engine in each pod (the ranker's
    ``fronts``): one per whole core the pod requests beyond the engine's first, at most
    :data:`FRONTS_MAX` (a pod of under 2 cores runs one process). ``None``: the user's
    ``model.env`` sets ``KVRANK_FRONTS`` (its value then stands, and the pod gets its run
    directory as if it had fronts)."""
    if any(e.get("name") == "KVRANK_FRONTS" for e in spec.model.env):
        return None
    resources = spec.model.resources
    cpu = (resources.get("requests") or {}).get("cpu") or (resources.get("limits") or {}).get("cpu")
    try:
        cores = int(parse_quantity(cpu)) if cpu is not None else 0
    except ValueError:  # not a quantity: the API server refuses the pod, saying so
        cores = 0
    return 0 if cores < 2 else min(cores - 1, FRONTS_MAX)


def _fronts_env(spec: RankerSpec) -> list[dict[str, str]]:
    fronts = fronts_for(spec)
    if fronts == 0:
        return []
    run_dir = [{"name": "KVRANK_RUN_DIR", "value": RUN_MOUNT}]
    return (
        run_dir if fronts is None else [{"name": "KVRANK_FRONTS", "value": str(fronts)}, *run_dir]
    )


def _ranker_port(spec: RankerSpec, grpc: bool = False) -> int:
    """Where the ranker serves HTTP (``grpc``: gRPC): the pod's port, or behind its queue
    proxy."""
    if spec.admission.queue_proxy.enabled:
        return queue_proxy.UPSTREAM_GRPC_PORT if grpc else queue_proxy.UPSTREAM_PORT
    return GRPC_PORT if grpc else spec.port


def ranker_resources(spec: RankerSpec) -> dict[str, Any]:
    """The user's ``model.resources`` with the ephemeral storage a ranker writes, unless set."""
    return with_defaults(spec.model.resources, *RANKER_STORAGE)


def _volumes(
    spec: RankerSpec, instance: str, download_limit: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts): config, a download folder bounded by ``download_limit``, the model
    volume, the cache-entry secret, the Redis password."""
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": f"{instance}-config"}},
        # artifacts given by URL are downloaded here (the root filesystem is read-only)
        {"name": "model-cache", "emptyDir": {"sizeLimit": download_limit}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True},
        {"name": "model-cache", "mountPath": MODEL_CACHE_MOUNT},
    ]
    if fronts_for(spec) != 0:  # the engine's socket, the processes' metrics files
        volumes.append({"name": "run", "emptyDir": {"sizeLimit": "256Mi"}})
        mounts.append({"name": "run", "mountPath": RUN_MOUNT})
    if spec.model.volume:
        volumes.append({"name": "models", **spec.model.volume})
        mounts.append({"name": "models", "mountPath": MODELS_MOUNT, "readOnly": True})
    entry = {
        "secretName": entry_secret_name(instance),
        "items": [{"key": "secret", "path": "secret"}],
    }
    volumes.append({"name": "cache-key", "secret": entry})
    mounts.append({"name": "cache-key", "mountPath": f"{CONFIG_MOUNT}/cache-key", "readOnly": True})
    secret = password_secret(spec, instance)
    if secret:
        items = [{"key": secret[1], "path": "password"}]
        volumes.append({"name": "redis-auth", "secret": {"secretName": secret[0], "items": items}})
        mounts.append(
            {"name": "redis-auth", "mountPath": f"{CONFIG_MOUNT}/redis", "readOnly": True}
        )
    ca = tls_ca_mount(instance, spec.cache.redis)
    if ca:
        volumes.append(ca[0])
        mounts.append(ca[1])
    return volumes, mounts


def _container(
    spec: RankerSpec,
    image: str,
    env: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
    resources: dict[str, Any],
) -> dict[str, Any]:
    # behind a queue proxy the pod's http and grpc ports are the proxy's, and the ranker's
    # own ports are no named ports: no Service or NetworkPolicy reaches them
    served = [
        {"name": "http", "containerPort": spec.port},
        {"name": "grpc", "containerPort": GRPC_PORT},
    ]
    return {
        "name": "ranker",
        "image": image,
        "args": ["serve"],
        "ports": [
            *([] if spec.admission.queue_proxy.enabled else served),
            {"name": "admin", "containerPort": ADMIN_PORT},
            {"name": "probes", "containerPort": PROBE_PORT},
        ],
        "env": env,
        "resources": resources,
        # on the probe port's own thread: a pod saturated by a spike stays ready (it sheds
        # what it cannot serve in time) and alive (its event loop still makes progress)
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": "probes"},
            "periodSeconds": 5,
            "timeoutSeconds": PROBE_TIMEOUT_S,
        },
        # download + load + warm-up may take minutes; liveness starts after it
        "startupProbe": {
            "httpGet": {"path": "/healthz", "port": "probes"},
            "periodSeconds": spec.model.pod.startup_period_seconds,
            "failureThreshold": spec.model.pod.startup_failure_threshold,
            "timeoutSeconds": PROBE_TIMEOUT_S,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "probes"},
            "periodSeconds": 10,
            "failureThreshold": 3,
            "timeoutSeconds": PROBE_TIMEOUT_S,
        },
        "volumeMounts": mounts,
        "securityContext": restricted_container(),
        # a failed start (artifact unreachable, wrong checksum) ends with its reason as the
        # last log line: the kubelet keeps it as the termination message the operator reads
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def services(spec: RankerSpec, instance: str, namespace: str) -> list[dict[str, Any]]:
    """One Service over every serving version (a warming canary is not one yet) or, with
    the bundled router, over the router's pods; plus one per version (for routers, and the
    shadow traffic that warms a canary)."""
    port = [{"name": "http", "port": spec.port, "targetPort": "http"}]
    ports = [*port, {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc"}]
    selector = ranker_selector(instance)
    if spec.canary is not None and not spec.canary.serving:
        selector["kvrank.io/version"] = spec.model.version
    if spec.routing.mode == "bundled":  # the router picks the version and the pod
        selector = {**ranker_selector(instance), "app.kubernetes.io/component": "router"}
    out = [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": instance, "namespace": namespace, "labels": labels(instance)},
            "spec": {"type": spec.service_type, "selector": selector, "ports": ports},
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
                    "selector": version_selector(instance, version),
                    "ports": [*port, {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc"}],
                },
            }
        )
    return out


def network_policies(spec: RankerSpec, instance: str, namespace: str) -> list[dict[str, Any]]:
    """Every pod of ``instance`` accepts no connection but what a policy of its kind allows
    (the Jobs, Redis bootstrap and cache purge, none); rankers: anyone may score (over HTTP or
    gRPC), probe and read a queue proxy's statistics, only pods labelled
    :data:`ADMIN_ACCESS_LABEL` reach the admin port. Redis' and the router's policies are theirs."""
    admins = {"podSelector": {"matchLabels": {ADMIN_ACCESS_LABEL: "true"}}}
    rankers: list[dict[str, Any]] = [
        {
            "ports": [
                {"port": "http"},
                {"port": "grpc"},
                {"port": PROBE_PORT},
                {"port": queue_proxy.STATS_PORT_NAME},
            ]
        },
        {"from": [admins], "ports": [{"port": ADMIN_PORT}]},
    ]
    every_pod = {"matchLabels": {"app.kubernetes.io/instance": instance}}
    return [
        network_policy(instance, namespace, labels(instance),
                       {"matchLabels": ranker_selector(instance)}, rankers),
        network_policy(f"{instance}-default-deny", namespace, labels(instance), every_pod, []),
    ]  # fmt: skip


def pod_disruption_budget(instance: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": instance, "namespace": namespace, "labels": labels(instance)},
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": ranker_selector(instance)},
        },
    }


POD_MONITOR_API = "monitoring.coreos.com/v1"
POD_TARGET_LABELS = ["app.kubernetes.io/instance", "kvrank.io/version"]
"""Copied from the pod onto every series (as ``app_kubernetes_io_instance`` and
``kvrank_io_version``): the alerts, the dashboard and the operator's Prometheus TTL source
select a RankerDeployment and a model version by them."""


PROMETHEUS_SELECTOR = '{{namespace="{ns}",app_kubernetes_io_instance="{name}"}}'
"""The series of one RankerDeployment's pods, by the target labels a PodMonitor (or
ServiceMonitor) of kube-prometheus-stack gives them: ``namespace`` (the pod's) and, through
``podTargetLabels`` above, the instance label the operator puts on every ranker pod."""


@dataclass(frozen=True)
class PodMonitoring:
    """The operator's PodMonitor settings (chart: ``monitoring.podMonitor``)."""

    labels: dict[str, str] = field(default_factory=dict)
    """Extra labels, e.g. ``release: kube-prometheus-stack`` for its ``podMonitorSelector``."""
    interval: str = "30s"


COMPONENT_META = "__meta_kubernetes_pod_label_app_kubernetes_io_component"
"""A pod's ``app.kubernetes.io/component`` label, as Prometheus' pod discovery names it."""
MONITORED = (
    ("ranker", "http", "/metrics"),
    ("ranker", queue_proxy.STATS_PORT_NAME, "/stats/prometheus"),
    ("router", "stats", "/stats/prometheus"),
)
"""What the PodMonitor scrapes of each kind of pod: (component, port name, path). A ranker's
queue proxy (only pods that have one have its port) and the bundled router expose Envoy's own
statistics (refused requests, requests in flight; retries, healthy upstream pods per version)
on a port that shows no more of the admin interface than that and ``/ready``."""


def pod_monitor(instance: str, namespace: str, settings: PodMonitoring) -> dict[str, Any]:
    """prometheus-operator's PodMonitor for every ranker pod of ``instance`` (any version)
    and, when it has the bundled router, every router pod: one endpoint per kind of pod,
    each kept to the pods of its component (both have a port named ``http``). One object
    whatever ``spec.routing`` says, so turning the router off leaves nothing to delete."""
    selector = {"app.kubernetes.io/instance": instance}
    components = sorted({component for component, _, _ in MONITORED})
    return {
        "apiVersion": POD_MONITOR_API,
        "kind": "PodMonitor",
        "metadata": {
            "name": f"{instance}-ranker",
            "namespace": namespace,
            "labels": {**settings.labels, **labels(instance)},
        },
        "spec": {
            "selector": {
                "matchLabels": selector,
                "matchExpressions": [
                    {
                        "key": "app.kubernetes.io/component",
                        "operator": "In",
                        "values": components,
                    }
                ],
            },
            "podTargetLabels": POD_TARGET_LABELS,
            "podMetricsEndpoints": [
                {
                    "port": port,
                    "path": path,
                    "interval": settings.interval,
                    "relabelings": [
                        {"sourceLabels": [COMPONENT_META], "regex": component, "action": "keep"}
                    ],
                }
                for component, port, path in MONITORED
            ],
        },
    }


def purge_job(
    spec: RankerSpec, instance: str, namespace: str, cache_ns: str, retired_at: str = ""
) -> dict[str, Any]:
    """A Job that removes one cache namespace from Redis (``kvrank cache purge``).

    Named after the namespace *and* its retirement: a version retired again later (a canary
    aborted twice) gets a new Job, not the finished one of the first time.
    """
    url, cluster = redis_url(spec, instance, namespace)
    digest = hashlib.sha1(f"{cache_ns}@{retired_at}".encode()).hexdigest()[:8]
    args = ["cache", "purge", "--namespace", cache_ns, "--redis", url]
    if cluster:
        args.append("--cluster")
    ca_mount = tls_ca_mount(instance, spec.cache.redis)
    if ca_mount:
        args += ["--tls-ca-file", TLS_CA_FILE, "--no-tls-check-hostname"]
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
                    **NO_API_TOKEN,
                    "securityContext": restricted_pod(spec.ids(RANKER_UID)),
                    "containers": [
                        {
                            "name": "purge",
                            "image": spec.model.image,
                            "args": args,
                            "env": env,
                            "resources": PURGE_RESOURCES,
                            "securityContext": restricted_container(),
                            **({"volumeMounts": [ca_mount[1]]} if ca_mount else {}),
                        }
                    ],
                    **({"volumes": [ca_mount[0]]} if ca_mount else {}),
                },
            },
        },
    }
