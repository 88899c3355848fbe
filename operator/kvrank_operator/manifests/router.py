"""The bundled router's configuration: stock Envoy, sending each user to one ranker pod.

Affinity is a routing decision made by an existing proxy: Envoy hashes the routing header
(the user id, so it never reads the body) into a Maglev table of the ranker pods of each
model version, with bounded load (``hash_balance_factor``: no pod takes more than that
share of the mean), so a user's repeat requests find its K/V in that pod's L1. Maglev, not
``RING_HASH``: Envoy's ring gives each host ``ceil(minimum_ring_size / hosts)`` points, so
when one of 4 pods goes its 3 survivors get a third more points each and ~15 % of *their*
users move too (measured here: 187 of 222 kept); Maglev's table kept every one of them
(4 runs) and split 320 users within 1.15× of the mean.
The canary's traffic share is a split *per user*: ``weighted_clusters`` pick the version
from the same hash (``use_hash_policy``) with the canary listed first, so a user stays on
one version, and raising the weight from 25 to 50 moves only the users in the added band.
A connect failure, a reset or a shed answer (a ranker's 503 carrying ``x-kvrank-shed``:
admission control refused it before any work) is retried once on another pod, with
retries held to a fifth of the requests in flight (a retry budget: a spike that makes
every pod shed cannot become a retry storm); a pod that fails to answer 5 times in a row
is ejected for a while (outlier detection), one that answers — shedding included — never,
as its users would pile onto the others; pods come from DNS (a headless Service per
version: one address per ready pod). A canary gets its weight only while it has a ready
pod (the operator renders 0 otherwise): an Envoy cluster without hosts would answer its
band of users 503, where kube-proxy would have sent them to the stable pods.

Envoy reads three files from one directory (a ConfigMap's volume): ``envoy.yaml`` (the
bootstrap: the admin interface on loopback only, listeners and clusters from the other
two files) and ``lds.yaml``/``cds.yaml``, which it reloads when the kubelet swaps the
ConfigMap in, so a weight change needs no restart. A second listener serves only
``/ready`` and ``/stats/prometheus`` of the admin interface (liveness, the PodMonitor) and
``/routable`` (readiness): 200 once the stable version's cluster has a healthy host, so a
router pod joins the Service only when it can route (DNS may know a version's pods some
seconds after they are Ready).
No access log: the routing header is a user id. Every answer says how many tries it took
(``x-envoy-attempt-count``). Envoy closes an idle connection to a ranker before the ranker
would (:data:`~kvrank_operator.manifests.envoy.UPSTREAM_IDLE_TIMEOUT_S`), so a request never
meets a connection the ranker is closing: that reset would be retried on another pod.

:func:`router_objects` builds what a ``RankerDeployment`` with ``routing.mode: bundled``
owns for it: the ConfigMap with those files, the router Deployment (Pod Security
``restricted``, probes on ``/ready``), its PodDisruptionBudget and a headless Service per
live version; :mod:`~kvrank_operator.manifests.ranker` points the shared Service at the
router pods. Pure: plain dicts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvrank_common import MAX_TIMEOUT_MS, PROBE_TIMEOUT_S, SHED_HEADER
from kvrank_operator.manifests import envoy
from kvrank_operator.manifests.common import (
    GRPC_PORT,
    NO_API_TOKEN,
    deployment_name,
    labels,
    network_policy,
    restricted_container,
    restricted_pod,
    version_labels,
    version_selector,
    with_defaults,
)
from kvrank_operator.manifests.envoy import ADMIN_PORT, STATS_PORT
from kvrank_operator.spec import ROUTING_HEADER, RankerSpec

CONFIG_DIR = "/etc/envoy"
UID = 10001
ROUTABLE = "/routable"
"""The router pods' readiness: the stable version's cluster has a healthy host."""
RETRY_ON = "connect-failure,reset,retriable-headers"
"""Retried on another pod: the request never reached a ranker, its pod went away, or the
ranker shed it (a header listed in ``retriable_headers``: :data:`kvrank_common.SHED_HEADER`,
retried once on another pod, within :data:`RETRY_BUDGET_PERCENT`)."""
GRPC_RETRY_ON = "connect-failure,reset,resource-exhausted"
"""Retried on another pod over gRPC: as :data:`RETRY_ON`, a shed call being one answered
``RESOURCE_EXHAUSTED`` (admission control refused it before any work)."""
RETRY_BUDGET_PERCENT = 20.0
"""Retries in flight, as a share of the requests in flight: a spike that makes every pod
shed turns into at most this much more load, never a retry storm."""


@dataclass(frozen=True)
class Upstream:
    """One model version's pods, as the router sees them."""

    name: str
    """The Envoy cluster (and its stats prefix): the version's Deployment name."""
    weight: int
    """Its share of users, in percent."""
    required: bool
    """The router is ready only while this one has a healthy host (the stable version)."""
    endpoints: tuple[tuple[str, int], ...]
    """``(host, port)``: in a cluster one DNS name with an address per ready pod (a
    headless Service); elsewhere each pod's own address."""
    grpc_endpoints: tuple[tuple[str, int], ...] = ()
    """The same pods' gRPC ports (none: the version is not routed over gRPC)."""


