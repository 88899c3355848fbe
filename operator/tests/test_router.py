"""The bundled router's configuration, run by the stock Envoy binary in front of real
``kvrank serve`` processes: each user's repeat requests reach the one pod that holds its
K/V (L1), while random routing mostly misses it; the canary's share is split per user, a
user sees one version, and raising the weight moves only the users in the added band —
on a configuration Envoy reloads from its files without a restart."""

from __future__ import annotations

import http.server
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
import yaml
from envoy_router import EnvoyRouter

from kvrank.admission import TIMEOUT_HEADER
from kvrank.model.artifact import save_model
from kvrank.model.config import TINY
from kvrank.model.ranker import RankerModel
from kvrank.tools.processes import RankerProcess, free_port
from kvrank.tools.workload import Workload, WorkloadSettings
from kvrank_operator.manifests.router import RouterConfig, Upstream

pytestmark = pytest.mark.slow
USERS = 80
PODS = 4


def artifact(root: Path, version: str, seed: int) -> Path:
    torch.manual_seed(seed)
    return save_model(RankerModel(TINY, version).eval(), root / version)


WAIT_S = 30
"""What a scoring call through the router waits, and says it waits (the rankers' deadline
header): a ranker on a loaded machine sheds a request it cannot answer within the 5 s default
(``x-kvrank-shed: deadline``), which is not what these tests are about."""


def caller(user: str) -> dict[str, str]:
    """A call's headers: the routing key and the deadline the caller waits."""
    return {"X-KVRank-User": user, TIMEOUT_HEADER: str(WAIT_S * 1000)}


class Envoy(EnvoyRouter):
    """The router on loopback, and a scoring call through it that must succeed."""

    def score(self, body: dict, user: str) -> dict:
        resp = httpx.post(
            f"http://127.0.0.1:{self.port}/v1/score",
            json=body,
            headers=caller(user),
            timeout=WAIT_S + 5,
        )
        assert resp.status_code == 200, (dict(resp.headers), resp.text)  # who answered
        return dict(resp.json())


@pytest.fixture
def envoy(tmp_path: Path) -> Iterator[Envoy]:
    e = Envoy(tmp_path)
    yield e
    e.stop()


def requests(users: int = USERS) -> list[dict]:
    """One request per user (the same history each time: a user between two events)."""
    pool = [r.body for r in Workload(TINY, WorkloadSettings(users=50, candidates=8)).requests(50)]
    return [{**pool[i % len(pool)], "user_id": f"user-{i}"} for i in range(users)]


def pods(tmp_path: Path, model: Path, n: int, l1_entries: float) -> list[RankerProcess]:
    """``n`` rankers with L1 room for ``l1_entries`` entries each, kept an hour: a pass over
    the users outlasts the default minute on a loaded machine (every entry of the first pass
    expired before the second was seen: a verdict on the machine's speed, not the routing)."""
    entry = 1 + int(l1_entries * kv_bytes(model))
    args, env = ("--l1-bytes", str(entry)), {"KVRANK_TTL_FIXED_SECONDS": "3600"}
    return [RankerProcess.start(model, tmp_path, *args, env=env) for _ in range(n)]


def kv_bytes(model: Path) -> int:
    from kvrank.model.artifact import load_ranker
    from kvrank.model.features import example_user

    m = load_ranker(model)
    return int(m.encode_user(example_user(m.features, TINY.max_events, torch.Generator())).nbytes)


