"""Every invalid RankerDeployment is refused by the API server at ``kubectl apply``, with a
message naming the field — the operator never sees it. Server-side dry runs against the
session's cluster with the CRD this tree generates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from api_server import install_crds
from spec_fragments import POD_KNOBS, SPEC_FILES

from kvrank_operator.crd import API_VERSION

pytestmark = pytest.mark.kube

VALID: dict[str, Any] = {"model": {"version": "v1", "uri": "/models/v1"}}
CANARY: dict[str, Any] = {"version": "v2", "uri": "/models/v2"}
ERRORS = {"errorRatio": {"max": 0.01}}
PROGRESSIVE: dict[str, Any] = {
    **CANARY,
    "shadow": {"sample": 0.2},
    "warmup": {"hitRatio": 0.7, "minRequests": 100},
    "steps": [{"weight": 20, "pauseSeconds": 60}, {"weight": 50}],
    "analysis": {
        "scoreDelta": {"max": 0.01, "quantile": 0.99, "minSamples": 100},
        "rankCorrelation": {"min": 0.95},
        "topKChangedRatio": {"max": 0.05},
        "p99LatencyRatio": {"max": 1.5},
        **ERRORS,
        "source": {"type": "prometheus", "prometheus": {"url": "http://prometheus:9090"}},
    },
}
CORE_KNOBS: dict[str, Any] = {
    "resources": {
        "requests": {"cpu": "500m", "memory": "1.5Gi", "ephemeral-storage": 2147483648},
        "limits": {"nvidia.com/gpu": 1, "memory": "4Gi"},
    },
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}
                ]
            }
        },
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 50,
                    "podAffinityTerm": {
                        "topologyKey": "topology.kubernetes.io/zone",
                        "labelSelector": {"matchLabels": {"app": "ranker"}},
                    },
                }
            ]
        },
    },
    "tolerations": [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Equal", "value": "true", "tolerationSeconds": 30},
    ],
    "env": [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "token"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ],
}


@pytest.fixture(scope="module")
def admit(cluster):
    install_crds(cluster, [], [], ours=True)

    def admit(spec: dict[str, Any]) -> tuple[bool, str]:
        doc = {
            "apiVersion": API_VERSION,
            "kind": "RankerDeployment",
            "metadata": {"name": "admission", "namespace": "default"},
            "spec": spec,
        }
        out = cluster.kubectl(
            "apply", "--dry-run=server", "-f", "-", input=json.dumps(doc), check=False
        )
        return out.returncode == 0, out.stderr

    return admit


def with_(patch: dict[str, Any]) -> dict[str, Any]:
    return {**VALID, **patch}


INVALID = [
    (
        "canary equal to stable",
        with_({"canary": {"version": "v1", "uri": "/m"}}),
        "spec.canary.version",
    ),
    (
        "canary weight over 100",
        with_({"canary": {"version": "v2", "uri": "/m", "weight": 150}}),
        "spec.canary.weight",
    ),
    (
        "a version that is no label",
        {"model": {"version": "V1_beta", "uri": "/m"}},
        "spec.model.version",
    ),
    ("negative replicas", {"model": {**VALID["model"], "replicas": -1}}, "spec.model.replicas"),
    ("an hdfs:// artifact", {"model": {"version": "v1", "uri": "hdfs://nn/m"}}, "spec.model.uri"),
    (
        "an oci:// model image that is no image reference",
        {"model": {"version": "v1", "uri": "oci://Registry/Feed Model:v1"}},
        "spec.model.uri",
    ),
    (
        "a canary's oci:// model image with a short digest",
        with_({"canary": {"version": "v2", "uri": "oci://ghcr.io/m@sha256:12", "weight": 5}}),
        "spec.canary.uri",
    ),
    (
        "a gs:// URI without a bucket",
        {"model": {"version": "v1", "uri": "gs:///m"}},
        "spec.model.uri",
    ),
    (
        "an s3:// URI without a bucket",
        {"model": {"version": "v1", "uri": "s3:///m"}},
        "spec.model.uri",
    ),
    (
        "a volume with a uri outside it",
        {"model": {"version": "v1", "uri": "/data/m", "volume": {"emptyDir": {}}}},
        "spec.model.uri",
    ),
    (
        "external Redis without url",
        with_({"cache": {"redis": {"mode": "external"}}}),
        "spec.cache.redis.url",
    ),
    (
        "managed Redis with a url",
        with_({"cache": {"redis": {"url": "redis://r:6379"}}}),
        "spec.cache.redis.url",
    ),
    (
        "TLS over redis://",
        with_({"cache": {"redis": {"mode": "external", "url": "redis://r:6379", "tls": True}}}),
        "spec.cache.redis.url",
    ),
    ("Redis memory 2GB", with_({"cache": {"redis": {"memory": "2GB"}}}), "spec.cache.redis.memory"),
    ("two shards", with_({"cache": {"redis": {"shards": 2}}}), "spec.cache.redis.shards"),
    (
        "a TLS Secret for a Redis without managed TLS",
        with_({"cache": {"redis": {"tlsSecretName": "mine"}}}),
        "spec.cache.redis.tlsSecretName",
    ),
    ("negative L1 bytes", with_({"cache": {"l1Bytes": -1}}), "spec.cache.l1Bytes"),
    ("fixed TTL without seconds", with_({"ttl": {"mode": "fixed"}}), "spec.ttl.fixedSeconds"),
    (
        "TTL min above max",
        with_({"ttl": {"minSeconds": 500, "maxSeconds": 300}}),
        "spec.ttl.minSeconds",
    ),
    (
        "a pod label the operator selects on",
        {"model": {**VALID["model"], "pod": {"labels": {"app.kubernetes.io/instance": "x"}}}},
        "spec.model.pod.labels",
    ),
    (
        "root as the pod's user",
        {"model": {**VALID["model"], "pod": {"securityContext": {"runAsUser": 0}}}},
        "spec.model.pod.securityContext.runAsUser",
    ),
    ("the admin port as Service port", with_({"service": {"port": 8081}}), "spec.service.port"),
    (
        "Prometheus source without url",
        with_({"ttl": {"source": {"type": "prometheus"}}}),
        "spec.ttl.source.prometheus",
    ),
    (
        "a relative Prometheus token file",
        with_(
            {
                "ttl": {
                    "source": {
                        "type": "prometheus",
                        "prometheus": {"url": "https://p:9091", "bearerTokenFile": "token"},
                    }
                }
            }
        ),
        "spec.ttl.source.prometheus.bearerTokenFile",
    ),
    (
        "steps without any analysis check",
        with_({"canary": {**CANARY, "steps": [{"weight": 10}]}}),
        "spec.canary.analysis",
    ),
    (
        "a score check without shadow traffic",
        with_({"canary": {**CANARY, "analysis": {"scoreDelta": {"max": 0.01}}}}),
        "spec.canary.analysis",
    ),
    (
        "a warm-up without shadow traffic",
        with_({"canary": {**CANARY, "warmup": {"hitRatio": 0.5}}}),
        "spec.canary.warmup",
    ),
    (
        "a step weight of 0",
        with_({"canary": {**CANARY, "steps": [{"weight": 0}], "analysis": ERRORS}}),
        "spec.canary.steps[0].weight",
    ),
    (
        "a minimum on a maximum-only check",
        with_({"canary": {**CANARY, "analysis": {"errorRatio": {"min": 0.01}}}}),
        "spec.canary.analysis.errorRatio.min",  # unknown field: only max exists
    ),
    (
        "limit for limits in the ranker's resources",
        {"model": {**VALID["model"], "resources": {"limit": {"nvidia.com/gpu": 1}}}},
        "spec.model.resources.limit",
    ),
    (
        "a CPU request that is no quantity",
        {"model": {**VALID["model"], "resources": {"requests": {"cpu": "two"}}}},
        "spec.model.resources.requests",
    ),
    (
        "a misspelt affinity",
        {"model": {**VALID["model"], "affinity": {"nodeAffinity": {"required": {}}}}},
        "spec.model.affinity.nodeAffinity.required",
    ),
    (
        "a toleration without its effect spelt right",
        {"model": {**VALID["model"], "tolerations": [{"key": "gpu", "efect": "NoSchedule"}]}},
        "spec.model.tolerations[0].efect",
    ),
    (
        "a misspelt volume source",
        {"model": {"version": "v1", "uri": "/models/v1", "volume": {"persistentVolume": {}}}},
        "spec.model.volume.persistentVolume",
    ),
    (
        "an env var from a secret without its key",
        {"model": {**VALID["model"], "env": [{"name": "T", "valueFrom": {"secretKeyRef": {}}}]}},
        "spec.model.env[0].valueFrom.secretKeyRef.key",
    ),
    (
        "Redis memory limits in a typo",
        with_({"cache": {"redis": {"resources": {"limits": {"memory": "2 GB"}}}}}),
        "spec.cache.redis.resources.limits",
    ),
    ("an unknown admission mode", with_({"admission": {"mode": "queue"}}), "spec.admission.mode"),
    (
        "no request at all in a pod",
        with_({"admission": {"maxInflight": 0}}),
        "spec.admission.maxInflight",
    ),
    (
        "a queue proxy letting no request through",
        with_({"admission": {"queueProxy": {"enabled": True, "maxInflight": 0}}}),
        "spec.admission.queueProxy.maxInflight",
    ),
    (
        "a default deadline over a minute",
        with_({"admission": {"defaultTimeoutMs": 60001}}),
        "spec.admission.defaultTimeoutMs",
    ),
    (
        "no time budgeted for a request",
        with_({"admission": {"budgetShare": 0}}),
        "spec.admission.budgetShare",
    ),
    (
        "a shadow sample over 1",
        with_({"canary": {**CANARY, "shadow": {"sample": 1.5}}}),
        "spec.canary.shadow.sample",
    ),
    (
        "a canary version that names the stable's Deployment and cache namespace",
        with_(
            {"model": {**VALID["model"], "version": "1.0"}, "canary": {**CANARY, "version": "1-0"}}
        ),
        "spec.canary.version",
    ),
    (
        "model artifacts from the node's own files",
        {"model": {**VALID["model"], "uri": "/models/v1", "volume": {"hostPath": {"path": "/"}}}},
        "spec.model.volume",
    ),
    (
        "a Redis password in the URL instead of a Secret",
        with_({"cache": {"redis": {"mode": "external", "url": "redis://:hunter2@r:6379"}}}),
        "spec.cache.redis.url",
    ),
    (  # written as an integer, the OpenAPI minimum alone is compared truncated (0 >= 0)
        "a TTL factor of 0 below its fractional minimum",
        with_({"ttl": {"factor": 0}}),
        "spec.ttl.factor",
    ),
    ("a TTL minSeconds of 0", with_({"ttl": {"minSeconds": 0}}), "spec.ttl.minSeconds"),
    (
        "a Redis user and password in the URL",
        with_({"cache": {"redis": {"mode": "external", "url": "rediss://ranker:pw@r:6380/0"}}}),
        "spec.cache.redis.url",
    ),
]


@pytest.mark.parametrize(("case", "spec", "field"), INVALID, ids=[c[0] for c in INVALID])
def test_an_invalid_spec_is_refused_naming_its_field(admit, case, spec, field) -> None:
    admitted, message = admit(spec)
    assert not admitted, f"{case}: admitted"
    assert field in message, f"{case}: {message}"


@pytest.mark.parametrize(
    "spec",
    [
        VALID,
        with_({"cache": {"redis": {"memory": "1.5Gi"}}}),
        with_({"cache": {"redis": {"memory": 1073741824}}}),
        with_({"canary": {"version": "v2", "uri": "https://models.example/v2"}}),
        with_({"ttl": {"mode": "fixed", "fixedSeconds": 30}}),
        with_(
            {
                "ttl": {
                    "source": {
                        "type": "prometheus",
                        "prometheus": {
                            "url": "https://thanos-querier.openshift-monitoring.svc:9091",
                            "bearerTokenFile": "/var/run/secrets/kvrank/prometheus/token",
                            "caFile": "/var/run/secrets/kvrank/prometheus/ca.crt",
                            "headers": {"X-Scope-OrgID": "ranking"},
                        },
                    }
                }
            }
        ),
        with_({"cache": {"redis": {"mode": "external", "url": "rediss://r:6380", "tls": True}}}),
        with_({"cache": {"redis": {"mode": "external", "url": "redis://ranker@r:6379/0"}}}),
        {"model": {**VALID["model"], "pod": POD_KNOBS}},
        with_({"cache": {"redis": {"tls": True}}}),
        with_({"cache": {"redis": {"tls": True, "tlsSecretName": "from-cert-manager"}}}),
        with_({"canary": PROGRESSIVE}),
        {"model": {**VALID["model"], **CORE_KNOBS}},
        with_(
            {
                "admission": {
                    "mode": "shed",
                    "defaultTimeoutMs": 300,
                    "maxInflight": 64,
                    "budgetShare": 0.5,
                }
            }
        ),
    ],
    ids=[
        "minimal",
        "fractional memory",
        "integer memory",
        "https canary",
        "fixed TTL",
        "Prometheus behind auth",
        "TLS",
        "a Redis user without a password in the URL",
        "every pod knob",
        "managed TLS",
        "managed TLS with a Secret of one's own",
        "a progressive rollout with every check",
        "core types: resources, affinity, tolerations, env from a Secret",
        "admission control",
    ],
)
def test_a_valid_spec_is_admitted(admit, spec) -> None:
    admitted, message = admit(spec)
    assert admitted, message


EXAMPLES = SPEC_FILES


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_is_admitted(admit, path: Path) -> None:
    admitted, message = admit(yaml.safe_load(path.read_text())["spec"])
    assert admitted, f"{path.name}: {message}"


def test_tls_of_a_live_managed_redis_cannot_change(cluster, admit) -> None:
    doc = {
        "apiVersion": API_VERSION,
        "kind": "RankerDeployment",
        "metadata": {"name": "tls-transition", "namespace": "default"},
        "spec": with_({"cache": {"redis": {"mode": "managed"}}}),
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))
    try:
        doc["spec"]["cache"]["redis"]["tls"] = True
        out = cluster.kubectl(
            "apply", "--dry-run=server", "-f", "-", input=json.dumps(doc), check=False
        )
        assert out.returncode != 0 and "spec.cache.redis.tls" in out.stderr, out.stderr
        assert "cannot change" in out.stderr
    finally:
        cluster.kubectl("delete", "rkd", "tls-transition", "-n", "default", "--wait=false")
