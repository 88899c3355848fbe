"""A ranker pod's queue proxy: stock Envoy beside the ranker, holding at most ``maxInflight``
scoring requests in flight to it and refusing one more at once (what Knative's queue-proxy does
for KServe's ``containerConcurrency``).

Why a second process: under a spike most requests must be refused, and a ranker that refuses
them itself does it on the event loop that shares Python's interpreter lock with its model
thread — every refusal takes the lock from the model for a moment (measured at 4x one CPU
ranker's capacity: 0.83-0.85x of its capacity answered in time alone, 0.87-0.94x behind this
proxy on two days; ``make bench-overload-front``). Envoy answers the overflow in C++, before
Python sees it: 503 with ``Retry-After: 1`` and ``x-kvrank-shed: queue``, the header the
bundled router retries on another pod (within its retry budget). The ranker's own admission
control still screens what gets through (deadlines, estimated wait).

Only scoring (``/v1/…``) is bounded; ``/metrics``, ``/healthz`` and ``/readyz`` go to the
ranker through a second, unbounded cluster, so Prometheus and the operator keep reading a
saturated pod. The Open Inference Protocol's gRPC port goes through the proxy too (a listener
of its own, HTTP/2 to the ranker's gRPC server, with a bound of its own of ``maxInflight``
calls; Envoy's circuit breakers are per upstream, so a pod called both ways holds up to that
many of each): an overflow is answered ``RESOURCE_EXHAUSTED``, as the ranker sheds a call
itself, with the same shed header, and the bundled router retries it on another pod. No route
timeout: the caller's deadline travels in its header and the ranker drops work nobody waits
for. The ranker listens on :data:`UPSTREAM_PORT` (not a named port of the pod, so neither
Service nor NetworkPolicy lets anyone else reach it); its probe and admin ports are unchanged.
Envoy's statistics (what it refused, what it holds in flight) are on :data:`STATS_PORT` for the
PodMonitor. The whole bootstrap travels in the container's arguments (``--config-yaml``), so a
changed bound rolls the pods like any other pod setting. Pure: plain dicts.
"""

from __future__ import annotations

import json
from typing import Any

from kvrank_common import PROBE_TIMEOUT_S, SHED_HEADER
from kvrank_operator.manifests import envoy
from kvrank_operator.manifests.common import (
    GRPC_PORT,
    restricted_container,
    with_defaults,
)
from kvrank_operator.manifests.envoy import ADMIN_PORT, STATS_PORT
from kvrank_operator.spec import RankerSpec

UPSTREAM_PORT = 8083
"""Where the ranker listens behind its queue proxy (its scoring port moves here)."""
UPSTREAM_GRPC_PORT = 8084
"""Where the ranker's gRPC server listens behind its queue proxy."""
STATS_PORT_NAME = "proxy-stats"
"""The name of the proxy's :data:`~kvrank_operator.manifests.envoy.STATS_PORT`, where the
PodMonitor reads how many requests it refused over the bound
(``envoy_cluster_upstream_rq_active_overflow{envoy_cluster_name="ranker"}``) and what it holds
in flight (``envoy_cluster_upstream_rq_active``)."""
SPARE_CONNECTIONS = 4
"""Connections to the ranker beyond the in-flight bound: with none, a request over the bound
waited in Envoy's queue for a connection (measured: admitted p99 ~600 ms, health probes
~250 ms behind it) instead of being refused at once."""
GRPC_RESOURCE_EXHAUSTED = "8"
"""The gRPC status of a call shed over the bound (what the ranker's own admission answers)."""
OPS_MAX_REQUESTS = 64
"""In flight on the unbounded side (metrics, health): never reached in practice."""
RESOURCES = (
    {"cpu": "50m", "memory": "32Mi", "ephemeral-storage": "16Mi"},
    {"memory": "256Mi", "ephemeral-storage": "64Mi"},
)
"""(requests, limits) unless the user sets ``admission.queueProxy.resources``."""