def test_each_user_reaches_the_pod_holding_its_entry(envoy: Envoy, tmp_path: Path) -> None:
    """4 pods, each with L1 room for twice its share of the users (how many a pod gets is
    the hash's business; at 80 users one was seen to get 30, another 9): through the router
    each user is encoded once, on one pod, and every repeat request is an L1 hit there; the
    same requests sent to a pod at random mostly are not."""
    model = artifact(tmp_path / "models", "v1", 0)
    rankers = pods(tmp_path, model, PODS, 2 * USERS / PODS)
    try:
        endpoints = tuple(("127.0.0.1", r.port) for r in rankers)
        envoy.write(RouterConfig([Upstream("feed-v1", 100, True, endpoints)], port=envoy.port))
        envoy.start()
        assert (
            httpx.get(f"http://127.0.0.1:{envoy.stats_port}/routable", timeout=5).status_code == 200
        )
        bodies = requests()
        for body in bodies:  # the first pass fills each user's pod
            envoy.score(body, body["user_id"])
        routed = [envoy.score(b, b["user_id"])["cache"] for b in bodies]
        l1_share = routed.count("l1") / len(routed)
        # each user encoded once, on its pod: how many users each pod holds
        users_per_pod = [r.metric("kvrank_user_encodes_total", kind="full") for r in rankers]
        # the same pods, each request to one at random (kube-proxy's choice)
        rng = torch.Generator().manual_seed(0)
        unrouted = []
        for _ in range(2):
            for b in bodies:
                pod = rankers[int(torch.randint(PODS, (1,), generator=rng))]
                answer = httpx.post(
                    f"{pod.url}/v1/score", json=b, headers=caller(b["user_id"]), timeout=WAIT_S + 5
                ).json()
                unrouted.append(answer["cache"])
        random_share = unrouted[len(bodies) :].count("l1") / len(bodies)
        print(
            f"L1 share: routed {l1_share:.2f}, random {random_share:.2f}; users/pod {users_per_pod}"
        )
        assert l1_share >= 0.95, Counter(routed)
        assert sum(users_per_pod) == USERS, users_per_pod  # one pod per user
        assert random_share <= l1_share - 0.3, Counter(unrouted)
    finally:
        for r in rankers:
            r.stop()


def test_grpc_calls_reach_the_pod_holding_the_users_entry(envoy: Envoy, tmp_path: Path) -> None:
    """Through the router's gRPC listener, the user key sent as call metadata (what
    ``tritonclient.grpc`` sends as ``headers``): each user is encoded once, on one pod, every
    repeat call is an L1 hit there, and the scores are those the JSON API gives."""
    import tritonclient.grpc as triton

    from kvrank.model.onetrans import feature_spec
    from kvrank.server.oip import tensors

    model = artifact(tmp_path / "models", "v1", 0)
    grpc_ports = [free_port() for _ in range(3)]
    env = {"KVRANK_TTL_FIXED_SECONDS": "3600"}
    rankers = [
        RankerProcess.start(model, tmp_path, "--grpc-port", str(p), env=env) for p in grpc_ports
    ]
    client = None
    try:
        http = tuple(("127.0.0.1", r.port) for r in rankers)
        grpc = tuple(("127.0.0.1", p) for p in grpc_ports)
        upstream = Upstream("feed-v1", 100, True, http, grpc)
        envoy.write(RouterConfig([upstream], port=envoy.port, grpc_port=envoy.grpc_port))
        envoy.start()
        envoy.wait_routable()
        client = triton.InferenceServerClient(f"127.0.0.1:{envoy.grpc_port}")
        spec, bodies = feature_spec(TINY), requests(40)

        def call(body: dict) -> tuple[str, list[float]]:
            inputs = []
            for name, kind, array in tensors(spec, body):
                tensor = triton.InferInput(name, list(array.shape), kind)
                tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            result = client.infer("ranker", inputs, headers={"x-kvrank-user": body["user_id"]})
            cache = result.get_response().parameters["cache"].string_param
            return cache, result.as_numpy("scores").astype(float).tolist()

        first = [call(b) for b in bodies]
        again = [call(b) for b in bodies]
        users_per_pod = [r.metric("kvrank_user_encodes_total", kind="full") for r in rankers]
        caches = [cache for cache, _ in again]
        assert caches.count("l1") / len(caches) >= 0.95, Counter(caches)
        assert sum(users_per_pod) == len(bodies), users_per_pod  # one pod per user
        assert [s for _, s in again] == [s for _, s in first]
        for body, (_, scores) in list(zip(bodies, again, strict=True))[:5]:
            assert envoy.score(body, body["user_id"])["scores"] == scores
        assert sum(r.metric("kvrank_requests_total", protocol="v2-grpc") for r in rankers) == 80
    finally:
        if client is not None:
            client.close()
        for r in rankers:
            r.stop()


