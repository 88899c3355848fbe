"""Cache-affinity routing: with ``routing.mode: bundled`` the shared Service fronts an Envoy
router the operator deploys, which sends each user (by the routing header) to one ranker
pod, so its repeat requests are L1 hits where the plain Service spreads them over every pod;
a prefetch routed by the same key makes the next request a hit; gRPC calls are routed by the
same key through the routers' gRPC listener; a pod deleted under load
fails no request and moves only its own users, whose entries come back from Redis; and the
canary's share is split per user, so raising it moves only the users it adds."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from rankers import BODIES, Ranker, Rankers
from release import OperatorRelease
from stack import NS, Stack

from kvrank.model.artifact import load_ranker
from kvrank.server.schemas import request_model, to_inputs
from kvrank.tools.processes import samples

pytestmark = [pytest.mark.kube, pytest.mark.slow, pytest.mark.e2e]
HEADER = "X-KVRank-User"
PODS = 4
USERS = 160
L1_SHARES = 1.75
"""Each pod's L1 holds this many times its share of the users: far from all of them, and above
what the hash gives any pod (its count is binomial: 40 ± 5.5 of 160 users, so 1.75× is 5.6
standard deviations away on each run)."""


def users(n: int, prefix: str = "routed-user") -> list[dict[str, Any]]:
    """``n`` users, each with one history (the same request each time it comes back)."""
    return [{**BODIES[i % len(BODIES)], "user_id": f"{prefix}-{i}"} for i in range(n)]


def entry_bytes(stack: Stack, bodies: list[dict[str, Any]]) -> list[int]:
    """What each user's entry takes in L1 (fp32 K/V, as the run serves)."""
    model = load_ranker(stack.models / "feed-ranker" / "v1")
    schema = request_model(model.features)
    sizes = []
    for body in bodies:
        user, _ = to_inputs(schema.model_validate(body), model.features)
        sizes.append(int(model.encode_user(user, "fp32").nbytes))
    return sizes


def routed(ranker: Ranker, **spec: Any) -> dict[str, Any]:
    doc = ranker.spec(replicas=PODS)
    doc["spec"]["routing"] = {"mode": "bundled", "image": ranker.stack.images.router}
    # entries outlive every scenario of the module (one took 308 s on a loaded machine, and
    # the next one counts on the entries it left): a user that moves finds its entry in Redis
    doc["spec"]["ttl"] = {"mode": "fixed", "fixedSeconds": 3600}
    doc["spec"].update(spec)
    return doc


def post(
    ranker: Ranker, body: dict[str, Any], service: str | None = None, path: str = "/v1/score"
) -> httpx.Response:
    return ranker.stack.score(
        service or ranker.name, body, headers={HEADER: body["user_id"]}, path=path
    )


def answer(ranker: Ranker, body: dict[str, Any], service: str | None = None) -> tuple[str, str]:
    """``(cache outcome, the pod that answered)`` of one request, which must succeed."""
    resp = post(ranker, body, service)
    assert resp.status_code == 200, resp.text
    return resp.json()["cache"], resp.headers["x-kvrank-pod"]


