"""Cache-affinity routing (``spec.routing``) and the ``RouterReady`` condition.

``bundled``: the router's objects for the spec as the rollout applies it: the canary's
traffic share is an input of the router's ConfigMap (Envoy reloads it from the mounted
files, no restart), so a progressive step moves the users of one band of the hash, no more;
a canary without a ready pod gets no share. Ready once a router pod is (its readiness: it
can route to the stable version). A version that is no longer live loses its headless
Service with its Deployment (see ``versions``).

``gateway``: the HTTPRoute and BackendTrafficPolicy, the same way (the route's weights
follow the rollout); Ready once every Gateway the route names accepted it. Where the cluster
serves neither kind the condition says so and nothing is applied.

While the router is not ready, the instance is not (requests go through it). When the mode
goes back to ``none`` (or changes) what the former mode made is deleted — once, as the prior
status's condition says there was routing, so a RankerDeployment without routing costs no
API calls here.
"""

from __future__ import annotations

from kvrank_operator import manifests as m
from kvrank_operator.manifests.desired import Desired
from kvrank_operator.manifests.gateway import POLICY_API, ROUTE_API, gateway_objects, route_accepted
from kvrank_operator.manifests.router import router_name, router_objects
from kvrank_operator.reconcilers.base import Applied, Context, Pass, Report
from kvrank_operator.reconcilers.observe import Observed
from kvrank_operator.spec import RankerSpec
from kvrank_operator.state import ConditionUpdate

CONDITION = "RouterReady"
GATEWAY_KINDS = ((ROUTE_API, "HTTPRoute"), (POLICY_API, "BackendTrafficPolicy"))
MODE_OF_REASON = {
    "PodsReady": "bundled",
    "PodsWaiting": "bundled",
    "RouteAccepted": "gateway",
    "RouteNotAccepted": "gateway",
    "GatewayAPIMissing": "gateway",
}
"""The condition's reason says which mode made the objects there are."""


def desired(c: Context) -> list[Desired]:
    name, ns, live = c.instance.name, c.instance.namespace, c.live
    if live.routing.mode == "bundled":
        return [Desired(obj) for obj in router_objects(live, name, ns, c.routed)]
    if live.routing.mode == "gateway":
        return [Desired(obj, optional=True) for obj in gateway_objects(live, name, ns)]
    return []


def report(p: Pass, c: Context, seen: Observed, applied: Applied) -> Report:
    mode = c.live.routing.mode
    prior = p.prior.condition(CONDITION)
    before = MODE_OF_REASON.get(prior.reason, "bundled") if prior is not None else "none"
    if before not in ("none", mode):
        _remove(p, c.live, before)
    if mode == "none":
        return Report(removed=(CONDITION,))
    ok, reason, message = _bundled(c.live, seen) if mode == "bundled" else _gateway(seen, applied)
    unready: tuple[tuple[str, str], ...] = () if ok else (("RouterNotReady", f"router: {message}"),)
    return Report(conditions=(ConditionUpdate(CONDITION, ok, reason, message),), unready=unready)


def _bundled(live: RankerSpec, seen: Observed) -> tuple[bool, str, str]:
    ready = seen.router_ready
    message = f"{ready}/{live.routing.replicas} router pods ready"
    return ready > 0, "PodsReady" if ready > 0 else "PodsWaiting", message


def _gateway(seen: Observed, applied: Applied) -> tuple[bool, str, str]:
    if applied.unserved:
        served = " or ".join(applied.unserved)
        why = f"not served: {served} (install Gateway API, Envoy Gateway)"
        return False, "GatewayAPIMissing", why
    if applied.refused:
        return False, "RouteNotAccepted", "; ".join(applied.refused)
    ok, message = route_accepted(seen.route)
    return ok, "RouteAccepted" if ok else "RouteNotAccepted", message


def _remove(p: Pass, live: RankerSpec, mode: str) -> None:
    name, ns = p.instance.name, p.instance.namespace
    if mode == "gateway":
        for api, kind in GATEWAY_KINDS:
            if p.kube.serves(api, kind):
                p.kube.delete(api, kind, ns, name)
        return
    for api, kind in (
        ("apps/v1", "Deployment"),
        ("policy/v1", "PodDisruptionBudget"),
        ("v1", "ConfigMap"),
    ):
        p.kube.delete(api, kind, ns, router_name(name))
    for version, _ in live.versions():
        p.kube.delete("v1", "Service", ns, m.pods_service(name, version))