def test_a_history_sent_by_reference_reaches_the_pod_holding_it(
    envoy: Envoy, tmp_path: Path
) -> None:
    """Through the router a user's ``If-Match`` request (candidates only) reaches the pod
    whose L1 holds the entry its ETag names, and is scored as the full request was; the same
    reference sent to a pod without the entry (no shared Redis here) is a 412 there."""
    model = artifact(tmp_path / "models", "v1", 0)
    rankers = pods(tmp_path, model, 2, USERS)
    try:
        endpoints = tuple(("127.0.0.1", r.port) for r in rankers)
        envoy.write(RouterConfig([Upstream("feed-v1", 100, True, endpoints)], port=envoy.port))
        envoy.start()
        url = f"http://127.0.0.1:{envoy.port}/v1/score"
        for body in requests(10):
            user = body["user_id"]
            full = httpx.post(url, json=body, headers=caller(user), timeout=WAIT_S + 5)
            assert full.status_code == 200, full.text
            ref = {"user_id": user, "candidates": body["candidates"]}
            tag = {**caller(user), "If-Match": full.headers["etag"]}
            again = httpx.post(url, json=ref, headers=tag, timeout=WAIT_S + 5)
            assert again.status_code == 200, again.text
            assert again.json()["cache"] == "l1"
            assert again.json()["scores"] == full.json()["scores"]
        # each pod answers by reference only for the users it holds
        statuses = Counter(
            httpx.post(f"{r.url}/v1/score", json=ref, headers=tag, timeout=WAIT_S + 5).status_code
            for r in rankers
        )
        assert statuses == Counter({200: 1, 412: 1}), statuses
    finally:
        for r in rankers:
            r.stop()


def test_a_canary_share_is_split_per_user_and_grows_by_a_band(envoy: Envoy, tmp_path: Path) -> None:
    stable = pods(tmp_path, artifact(tmp_path / "models", "v1", 0), 1, 10)
    canary = pods(tmp_path, artifact(tmp_path / "models", "v2", 1), 1, 10)
    try:

        def config(weight: int) -> RouterConfig:
            return RouterConfig(
                [
                    Upstream(
                        "feed-v2", weight, False, tuple(("127.0.0.1", r.port) for r in canary)
                    ),
                    Upstream(
                        "feed-v1", 100 - weight, True, tuple(("127.0.0.1", r.port) for r in stable)
                    ),
                ],
                port=envoy.port,
            )

        def versions() -> dict[str, str]:
            seen: dict[str, set[str]] = {}
            for _ in range(2):
                for b in bodies:
                    seen.setdefault(b["user_id"], set()).add(
                        envoy.score(b, b["user_id"])["model_version"]
                    )
            assert all(len(v) == 1 for v in seen.values()), "a user saw two versions"
            return {u: v.pop() for u, v in seen.items()}

        bodies = requests(200)
        envoy.write(config(25))
        envoy.start()
        at_25 = versions()
        envoy.write(config(50))  # reloaded from the files: no restart
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            at_50 = versions()
            if sum(v == "v2" for v in at_50.values()) > 0.4 * len(bodies):
                break
            time.sleep(0.5)
        share_25 = sum(v == "v2" for v in at_25.values()) / len(bodies)
        share_50 = sum(v == "v2" for v in at_50.values()) / len(bodies)
        print(f"canary share of users: {share_25:.2f} at 25, {share_50:.2f} at 50")
        assert abs(share_25 - 0.25) <= 0.08 and abs(share_50 - 0.50) <= 0.08
        assert all(at_50[u] == "v2" for u, v in at_25.items() if v == "v2"), "a canary user moved"
    finally:
        for r in [*stable, *canary]:
            r.stop()