def envoy_bootstrap(
    listen: int,
    upstream: int,
    max_inflight: int,
    admin: int,
    stats: int = STATS_PORT,
    listen_address: str = "0.0.0.0",
    grpc: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """Envoy's bootstrap: a listener on ``listen`` proxying to the ranker on loopback
    ``upstream``, at most ``max_inflight`` scoring requests in flight, an overflow answered
    503 with the shed headers; Envoy's own statistics on ``stats``. ``grpc``: ``(listen,
    upstream)`` of the gRPC port, bounded the same way."""
    manager = _connection_manager("ranker", "ranker-ops", max_inflight)
    listeners = [envoy.listener("queue", listen, manager, listen_address)]
    bounded = {
        # the bound: one more request in flight overflows (503); room to spare in
        # connections, so that no request waits in Envoy for one (a queue no deadline sees)
        "max_requests": max_inflight,
        "max_connections": max_inflight + SPARE_CONNECTIONS,
        "max_pending_requests": max_inflight,
        "max_retries": 0,
    }
    ops = {"max_requests": OPS_MAX_REQUESTS, "max_connections": OPS_MAX_REQUESTS}
    clusters = [_cluster("ranker", upstream, bounded), _cluster("ranker-ops", upstream, ops)]
    if grpc is not None:
        manager = {**_connection_manager("ranker-grpc", None, max_inflight), "codec_type": "HTTP2"}
        listeners.append(envoy.listener("queue-grpc", grpc[0], manager, listen_address))
        clusters.append(_cluster("ranker-grpc", grpc[1], bounded, http2=True))
    listeners.append(envoy.stats_listener(stats, address=listen_address))
    return {
        "admin": {"address": envoy.socket("127.0.0.1", admin)},
        "static_resources": {
            "listeners": listeners,
            "clusters": [*clusters, envoy.admin_cluster(admin)],
        },
    }


def _connection_manager(scoring: str, ops: str | None, max_inflight: int) -> dict[str, Any]:
    """Scoring to the bounded cluster, the rest to the unbounded one (``ops``; ``None``:
    everything is scoring, as on the gRPC port); an overflow's reply."""
    shed: list[dict[str, Any]] = [
        {"header": {"key": "retry-after", "value": "1"}},
        {"header": {"key": SHED_HEADER, "value": "queue"}},
    ]
    shed_reply: dict[str, Any] = {
        "filter": {"response_flag_filter": {"flags": ["UO"]}},  # upstream overflow
        "headers_to_add": shed,
    }
    if ops is None:  # gRPC: the status the ranker sheds with itself, not Envoy's UNAVAILABLE
        status = {"key": "grpc-status", "value": GRPC_RESOURCE_EXHAUSTED}
        shed.append({"header": status, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"})
        why = f"overloaded: the pod's queue proxy holds {max_inflight} calls in flight"
        shed_reply["body"] = {"inline_string": why}  # the call's grpc-message
    routes = [{"match": {"prefix": "/"}, "route": {"cluster": scoring, "timeout": "0s"}}]
    if ops is not None:
        routes = [
            {"match": {"prefix": "/v1/"}, "route": {"cluster": scoring, "timeout": "0s"}},
            {"match": {"prefix": "/"}, "route": {"cluster": ops, "timeout": "30s"}},
        ]
    return {
        "@type": envoy.HTTP_CONNECTION_MANAGER,
        "stat_prefix": "queue" if ops is not None else "queue_grpc",
        "local_reply_config": {"mappers": [shed_reply]},
        "http_filters": [envoy.router_filter()],
        "route_config": {"virtual_hosts": [{"name": "ranker", "domains": ["*"], "routes": routes}]},
    }


def _cluster(
    name: str, upstream: int, thresholds: dict[str, int], http2: bool = False
) -> dict[str, Any]:
    return envoy.static_cluster(
        name, upstream, "1s", http2=http2, circuit_breakers={"thresholds": [thresholds]}
    )


def container(spec: RankerSpec) -> dict[str, Any]:
    """The proxy's container: the router image's Envoy, the pod's ``http`` port."""
    qp = spec.admission.queue_proxy
    bootstrap = envoy_bootstrap(
        spec.port,
        UPSTREAM_PORT,
        qp.max_inflight,
        ADMIN_PORT,
        STATS_PORT,
        grpc=(GRPC_PORT, UPSTREAM_GRPC_PORT),
    )
    return {
        "name": "queue-proxy",
        "image": spec.routing.image,
        "args": [
            "--config-yaml",
            json.dumps(bootstrap, separators=(",", ":"), sort_keys=True),
            "--disable-hot-restart",
            "--concurrency",
            "1",
            "-l",
            "warn",
        ],
        "ports": [
            {"name": "http", "containerPort": spec.port},
            {"name": "grpc", "containerPort": GRPC_PORT},
            {"name": STATS_PORT_NAME, "containerPort": STATS_PORT},
        ],
        "resources": with_defaults(qp.resources, *RESOURCES),
        "readinessProbe": {
            "tcpSocket": {"port": "http"},
            "periodSeconds": 5,
            "timeoutSeconds": PROBE_TIMEOUT_S,
        },
        "livenessProbe": {
            "tcpSocket": {"port": "http"},
            "periodSeconds": 10,
            "timeoutSeconds": PROBE_TIMEOUT_S,
        },
        "securityContext": restricted_container(),
    }
