"""The routing concern: the instance is not Ready while the router requests go through is
not, and the Gateway API's absence or refusal is a condition, not a failed pass."""

from __future__ import annotations

from passes import STABLE, observed, pass_of

from kvrank_operator.reconcile import ready_condition
from kvrank_operator.reconcilers import routing
from kvrank_operator.reconcilers.base import Applied, Report

BUNDLED = {**STABLE, "routing": {"mode": "bundled", "replicas": 2}}
GATEWAY = {**STABLE, "routing": {"mode": "gateway", "gateway": {"name": "edge"}}}


def test_ready_waits_for_the_router_requests_go_through() -> None:
    """With no router pod ready the instance is not Ready, whatever the versions say; the
    reason names the router and the message carries every concern's why."""
    p, c = pass_of(BUNDLED)

    def router(ready: int) -> Report:
        return routing.report(p, c, observed(router_ready=ready), Applied())

    waiting = ready_condition(Report() + router(0))
    assert not waiting.ok and waiting.reason == "RouterNotReady"
    assert "0/2 router pods ready" in waiting.message
    assert ready_condition(Report() + router(1)).ok
    versions_waiting = Report(unready=(("Waiting", "waiting for v2"),))
    both = ready_condition(versions_waiting + router(0))
    assert both.reason == "Waiting" and both.message.startswith("waiting for v2; router: 0/2")


def test_without_the_gateway_api_the_condition_says_what_to_install() -> None:
    p, c = pass_of(GATEWAY)
    wanted = routing.desired(c)
    assert {d.kind for d in wanted} == {"HTTPRoute", "BackendTrafficPolicy"}
    assert all(d.optional for d in wanted)
    unserved = Applied(unserved=("HTTPRoute (gateway.networking.k8s.io/v1)",))
    (u,) = routing.report(p, c, observed(), unserved).conditions
    assert (u.ok, u.reason) == (False, "GatewayAPIMissing") and "install Gateway API" in u.message
    refused = Applied(refused=("HTTPRoute feed: API 422 Unprocessable Entity",))
    (u,) = routing.report(p, c, observed(), refused).conditions
    assert (u.ok, u.reason, u.message) == (False, "RouteNotAccepted", refused.refused[0])


def test_without_routing_it_wants_nothing_and_removes_its_condition() -> None:
    p, c = pass_of(STABLE)
    assert routing.desired(c) == []
    assert routing.report(p, c, observed(), Applied()).removed == ("RouterReady",)
