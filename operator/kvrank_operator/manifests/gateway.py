"""``routing.mode: gateway``: the routing objects for a cluster that runs Gateway API with
Envoy Gateway, instead of a router of our own.

- an ``HTTPRoute`` attached to the user's Gateway, with one weighted ``backendRef`` per
  serving version's own Service (the canary's weight, the stable version the rest);
- an Envoy Gateway ``BackendTrafficPolicy`` on that route: consistent hashing on the routing
  header (Envoy Gateway's Maglev table: a user's requests reach one pod), a retry on another
  pod for a connect failure or reset, passive health checks (outlier detection) as the
  bundled router has.

What differs from ``bundled``: Envoy Gateway's consistent hash has no bounded load
(``hashBalanceFactor`` applies to the bundled router only), and how it splits a weighted
route among users is the gateway's business, so a user keeping one version while the weight
changes is promised by the bundled router only. Pure: plain dicts.
"""

from __future__ import annotations

from typing import Any

from kvrank_operator.manifests.common import deployment_name, labels
from kvrank_operator.spec import RankerSpec

ROUTE_API = "gateway.networking.k8s.io/v1"
POLICY_API = "gateway.envoyproxy.io/v1alpha1"
TIMEOUT = "5s"
RETRY_ON = ("connect-failure", "reset")
"""What Envoy Gateway retries on another pod. Not a shed answer: its policy cannot match the
rankers' ``x-kvrank-shed`` header (only status codes, which would retry any 503), so with
``routing.mode: gateway`` a shed request goes back to its caller (the bundled router retries
it once)."""


def gateway_objects(spec: RankerSpec, instance: str, namespace: str) -> list[dict[str, Any]]:
    """The HTTPRoute, then its BackendTrafficPolicy."""
    return [http_route(spec, instance, namespace), traffic_policy(spec, instance, namespace)]


def http_route(spec: RankerSpec, instance: str, namespace: str) -> dict[str, Any]:
    gw = spec.routing.gateway
    parent: dict[str, Any] = {"name": gw.name}
    if gw.namespace:
        parent["namespace"] = gw.namespace
    if gw.section_name:
        parent["sectionName"] = gw.section_name
    c = spec.canary
    canary_weight = c.weight if c is not None and c.serving else 0
    backends: list[dict[str, Any]] = [
        {
            "name": deployment_name(instance, version),
            "port": spec.port,
            "weight": canary_weight if role == "canary" else 100 - canary_weight,
        }
        for version, role in sorted(spec.versions(), key=lambda v: v[1] != "canary")
    ]
    rule: dict[str, Any] = {
        "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
        "backendRefs": [b for b in backends if b["weight"] > 0],
        "timeouts": {"request": TIMEOUT},
    }
    route_spec: dict[str, Any] = {"parentRefs": [parent], "rules": [rule]}
    if gw.hostnames:
        route_spec["hostnames"] = list(gw.hostnames)
    return {
        "apiVersion": ROUTE_API,
        "kind": "HTTPRoute",
        "metadata": _meta(instance, namespace),
        "spec": route_spec,
    }


def traffic_policy(spec: RankerSpec, instance: str, namespace: str) -> dict[str, Any]:
    target = {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": instance}
    return {
        "apiVersion": POLICY_API,
        "kind": "BackendTrafficPolicy",
        "metadata": _meta(instance, namespace),
        "spec": {
            "targetRefs": [target],
            "loadBalancer": {
                "type": "ConsistentHash",
                "consistentHash": {"type": "Headers", "headers": [{"name": spec.routing.header}]},
            },
            "retry": {"numRetries": 1, "retryOn": {"triggers": list(RETRY_ON)}},
            "healthCheck": {
                "passive": {
                    "consecutive5XxErrors": 5,
                    "interval": "5s",
                    "baseEjectionTime": "15s",
                    "maxEjectionPercent": 50,
                }
            },
        },
    }


def route_accepted(route: dict[str, Any] | None) -> tuple[bool, str]:
    """Whether every parent (Gateway) of the HTTPRoute accepted it, and what it said."""
    parents = ((route or {}).get("status") or {}).get("parents") or []
    if not parents:
        return False, "no gateway has accepted the HTTPRoute yet"
    for parent in parents:
        ref = parent.get("parentRef", {}).get("name", "?")
        accepted = next(
            (c for c in parent.get("conditions") or [] if c.get("type") == "Accepted"), None
        )
        if accepted is None or accepted.get("status") != "True":
            why = (accepted or {}).get("message") or "not accepted yet"
            return False, f"gateway {ref}: {why}"
    return True, "accepted by " + ", ".join(
        p.get("parentRef", {}).get("name", "?") for p in parents
    )


def _meta(instance: str, namespace: str) -> dict[str, Any]:
    return {"name": instance, "namespace": namespace, "labels": labels(instance, "routing")}
