"""``routing.mode: gateway`` against the session's real API server with the real Gateway API
and Envoy Gateway CRDs (from their Go modules): what the operator writes passes a strict
server-side dry run (and a broken policy would not), and the ``kvrank-operator run``
process writes the HTTPRoute and BackendTrafficPolicy, follows the canary's weight, reports
whether the Gateway accepted the route, and deletes both when routing goes back to none.

No gateway controller runs here: the test plays its one part the operator reads, the
``Accepted`` condition on the route's status."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from api_server import fetched_crds, install_crds, strict_dry_run
from localkube.images import PAUSE_IMAGE
from localkube.processes import wait_for
from operator_process import condition, operator, rkd_status, tail_of

from kvrank_operator.crd import API_VERSION
from kvrank_operator.manifests.gateway import gateway_objects
from kvrank_operator.spec import parse_spec

pytestmark = pytest.mark.kube
CRDS = (
    "httproutes.gateway.networking.k8s.io",
    "gateways.gateway.networking.k8s.io",
    "gatewayclasses.gateway.networking.k8s.io",
    "backendtrafficpolicies.gateway.envoyproxy.io",
)


def spec(weight: int | None = 25, mode: str = "gateway") -> dict[str, Any]:
    doc: dict[str, Any] = {
        "model": {"version": "v1", "uri": "/models/v1", "image": PAUSE_IMAGE, "replicas": 1},
        "cache": {"redis": {"mode": "external", "url": "redis://nowhere.invalid:6379"}},
        "routing": {"mode": mode, "gateway": {"name": "public", "namespace": "gateways"}},
    }
    if weight is not None:
        doc["canary"] = {"version": "v2", "uri": "/models/v2", "weight": weight}
    return doc


@pytest.fixture(scope="module")
def gateway_api(cluster):  # type: ignore[no-untyped-def]
    install_crds(cluster, sorted(fetched_crds("gateway-crds.sh").glob("*.yaml")), CRDS, ours=True)
    return cluster


@pytest.mark.parametrize("weight", [None, 25], ids=["stable-only", "canary-at-25"])
def test_the_route_and_policy_pass_a_strict_dry_run(gateway_api, weight) -> None:
    for doc in gateway_objects(parse_spec(spec(weight)), "feed", "default"):
        ok, err = strict_dry_run(gateway_api, doc)
        assert ok, f"{doc['kind']}: {err}"


def test_a_policy_the_crd_does_not_describe_is_refused(gateway_api) -> None:
    _, policy = gateway_objects(parse_spec(spec()), "feed", "default")
    policy["spec"]["loadBalancer"]["consistentHash"]["type"] = "UserId"
    ok, err = strict_dry_run(gateway_api, policy)
    assert not ok and "consistentHash.type" in err, err


def test_the_operator_writes_follows_and_removes_the_gateway_objects(
    gateway_api, tmp_path: Path
) -> None:
    cluster = gateway_api
    ns = f"gw-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)

    def get(kind: str) -> dict[str, Any] | None:
        out = cluster.kubectl("get", kind, "feed", "-n", ns, "-o", "json", check=False)
        return json.loads(out.stdout) if out.returncode == 0 else None

    def weights() -> dict[str, int]:
        route = get("httproute") or {"spec": {"rules": [{"backendRefs": []}]}}
        return {b["name"]: b["weight"] for b in route["spec"]["rules"][0]["backendRefs"]}

    def apply(body: dict[str, Any]) -> None:
        doc = {
            "apiVersion": API_VERSION,
            "kind": "RankerDeployment",
            "metadata": {"name": "feed", "namespace": ns},
            "spec": body,
        }
        cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))

    with operator(cluster, ns, tmp_path) as op:
        apply(spec(25))
        wait_for(
            lambda: weights() == {"feed-v2": 25, "feed-v1": 75},
            "the weighted route",
            60,
            tail_of(op.log),
        )
        policy = get("backendtrafficpolicy")
        assert policy is not None
        assert policy["spec"]["loadBalancer"]["consistentHash"]["headers"] == [
            {"name": "X-KVRank-User"}
        ]
        assert policy["spec"]["targetRefs"][0]["name"] == "feed"
        wait_for(
            lambda: (
                condition(rkd_status(cluster, ns), "RouterReady") == ("False", "RouteNotAccepted")
            ),
            "RouterReady False: no gateway accepted the route",
            60,
            tail_of(op.log),
        )
        # the gateway controller's part: it accepts the route
        accepted = {
            "status": {
                "parents": [
                    {
                        "parentRef": {"name": "public", "namespace": "gateways"},
                        "controllerName": "gateway.envoyproxy.io/gatewayclass-controller",
                        "conditions": [
                            {
                                "type": "Accepted",
                                "status": "True",
                                "reason": "Accepted",
                                "message": "Route is accepted",
                                "lastTransitionTime": "2026-01-01T00:00:00Z",
                                "observedGeneration": 1,
                            }
                        ],
                    }
                ]
            }
        }
        cluster.kubectl(
            "patch", "httproute", "feed", "-n", ns, "--subresource=status", "--type=merge",
            "-p", json.dumps(accepted),
        )  # fmt: skip
        wait_for(
            lambda: condition(rkd_status(cluster, ns), "RouterReady") == ("True", "RouteAccepted"),
            "RouterReady True once the gateway accepted the route",
            60,
            tail_of(op.log),
        )
        apply(spec(50))
        wait_for(
            lambda: weights() == {"feed-v2": 50, "feed-v1": 50},
            "the canary's new weight",
            60,
            tail_of(op.log),
        )
        apply(spec(None, mode="none"))
        wait_for(
            lambda: get("httproute") is None and get("backendtrafficpolicy") is None,
            "both objects deleted",
            60,
            tail_of(op.log),
        )
        wait_for(
            lambda: condition(rkd_status(cluster, ns), "RouterReady") is None,
            "RouterReady gone",
            60,
            tail_of(op.log),
        )
        # while the operator runs: it removes its finalizer (a RankerDeployment left with one
        # would hold up the deletion of the CRD, which the install scenario does)
        cluster.kubectl("delete", "rkd", "feed", "-n", ns)
    cluster.kubectl("delete", "namespace", ns, "--wait=false")