@dataclass(frozen=True)
class RouterConfig:
    upstreams: Sequence[Upstream]
    """The canary first, when there is one: the users in its band of the hash."""
    header: str = ROUTING_HEADER
    hash_balance_factor: int = 150
    """Bounded load, in percent of the mean (≥ 100); 0: unbounded."""
    port: int = 8080
    timeout_s: float = MAX_TIMEOUT_MS / 1e3
    """How long a request may take through the router: the longest deadline a caller may
    state. The caller's own deadline travels in its header (or as its gRPC deadline) and the
    ranker answers 504 once it passes, or applies its default to a caller that states none:
    a shorter bound here would cut deadlines the ranker honours."""
    dns_refresh_s: float = 2.0
    grpc_port: int = GRPC_PORT
    """The gRPC listener's port (when an upstream has gRPC endpoints)."""


def router_name(instance: str) -> str:
    return f"{instance}-router"


def pods_service(instance: str, version: str) -> str:
    """A version's headless Service: one DNS address per ready pod, for the router."""
    return f"{deployment_name(instance, version)[:58].rstrip('-')}-pods"


def router_config(
    spec: RankerSpec, instance: str, namespace: str, ready: frozenset[str] = frozenset()
) -> RouterConfig:
    """The canary (first) at its weight once it serves and has a pod in ``ready`` (the
    versions with a ready pod), the stable version at the rest."""
    c = spec.canary
    serving = c is not None and c.serving and c.version in ready
    canary_weight = c.weight if c is not None and serving else 0
    domain = spec.routing.cluster_domain

    def pods(version: str) -> str:  # absolute (a final dot): no search-domain queries first
        return f"{pods_service(instance, version)}.{namespace}.svc.{domain}."

    upstreams = [
        Upstream(
            deployment_name(instance, version),
            canary_weight if role == "canary" else 100 - canary_weight,
            role != "canary",
            ((pods(version), spec.port),),
            ((pods(version), GRPC_PORT),),
        )
        for version, role in sorted(spec.versions(), key=lambda v: v[1] != "canary")
    ]
    r = spec.routing
    return RouterConfig(upstreams, r.header, r.hash_balance_factor, spec.port)


def router_objects(
    spec: RankerSpec, instance: str, namespace: str, ready: frozenset[str] = frozenset()
) -> list[dict[str, Any]]:
    """What ``routing.mode: bundled`` adds, in the order it is applied (``ready``: the
    versions with a ready pod)."""
    name = router_name(instance)
    meta = {"name": name, "namespace": namespace, "labels": labels(instance, "router")}
    files = envoy_files(router_config(spec, instance, namespace, ready))
    out: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": files}
    ]
    out += [_pods_service(spec, instance, namespace, v) for v, _ in spec.versions()]
    out.append(_router_deployment(spec, instance, namespace))
    # callers score through it from anywhere; Prometheus and the probes read its stats port
    open_ports = [{"ports": [{"port": "http"}, {"port": "grpc"}, {"port": "stats"}]}]
    selector = {"matchLabels": router_selector(instance)}
    out.append(network_policy(name, namespace, labels(instance, "router"), selector, open_ports))
    out.append(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": meta,
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": router_selector(instance)}},
        }
    )
    return out


def router_selector(instance: str) -> dict[str, str]:
    return {"app.kubernetes.io/instance": instance, "app.kubernetes.io/component": "router"}


def _pods_service(spec: RankerSpec, instance: str, namespace: str, version: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": pods_service(instance, version),
            "namespace": namespace,
            "labels": version_labels(instance, version),
        },
        "spec": {
            "clusterIP": "None",  # headless: the router resolves every ready pod's address
            "selector": version_selector(instance, version),
            "ports": [{"name": "http", "port": spec.port, "targetPort": "http"}],
        },
    }


