"""Pieces of Envoy configuration the bundled router and the rankers' queue proxy share: a
listener, the router filter, a static cluster, and the listener that shows other pods only
``/ready`` and ``/stats/prometheus`` of an admin interface kept on loopback. Pure: plain
dicts in Envoy's v3 schema."""

from __future__ import annotations

from typing import Any

HTTP_CONNECTION_MANAGER = (
    "type.googleapis.com/envoy.extensions.filters.network."
    "http_connection_manager.v3.HttpConnectionManager"
)
ADMIN_CLUSTER = "admin"
ADMIN_PORT = 9901
"""An Envoy's admin interface, on loopback only (it can drain and stop the proxy)."""
STATS_PORT = 9902
"""What of it other pods may see (:func:`stats_listener`): ``/ready``, ``/stats/prometheus``."""
UPSTREAM_IDLE_TIMEOUT_S = 30
"""An Envoy closes a connection to a ranker idle this long, well before the ranker would (its
``keep_alive_s``, 75 s). Whichever side closes an idle connection first must be the proxy: a
request sent on a connection the ranker is closing meets a reset, which the router retries on
another pod (a user moved away from its cached entry) and the queue proxy answers 503."""


def socket(address: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": address, "port_value": port}}


def router_filter() -> dict[str, Any]:
    return {
        "name": "envoy.filters.http.router",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
        },
    }


def listener(
    name: str, port: int, manager: dict[str, Any], address: str = "0.0.0.0"
) -> dict[str, Any]:
    return {
        "name": name,
        "address": socket(address, port),
        "filter_chains": [
            {"filters": [{"name": "envoy.filters.network.http_connection_manager",
                          "typed_config": manager}]}
        ],
    }  # fmt: skip


def upstream_http_options(http2: bool = False) -> dict[str, Any]:
    """HTTP/1.1 (or ``http2``: HTTP/2, gRPC's) to the rankers, idle connections closed after
    :data:`UPSTREAM_IDLE_TIMEOUT_S` (a cluster's ``typed_extension_protocol_options``)."""
    protocol: dict[str, Any] = {"http2_protocol_options" if http2 else "http_protocol_options": {}}
    return {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "common_http_protocol_options": {"idle_timeout": f"{UPSTREAM_IDLE_TIMEOUT_S}s"},
            "explicit_http_config": protocol,
        }
    }


def static_cluster(
    name: str, port: int, connect_timeout: str, http2: bool = False, **extra: Any
) -> dict[str, Any]:
    """A cluster of one host on loopback (``http2``: HTTP/2, a gRPC server)."""
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": connect_timeout,
        "typed_extension_protocol_options": upstream_http_options(http2),
        **extra,
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": socket("127.0.0.1", port)}}]}],
        },
    }


def admin_cluster(admin_port: int) -> dict[str, Any]:
    """The admin interface on loopback, for :func:`stats_listener`'s routes."""
    return static_cluster(ADMIN_CLUSTER, admin_port, "0.25s")


def stats_listener(
    port: int, filters: list[dict[str, Any]] | None = None, address: str = "0.0.0.0"
) -> dict[str, Any]:
    """What other pods may see of the admin interface: ``/ready`` and ``/stats/prometheus``
    (liveness, the PodMonitor); ``filters`` may answer more paths before the router filter."""
    routes = [
        {"match": {"path": path}, "route": {"cluster": ADMIN_CLUSTER}}
        for path in ("/ready", "/stats/prometheus")
    ]
    manager = {
        "@type": HTTP_CONNECTION_MANAGER,
        "stat_prefix": "stats",
        "route_config": {
            "name": "stats",
            "virtual_hosts": [{"name": "admin", "domains": ["*"], "routes": routes}],
        },
        "http_filters": [*(filters or []), router_filter()],
    }
    return listener("stats", port, manager, address)
