"""``kvrank-operator render``: what the operator would apply for a RankerDeployment, printed
without a cluster — every example renders, Secrets keep their keys but never a value, and a
document the operator would refuse is refused naming the field. (That it is what the
operator does apply is shown against a real API server in ``test_reconcile_pass``, object for
object, and in ``test_operator_process`` by a running operator.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from spec_fragments import EXAMPLE_DIR, SPEC_FILES

from kvrank_operator.render import REDACTED

EXAMPLES = SPEC_FILES
CLI = str(Path(sys.executable).parent / "kvrank-operator")


def render(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, "render", *args], input=stdin, capture_output=True, text=True)


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_every_example_renders_its_rankers_and_no_secret_value(example: Path) -> None:
    out = render("-f", str(example), "--namespace", "prod")
    assert out.returncode == 0, out.stderr
    objects = list(yaml.safe_load_all(out.stdout))
    doc = yaml.safe_load(example.read_text())
    name = doc["metadata"]["name"]
    assert all(o["metadata"]["namespace"] == "prod" for o in objects)
    deployments = [o for o in objects if o["kind"] == "Deployment" and "ranker" in str(o)]
    versions = {doc["spec"]["model"]["version"], (doc["spec"].get("canary") or {}).get("version")}
    want = {f"{name}-{v}" for v in versions if v}
    assert want <= {d["metadata"]["name"] for d in deployments}
    for secret in (o for o in objects if o["kind"] == "Secret"):
        values = {**secret.get("data", {}), **secret.get("stringData", {})}
        assert values and set(values.values()) == {REDACTED}, secret["metadata"]["name"]


def test_the_same_spec_renders_the_same_objects() -> None:
    (basic,) = (e for e in EXAMPLES if e.name == "basic.yaml")
    assert render("-f", str(basic)).stdout == render("-f", "-", stdin=basic.read_text()).stdout


def test_the_pod_monitor_is_added_on_request() -> None:
    (basic,) = (e for e in EXAMPLES if e.name == "basic.yaml")
    kinds = [
        o["kind"] for o in yaml.safe_load_all(render("-f", str(basic), "--pod-monitor").stdout)
    ]
    assert kinds.count("PodMonitor") == 1
    assert "PodMonitor" not in render("-f", str(basic)).stdout


def test_a_spec_that_names_no_image_runs_the_operators_defaults() -> None:
    """A site's own registry is set once, on the operator (the chart's defaultImages), not
    on every RankerDeployment; an image the spec names still wins."""
    doc = (
        "apiVersion: kvrank.io/v1alpha1\nkind: RankerDeployment\nmetadata: {name: feed}\n"
        "spec: {model: {version: v1, uri: /models/v1}, routing: {mode: bundled}}\n"
    )
    mirror = ("--ranker-image=reg.local/ranker:1", "--redis-image=reg.local/redis@sha256:ab")
    out = render("-f", "-", *mirror, "--router-image=reg.local/envoy:2", stdin=doc)
    assert out.returncode == 0, out.stderr
    images = {
        o["metadata"]["name"]: {c["image"] for c in o["spec"]["template"]["spec"]["containers"]}
        for o in yaml.safe_load_all(out.stdout)
        if o["kind"] in ("Deployment", "StatefulSet")
    }
    assert images["feed-v1"] == {"reg.local/ranker:1"}
    assert images["feed-redis"] == {"reg.local/redis@sha256:ab"}
    assert {"reg.local/envoy:2"} <= images["feed-router"]
    named = doc.replace("uri: /models/v1}", "uri: /models/v1, image: mine/ranker:3}")
    out = render("-f", "-", *mirror, stdin=named)
    assert "image: mine/ranker:3" in out.stdout and "reg.local/ranker:1" not in out.stdout


@pytest.mark.parametrize(
    ("doc", "named"),
    [
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "kind: v1/ConfigMap"),
        ("apiVersion: kvrank.io/v1alpha1\nkind: RankerDeployment\nspec: {}\n", "metadata.name"),
        (
            "apiVersion: kvrank.io/v1alpha1\nkind: RankerDeployment\nmetadata: {name: x}\n"
            "spec: {model: {version: v1, uri: /m}, admission: {mode: queue}}\n",
            "spec.admission.mode",
        ),
        (
            "apiVersion: kvrank.io/v1alpha1\nkind: RankerDeployment\nmetadata: {name: x}\n"
            "spec: {model: {version: v1, uri: /m}, canary: {version: v1, uri: /m}}\n",
            "spec.canary",
        ),
        ("model: [unclosed\n", "while parsing"),
    ],
    ids=[
        "not a RankerDeployment",
        "no name",
        "an unknown admission mode",
        "canary = stable",
        "not YAML",
    ],
)
def test_a_document_the_operator_would_refuse_is_refused_naming_the_field(doc, named) -> None:
    out = render("-f", "-", stdin=doc)
    assert out.returncode == 2 and not out.stdout
    assert named in out.stderr, out.stderr


BASIC = (EXAMPLE_DIR / "basic.yaml").read_text()


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (("  cache:", "  cahce:"), "spec.cahce: unknown field"),
        (("replicasPerShard", "replicaPerShard"), "spec.cache.redis.replicaPerShard: unknown"),
        (("mode: auto", "mode: fixd"), "spec.ttl.mode: 'fixd' is not one of auto, fixed"),
        (("      limits:", "      limit:"), "spec.model.resources.limit: unknown field"),
        (("replicas: 2", "replicas: one"), "spec.model.replicas: must be an integer"),
        (("shards: 3", "shards: 2"), "spec.cache.redis.shards: should be greater than or equal"),
    ],
    ids=["cahce", "replicaPerShard", "fixd", "limit", "replicas: one", "2 shards"],
)
def test_a_spec_the_crd_schema_refuses_is_refused_before_anything_renders(edit, named) -> None:
    """What the API server's schema would refuse, or silently drop (a misspelt field), is
    an error naming the field — not a default rendered in its place, nor a traceback."""
    old, new = edit
    assert old in BASIC
    out = render("-f", "-", stdin=BASIC.replace(old, new, 1))
    assert out.returncode == 2 and not out.stdout, out.stdout[:200]
    assert named in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_with_platform_ids_no_pod_fixes_its_uid_unless_the_spec_does() -> None:
    """OpenShift's restricted-v2 SCC assigns each namespace's pods a uid from its range and
    refuses pods that fix another: with ``--platform-ids`` (the chart's ``podIds``) no pod
    the operator makes names one — rankers, Redis, its bootstrap Job, the router, a purge
    Job — and every pod still says it runs as non-root."""
    from kvrank_operator import manifests as m
    from kvrank_operator.spec import Defaults, parse_spec

    doc = (
        "apiVersion: kvrank.io/v1alpha1\nkind: RankerDeployment\nmetadata: {name: feed}\n"
        "spec: {model: {version: v1, uri: /models/v1}, routing: {mode: bundled},"
        " cache: {redis: {mode: managed, tls: true}}}\n"
    )

    def pods(*flags: str, text: str = doc) -> dict[str, dict[str, object]]:
        out = render("-f", "-", *flags, stdin=text)
        assert out.returncode == 0, out.stderr
        return {
            f"{o['kind']}/{o['metadata']['name']}": o["spec"]["template"]["spec"]
            for o in yaml.safe_load_all(out.stdout)
            if o["kind"] in ("Deployment", "StatefulSet", "Job")
        }

    ids = {"runAsUser", "runAsGroup", "fsGroup"}
    platform = pods("--platform-ids")
    assert set(platform) == {"Deployment/feed-v1", "StatefulSet/feed-redis",
                             "Job/feed-redis-bootstrap", "Deployment/feed-router"}  # fmt: skip
    for name, pod in platform.items():
        security = pod["securityContext"]
        assert isinstance(security, dict) and security["runAsNonRoot"] is True, name
        assert not ids & security.keys(), f"{name} fixes {ids & security.keys()}"
    for name, pod in pods().items():  # by default every pod runs as the images' uid
        assert pod["securityContext"]["runAsUser"] == 10001, name  # type: ignore[index]
    own = doc.replace(
        "uri: /models/v1}", "uri: /models/v1, pod: {securityContext: {runAsUser: 1000700000}}}"
    )
    ranker = pods("--platform-ids", text=own)["Deployment/feed-v1"]["securityContext"]
    assert ranker["runAsUser"] == 1000700000 and "fsGroup" not in ranker  # type: ignore[index]
    spec = parse_spec(yaml.safe_load(doc)["spec"], Defaults(platform_ids=True))
    purge = m.purge_job(spec, "feed", "prod", "v-v0", "2026-01-01T00:00:00Z")
    assert not ids & purge["spec"]["template"]["spec"]["securityContext"].keys()