def _router_deployment(spec: RankerSpec, instance: str, namespace: str) -> dict[str, Any]:
    r, name = spec.routing, router_name(instance)
    live = {
        "httpGet": {"path": "/ready", "port": "stats"},
        "periodSeconds": 5,
        "timeoutSeconds": PROBE_TIMEOUT_S,
    }
    routable = {  # every 2 s, each look waiting at most until the next one
        "httpGet": {"path": ROUTABLE, "port": "stats"},
        "periodSeconds": 2,
        "timeoutSeconds": 2,
    }
    container = {
        "name": "envoy",
        "image": r.image,
        "args": ["-c", f"{CONFIG_DIR}/envoy.yaml", "--disable-hot-restart", "-l", "warn"],
        "ports": [
            {"name": "http", "containerPort": spec.port},
            {"name": "grpc", "containerPort": GRPC_PORT},
            {"name": "stats", "containerPort": STATS_PORT},
        ],
        "readinessProbe": {**routable, "failureThreshold": 2},
        "livenessProbe": {**live, "failureThreshold": 6, "initialDelaySeconds": 10},
        "resources": with_defaults(
            r.resources
            or {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
            {"ephemeral-storage": "64Mi"},  # Envoy writes its log only
            {"ephemeral-storage": "256Mi"},
        ),
        "securityContext": restricted_container(),
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}],
    }
    pod = {
        **NO_API_TOKEN,
        "securityContext": restricted_pod(spec.ids(UID)),
        "containers": [container],
        "volumes": [{"name": "config", "configMap": {"name": name}}],
        "terminationGracePeriodSeconds": 15,
    }
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(STATS_PORT),
        "prometheus.io/path": "/stats/prometheus",
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(instance, "router")},
        "spec": {
            "replicas": r.replicas,
            "selector": {"matchLabels": router_selector(instance)},
            "strategy": {"rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": labels(instance, "router"), "annotations": annotations},
                "spec": pod,
            },
        },
    }


def envoy_files(cfg: RouterConfig) -> dict[str, str]:
    """The files of the router's ConfigMap: ``envoy.yaml``, ``lds.yaml``, ``cds.yaml``."""
    import yaml

    listeners = [_scoring(cfg, grpc=False), _stats(cfg)]
    clusters = [_cluster(cfg, u, grpc=False) for u in cfg.upstreams]
    if any(u.grpc_endpoints for u in cfg.upstreams):
        listeners.append(_scoring(cfg, grpc=True))
        clusters += [_cluster(cfg, u, grpc=True) for u in cfg.upstreams]
    resources = {
        "lds.yaml": [_typed("listener.v3.Listener", lst) for lst in listeners],
        "cds.yaml": [
            _typed("cluster.v3.Cluster", c) for c in [*clusters, envoy.admin_cluster(ADMIN_PORT)]
        ],
    }
    files = {name: yaml.safe_dump({"resources": docs}) for name, docs in resources.items()}
    files["envoy.yaml"] = yaml.safe_dump(bootstrap())
    return files


def bootstrap() -> dict[str, Any]:
    def watched(name: str) -> dict[str, Any]:
        return {
            "resource_api_version": "V3",
            "path_config_source": {
                "path": f"{CONFIG_DIR}/{name}",
                "watched_directory": {"path": CONFIG_DIR},  # the kubelet swaps a symlink
            },
        }

    return {
        "node": {"id": "kvrank-router", "cluster": "kvrank-router"},
        "admin": {"address": envoy.socket("127.0.0.1", ADMIN_PORT)},
        "dynamic_resources": {"lds_config": watched("lds.yaml"), "cds_config": watched("cds.yaml")},
    }


