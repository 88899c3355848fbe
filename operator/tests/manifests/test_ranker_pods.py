"""A version's ranker pods: their Deployment, the config file they read, their environment,
volumes, ports and the Jobs that purge a retired version's entries."""

from __future__ import annotations

import pytest
import yaml
from spec_fragments import POD_KNOBS, SECRET_REF, example, first_container

from kvrank_operator import manifests as m
from kvrank_operator.errors import SpecError
from kvrank_operator.spec import namespace_for, parse_spec


def test_deployment_carries_version_namespace_probes_and_gpu() -> None:
    doc = example("basic.yaml")  # sized for a GPU node (docs/deployment.md, production)
    limits = {"memory": "8Gi", "nvidia.com/gpu": 1}
    doc["model"]["resources"] = {"requests": {"cpu": "4", "memory": "8Gi"}, "limits": limits}
    spec = parse_spec(doc)
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
    assert env["KVRANK_DEVICE"] == "cuda"  # a pod given a GPU computes on it
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
    # as the ACL user of the rankers, its password from that user's Secret
    assert cfg.redis.url == "redis://ranker@feed-redis-0.feed-redis-headless.prod.svc:6379"
    dep = m.deployment(spec, "feed", "prod", "v1", "/models/v1", 2, "stable")
    auth = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "redis-auth")
    assert auth["secret"]["secretName"] == "feed-redis-ranker-auth"


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


def test_a_default_spec_gives_pods_the_rankers_own_defaults() -> None:
    from kvrank.server.config import ServerConfig

    spec = parse_spec({"model": {"version": "v1", "uri": "/models/v1"}})
    doc = yaml.safe_load(m.ranker_config(spec, "feed", "prod", ttl_s=None))
    defaults = ServerConfig.model_construct()  # no environment, no file
    assert doc.get("l1_bytes") == defaults.l1_bytes  # unset: each pod's by its device
    assert doc["ttl"] == defaults.ttl.model_dump(exclude={"default_seconds"})


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
    got = first_container(dep)["resources"]
    assert got.get("requests") == requests and got["limits"] == limits
    # the download folder is bounded by the same limit
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert volumes["model-cache"]["emptyDir"]["sizeLimit"] == limits["ephemeral-storage"]


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
    ("reference", "policy"),
    [
        ("ghcr.io/kvrank/feed-ranker-model:v1", "IfNotPresent"),
        ("registry.local:5000/models/feed:latest", "Always"),
        ("registry.local:5000/models/feed", "Always"),
        ("ghcr.io/kvrank/feed-ranker-model@sha256:" + "ab" * 32, "IfNotPresent"),
    ],
)
def test_a_model_image_is_mounted_read_only_and_served_from_its_models_folder(
    reference: str, policy: str
) -> None:
    """``oci://`` names a model image: an image volume the node pulls (as the API server
    would default its policy), mounted read-only; the ranker reads the artifact under
    ``/models`` in it and downloads nothing. Stable and canary each get their own image."""
    canary = {"version": "v2", "uri": "oci://ghcr.io/kvrank/feed-ranker-model:v2", "weight": 20}
    spec = parse_spec({"model": {"version": "v1", "uri": f"oci://{reference}"}, "canary": canary})
    for version, role, want in (("v1", "stable", reference), ("v2", "canary", canary["uri"][6:])):
        uri = spec.artifact_of(role)[0]
        pod = m.deployment(spec, "feed", "prod", version, uri, 1, role)["spec"]["template"]["spec"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "model-image"]
        assert volume["image"]["reference"] == want
        assert volume["image"]["pullPolicy"] == (policy if role == "stable" else "IfNotPresent")
        ranker = pod["containers"][0]
        mount = next(x for x in ranker["volumeMounts"] if x["name"] == "model-image")
        assert mount == {"name": "model-image", "mountPath": "/model-image", "readOnly": True}
        env = {e["name"]: e.get("value") for e in ranker["env"]}
        assert env["KVRANK_MODEL_DIR"] == "/model-image/models"
    url = parse_spec({"model": {"version": "v1", "uri": "https://models.example/v1"}})
    pod = m.deployment(url, "feed", "prod", "v1", url.model.uri, 1, "stable")["spec"]["template"][
        "spec"
    ]
    assert not [v for v in pod["volumes"] if v["name"] == "model-image"]
    for bad in ("oci://", "oci://Ghcr.io/Feed:v1", "oci://feed:v1 extra", "oci://feed@sha256:12"):
        with pytest.raises(SpecError, match=r"spec\.model\.uri.*image reference"):
            parse_spec({"model": {"version": "v1", "uri": bad}})


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


@pytest.mark.parametrize(
    ("resources", "fronts"),
    [
        ({}, None),  # nothing requested: one process, as on a laptop
        ({"requests": {"cpu": "1500m"}}, None),  # under 2 cores: the split would not pay
        ({"requests": {"cpu": "2"}}, "1"),
        ({"limits": {"cpu": "4"}}, "3"),  # a limit alone is the request
        ({"requests": {"cpu": "4500m"}, "limits": {"cpu": "8"}}, "3"),  # whole cores requested
        ({"requests": {"cpu": "64"}}, "8"),
    ],
)
def test_a_pod_runs_a_front_per_core_it_requests_beyond_the_engines(
    resources: dict, fronts: str | None
) -> None:
    spec = {"model": {"version": "v1", "uri": "/m", "resources": resources}}
    env = _env_of(spec)
    assert env.get("KVRANK_FRONTS") == fronts
    pod = m.deployment(parse_spec(spec), "feed", "prod", "v1", "/m", 1, "stable")
    volumes = {v["name"] for v in pod["spec"]["template"]["spec"]["volumes"]}
    # a pod with fronts keeps the engine's socket and its metrics files on a volume of its
    # own (the root filesystem is read-only); a pod without has neither
    assert ("run" in volumes) == (fronts is not None)
    assert (env.get("KVRANK_RUN_DIR") == "/run/kvrank") == (fronts is not None)


def test_fronts_the_user_sets_stand_and_get_their_run_directory() -> None:
    from kvrank.server.config import load_config

    mine = [{"name": "KVRANK_FRONTS", "value": "5"}]
    spec = {"model": {"version": "v1", "uri": "/m", "env": mine, "resources": {}}}
    env = _ranker_env_list(spec)
    assert [v for k, v in env if k == "KVRANK_FRONTS"] == ["5"]
    values = dict(env)
    assert values["KVRANK_RUN_DIR"] == "/run/kvrank"
    cfg = load_config({"fronts": values["KVRANK_FRONTS"], "run_dir": values["KVRANK_RUN_DIR"]})
    assert (cfg.fronts, cfg.run_dir) == (5, "/run/kvrank")
