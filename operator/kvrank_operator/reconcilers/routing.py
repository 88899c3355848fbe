"""Cache-affinity routing (``spec.routing``) and the ``RouterReady`` condition.

``bundled``: the router's objects are applied for the spec as the rollout applies it: the
canary's traffic share is an input of the router's ConfigMap (Envoy reloads it from the
mounted files, no restart), so a progressive step moves the users of one band of the hash,
no more; a canary without a ready pod gets no share. Ready once a router pod is (its
readiness: it can route to the stable version). A version that is no longer live loses its
headless Service with its Deployment (see ``versions``).

``gateway``: the HTTPRoute and BackendTrafficPolicy are applied the same way (the route's
weights follow the rollout); Ready once every Gateway the route names accepted it. Where
the cluster serves neither kind the condition says so and nothing is applied.

When the mode goes back to ``none`` (or changes) what the former mode made is deleted —
once, as the prior status's condition says there was routing, so a RankerDeployment without
routing costs no API calls here.
"""

from __future__ import annotations

import dataclasses

from kvrank_operator import manifests as m
from kvrank_operator.manifests.gateway import POLICY_API, ROUTE_API, gateway_objects, route_accepted
from kvrank_operator.manifests.router import router_name, router_objects, router_selector
from kvrank_operator.reconcilers.base import Pass, Report
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


def reconcile(p: Pass, live: RankerSpec, seen: Observed) -> Report:
    mode = live.routing.mode
    prior = p.prior.condition(CONDITION)
    before = MODE_OF_REASON.get(prior.reason, "bundled") if prior is not None else "none"
    if before not in ("none", mode):
        _remove(p, live, before)
    if mode == "none":
        return Report(removed=(CONDITION,))
    ok, reason, message = _bundled(p, live, seen) if mode == "bundled" else _gateway(p, live)
    return Report(conditions=(ConditionUpdate(CONDITION, ok, reason, message),))


def _bundled(p: Pass, live: RankerSpec, seen: Observed) -> tuple[bool, str, str]:
    name, ns = p.instance.name, p.instance.namespace
    serving = frozenset(v for v, _ in live.versions() if seen.ready_replicas(v) > 0)
    for obj in router_objects(live, name, ns, serving):
        p.kube.apply(obj, p.instance.owner)
    # listed, not read by name: the operator may list Deployments, not get them
    deps = p.kube.list("apps/v1", "Deployment", ns, router_selector(name))
    ready = sum(int((d.get("status") or {}).get("readyReplicas") or 0) for d in deps)
    ok = ready > 0
    message = f"{ready}/{live.routing.replicas} router pods ready"
    return ok, "PodsReady" if ok else "PodsWaiting", message


def _gateway(p: Pass, live: RankerSpec) -> tuple[bool, str, str]:
    name, ns = p.instance.name, p.instance.namespace
    missing = [f"{kind} ({api})" for api, kind in GATEWAY_KINDS if not p.kube.serves(api, kind)]
    if missing:
        served = " or ".join(missing)
        return (
            False,
            "GatewayAPIMissing",
            f"not served: {served} (install Gateway API, Envoy Gateway)",
        )
    for obj in gateway_objects(live, name, ns):
        p.kube.apply(obj, p.instance.owner)
    ok, message = route_accepted(p.kube.get(ROUTE_API, "HTTPRoute", ns, name))
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


def fold_into_ready(report: Report) -> Report:
    """``Ready`` is false while the router that requests go through is not ready: what
    ``kubectl wait --for=condition=Ready`` waits for is an instance that answers."""
    router = next((c for c in report.conditions if c.type == CONDITION), None)
    if router is None or router.ok:
        return report
    conditions = tuple(
        ConditionUpdate(c.type, False, "RouterNotReady", f"{c.message}; router: {router.message}")
        if c.type == "Ready" and c.ok
        else c
        for c in report.conditions
    )
    return dataclasses.replace(report, conditions=conditions)
