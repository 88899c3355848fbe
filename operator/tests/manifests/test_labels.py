"""The labels on everything the operator makes, and the selectors that must never change."""

from __future__ import annotations

import pytest
from spec_fragments import example

from kvrank_operator import manifests as m
from kvrank_operator.spec import parse_spec

RECOMMENDED = ("name", "instance", "version", "component", "part-of", "managed-by")


def _everything_the_operator_makes() -> list[dict]:
    from kvrank_operator.manifests.gateway import gateway_objects

    canary = parse_spec(example("canary.yaml"))
    bundled = parse_spec({**example("canary.yaml"), "routing": {"mode": "bundled"}})
    gateway = {"mode": "gateway", "gateway": {"name": "public", "namespace": "gateways"}}
    objs = [d.obj for d in m.desired_rankers(canary, "feed", "prod", 60.0, "k" * 43)]
    objs += [d.obj for d in m.desired_redis(canary, "feed", "prod", ("s3cret", "r4nker"))]
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
