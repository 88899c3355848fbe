"""Spec parsing: what a RankerDeployment may say, each refusal naming its field, and the
CRD's defaults equal to the parser's."""

from __future__ import annotations

import pytest
from spec_fragments import example

from kvrank_operator.errors import SpecError
from kvrank_operator.spec import parse_spec


def test_examples_parse() -> None:
    pvc = parse_spec(example("pvc-model.yaml"))
    assert pvc.model.volume["persistentVolumeClaim"]["claimName"] == "feed-models"
    url = parse_spec(example("url-model.yaml"))
    assert url.model.uri.startswith("http://") and url.model.sha256 is None
    s3 = parse_spec(example("s3-model.yaml"))  # a template: the bucket's details are the user's
    assert s3.model.uri.startswith("s3://") and s3.model.sha256
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
    spec = parse_spec(example("canary.yaml"))  # 2 replicas, weight 20: one pod each
    assert spec.replicas_of("canary") == 1 and spec.replicas_of("stable") == 1
    doc = example("canary.yaml")
    five = parse_spec({**doc, "model": {**doc["model"], "replicas": 5}})
    assert five.replicas_of("canary") == 1 and five.replicas_of("stable") == 4
    explicit = parse_spec(
        {
            **doc,
            "model": {**doc["model"], "replicas": 5},
            "canary": {"version": "v2", "uri": "/m2", "weight": 50, "replicas": 3},
        }
    )
    assert explicit.replicas_of("canary") == 3 and explicit.replicas_of("stable") == 5


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


def test_stdlib_operator_is_not_shadowed_by_the_operator_folder() -> None:
    import operator

    assert operator.attrgetter("real")(3) == 3
