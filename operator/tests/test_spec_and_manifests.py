"""Spec parsing and the pure manifest builders: what the operator will ask the API for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from spec_fragments import POD_KNOBS, SECRET_REF

from kvrank_operator import manifests as m
from kvrank_operator.errors import SpecError
from kvrank_operator.spec import namespace_for, parse_quantity, parse_spec
from kvrank_operator.ttl import next_ttl, parse_interval_means, target_ttl

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str) -> dict:
    return yaml.safe_load((EXAMPLES / name).read_text())["spec"]


def test_examples_parse() -> None:
    pvc = parse_spec(example("pvc-model.yaml"))
    assert pvc.model.volume["persistentVolumeClaim"]["claimName"] == "feed-models"
    url = parse_spec(example("url-model.yaml"))
    assert url.model.uri.startswith("https://") and url.model.sha256
    basic = parse_spec(example("basic.yaml"))
    assert basic.model.version == "v1" and basic.canary is None
    assert basic.cache.redis.mode == "managed" and basic.cache.redis.shards == 3
    canary = parse_spec(example("canary.yaml"))
    assert [v for v, _ in canary.versions()] == ["v1", "v2"]
    ext = parse_spec(example("external-redis.yaml"))
    assert ext.cache.redis.password_secret == ("feed-redis", "password")
    assert ext.ttl.mode == "fixed" and ext.ttl.fixed_seconds == 120


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"canary": {"version": "v1", "uri": "/m"}}, "canary.version"),
        ({"cache": {"redis": {"mode": "external"}}}, "cache.redis.url"),
        ({"cache": {"redis": {"mode": "managed", "url": "redis://x:1"}}}, "cache.redis.url"),
        ({"ttl": {"mode": "fixed"}}, "ttl.fixedSeconds"),
        ({"ttl": {"minSeconds": 500, "maxSeconds": 300}}, "ttl.minSeconds"),
        (
            {"cache": {"redis": {"mode": "external", "url": "redis://x:1", "tls": True}}},
            "cache.redis.url",
        ),
        ({"canary": {"version": "v2", "uri": "hdfs://nn/v2"}}, "canary.uri"),
        ({"cache": {"redis": {"tlsSecretName": "mine"}}}, "cache.redis.tlsSecretName"),
        ({"routing": {"mode": "mesh"}}, "routing.mode"),
        ({"routing": {"mode": "gateway"}}, "routing.gateway.name"),
        ({"routing": {"mode": "bundled", "hashBalanceFactor": 50}}, "routing.hashBalanceFactor"),
        ({"admission": {"mode": "queue"}}, "admission.mode"),
        ({"admission": {"queueProxy": {"maxInflight": 0}}}, "admission.queueProxy.maxInflight"),
    ],
)
def test_semantic_errors_name_the_field(patch: dict, field: str) -> None:
    spec = {"model": {"version": "v1", "uri": "/m"}, **patch}
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    assert info.value.field == field and f"spec.{field}" in str(info.value)


def test_canary_replica_split_by_weight() -> None:
    spec = parse_spec(example("canary.yaml"))  # 5 replicas, weight 20
    assert spec.replicas_of("canary") == 1 and spec.replicas_of("stable") == 4
    explicit = parse_spec(
        {
            **example("canary.yaml"),
            "canary": {"version": "v2", "uri": "/m2", "weight": 50, "replicas": 3},
        }
    )
    assert explicit.replicas_of("canary") == 3 and explicit.replicas_of("stable") == 5


def test_deployment_carries_version_namespace_probes_and_gpu() -> None:
    spec = parse_spec(example("basic.yaml"))
    dep = m.deployment(spec, "feed", "prod", "v1", "/models/v1", 2, "stable")
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["KVRANK_NAMESPACE"] == namespace_for("feed", "prod", "v1")
    assert env["KVRANK_NAMESPACE"].endswith(".v1")
    assert env["KVRANK_MODEL_DIR"] == "/models/v1"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert "kvrank.io/role" not in dep["spec"]["template"]["metadata"]["labels"]


def test_ranker_config_matches_the_server_schema() -> None:
    from kvrank.server.config import ServerConfig  # the file pods read must validate

    spec = parse_spec(example("basic.yaml"))
    doc = yaml.safe_load(m.ranker_config(spec, "feed", "prod", ttl_s=42.0))
    cfg = ServerConfig.model_validate(doc)
    assert cfg.ttl.fixed_seconds == 42.0 and cfg.redis.cluster is True
    assert cfg.redis.url == "redis://feed-redis-0.feed-redis-headless.prod.svc:6379"


def test_a_host_tier_is_in_the_pods_config_only_when_asked_for() -> None:
    from kvrank.server.config import ServerConfig

    doc = example("basic.yaml")
    plain = yaml.safe_load(m.ranker_config(parse_spec(doc), "feed", "prod", ttl_s=None))
    assert "host_bytes" not in plain  # an unchanged spec keeps the file its pods have
    doc["cache"]["hostBytes"] = 8 * 2**30
    with_host = yaml.safe_load(m.ranker_config(parse_spec(doc), "feed", "prod", ttl_s=None))
    assert ServerConfig.model_validate(with_host).host_bytes == 8 * 2**30


def test_every_variable_the_operator_sets_is_a_ranker_setting() -> None:
    from kvrank.server.config import environment_variables

    spec = parse_spec(example("external-redis.yaml"))
    dep = m.deployment(spec, "feed", "prod", "v1", "/models/v1", 2, "stable")
    (ranker,) = dep["spec"]["template"]["spec"]["containers"]
    names = {e["name"] for e in ranker["env"] if e["name"].startswith("KVRANK_")}
    assert {"KVRANK_MODEL_DIR", "KVRANK_MODEL_VERSION", "KVRANK_CONFIG_FILE"} <= names
    # the Open Inference Protocol serves the model under the deployment's name
    assert {"name": "KVRANK_MODEL_NAME", "value": "feed"} in ranker["env"]
    assert names <= set(environment_variables()), names - set(environment_variables())


def test_admission_settings_reach_the_pods_as_the_rankers_own_and_only_when_set() -> None:
    from kvrank.server.config import load_config

    def ranker_env(spec: dict) -> dict[str, str]:
        dep = m.deployment(parse_spec(spec), "feed", "prod", "v1", "/models/v1", 2, "stable")
        (ranker,) = dep["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e["value"] for e in ranker["env"] if "ADMISSION" in e["name"]}

    model = {"version": "v1", "uri": "/models/v1"}
    assert ranker_env({"model": model}) == {}  # the rankers' defaults, the pods unchanged
    admission = {"mode": "drop", "defaultTimeoutMs": 250, "maxInflight": 64, "budgetShare": 0.5}
    env = ranker_env({"model": model, "admission": admission})
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        settings = load_config({}).admission
    got = (settings.mode, settings.default_timeout_ms, settings.max_inflight, settings.budget_share)
    assert got == ("drop", 250, 64, 0.5)


def test_a_queue_proxy_takes_the_pods_http_port_and_bounds_scoring_only() -> None:
    from kvrank_operator.manifests.queue_proxy import UPSTREAM_PORT

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
    # the pod's http port (Services, the router, the PodMonitor) is the proxy's
    # (gRPC is the ranker's own: the proxy carries HTTP)
    assert [p["name"] for p in ranker["ports"]] == ["grpc", "admin", "probes"]
    assert proxy["ports"] == [
        {"name": "http", "containerPort": 8080},
        {"name": "proxy-stats", "containerPort": 9902},  # Envoy's statistics, for the PodMonitor
    ]
    env = {e["name"]: e.get("value") for e in ranker["env"]}
    assert env["KVRANK_PORT"] == str(UPSTREAM_PORT) and env["KVRANK_HOST"] == "0.0.0.0"
    assert ranker["readinessProbe"]["httpGet"]["port"] == "probes"  # never behind the bound
    bootstrap = json.loads(proxy["args"][proxy["args"].index("--config-yaml") + 1])
    listener, stats = bootstrap["static_resources"]["listeners"]
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
    assert set(clusters) == {"ranker", "ranker-ops", "admin"}
    for c in (clusters["ranker"], clusters["ranker-ops"]):
        (endpoint,) = c["load_assignment"]["endpoints"][0]["lb_endpoints"]
        assert endpoint["endpoint"]["address"]["socket_address"] == {
            "address": "127.0.0.1",
            "port_value": UPSTREAM_PORT,
        }
    assert bootstrap["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"
    assert proxy["securityContext"]["readOnlyRootFilesystem"] is True
    assert proxy["resources"]["limits"]["memory"] == "256Mi"
    # a changed bound is a changed pod template: the pods roll
    assert pod({"queueProxy": {"enabled": True, "maxInflight": 9}}) != template


def test_a_default_spec_gives_pods_the_rankers_own_defaults() -> None:
    from kvrank.server.config import ServerConfig

    spec = parse_spec({"model": {"version": "v1", "uri": "/models/v1"}})
    doc = yaml.safe_load(m.ranker_config(spec, "feed", "prod", ttl_s=None))
    defaults = ServerConfig.model_construct()  # no environment, no file
    assert doc.get("l1_bytes") == defaults.l1_bytes  # unset: each pod's by its device
    assert doc["ttl"] == defaults.ttl.model_dump(exclude={"default_seconds"})


def _with_schema_defaults(schema: dict, doc: dict) -> dict:
    """What the API server stores: ``doc`` with every ``default`` of ``schema`` filled in
    (inside the objects that are there, as the API server does)."""
    out = dict(doc)
    for key, sub in schema.get("properties", {}).items():
        if key not in out and "default" in sub:
            out[key] = sub["default"]
        if key not in out:
            continue
        if sub.get("type") == "object" and "properties" in sub:
            out[key] = _with_schema_defaults(sub, out[key])
        if sub.get("type") == "array" and "properties" in sub.get("items", {}):
            out[key] = [_with_schema_defaults(sub["items"], item) for item in out[key]]
    return out


@pytest.mark.parametrize(
    "name", ["basic.yaml", "canary.yaml", "progressive.yaml", "external-redis.yaml"]
)
def test_the_crd_defaults_are_the_parsers_defaults(name: str) -> None:
    from kvrank_operator.crd import SPEC

    raw = example(name)
    assert parse_spec(_with_schema_defaults(SPEC, raw)) == parse_spec(raw)


def test_managed_redis_objects() -> None:
    spec = parse_spec(example("basic.yaml"))
    objs = {o["kind"]: o for o in m.managed_redis(spec, "feed", "prod", "s3cret")}
    assert objs["StatefulSet"]["spec"]["replicas"] == 6  # 3 shards × (1 + 1 replica)
    assert objs["Secret"]["stringData"]["password"] == "s3cret"
    script = objs["Job"]["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert "cluster_slots_assigned:16384" in script and "refusing to re-create" in script
    assert "--cluster-replicas 1" in script
    allowed = [
        f.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component")
        for f in objs["NetworkPolicy"]["spec"]["ingress"][0]["from"]
    ]
    assert "ranker" in allowed and "redis" in allowed
    assert objs["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1


def _container(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize(
    ("resources", "requests", "limits"),
    [
        # nothing set: the storage a ranker writes, requested and bounded
        ({}, {"ephemeral-storage": "1Gi"}, {"ephemeral-storage": "8Gi"}),
        # a GPU and memory given: kept as they are, only the storage added
        (
            {"limits": {"nvidia.com/gpu": 1, "memory": "4Gi"}},
            {"ephemeral-storage": "1Gi"},
            {"nvidia.com/gpu": 1, "memory": "4Gi", "ephemeral-storage": "8Gi"},
        ),
        # a request above the default limit raises the limit to it (never limit < request)
        (
            {"requests": {"ephemeral-storage": "20Gi"}},
            {"ephemeral-storage": "20Gi"},
            {"ephemeral-storage": "20Gi"},
        ),
        # a limit alone is also the request: no default request is added next to it
        ({"limits": {"ephemeral-storage": "2Gi"}}, None, {"ephemeral-storage": "2Gi"}),
    ],
)
def test_rankers_get_the_storage_they_write_unless_the_user_sized_it(
    resources: dict, requests: dict | None, limits: dict
) -> None:
    spec = parse_spec({"model": {"version": "v1", "uri": "https://m/v1", "resources": resources}})
    dep = m.deployment(spec, "feed", "prod", "v1", spec.model.uri, 1, "stable")
    got = _container(dep)["resources"]
    assert got.get("requests") == requests and got["limits"] == limits
    # the download folder is bounded by the same limit
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert volumes["model-cache"]["emptyDir"]["sizeLimit"] == limits["ephemeral-storage"]


def test_redis_requests_cpu_and_storage_unless_its_resources_say_otherwise() -> None:
    spec = parse_spec(example("basic.yaml"))
    sts = next(o for o in m.managed_redis(spec, "feed", "prod", "pw") if o["kind"] == "StatefulSet")
    res = _container(sts)["resources"]
    memory = spec.cache.redis.memory
    assert res["requests"] == {"memory": memory, "cpu": "100m", "ephemeral-storage": "64Mi"}
    assert res["limits"]["memory"] == memory and res["limits"]["ephemeral-storage"].endswith("Mi")
    # a replica's full sync writes up to the data set (memory) to disk, plus logs
    assert int(res["limits"]["ephemeral-storage"][:-2]) * 2**20 > parse_quantity(memory)
    own = {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}}
    spec = parse_spec({**example("basic.yaml"), "cache": {"redis": {"resources": own}}})
    sts = next(o for o in m.managed_redis(spec, "feed", "prod", "pw") if o["kind"] == "StatefulSet")
    assert _container(sts)["resources"]["requests"]["cpu"] == "2"
    # uid and gid above 10000 (clear of the host's users), any redis image runs under them
    security = sts["spec"]["template"]["spec"]["securityContext"]
    assert security["runAsUser"] > 10000 and security["runAsGroup"] > 10000


def test_every_ranker_serves_v2_grpc_and_its_services_and_the_router_reach_it() -> None:
    grpc = {"name": "grpc", "port": 8001, "targetPort": "grpc"}
    spec = parse_spec({"model": {"version": "v1", "uri": "/m"}})
    (ranker,) = m.deployment(spec, "feed", "prod", "v1", "/m", 2, "stable")["spec"]["template"][
        "spec"
    ]["containers"]
    assert {"name": "grpc", "containerPort": 8001} in ranker["ports"]
    assert {"name": "KVRANK_GRPC_PORT", "value": "8001"} in ranker["env"]
    shared, version = m.services(spec, "feed", "prod")
    assert grpc in shared["spec"]["ports"] and grpc in version["spec"]["ports"]
    # the bundled router routes gRPC too: its Service's grpc port is the router's listener,
    # which its pods expose and its NetworkPolicy admits, to each version's pods' gRPC port
    routed = parse_spec({"model": {"version": "v1", "uri": "/m"}, "routing": {"mode": "bundled"}})
    shared, version = m.services(routed, "feed", "prod")
    assert grpc in shared["spec"]["ports"] and grpc in version["spec"]["ports"]
    objects = {o["kind"]: o for o in m.router_objects(routed, "feed", "prod")}
    (envoy,) = objects["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert {"name": "grpc", "containerPort": 8001} in envoy["ports"]
    (rule,) = objects["NetworkPolicy"]["spec"]["ingress"]
    assert {"port": "grpc"} in rule["ports"]
    lds = yaml.safe_load(objects["ConfigMap"]["data"]["lds.yaml"])["resources"]
    listener = next(x for x in lds if x["name"] == "scoring-grpc")
    assert listener["address"]["socket_address"]["port_value"] == 8001
    cds = yaml.safe_load(objects["ConfigMap"]["data"]["cds.yaml"])["resources"]
    (upstream,) = [c for c in cds if c["name"] == "feed-v1-grpc"]
    endpoint = upstream["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["address"]["socket_address"] == {
        "address": "feed-v1-pods.prod.svc.cluster.local.",
        "port_value": 8001,
    }


def test_only_pods_labelled_for_it_reach_a_rankers_admin_port_and_jobs_accept_nothing() -> None:
    spec = parse_spec(example("basic.yaml"))
    rankers, deny = m.network_policies(spec, "feed", "prod")
    assert rankers["spec"]["podSelector"]["matchLabels"] == m.ranker_selector("feed")
    open_rule, admin_rule = rankers["spec"]["ingress"]
    assert "from" not in open_rule  # scoring, probes, a queue proxy's statistics: from anywhere
    assert {p["port"] for p in open_rule["ports"]} == {"http", "grpc", 8082, "proxy-stats"}
    # behind a queue proxy the ranker's own port (8083) is in no rule: only the proxy reaches it
    assert admin_rule["ports"] == [{"port": 8081}]
    assert admin_rule["from"] == [{"podSelector": {"matchLabels": {m.ADMIN_ACCESS_LABEL: "true"}}}]
    # every pod of the instance: what no other policy allows is refused (the Jobs: all)
    assert "ingress" not in deny["spec"] and deny["spec"]["policyTypes"] == ["Ingress"]
    selector = deny["spec"]["podSelector"]["matchLabels"]
    job = m.purge_job(spec, "feed", "prod", "v-v1")
    bootstrap = next(o for o in m.managed_redis(spec, "feed", "prod", "pw") if o["kind"] == "Job")
    for j in (job, bootstrap):
        assert selector.items() <= j["spec"]["template"]["metadata"]["labels"].items()
        assert _container(j)["resources"]["limits"]["ephemeral-storage"]
    # applied with the rankers, in every pass
    kinds = [d.kind for d in m.desired_rankers(spec, "feed", "prod", None, "k")]
    assert kinds.count("NetworkPolicy") == 2


def test_pods_that_call_no_api_get_no_service_account_token() -> None:
    spec = parse_spec(example("basic.yaml"))
    pods = [
        m.deployment(spec, "feed", "prod", "v1", spec.model.uri, 1, "stable"),
        m.purge_job(spec, "feed", "prod", "v-v1"),
        *(
            o
            for o in m.managed_redis(spec, "feed", "prod", "pw")
            if "template" in o.get("spec", {})
        ),
    ]
    for obj in pods:
        assert obj["spec"]["template"]["spec"]["automountServiceAccountToken"] is False, obj["kind"]
    # a ServiceAccount the user names may be there for its token (a plugin calling an API)
    own = {**example("basic.yaml")}
    own["model"] = {**own["model"], "pod": {"serviceAccountName": "feed-reader"}}
    spec = parse_spec(own)
    pod = m.deployment(spec, "feed", "prod", "v1", spec.model.uri, 1, "stable")["spec"]["template"]
    assert "automountServiceAccountToken" not in pod["spec"]
    assert pod["spec"]["serviceAccountName"] == "feed-reader"


def test_purge_job_runs_kvrank_cache_purge() -> None:
    spec = parse_spec(example("basic.yaml"))
    job = m.purge_job(spec, "feed", "prod", "v-v1", "2026-01-01T00:00:00Z")
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:4] == ["cache", "purge", "--namespace", "v-v1"] and "--cluster" in args
    # retired again later (a canary aborted twice): a new Job, not the finished first one
    again = m.purge_job(spec, "feed", "prod", "v-v1", "2026-01-02T00:00:00Z")
    assert again["metadata"]["name"] != job["metadata"]["name"]
    assert (
        again["metadata"]["name"]
        == m.purge_job(spec, "feed", "prod", "v-v1", "2026-01-02T00:00:00Z")["metadata"]["name"]
    )


def test_ttl_policy_with_hysteresis() -> None:
    spec = parse_spec({"model": {"version": "v1", "uri": "/m"}}).ttl
    assert target_ttl(10, spec) == 30 and target_ttl(1000, spec) == 300
    assert next_ttl(None, 10, spec) == 30
    assert next_ttl(30, 10.5, spec) is None  # 31.5 is within 10 %
    assert next_ttl(30, 20, spec) == 60
    assert next_ttl(30, None, spec) is None
    text = (
        'kvrank_user_interval_mean_seconds{cache_namespace="a",model_version="v1"} 4.0\n'
        'kvrank_user_interval_mean_seconds{cache_namespace="b",model_version="v1"} 0.0\n'
    )
    assert parse_interval_means(text) == [4.0]


@pytest.mark.parametrize("knobs", [{}, {"factor": 2.0, "minSeconds": 5, "maxSeconds": 60}])
def test_the_pods_config_gives_them_the_ttl_policy_the_operator_tunes_by(knobs: dict) -> None:
    """The operator computes the TTL it writes into the pods' config from the policy it
    writes beside it; a pod reading that section applies the same TTL to the same mean."""
    from kvrank.cache.ttl import TTLSettings, ttl_for

    spec = parse_spec({"model": {"version": "v1", "uri": "/m"}, "ttl": knobs}).ttl
    ranker = TTLSettings(**spec.ranker_settings(None))
    for mean in (0.1, 1.5, 10.0, 42.0, 1000.0):
        assert target_ttl(mean, spec) == ttl_for(mean, ranker)


def test_stdlib_operator_is_not_shadowed_by_the_operator_folder() -> None:
    import operator

    assert operator.attrgetter("real")(3) == 3


def test_model_volume_is_mounted_read_only_under_models() -> None:
    spec = parse_spec(
        {
            "model": {
                "version": "v1",
                "uri": "/models/feed/v1",
                "volume": {"persistentVolumeClaim": {"claimName": "models"}},
            }
        }
    )
    pod = m.deployment(spec, "feed", "prod", "v1", spec.model.uri, 1, "stable")["spec"]["template"][
        "spec"
    ]
    vol = next(v for v in pod["volumes"] if v["name"] == "models")
    assert vol["persistentVolumeClaim"] == {"claimName": "models"}
    mount = next(x for x in pod["containers"][0]["volumeMounts"] if x["name"] == "models")
    assert mount == {"name": "models", "mountPath": "/models", "readOnly": True}
    with pytest.raises(SpecError, match=r"model\.uri"):
        parse_spec({"model": {"version": "v1", "uri": "/elsewhere/v1", "volume": {"emptyDir": {}}}})


@pytest.mark.parametrize(
    "uri", ["https://models.example/feed/v1", "s3://models/feed/v1", "gs://models/feed/v1"]
)
def test_url_artifacts_get_a_writable_download_cache(uri: str) -> None:
    spec = parse_spec({"model": {"version": "v1", "uri": uri}})
    pod = m.deployment(spec, "feed", "prod", "v1", spec.model.uri, 1, "stable")["spec"]["template"][
        "spec"
    ]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["KVRANK_MODEL_DIR"] == uri
    cache = next(v for v in pod["volumes"] if v["name"] == "model-cache")
    # bounded by the container's ephemeral-storage limit (a node's disk is shared)
    assert cache == {"name": "model-cache", "emptyDir": {"sizeLimit": "8Gi"}}
    mount = next(x for x in pod["containers"][0]["volumeMounts"] if x["name"] == "model-cache")
    assert env["KVRANK_MODEL_CACHE_DIR"] == mount["mountPath"]
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    with pytest.raises(SpecError, match=r"spec\.model\.uri.*'hdfs'"):
        parse_spec({"model": {"version": "v1", "uri": "hdfs://nn/v1"}})


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"cache": {"redis": {"memory": "2GB"}}}, "spec.cache.redis.memory"),
        ({"canary": {"version": "v1", "uri": "/m"}}, "spec.canary.version"),
    ],
)
def test_a_spec_past_the_schema_is_degraded_without_an_api_call(spec: dict, field: str) -> None:
    """The operator's own checks are the second line (a CRD from an older chart, a dry
    run): the reconcile ends in a Degraded condition naming the field, never an exception
    retried forever, and nothing is written or deleted."""
    import datetime as dt

    from kvrank_operator.reconcile import reconcile

    class NoAPI:
        def __getattr__(self, name: str) -> None:
            raise AssertionError(f"{name} called for an invalid spec")

    body = {
        "metadata": {"name": "feed", "namespace": "prod", "uid": "u1", "generation": 4},
        "spec": {"model": {"version": "v1", "uri": "/models/v1"}, **spec},
    }
    out = reconcile(NoAPI(), body, dt.datetime(2026, 1, 1, tzinfo=dt.UTC))  # type: ignore[arg-type]
    degraded = next(c for c in out.status.for_storage()["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "InvalidSpec"
    assert field in degraded["message"] and degraded["observedGeneration"] == 4
    assert [e[1] for e in out.events] == ["InvalidSpec"]


def test_platform_knobs_reach_every_ranker_pod() -> None:
    spec = parse_spec(
        {
            "model": {
                "version": "v1",
                "uri": "/models/v1",
                "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": SECRET_REF}}],
                "pod": POD_KNOBS,
            }
        }
    )
    dep = m.deployment(spec, "feed", "prod", "v1", "/models/v1", 2, "stable")
    meta, pod = dep["spec"]["template"]["metadata"], dep["spec"]["template"]["spec"]
    assert meta["labels"]["team"] == "feed" and meta["labels"]["kvrank.io/version"] == "v1"
    assert dep["spec"]["selector"]["matchLabels"].items() <= meta["labels"].items()
    assert meta["annotations"]["policy.example.com/profile"] == "gpu"
    assert meta["annotations"]["prometheus.io/scrape"] == "true"
    assert pod["imagePullSecrets"] == [{"name": "registry-creds"}]
    assert pod["serviceAccountName"] == "ranker-sa"
    assert (pod["priorityClassName"], pod["runtimeClassName"]) == ("serving-high", "nvidia")
    ctx = pod["securityContext"]
    assert (ctx["runAsUser"], ctx["runAsGroup"], ctx["fsGroup"]) == (20001, 20002, 20003)
    assert ctx["runAsNonRoot"] is True and ctx["seccompProfile"]["type"] == "RuntimeDefault"
    (c,) = pod["containers"]
    assert (c["startupProbe"]["periodSeconds"], c["startupProbe"]["failureThreshold"]) == (10, 90)
    token = next(e for e in c["env"] if e["name"] == "TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == SECRET_REF
    plain = m.deployment(parse_spec(example("basic.yaml")), "feed", "prod", "v1", "/m", 2, "stable")
    plain_pod = plain["spec"]["template"]["spec"]
    assert "serviceAccountName" not in plain_pod and "imagePullSecrets" not in plain_pod


def test_managed_redis_spreads_over_nodes_and_zones_and_takes_scheduling_knobs() -> None:
    doc = example("basic.yaml")
    doc["cache"]["redis"].update(
        resources={"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"memory": "2Gi"}},
        nodeSelector={"pool": "cache"},
        tolerations=[{"key": "cache", "operator": "Exists", "effect": "NoSchedule"}],
    )
    objs = {o["kind"]: o for o in m.managed_redis(parse_spec(doc), "feed", "prod", "pw")}
    pod = objs["StatefulSet"]["spec"]["template"]["spec"]
    spread = {c["topologyKey"]: c for c in pod["topologySpreadConstraints"]}
    assert spread.keys() == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    # preferred, not required: a one-zone (or one-node) cluster still schedules them
    assert {c["whenUnsatisfiable"] for c in spread.values()} == {"ScheduleAnyway"}
    assert pod["nodeSelector"] == {"pool": "cache"} and pod["tolerations"][0]["key"] == "cache"
    assert "affinity" not in pod
    assert pod["containers"][0]["resources"]["requests"]["cpu"] == "500m"
    basic = parse_spec(example("basic.yaml"))
    default = {o["kind"]: o for o in m.managed_redis(basic, "f", "p", "x")}
    limits = default["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert limits["limits"]["memory"] == limits["requests"]["memory"]


def test_the_redis_password_is_on_no_command_line() -> None:
    basic = parse_spec(example("basic.yaml"))
    objs = {o["kind"]: o for o in m.managed_redis(basic, "f", "p", "pw")}
    sts_pod = objs["StatefulSet"]["spec"]["template"]["spec"]
    job_pod = objs["Job"]["spec"]["template"]["spec"]
    for container in (*sts_pod["containers"], *job_pod["containers"]):
        text = json.dumps({k: container.get(k) for k in ("command", "args", "readinessProbe")})
        assert "--requirepass" not in text and "-a " not in text, text
    auth = next(v for v in sts_pod["volumes"] if v["name"] == "auth")
    assert auth["emptyDir"]["medium"] == "Memory"  # the password file never touches a disk
    assert "include /run/redis-auth/auth.conf" in objs["ConfigMap"]["data"]["redis.conf"]


def test_an_unchanged_object_is_not_sent_again_until_the_reapply_period() -> None:
    from kvrank_operator.kube import ApplyLedger

    now = [0.0]
    ledger = ApplyLedger(reapply_s=300, clock=lambda: now[0])  # a short period, for the test
    key = ("v1", "ConfigMap", "prod", "feed-config")
    cm = m.config_map(parse_spec(example("basic.yaml")), "feed", "prod", 30.0)
    digest = ledger.digest(cm)
    assert ledger.needs_sending(key, digest)
    ledger.sent(key, digest)
    now[0] = 299.0
    assert not ledger.needs_sending(key, digest)  # the steady state: no write
    changed = ledger.digest(m.config_map(parse_spec(example("basic.yaml")), "feed", "prod", 45.0))
    assert ledger.needs_sending(key, changed)  # a new TTL goes out at once
    now[0] = 300.0
    assert ledger.needs_sending(key, digest)  # drift is undone within the period
    ledger.sent(key, digest)
    ledger.forget()
    assert ledger.needs_sending(key, digest)  # a new spec: everything goes out again


def test_managed_tls_with_a_secret_of_ones_own_generates_none() -> None:
    spec = parse_spec(
        {
            "model": {"version": "v1", "uri": "/m"},
            "cache": {"redis": {"mode": "managed", "tls": True, "tlsSecretName": "from-cm"}},
        }
    )
    objs = m.managed_redis(spec, "feed", "prod", "pw")
    assert not [o for o in objs if o["kind"] == "Secret" and o["metadata"]["name"].endswith("-tls")]
    pod = next(o for o in objs if o["kind"] == "StatefulSet")["spec"]["template"]["spec"]
    assert {"name": "tls", "secret": {"secretName": "from-cm", "defaultMode": 0o440}} in pod[
        "volumes"
    ]
    dep = m.deployment(spec, "feed", "prod", "v1", "/m", 1, "stable")
    volumes = dep["spec"]["template"]["spec"]["volumes"]
    assert {
        "name": "redis-tls",
        "secret": {"secretName": "from-cm", "items": [{"key": "ca.crt", "path": "ca.crt"}]},
    } in volumes


@pytest.mark.parametrize(
    ("last_line", "shown"),
    [
        ("kvrank serve: sha256 of model.safetensors is ab…, expected 00…", "expected 00…"),
        ('{"severity": "error", "message": "model version \'v1\', expected \'v2\'"}', "expected"),
    ],
)
def test_a_pods_start_failure_is_its_last_log_message(last_line: str, shown: str) -> None:
    from kvrank_operator.reconcilers.observe import start_failure

    pod = {
        "status": {
            "containerStatuses": [
                {
                    "ready": False,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {
                        "terminated": {"exitCode": 2, "message": f"starting\n{last_line}\n"}
                    },
                }
            ]
        }
    }
    why = start_failure(pod)
    assert why is not None and shown in why and why.endswith("(exit code 2)")
    assert "severity" not in why  # a JSON line shows as its message


def _env_of(spec: dict, role: str = "stable", version: str = "v1") -> dict[str, str | None]:
    parsed = parse_spec(spec)
    dep = m.deployment(parsed, "feed", "prod", version, "/models/x", 1, role)
    (ranker,) = dep["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in ranker["env"]}


def test_a_version_given_a_gpu_computes_on_it_and_one_without_uses_the_rankers_default() -> None:
    from kvrank.server.config import ServerConfig

    gpu = {"model": {"version": "v1", "uri": "/m", "resources": {"limits": {"nvidia.com/gpu": 1}}}}
    assert _env_of(gpu)["KVRANK_DEVICE"] == "cuda"
    requested = {"model": {**gpu["model"], "resources": {"requests": {"nvidia.com/gpu": "2"}}}}
    assert _env_of(requested)["KVRANK_DEVICE"] == "cuda"
    cpu = {"model": {"version": "v1", "uri": "/m", "resources": {"limits": {"cpu": "2"}}}}
    assert "KVRANK_DEVICE" not in _env_of(cpu)
    assert ServerConfig.model_construct().device == "auto"  # what that pod then runs with
    zero = {"model": {**gpu["model"], "resources": {"limits": {"nvidia.com/gpu": 0}}}}
    assert "KVRANK_DEVICE" not in _env_of(zero)
    mine = {"model": {**gpu["model"], "env": [{"name": "KVRANK_DEVICE", "value": "cuda:1"}]}}
    assert [v for k, v in _ranker_env_list(mine) if k == "KVRANK_DEVICE"] == ["cuda:1"]


def _ranker_env_list(spec: dict) -> list[tuple[str, str | None]]:
    dep = m.deployment(parse_spec(spec), "feed", "prod", "v1", "/models/x", 1, "stable")
    (ranker,) = dep["spec"]["template"]["spec"]["containers"]
    return [(e["name"], e.get("value")) for e in ranker["env"]]


def test_a_canary_brings_its_own_image_and_promotion_makes_it_the_stables() -> None:
    from kvrank_operator.rollout import promotion

    raw = {
        "model": {"version": "v1", "uri": "/m/v1", "image": "reg/ranker-team:1"},
        "canary": {"version": "v2", "uri": "/m/v2", "image": "reg/ranker-team:2"},
    }
    spec = parse_spec(raw)
    images = {
        role: m.deployment(spec, "feed", "prod", v, "/m", 1, role)["spec"]["template"]["spec"][
            "containers"
        ][0]["image"]
        for v, role in spec.versions()
    }
    assert images == {"stable": "reg/ranker-team:1", "canary": "reg/ranker-team:2"}
    patch = promotion(spec.canary)  # type: ignore[arg-type]
    assert patch["spec"]["model"]["image"] == "reg/ranker-team:2"
    assert patch["spec"]["model"]["version"] == "v2" and patch["spec"]["canary"] is None
    plain = parse_spec({**raw, "canary": {"version": "v2", "uri": "/m/v2"}})
    assert "image" not in promotion(plain.canary)["spec"]["model"]  # type: ignore[arg-type]
    canary = m.deployment(plain, "feed", "prod", "v2", "/m", 1, "canary")
    assert canary["spec"]["template"]["spec"]["containers"][0]["image"] == "reg/ranker-team:1"


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


@pytest.mark.parametrize("url", ["redis://:hunter2@r:6379", "rediss://ranker:pw@r:6380/0"])
def test_a_redis_password_in_the_url_is_refused_pointing_at_the_secret_field(url: str) -> None:
    doc = {"model": {"version": "v1", "uri": "/m/v1"}, "cache": {"redis": {"url": url}}}
    doc["cache"]["redis"]["mode"] = "external"
    with pytest.raises(SpecError, match=r"cache\.redis\.url.*passwordSecretRef"):
        parse_spec(doc)
    doc["cache"]["redis"]["url"] = "redis://ranker@r:6379"  # a user alone shows no secret
    assert parse_spec(doc).cache.redis.url == "redis://ranker@r:6379"


@pytest.mark.parametrize(
    ("stable", "canary"), [("1.0", "1-0"), ("v2-1", "v2.1"), ("a.b.c", "a-b.c")]
)
def test_versions_that_would_share_a_deployment_are_refused(stable: str, canary: str) -> None:
    from kvrank_operator.manifests.common import deployment_name

    assert deployment_name("feed", stable) == deployment_name("feed", canary)  # the collision
    doc = {
        "model": {"version": stable, "uri": "/m/a"},
        "canary": {"version": canary, "uri": "/m/b"},
    }
    with pytest.raises(SpecError, match=r"canary\.version.*one Deployment and Service name"):
        parse_spec(doc)
    doc["canary"]["version"] = canary + "x"
    spec = parse_spec(doc)
    assert deployment_name("feed", spec.model.version) != deployment_name("feed", canary + "x")


def test_model_artifacts_from_a_host_path_are_refused() -> None:
    doc = {"model": {"version": "v1", "uri": "/models/v1", "volume": {"hostPath": {"path": "/"}}}}
    with pytest.raises(SpecError, match=r"model\.volume.*hostPath"):
        parse_spec(doc)
    doc["model"]["volume"] = {"persistentVolumeClaim": {"claimName": "models"}}
    assert parse_spec(doc).model.volume == {"persistentVolumeClaim": {"claimName": "models"}}


def test_every_ranker_pod_tags_its_entries_with_the_deployments_own_secret() -> None:
    """One Secret per RankerDeployment, created once (never replaced under running pods),
    mounted read-only into every version's pods, and named in the file they read."""
    from kvrank.server.config import ServerConfig

    spec = parse_spec(example("canary.yaml"))
    desired = m.desired_rankers(spec, "feed", "prod", None, "generated-secret-value")
    secret = desired[0]
    assert secret.kind == "Secret" and secret.create_only
    assert secret.obj["metadata"]["name"] == m.entry_secret_name("feed")
    assert secret.obj["stringData"] == {"secret": "generated-secret-value"}
    cfg = ServerConfig.model_validate(yaml.safe_load(m.ranker_config(spec, "feed", "prod", None)))
    assert cfg.entry_secret_file == m.ENTRY_SECRET_FILE
    for d in (d for d in desired if d.kind == "Deployment"):
        pod = d.obj["spec"]["template"]["spec"]
        (volume,) = (v for v in pod["volumes"] if "secret" in v and v["name"] == "cache-key")
        assert volume["secret"]["secretName"] == m.entry_secret_name("feed")
        mounts = {x["mountPath"]: x for x in pod["containers"][0]["volumeMounts"]}
        mount = mounts[m.ENTRY_SECRET_FILE.rsplit("/", 1)[0]]
        assert mount["name"] == "cache-key" and mount["readOnly"] is True
    other = m.desired_rankers(spec, "other", "prod", None, "another value")[0]
    assert other.obj["metadata"]["name"] != secret.obj["metadata"]["name"]