def one_pass(ranker: Ranker, bodies: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    return {b["user_id"]: answer(ranker, b) for b in bodies}


def l1_share(answers: dict[str, tuple[str, str]] | list[tuple[str, str]]) -> float:
    outcomes = [a[0] for a in (answers.values() if isinstance(answers, dict) else answers)]
    return outcomes.count("l1") / len(outcomes)


@pytest.fixture(scope="module")
def ranker(stack: Stack, release: OperatorRelease) -> Iterator[Ranker]:
    """4 routed pods, each L1 holding :data:`L1_SHARES` times its share of the users."""
    release.ensure()
    made = Rankers(stack)
    try:
        ranker = made.new("routed")
        doc = routed(ranker)
        every_entry = sum(entry_bytes(stack, users(USERS)))
        doc["spec"]["cache"]["l1Bytes"] = int(L1_SHARES * every_entry / PODS)
        ranker.apply(doc)
        ranker.wait_ready(timeout=300)
        ranker.wait_condition("RouterReady", timeout=180)
        yield ranker
    finally:
        made.delete_all()


ROUTER_EVENTS = (  # (the text parser gives a counter's sample the _total suffix)
    "envoy_cluster_membership_change_total",
    "envoy_cluster_outlier_detection_ejections_enforced_total",
)
"""What moves a user legitimately, as each router counts it: its table of pods changed (a pod
left or joined the version's DNS name), or a pod was ejected for failing to answer."""


def router_events(stack: Stack, ranker: Ranker) -> dict[str, float]:
    """:data:`ROUTER_EVENTS` for the stable version's cluster, per router pod (by name: a
    router that restarted starts its counters again, which is a change too); and each ranker
    pod's restarts: one that restarted within a probe period keeps its place in every table
    but comes back with an empty L1, so its users' entries come from Redis."""
    cluster = ranker.version_name("v1")
    selector = "app.kubernetes.io/component=router,app.kubernetes.io/instance=" + ranker.name
    out = {}
    for pod in stack.select("pods", selector):
        name = pod["metadata"]["name"]
        path = f"/api/v1/namespaces/{NS}/pods/{name}:9902/proxy/stats/prometheus"
        text = stack.kubectl("get", "--raw", path)
        for event in ROUTER_EVENTS:
            out[f"{name}/{event}"] = sum(samples(text, event, envoy_cluster_name=cluster))
        # the pods it learned first were a change too: a router that counts none is misread
        assert out[f"{name}/{ROUTER_EVENTS[0]}"] >= 1, text[:2000]
    for pod in ranker.pods(version="v1"):
        statuses = pod["status"].get("containerStatuses", [])
        out[f"{pod['metadata']['name']}/restarts"] = sum(c["restartCount"] for c in statuses)
    return out


def tried_pass(ranker: Ranker, bodies: list[dict[str, Any]]) -> dict[str, tuple[str, str, int]]:
    """Each user's ``(cache outcome, pod, tries)``: the router's ``x-envoy-attempt-count``
    says whether the answer came on the first try or from a retry on another pod."""
    out = {}
    for body in bodies:
        resp = post(ranker, body)
        assert resp.status_code == 200, resp.text
        tries = int(resp.headers["x-envoy-attempt-count"])
        out[body["user_id"]] = (resp.json()["cache"], resp.headers["x-kvrank-pod"], tries)
    return out


def steady_passes(
    stack: Stack, ranker: Ranker, bodies: list[dict[str, Any]]
) -> list[dict[str, tuple[str, str, int]]] | None:
    """A pass that puts each user's entry on its pod, then two passes over every user, while
    no router's table changed and no ranker restarted; ``None`` if one did (a ranker's
    readiness failed under load, a router or a ranker restarted): all three are made again."""
    before = router_events(stack, ranker)
    one_pass(ranker, bodies)
    passes = [tried_pass(ranker, bodies) for _ in range(2)]
    return passes if router_events(stack, ranker) == before else None


def test_each_user_reaches_the_pod_holding_its_entry(stack: Stack, ranker: Ranker) -> None:
    """While the routers' tables stay as they are, every user's first tries reach one pod; a
    retry (its pod reset the connection or failed to answer) may reach another, and says so."""
    shared = stack.must_get("service", ranker.name)["spec"]["selector"]
    assert shared["app.kubernetes.io/component"] == "router"
    bodies = users(USERS)
    passes = stack.wait_for(
        lambda: steady_passes(stack, ranker, bodies), "two passes with the routers unchanged", 900
    )
    first_tries = [{u: a[:2] for u, a in p.items() if a[2] == 1} for p in passes]
    retried = sum(a[2] > 1 for p in passes for a in p.values())
    pods_of = {u: {r[u][1] for r in first_tries if u in r} for u in passes[0]}
    assert all(len(p) <= 1 for p in pods_of.values()), "a user's first tries reached two pods"
    per_pod = Counter(p.pop() for p in pods_of.values() if p)
    repeats = first_tries
    print(f"answers retried on another pod: {retried} of {2 * USERS}")
    # the same repeats through the version's plain Service: kube-proxy picks a pod at random,
    # which holds the user's entry one time in PODS
    through_service = [answer(ranker, b, ranker.version_name("v1")) for b in bodies]
    share = sum(l1_share(r) for r in repeats) / len(repeats)
    print(f"L1 share: router {share:.2f}, plain Service {l1_share(through_service):.2f}")
    print(f"users per pod: {sorted(per_pod.values())}")
    assert share >= 0.9, repeats
    assert len(per_pod) == PODS and max(per_pod.values()) <= L1_SHARES * USERS / PODS, per_pod
    assert l1_share(through_service) <= 0.4, through_service


def test_a_prefetch_routed_by_the_same_key_makes_the_ranking_request_a_hit(
    stack: Stack, ranker: Ranker
) -> None:
    def prefetched() -> float:
        return sum(
            sum(samples(text, "kvrank_prefetches_total", result="miss"))
            for text in stack.metrics(ranker.version_name("v1"))
        )

    before = prefetched()
    for i, body in enumerate(users(5, "prefetched")):
        ahead = {k: v for k, v in body.items() if k != "candidates"}  # the retrieval stage's
        resp = post(ranker, ahead, path="/v1/prefetch")
        assert resp.status_code == 202, resp.text
        stack.wait_for(lambda n=before + i + 1: prefetched() >= n, f"prefetch {i} made", 30)
        # the user's first ranking request: its entry was made on the pod it is routed to
        assert answer(ranker, body)[0] == "l1", body["user_id"]


def test_grpc_calls_through_the_routers_stick_to_the_pod_holding_the_users_entry(
    stack: Stack, ranker: Ranker
) -> None:
    """The shared Service's ``grpc`` port is the routers' too: with the user key as call
    metadata, a user's repeat ``ModelInfer`` calls are L1 hits on the pod its first call
    filled, scored as the JSON API scores them."""
    import tritonclient.grpc as triton

    from kvrank.server.oip import tensors

    spec = load_ranker(stack.models / "feed-ranker" / "v1").features
    client = triton.InferenceServerClient(stack.grpc_address(ranker.name))

    def call(body: dict[str, Any]) -> tuple[str, list[float]]:
        inputs = []
        for name, kind, array in tensors(spec, body):
            tensor = triton.InferInput(name, list(array.shape), kind)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        result = client.infer(ranker.name, inputs, headers={HEADER.lower(): body["user_id"]})
        cache = result.get_response().parameters["cache"].string_param
        return cache, result.as_numpy("scores").astype(float).tolist()

    try:
        bodies = users(24, "grpc-user")
        first = [call(b) for b in bodies]
        again = [call(b) for b in bodies]
    finally:
        client.close()
    assert sum(c == "l1" for c, _ in again) >= 0.9 * len(bodies), again
    assert [s for _, s in again] == [s for _, s in first]
    for body, (_, scores) in list(zip(bodies, again, strict=True))[:3]:
        assert post(ranker, body).json()["scores"] == scores


def test_a_pod_deleted_under_load_fails_no_request_and_moves_only_its_users(
    stack: Stack, ranker: Ranker
) -> None:
    # the users the first scenario routed (their entries sit in their pods' protected L1
    # segment; new users would only pass through the probation segment of a full L1)
    bodies = users(USERS)
    one_pass(ranker, bodies)
    before = one_pass(ranker, bodies)
    assert l1_share(before) >= 0.9, before
    victim = Counter(pod for _, pod in before.values()).most_common(1)[0][0]
    (node,) = stack.kubectl("get", "nodes", "-o", "name").split()
    # the node cordoned (as a drain does): the replacement pod waits, so what is measured
    # is the table without the victim; uncordoned, the replacement joins it
    stack.kubectl("cordon", node)
    try:
        stack.kubectl("delete", "pod", "-n", NS, victim, "--wait=false")
        failures: list[str] = []
        first_elsewhere: dict[str, str] = {}  # a user's first answer from another pod
        passes = 0
        while victim in stack.kubectl("get", "pods", "-n", NS, "-o", "name") or passes < 3:
            for body in bodies:  # the load: every user, over and over
                resp = post(ranker, body)
                if resp.status_code != 200:
                    failures.append(f"{resp.status_code} {resp.text[:200]}")
                    continue
                user, pod = body["user_id"], resp.headers["x-kvrank-pod"]
                if pod != before[user][1]:
                    first_elsewhere.setdefault(user, resp.json()["cache"])
            passes += 1
        after = one_pass(ranker, bodies)
    finally:
        stack.kubectl("uncordon", node)
    assert not failures, failures[:5]
    theirs = [u for u, (_, pod) in before.items() if pod == victim]
    kept = [u for u, (_, pod) in before.items() if pod != victim and after[u][1] == pod]
    print(f"pod {victim} deleted: {len(theirs)} of its users moved; "
          f"{len(kept)} of {USERS - len(theirs)} others kept their pod")  # fmt: skip
    assert len(kept) >= 0.9 * (USERS - len(theirs)), (before, after)
    assert all(after[u][1] != victim for u in after)
    # a moved user's entry was found on its new pod, never made again: from Redis, or from
    # that pod's L1 where a plain-Service request of the first scenario left it
    assert set(theirs) <= set(first_elsewhere), first_elsewhere
    print(f"moved users' first answers: {dict(Counter(first_elsewhere.values()))}")
    assert "miss" not in first_elsewhere.values(), first_elsewhere
    assert Counter(first_elsewhere[u] for u in theirs)["l2"] >= len(theirs) / 2, first_elsewhere
    stack.wait_for(lambda: ranker.ready_replicas("v1") == PODS, "the replacement pod", 240)
    stack.wait_for(  # the replacement takes its share of the users: one pass warms it
        lambda: one_pass(ranker, bodies) and l1_share(one_pass(ranker, bodies)) >= 0.9,
        "the L1 share back one pass after the replacement joined",
        120,
    )


SETTLE_S = 420
"""How long a weight may take to reach every answer: the kubelet brings the router's ConfigMap
(its sync period plus its cache's TTL: up to ~2 min), a new canary pod starts (~3 min while
the other lane loads both cores), the router's DNS learns it, and each look is two passes of
160 requests through the API server's proxy. A bound on waiting, not the verdict: the shares
and the users that stay are (180 s ran out once under load; 194 s in all alone)."""


def test_the_canary_share_is_split_per_user_and_grows_by_a_band(
    stack: Stack, rankers: Rankers
) -> None:
    bodies = users(160)
    ranker = rankers.new("split")

    def canary(weight: int) -> dict[str, Any]:
        return ranker.with_canary(routed(ranker), "v2", weight)

    unsettled: list[str] = []

    def versions() -> dict[str, str] | None:
        """Each user's version over two passes of answers; ``None`` while a user saw two (the
        router between two weights: the kubelet brings a ConfigMap's update within a minute)
        or the router had no host yet for a user's version (its DNS learns a new version's
        pods a few seconds after they are Ready), counted in ``unsettled``."""
        seen: dict[str, set[str]] = {}
        for _ in range(2):
            for b in bodies:
                resp = post(ranker, b)
                if resp.status_code == 503 and "no healthy upstream" in resp.text:
                    unsettled.append(b["user_id"])
                    return None
                assert resp.status_code == 200, resp.text
                seen.setdefault(b["user_id"], set()).add(resp.json()["model_version"])
        if any(len(v) > 1 for v in seen.values()):
            return None
        return {u: v.pop() for u, v in seen.items()}

    def share(of: dict[str, str]) -> float:
        return sum(v == "v2" for v in of.values()) / len(of)

    ranker.apply(canary(25))
    ranker.wait_ready("with the canary", 300)
    ranker.wait_condition("RouterReady", timeout=180)
    at_25 = stack.wait_for(
        lambda: (v := versions()) and abs(share(v) - 0.25) <= 0.08 and v,
        "a quarter of the users on the canary",
        SETTLE_S,
    )
    ranker.apply(canary(50))
    at_50 = stack.wait_for(  # the router reloads its ConfigMap as the kubelet updates it
        lambda: (v := versions()) and abs(share(v) - 0.5) <= 0.08 and v,
        "half of the users on the canary",
        SETTLE_S,
    )
    print(
        f"canary share of users: {share(at_25):.2f} at 25, {share(at_50):.2f} at 50;"
        f" {len(unsettled)} passes met a version without a routable host yet"
    )
    moved = [u for u, v in at_25.items() if v == "v2" and at_50[u] != "v2"]
    assert not moved, f"{len(moved)} users left the canary when its share grew"