class Shedding:
    """A pod that sheds every scoring request, as a ranker's admission control does under a
    spike (503, ``Retry-After``, ``x-kvrank-shed``); users named ``plain-*`` get a plain 503
    instead. Counts what reached it."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        hits = self.hits

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["content-length"]))
                user = self.headers["x-kvrank-user"]
                hits[user] += 1
                self.send_response(503)
                if not user.startswith("plain-"):
                    self.send_header("retry-after", "1")
                    self.send_header("x-kvrank-shed", "deadline")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_shed_request_is_retried_once_on_another_pod_and_the_shedding_pod_kept(
    envoy: Envoy, tmp_path: Path
) -> None:
    """Of two real pods and one that sheds everything: the shedding pod's users are answered
    by another pod on the retry; a 503 that is not a shed is not retried; and however many
    it sheds, the shedding pod is not ejected (its users would pile onto the others)."""
    rankers = pods(tmp_path, artifact(tmp_path / "models", "v1", 0), 2, 40)
    shedding = Shedding()
    try:
        endpoints = (*(("127.0.0.1", r.port) for r in rankers), ("127.0.0.1", shedding.port))
        envoy.write(RouterConfig([Upstream("feed-v1", 100, True, endpoints)], port=envoy.port))
        envoy.start()
        bodies = requests(40)
        for _ in range(2):
            for body in bodies:
                envoy.score(body, body["user_id"])  # asserts 200
        shed_users = set(shedding.hits)
        assert 5 <= len(shed_users) <= 35, shedding.hits  # the hash gave it a share
        assert set(shedding.hits.values()) == {2}  # one try per request, the retry elsewhere
        stats = httpx.get(f"http://127.0.0.1:{envoy.admin_port}/stats", timeout=5).text

        def stat(name: str) -> int:
            (line,) = [x for x in stats.splitlines() if x.startswith(f"cluster.feed-v1.{name}:")]
            return int(line.split(":")[1])

        assert stat("upstream_rq_retry") == 2 * len(shed_users)
        assert stat("outlier_detection.ejections_enforced_total") == 0
        plain = {**bodies[0], "user_id": "plain-0"}
        answers = []
        for i in range(40):  # some plain-* user reaches the shedding pod: its 503 stands
            body = {**plain, "user_id": f"plain-{i}"}
            answers.append(
                httpx.post(
                    f"http://127.0.0.1:{envoy.port}/v1/score",
                    json=body,
                    headers=caller(body["user_id"]),
                    timeout=WAIT_S + 5,
                ).status_code
            )
        assert Counter(answers)[503] == len(shedding.hits) - len(shed_users) > 0, answers
    finally:
        for r in rankers:
            r.stop()
        shedding.stop()


def bundled(**canary: object) -> dict:
    doc = {
        "model": {"version": "v1", "uri": "/models/v1", "replicas": 4},
        "routing": {"mode": "bundled"},
    }
    if canary:
        doc["canary"] = {"version": "v2", "uri": "/models/v2", **canary}
    return doc


def test_with_the_bundled_router_the_service_fronts_it_and_each_version_gets_a_pod_list() -> None:
    import kvrank_operator.manifests as m
    from kvrank_operator.spec import parse_spec

    spec = parse_spec(bundled(weight=25))
    both = frozenset({"v1", "v2"})
    objs = {
        (o["kind"], o["metadata"]["name"]): o for o in m.router_objects(spec, "feed", "prod", both)
    }
    (shared, *_) = m.services(spec, "feed", "prod")
    assert shared["spec"]["selector"]["app.kubernetes.io/component"] == "router"
    for version in ("v1", "v2"):
        headless = objs[("Service", f"feed-{version}-pods")]["spec"]
        assert headless["clusterIP"] == "None"
        assert headless["selector"]["kvrank.io/version"] == version
    dep = objs[("Deployment", "feed-router")]
    pod = dep["spec"]["template"]["spec"]
    (envoy,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert envoy["securityContext"]["readOnlyRootFilesystem"] is True
    # ready while it can route to the stable version (its cluster has a healthy host)
    assert envoy["readinessProbe"]["httpGet"] == {"path": "/routable", "port": "stats"}
    assert envoy["livenessProbe"]["httpGet"] == {"path": "/ready", "port": "stats"}
    lds = yaml.safe_load(objs[("ConfigMap", "feed-router")]["data"]["lds.yaml"])
    stats = lds["resources"][1]["filter_chains"][0]["filters"][0]["typed_config"]
    check = stats["http_filters"][0]["typed_config"]
    assert check["cluster_min_healthy_percentages"] == {"feed-v1": {"value": 1.0}}
    assert dep["spec"]["replicas"] == 2
    assert objs[("PodDisruptionBudget", "feed-router")]["spec"]["maxUnavailable"] == 1
    # without the router: none of it, and the Service picks ranker pods again
    plain = parse_spec({k: v for k, v in bundled(weight=25).items() if k != "routing"})
    assert (
        m.services(plain, "feed", "prod")[0]["spec"]["selector"]["app.kubernetes.io/component"]
        == "ranker"
    )


def test_the_routers_split_follows_the_canary_once_it_serves() -> None:
    from kvrank_operator.manifests.router import router_config
    from kvrank_operator.spec import parse_spec

    both = frozenset({"v1", "v2"})

    def weights(ready: frozenset[str] = both, **canary: object) -> list[tuple[str, int]]:
        cfg = router_config(parse_spec(bundled(**canary)), "feed", "prod", ready)
        return [(u.name, u.weight) for u in cfg.upstreams]

    assert weights() == [("feed-v1", 100)]
    assert weights(weight=25) == [("feed-v2", 25), ("feed-v1", 75)]  # the canary first
    # a canary without a ready pod: its band of users would meet a cluster without hosts
    assert weights(frozenset({"v1"}), weight=25) == [("feed-v2", 0), ("feed-v1", 100)]
    (upstream, _) = router_config(parse_spec(bundled(weight=25)), "feed", "prod", both).upstreams
    assert upstream.endpoints == (("feed-v2-pods.prod.svc.cluster.local.", 8080),)


def test_envoy_loads_the_configuration_rendered_for_a_cluster(envoy: Envoy) -> None:
    """What the operator puts in the router's ConfigMap, as Envoy reads it: both listeners
    and every version's cluster loaded (the names resolve only in a cluster)."""
    from kvrank_operator.manifests.router import router_config
    from kvrank_operator.spec import parse_spec

    cfg = router_config(parse_spec(bundled(weight=25)), "feed", "prod")
    envoy.write(RouterConfig(cfg.upstreams, cfg.header, cfg.hash_balance_factor, envoy.port))
    envoy.start()
    clusters = httpx.get(f"http://127.0.0.1:{envoy.admin_port}/clusters", timeout=5).text
    assert "feed-v1::" in clusters and "feed-v2::" in clusters
    listeners = httpx.get(f"http://127.0.0.1:{envoy.admin_port}/listeners", timeout=5).text
    assert "scoring" in listeners and "stats" in listeners
    # live, but not routable: outside a cluster the versions' names resolve to no pod
    assert httpx.get(f"http://127.0.0.1:{envoy.stats_port}/routable", timeout=5).status_code == 503


def test_the_routing_benchmark_shows_what_affinity_and_the_host_tier_save(tmp_path: Path) -> None:
    """The benchmark's smoke run, as a user runs it: the same requests routed by user keep
    more answers in L1 and read far less from Redis than spread over the pods; a host tier
    under a small L1 serves what L1 evicted instead of Redis; and nothing fails."""
    import bench_routing

    report = bench_routing.run("smoke", None, tmp_path)
    routing, host = report["routing"], report["host_tier"]
    sizes = bench_routing.PROFILES["smoke"]
    assert report["errors"] == 0
    assert all(s["requests"] == sizes.routing_requests for s in routing.values())
    assert all(s["requests"] == sizes.host_requests for s in host.values())
    un, ro = routing["unrouted"], routing["routed"]
    assert ro["l1_hit_ratio"] >= un["l1_hit_ratio"] + 0.1, (un, ro)
    assert ro["redis_bytes_per_request"] < 0.5 * un["redis_bytes_per_request"], (un, ro)
    off, on = host["device_only"], host["device_and_host"]
    assert off["host_hit_ratio"] == 0 < on["host_hit_ratio"], (off, on)
    assert on["redis_bytes_per_request"] < 0.5 * off["redis_bytes_per_request"], (off, on)