RECOMMENDED = ("name", "instance", "version", "component", "part-of", "managed-by")


def _everything_the_operator_makes() -> list[dict]:
    from kvrank_operator.manifests.gateway import gateway_objects

    canary = parse_spec(example("canary.yaml"))
    bundled = parse_spec({**example("canary.yaml"), "routing": {"mode": "bundled"}})
    gateway = {"mode": "gateway", "gateway": {"name": "public", "namespace": "gateways"}}
    objs = [d.obj for d in m.desired_rankers(canary, "feed", "prod", 60.0, "k" * 43)]
    objs += [d.obj for d in m.desired_redis(canary, "feed", "prod", "s3cret")]
    objs += m.router_objects(bundled, "feed", "prod", frozenset({"v1"}))
    objs += gateway_objects(
        parse_spec({**example("canary.yaml"), "routing": gateway}), "feed", "prod"
    )
    objs.append(m.purge_job(canary, "feed", "prod", "v-v1", "2026-01-01T00:00:00Z"))
    objs.append(m.pod_monitor("feed", "prod", m.PodMonitoring()))
    return objs


def test_every_object_the_operator_makes_carries_the_recommended_labels() -> None:
    for obj in _everything_the_operator_makes():
        where = f"{obj['kind']} {obj['metadata']['name']}"
        metas = [obj["metadata"]]
        if "template" in obj.get("spec", {}) and obj["kind"] != "StatefulSet":
            metas.append(obj["spec"]["template"]["metadata"])  # its pods
        for meta in metas:
            got = {k.removeprefix("app.kubernetes.io/") for k in meta["labels"]}
            assert set(RECOMMENDED) <= got, f"{where} lacks {set(RECOMMENDED) - got}"
            assert meta["labels"]["app.kubernetes.io/part-of"] == "kvrank", where
            assert meta["labels"]["app.kubernetes.io/instance"] == "feed", where
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in _everything_the_operator_makes()}
    # the version a ranker's objects run is its model's; Redis's, its image's tag
    canary_pods = by_name[("Deployment", "feed-v2")]["spec"]["template"]["metadata"]["labels"]
    assert canary_pods["app.kubernetes.io/version"] == "v2"
    redis = by_name[("StatefulSet", "feed-redis")]["metadata"]["labels"]
    assert redis["app.kubernetes.io/version"] == m.image_tag(
        parse_spec(example("canary.yaml")).cache.redis.image
    )


