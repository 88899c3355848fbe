"""The queue proxy beside a ranker (and the timeouts both proxies keep toward rankers)."""

from __future__ import annotations

import json

import yaml

from kvrank_operator import manifests as m
from kvrank_operator.spec import parse_spec


def test_a_queue_proxy_takes_the_pods_http_port_and_bounds_scoring_only() -> None:
    from kvrank_operator.manifests.queue_proxy import UPSTREAM_GRPC_PORT, UPSTREAM_PORT

    def pod(admission: dict) -> dict:
        spec = parse_spec({"model": {"version": "v1", "uri": "/m"}, "admission": admission})
        return m.deployment(spec, "feed", "prod", "v1", "/m", 2, "stable")["spec"]["template"]

    assert [c["name"] for c in pod({})["spec"]["containers"]] == ["ranker"]  # off by default
    template = pod({"queueProxy": {"enabled": True, "maxInflight": 8}})
    ranker, proxy = template["spec"]["containers"]
    assert (
        proxy["name"] == "queue-proxy"
        and proxy["image"] == parse_spec({"model": {"version": "v1", "uri": "/m"}}).routing.image
    )  # the router image: the same stock Envoy
    # the pod's http and grpc ports (Services, the router, the PodMonitor) are the proxy's
    assert [p["name"] for p in ranker["ports"]] == ["admin", "probes"]
    assert proxy["ports"] == [
        {"name": "http", "containerPort": 8080},
        {"name": "grpc", "containerPort": 8001},
        {"name": "proxy-stats", "containerPort": 9902},  # Envoy's statistics, for the PodMonitor
    ]
    env = {e["name"]: e.get("value") for e in ranker["env"]}
    assert env["KVRANK_PORT"] == str(UPSTREAM_PORT) and env["KVRANK_HOST"] == "0.0.0.0"
    assert env["KVRANK_GRPC_PORT"] == str(UPSTREAM_GRPC_PORT)
    assert ranker["readinessProbe"]["httpGet"]["port"] == "probes"  # never behind the bound
    bootstrap = json.loads(proxy["args"][proxy["args"].index("--config-yaml") + 1])
    listener, grpc, stats = bootstrap["static_resources"]["listeners"]
    assert grpc["address"]["socket_address"]["port_value"] == 8001
    assert stats["address"]["socket_address"]["port_value"] == 9902
    assert listener["address"]["socket_address"]["port_value"] == 8080
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    routes = manager["route_config"]["virtual_hosts"][0]["routes"]
    assert [(r["match"]["prefix"], r["route"]["cluster"]) for r in routes] == [
        ("/v1/", "ranker"),
        ("/", "ranker-ops"),
    ]
    clusters = {c["name"]: c for c in bootstrap["static_resources"]["clusters"]}
    bound = clusters["ranker"]["circuit_breakers"]["thresholds"][0]
    assert bound["max_requests"] == 8 and bound["max_connections"] > 8
    assert set(clusters) == {"ranker", "ranker-ops", "ranker-grpc", "admin"}
    # gRPC: every call bounded alike, over HTTP/2 to the ranker's gRPC server
    assert clusters["ranker-grpc"]["circuit_breakers"]["thresholds"][0] == bound
    (options,) = clusters["ranker-grpc"]["typed_extension_protocol_options"].values()
    assert "http2_protocol_options" in options["explicit_http_config"]
    for name, port in (("ranker", UPSTREAM_PORT), ("ranker-ops", UPSTREAM_PORT),
                       ("ranker-grpc", UPSTREAM_GRPC_PORT)):  # fmt: skip
        (endpoint,) = clusters[name]["load_assignment"]["endpoints"][0]["lb_endpoints"]
        assert endpoint["endpoint"]["address"]["socket_address"] == {
            "address": "127.0.0.1",
            "port_value": port,
        }
    assert bootstrap["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"
    assert proxy["securityContext"]["readOnlyRootFilesystem"] is True
    assert proxy["resources"]["limits"]["memory"] == "256Mi"
    # a changed bound is a changed pod template: the pods roll
    assert pod({"queueProxy": {"enabled": True, "maxInflight": 9}}) != template


def test_the_proxies_close_idle_connections_to_a_ranker_before_the_ranker_does() -> None:
    """A request a proxy sends on a connection the ranker is closing meets a reset: the router
    retries it on another pod (the user leaves its cached entry), the queue proxy answers 503.
    Both proxies' clusters close idle connections first."""
    from kvrank.server.config import ServerConfig
    from kvrank_operator.manifests.envoy import UPSTREAM_IDLE_TIMEOUT_S
    from kvrank_operator.manifests.queue_proxy import envoy_bootstrap
    from kvrank_operator.manifests.router import envoy_files, router_config

    assert ServerConfig().keep_alive_s > UPSTREAM_IDLE_TIMEOUT_S
    spec = parse_spec({"model": {"version": "v1", "uri": "/m/v1"}, "routing": {"mode": "bundled"}})
    cds = yaml.safe_load(envoy_files(router_config(spec, "feed", "prod"))["cds.yaml"])
    queue = envoy_bootstrap(8080, 8081, 16, 9901)["static_resources"]["clusters"]
    to_rankers = [c for c in [*cds["resources"], *queue] if c["name"] != "admin"]
    assert len(to_rankers) == 4  # the router's version (HTTP, gRPC), the queue proxy's two
    for cluster in to_rankers:
        (options,) = cluster["typed_extension_protocol_options"].values()
        idle = options["common_http_protocol_options"]["idle_timeout"]
        assert idle == f"{UPSTREAM_IDLE_TIMEOUT_S}s", cluster["name"]