def _scoring(cfg: RouterConfig, grpc: bool) -> dict[str, Any]:
    """The scoring listener: HTTP on ``cfg.port``, or (``grpc``) gRPC on ``cfg.grpc_port``,
    each to its own clusters of the same pods, by the same routing header (gRPC metadata)."""
    route: dict[str, Any] = {
        "hash_policy": [{"header": {"header_name": cfg.header}}],
        "timeout": _duration(cfg.timeout_s),
        "retry_policy": {
            "retry_on": GRPC_RETRY_ON if grpc else RETRY_ON,
            "retriable_headers": [{"name": SHED_HEADER, "present_match": True}],
            "num_retries": 1,
            "retry_host_predicate": [
                {
                    "name": "envoy.retry_host_predicates.previous_hosts",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.retry.host."
                        "previous_hosts.v3.PreviousHostsPredicate"
                    },
                }
            ],
            # Maglev picks a retry's host from the user's hash mutated by the attempt: each
            # try lands on the failed pod again with probability 1/pods, so with 10 tries
            # 1 in 1,024 of its users finds no other pod where there are 2, 1 in 59,049 of 3
            "host_selection_retry_max_attempts": 10,
        },
    }
    if grpc:  # the caller's gRPC deadline (grpc-timeout), within the router's own
        route["max_stream_duration"] = {"grpc_timeout_header_max": _duration(cfg.timeout_s)}
    live = [u for u in cfg.upstreams if u.weight > 0]
    names = [_cluster_name(u, grpc) for u in live]
    if len(live) == 1:
        route["cluster"] = names[0]
    else:
        route["weighted_clusters"] = {
            "clusters": [{"name": n, "weight": u.weight} for n, u in zip(names, live, strict=True)],
            "use_hash_policy": True,  # the version from the user's hash, not at random
        }
    name = "scoring-grpc" if grpc else "scoring"
    manager = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network."
        "http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": name,
        **({"codec_type": "HTTP2"} if grpc else {}),
        "route_config": {
            "name": name,
            "virtual_hosts": [
                {
                    "name": "rankers",
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": route}],
                    # x-envoy-attempt-count on every answer: a caller can tell an answer
                    # retried on another pod (away from the user's entry) from a first try
                    "include_attempt_count_in_response": True,
                }
            ],
        },
        "http_filters": [envoy.router_filter()],
    }
    return envoy.listener(name, cfg.grpc_port if grpc else cfg.port, manager)


def _stats(cfg: RouterConfig) -> dict[str, Any]:
    routable = {  # answered here: 200 while each required cluster has a healthy host
        "name": "envoy.filters.http.health_check",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.health_check.v3."
            "HealthCheck",
            "pass_through_mode": False,
            "headers": [{"name": ":path", "string_match": {"exact": ROUTABLE}}],
            "cluster_min_healthy_percentages": {
                u.name: {"value": 1.0} for u in cfg.upstreams if u.required
            },
        },
    }
    return envoy.stats_listener(STATS_PORT, [routable])


def _cluster_name(u: Upstream, grpc: bool) -> str:
    return f"{u.name}-grpc" if grpc else u.name


def _cluster(cfg: RouterConfig, u: Upstream, grpc: bool) -> dict[str, Any]:
    """A version's pods: HTTP/1.1 to their scoring port, or (``grpc``) HTTP/2 to their gRPC
    port — two Maglev tables over the same pods, so a user's gRPC calls stick to one pod as
    its HTTP calls do (not necessarily the same one: a table hashes address and port)."""
    name, endpoints = _cluster_name(u, grpc), u.grpc_endpoints if grpc else u.endpoints
    cluster: dict[str, Any] = {
        "name": name,
        "cluster_type": {  # strict DNS: every address of the name is a host (a ready pod)
            "name": "envoy.cluster.dns",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.clusters.dns.v3.DnsCluster",
                "dns_lookup_family": "V4_ONLY",
                "dns_refresh_rate": _duration(cfg.dns_refresh_s),
            },
        },
        "connect_timeout": "0.5s",
        "typed_extension_protocol_options": envoy.upstream_http_options(http2=grpc),
        "lb_policy": "MAGLEV",  # its default table: 65,537 entries
        # a pod is ejected for failing to answer (connect failures, resets, timeouts), never
        # for an answer: one that sheds under a spike keeps its users, who would otherwise
        # pile onto the others
        "outlier_detection": {
            "split_external_local_origin_errors": True,
            "consecutive_local_origin_failure": 5,
            "enforcing_consecutive_5xx": 0,
            "enforcing_consecutive_gateway_failure": 0,
            "enforcing_success_rate": 0,
            "interval": "5s",
            "base_ejection_time": "15s",
            "max_ejection_percent": 50,
        },
        "circuit_breakers": {
            "thresholds": [
                {
                    "retry_budget": {
                        "budget_percent": {"value": RETRY_BUDGET_PERCENT},
                        "min_retry_concurrency": 3,
                    }
                }
            ]
        },
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {"endpoint": {"address": envoy.socket(h, p)}} for h, p in endpoints
                    ]
                }
            ],
        },
    }
    if cfg.hash_balance_factor:  # bounded load: no pod over this share of the mean
        factor = {"hash_balance_factor": cfg.hash_balance_factor}
        cluster["common_lb_config"] = {"consistent_hashing_lb_config": factor}
    return cluster


def _typed(kind: str, doc: dict[str, Any]) -> dict[str, Any]:
    return {"@type": f"type.googleapis.com/envoy.config.{kind}", **doc}


def _duration(seconds: float) -> str:
    return f"{seconds:g}s"