def test_selectors_stay_the_labels_older_operators_selected_by() -> None:
    """A Deployment's and a StatefulSet's selector is immutable: a label added to it would
    make every object an older operator made impossible to update."""
    selecting = {
        "app.kubernetes.io/name": "kvrank-ranker",
        "app.kubernetes.io/instance": "feed",
        "app.kubernetes.io/managed-by": "kvrank-operator",
    }
    for obj in _everything_the_operator_makes():
        if obj["kind"] not in ("Deployment", "StatefulSet"):
            continue
        sel = obj["spec"]["selector"]["matchLabels"]
        component = {"feed-redis": "redis", "feed-router": "router"}.get(obj["metadata"]["name"])
        if component == "router":
            assert sel == {
                "app.kubernetes.io/instance": "feed",
                "app.kubernetes.io/component": "router",
            }
            continue
        expected = {**selecting, "app.kubernetes.io/component": component or "ranker"}
        if component is None:
            expected["kvrank.io/version"] = obj["metadata"]["labels"]["kvrank.io/version"]
        assert sel == expected, obj["metadata"]["name"]
        # ... and a Redis node's pod keeps exactly them: a new label would restart it on upgrade
        if component == "redis":
            assert obj["spec"]["template"]["metadata"]["labels"] == expected


@pytest.mark.parametrize(
    ("image", "tag"),
    [
        ("redis:7.2", "7.2"),
        ("registry.local:5000/redis:7.2.5@sha256:" + "a" * 64, "7.2.5"),
        ("registry.local:5000/redis", "latest"),
    ],
)
def test_an_images_tag_is_its_version_label(image: str, tag: str) -> None:
    assert m.label_value(m.image_tag(image)) == tag
