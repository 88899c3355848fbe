"""The ``RankerDeployment`` CustomResourceDefinition — the one source of truth.

The chart's ``crds/rankerdeployments.yaml`` is generated from :func:`crd` (``kvrank-operator
crd``) and a test keeps the two identical. The schema rejects what it can (required fields,
enums, bounds, patterns); ``spec.py`` checks the rest. Defaults are not written here: they
are read from the typed spec's dataclasses, so the API server and the parser agree.
"""

from __future__ import annotations

from typing import Any

from kvrank_common import ADMISSION_MODES
from kvrank_operator.core_types import SCHEMAS
from kvrank_operator.crd_descriptions import described
from kvrank_operator.spec import (
    CHECKS,
    HOST_PATH_REFUSED,
    IMAGE_REFERENCE,
    ROUTING_MODES,
    SHADOW_CHECKS,
    URL_PASSWORD_MESSAGE,
    URL_WITH_PASSWORD,
    VERSION_MAX,
    VERSION_PATTERN,
    VERSIONS_COLLIDE,
    AnalysisSpec,
    CacheSpec,
    CanarySpec,
    Check,
    ModelSpec,
    PodSettings,
    RankerSpec,
    RedisSpec,
    RoutingSpec,
    ShadowSpec,
    StepSpec,
    TTLSpec,
    WarmupSpec,
)

GROUP = "kvrank.io"
VERSION = "v1alpha1"
PLURAL = "rankerdeployments"
KIND = "RankerDeployment"
API_VERSION = f"{GROUP}/{VERSION}"
"""``kvrank.io/v1alpha1``: the one place the served API version is spelled."""

_NAME = {
    "type": "string",
    "pattern": VERSION_PATTERN,
    "description": f"A model version: lower-case DNS label characters, at most {VERSION_MAX}.",
}
QUANTITY_PATTERN = "^[0-9]+([.][0-9]+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$"
"""Byte quantities the operator understands (the Kubernetes client's parse_quantity reads them;
``spec.parse_quantity``); ``2GB`` is not one."""
_QUANTITY = {
    "x-kubernetes-int-or-string": True,
    "anyOf": [{"type": "integer"}, {"type": "string"}],
    "x-kubernetes-validations": [
        {
            "rule": f"type(self) == string ? self.matches('{QUANTITY_PATTERN}') : self > 0",
            "message": "must be a byte quantity such as 512Mi, 1Gi or 1073741824",
        }
    ],
}
_HTTP_URI = {
    "rule": "!self.uri.contains('://') || self.uri.startsWith('http://')"
    " || self.uri.startsWith('https://') || self.uri.matches('^(s3|gs)://[a-z0-9][a-z0-9._-]*/')"
    f" || self.uri.matches('{IMAGE_REFERENCE}')",
    "message": "only http(s):// URLs, s3://bucket/prefix, gs://bucket/prefix and"
    " oci://<image reference> (a model image) are fetched; other artifacts are a path in"
    " model.volume or baked into the image",
    "fieldPath": ".uri",
    "reason": "FieldValueInvalid",
}


def _rule(rule: str, message: str, field: str) -> dict[str, str]:
    """A cross-field check the API server runs at apply time, naming the field."""
    return {"rule": rule, "message": message, "fieldPath": field, "reason": "FieldValueInvalid"}


def _obj(props: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"type": "object", "properties": props, **extra}
    if required:
        doc["required"] = required
    return doc


def _core(kind: str, description: str) -> dict[str, Any]:
    """A Kubernetes core type, with the schema the API server itself checks it by (from
    :mod:`kvrank_operator.core_types`): ``limit:`` for ``limits:`` or ``cpu: two`` is refused
    at apply, not carried silently into a pod. The description names the type (the reference
    page links it rather than listing its fields)."""
    return {**SCHEMAS[kind], "description": f"{description} (core/v1 {kind})"}


_DNS_NAME = {"type": "string", "maxLength": 253, "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"}
_OWN_LABELS = {
    "rule": "self.all(k, !k.startsWith('app.kubernetes.io/') && !k.startsWith('kvrank.io/'))",
    "message": "app.kubernetes.io/* and kvrank.io/* are the operator's own (selectors use them)",
}
_NON_ROOT = {"type": "integer", "minimum": 1, "maximum": 2147483647}
POD = _obj(
    {
        "imagePullSecrets": {
            "type": "array",
            "items": _obj({"name": _DNS_NAME}, ["name"]),
            "description": "Secrets with registry credentials for the ranker image.",
        },
        "serviceAccountName": _DNS_NAME,
        "labels": {
            "type": "object",
            "additionalProperties": {"type": "string", "maxLength": 63},
            "x-kubernetes-validations": [_OWN_LABELS],
        },
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        "priorityClassName": _DNS_NAME,
        "runtimeClassName": _DNS_NAME,
        "securityContext": _obj(
            {"runAsUser": _NON_ROOT, "runAsGroup": _NON_ROOT, "fsGroup": _NON_ROOT},
            None,
            description="Non-root ids only: the pods stay within Pod Security restricted.",
        ),
        "startupProbe": _obj(
            {
                "periodSeconds": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 60,
                    "default": PodSettings.startup_period_seconds,
                },
                "failureThreshold": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 10000,
                    "default": PodSettings.startup_failure_threshold,
                },
            },
            None,
            description="How long a pod may download, load and warm up before liveness.",
        ),
    }
)


MODEL = _obj(
    {
        "version": _NAME,
        "uri": {
            "type": "string",
            "minLength": 1,
            "maxLength": 1024,
            "description": "Artifact location (config.json and model.safetensors under it): a"
            " path in a mounted volume or the image, an http(s):// URL, s3://bucket/prefix"
            " (credentials, region and endpoint from model.env: AWS_ACCESS_KEY_ID and"
            " AWS_SECRET_ACCESS_KEY from a Secret, or IRSA; AWS_ENDPOINT_URL for MinIO or Ceph)"
            " or gs://bucket/prefix (GOOGLE_SERVICE_ACCOUNT_KEY from a Secret, or GKE Workload"
            " Identity), or oci://<image reference>: a model image holding the artifact under"
            " /models, mounted read-only as an image volume (Kubernetes 1.35+).",
        },
        "sha256": {
            "type": "string",
            "pattern": "^[0-9a-fA-F]{64}$",
            "description": "SHA-256 of the artifact: config.json and model.safetensors, as"
            " `kvrank model-digest DIR` (or `sha256sum config.json model.safetensors |"
            " sha256sum`) prints it; pods refuse others.",
        },
        "image": {
            "type": "string",
            "minLength": 1,
            "maxLength": 512,
            "description": "The ranker image; a team's model comes in a derived image (FROM"
            " the ranker image, plus its plugin package). Default: the operator's"
            " --ranker-image (the chart's defaultImages.ranker).",
        },
        "replicas": {
            "type": "integer",
            "minimum": 0,
            "maximum": 1000,
            "default": ModelSpec.replicas,
        },
        "resources": _core(
            "ResourceRequirements", "Container resources, e.g. limits nvidia.com/gpu: 1."
        ),
        "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}},
        "tolerations": {"type": "array", "items": _core("Toleration", "A toleration.")},
        "affinity": _core("Affinity", "Pod affinity."),
        "env": {
            "type": "array",
            "items": _obj(
                {
                    "name": {"type": "string"},
                    "value": {"type": "string"},
                    "valueFrom": _core(
                        "EnvVarSource", "secretKeyRef, configMapKeyRef or fieldRef."
                    ),
                },
                ["name"],
            ),
        },
        "pod": POD,
        "volume": _core(
            "VolumeSource",
            "Volume source with the model artifacts (e.g. persistentVolumeClaim), mounted"
            " read-only at /models; uri is then a path under /models.",
        ),
        "externalReplicas": {
            "type": "boolean",
            "default": ModelSpec.external_replicas,
            "description": "An HPA/KEDA scales the Deployments directly: the operator leaves"
            " their replicas alone.",
        },
    },
    ["version", "uri"],
    **{
        "x-kubernetes-validations": [
            _HTTP_URI,
            _rule(
                "!has(self.volume) || self.uri.startsWith('/models/')",
                "must be a path under /models/ when model.volume is set (it is mounted there)",
                ".uri",
            ),
            _rule("!has(self.volume) || !has(self.volume.hostPath)", HOST_PATH_REFUSED, ".volume"),
        ]
    },
)

_SHARE = {"type": "number", "minimum": 0, "maximum": 1}


def _at_least(bound: float) -> dict[str, Any]:
    """A number of at least a fractional ``bound``. The API server compares a value written
    as an integer with an OpenAPI ``minimum`` truncated to an integer (``0`` passes
    ``minimum: 0.1``), so a CEL rule, which compares numbers as numbers, holds the bound."""
    rule = {"rule": f"self >= {bound}", "message": f"should be greater than or equal to {bound}"}
    return {"type": "number", "minimum": bound, "x-kubernetes-validations": [rule]}


_FILE = {"type": "string", "pattern": "^/", "maxLength": 1024}
_PROMETHEUS = _obj(
    {
        "url": {
            "type": "string",
            "pattern": r"^https?://[^\s]+$",
            "maxLength": 1024,
            "description": "The query API's base URL (/api/v1/query is appended).",
        },
        "bearerTokenFile": {
            **_FILE,
            "description": "A file in the operator's pod holding a bearer token, read at each"
            " query (a rotated token is picked up): a Secret the chart mounts"
            " (prometheusAuth.secretName), or the operator's own service-account token where"
            " the proxy in front of Prometheus accepts it.",
        },
        "caFile": {
            **_FILE,
            "description": "A PEM bundle in the operator's pod that the server's certificate"
            " must chain to (default: the system's CAs).",
        },
        "headers": {
            "type": "object",
            "additionalProperties": {"type": "string", "maxLength": 1024},
            "maxProperties": 16,
            "description": "Sent with every query: a tenant (X-Scope-OrgID for Mimir, Cortex,"
            " Thanos).",
        },
    },
    ["url"],
    description="Where to query and what reaching it takes.",
)
_PROMETHEUS_SOURCE = _obj(
    {
        "type": {"type": "string", "enum": ["pods", "prometheus"]},
        "prometheus": _PROMETHEUS,
    },
    None,
    **{
        "x-kubernetes-validations": [
            _rule(
                "!has(self.type) || self.type != 'prometheus' || has(self.prometheus)",
                "is required when the source type is prometheus",
                ".prometheus",
            )
        ]
    },
)


def _check(name: str) -> dict[str, Any]:
    bound, quantile, what = CHECKS[name]
    props: dict[str, Any] = {
        bound: {"type": "number"},
        "minSamples": {
            "type": "integer",
            "minimum": 1,
            "maximum": 10**9,
            "default": Check.min_samples,
            "description": "Fewer samples in the step's window: inconclusive, never a pass.",
        },
    }
    if quantile is not None:
        props["quantile"] = {**_SHARE, "default": quantile}
    return _obj(props, [bound], description=f"{bound} of {what}.")


ANALYSIS = _obj(
    {
        **{name: _check(name) for name in CHECKS},
        "inconclusiveTimeoutSeconds": {
            "type": "integer",
            "minimum": 0,
            "maximum": 86400,
            "default": AnalysisSpec.inconclusive_timeout_seconds,
            "description": "A step still without enough data this long after its pause"
            " aborts the rollout.",
        },
        "source": _PROMETHEUS_SOURCE,
    },
    None,
    description="Thresholds every step must meet, measured over the step from the ranker"
    " pods' metrics (or Prometheus). A failed check aborts at once; too few samples wait.",
)

CANARY = _obj(
    {
        "version": _NAME,
        "uri": {"type": "string", "minLength": 1, "maxLength": 1024},
        "image": {
            "type": "string",
            "minLength": 1,
            "maxLength": 512,
            "description": "The canary's own ranker image, to bring new model code (default:"
            " model.image). Promotion makes it the stable's.",
        },
        "weight": {"type": "integer", "minimum": 0, "maximum": 100, "default": CanarySpec.weight},
        "replicas": {"type": "integer", "minimum": 0, "maximum": 1000},
        "sha256": {
            "type": "string",
            "pattern": "^[0-9a-fA-F]{64}$",
            "description": "SHA-256 of the artifact: config.json and model.safetensors, as"
            " `kvrank model-digest DIR` (or `sha256sum config.json model.safetensors |"
            " sha256sum`) prints it; pods refuse others.",
        },
        "shadow": _obj(
            {
                "sample": {**_SHARE, "default": ShadowSpec.sample},
                "topK": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 1000,
                    "default": ShadowSpec.top_k,
                },
            },
            None,
            description="Stable pods mirror this share of their answered requests to the"
            " canary (warming its cache) and compare the scores.",
        ),
        "warmup": _obj(
            {
                "hitRatio": {**_SHARE, "default": WarmupSpec.hit_ratio},
                "minRequests": {
                    "type": "integer",
                    "minimum": 1,
                    "default": WarmupSpec.min_requests,
                },
                "timeoutSeconds": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 86400,
                    "default": WarmupSpec.timeout_seconds,
                },
            },
            None,
            description="The canary takes only shadow traffic until its hit ratio reaches"
            " hitRatio (or the timeout passes), then joins the Service.",
        ),
        "steps": {
            "type": "array",
            "maxItems": 20,
            "items": _obj(
                {
                    "weight": {"type": "integer", "minimum": 1, "maximum": 100},
                    "pauseSeconds": {
                        "type": "integer",
                        "minimum": 0,
                        "maximum": 86400,
                        "default": StepSpec.pause_seconds,
                    },
                },
                ["weight"],
            ),
            "description": "Weights the canary goes through, each analysed; after the last"
            " the operator promotes it. Empty: the canary stays at weight until a person"
            " promotes it.",
        },
        "analysis": ANALYSIS,
        "paused": {
            "type": "boolean",
            "default": False,
            "description": "Hold a stepped rollout at its current step: it neither advances"
            " nor promotes, and an inconclusive step does not time out (a failing check still"
            " aborts). false resumes it (kubectl rkd pause / resume).",
        },
        "skipToStep": {
            "type": "integer",
            "minimum": 1,
            "maximum": 21,
            "description": "Move a stepped rollout to this step now, its checks and pause"
            " skipped (1 ends a warm-up); one past the last step promotes. kubectl rkd promote"
            " writes the step after the current one. It belongs to this canary version:"
            " remove it when the version changes.",
        },
        "promotion": {
            "type": "string",
            "enum": ["spec", "status"],
            "default": CanarySpec.promotion,
            "description": "How a rollout that passed its last step promotes. spec: the"
            " operator rewrites the spec (model takes the canary's version, artifact and"
            " image; the canary block goes). status: it never writes the spec (GitOps:"
            " Argo CD or Flux would revert the change); status.canary says Promoted and the"
            " canary serves as the stable version until the spec names it as the model.",
        },
    },
    ["version", "uri"],
    **{
        "x-kubernetes-validations": [
            _HTTP_URI,
            _rule(
                "!has(self.skipToStep) || (has(self.steps)"
                " && self.skipToStep <= size(self.steps) + 1)",
                "needs canary.steps, and at most one past the last step (which promotes)",
                ".skipToStep",
            ),
            _rule(
                "self.version == oldSelf.version || !has(self.skipToStep)",
                "moves the rollout of one canary version: remove it when canary.version changes",
                ".skipToStep",
            ),
            _rule(
                "!has(self.warmup) || (has(self.shadow) && self.shadow.sample > 0.0)",
                "needs canary.shadow: shadow traffic warms it",
                ".warmup",
            ),
            _rule(
                "!has(self.steps) || size(self.steps) == 0 || (has(self.analysis) && ("
                + " || ".join(f"has(self.analysis.{n})" for n in CHECKS)
                + "))",
                "needs at least one check when canary.steps are set (steps that pass on time"
                " alone would promote a canary nobody measured)",
                ".analysis",
            ),
            _rule(
                "!has(self.analysis) || !("
                + " || ".join(f"has(self.analysis.{n})" for n in SHADOW_CHECKS)
                + ") || (has(self.shadow) && self.shadow.sample > 0.0)",
                "scoreDelta, rankCorrelation and topKChangedRatio are measured on shadow"
                " traffic: set canary.shadow",
                ".analysis",
            ),
        ]
    },
)

REDIS = _obj(
    {
        "mode": {"type": "string", "enum": ["managed", "external"], "default": RedisSpec.mode},
        "shards": {"type": "integer", "minimum": 3, "maximum": 64, "default": RedisSpec.shards},
        "replicasPerShard": {
            "type": "integer",
            "minimum": 0,
            "maximum": 3,
            "default": RedisSpec.replicas_per_shard,
        },
        "memory": {**_QUANTITY, "default": RedisSpec.memory},
        "image": {
            "type": "string",
            "minLength": 1,
            "maxLength": 512,
            "description": "Managed: the Redis image (7.x; it runs as uid 10001). Default: the"
            " operator's --redis-image (the chart's defaultImages.redis).",
        },
        "resources": _core(
            "ResourceRequirements", "Container resources; default: memory requested and limited."
        ),
        "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}},
        "tolerations": {"type": "array", "items": _core("Toleration", "A toleration.")},
        "affinity": _core("Affinity", "Pod affinity; pods are spread over nodes by default."),
        "persistence": {"type": "boolean", "default": RedisSpec.persistence},
        "url": {"type": "string", "maxLength": 1024, "pattern": r"^rediss?://[^\s]+$"},
        "cluster": {"type": "boolean", "default": RedisSpec.cluster},
        "passwordSecretRef": _obj(
            {"name": {"type": "string"}, "key": {"type": "string"}}, ["name", "key"]
        ),
        "tls": {"type": "boolean", "default": RedisSpec.tls},
        "tlsSecretName": {
            "type": "string",
            "maxLength": 253,
            "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
            "description": "A managed Redis's TLS Secret of your own (ca.crt, tls.crt, tls.key,"
            " e.g. from cert-manager); empty: the operator generates one.",
        },
    },
    None,
    **{
        "x-kubernetes-validations": [
            _rule(
                "self.mode != 'external' || has(self.url)",
                "is required when cache.redis.mode is external",
                ".url",
            ),
            _rule(
                "self.mode != 'managed' || !has(self.url)",
                "must be empty when cache.redis.mode is managed (the operator runs that Redis)",
                ".url",
            ),
            _rule(
                "!self.tls || !has(self.url) || self.url.startsWith('rediss://')",
                "must use rediss:// when cache.redis.tls is true",
                ".url",
            ),
            _rule(
                f"!has(self.url) || !self.url.matches('{URL_WITH_PASSWORD}')",
                URL_PASSWORD_MESSAGE,
                ".url",
            ),
            _rule(
                "!has(self.tlsSecretName) || (self.mode == 'managed' && self.tls)",
                "is only for a managed Redis with tls: true",
                ".tlsSecretName",
            ),
            {
                # a managed cluster's topology is fixed once formed: the bootstrap Job forms
                # it once, and slots are not migrated online
                "rule": "self.mode != 'managed' || oldSelf.mode != 'managed'"
                " || (self.shards == oldSelf.shards"
                " && self.replicasPerShard == oldSelf.replicasPerShard)",
                "message": "shards and replicasPerShard of a live managed Redis Cluster cannot"
                " change (no online resharding): deploy a new RankerDeployment with the new"
                " topology and move traffic to it, or delete and re-create this one (its cache"
                " starts empty)",
                "fieldPath": ".shards",
                "reason": "FieldValueForbidden",
            },
            {
                # a cluster half on TLS cannot talk to itself (the bus is TLS too)
                "rule": "self.mode != 'managed' || oldSelf.mode != 'managed'"
                " || self.tls == oldSelf.tls",
                "message": "tls of a live managed Redis Cluster cannot change: deploy a new"
                " RankerDeployment with it, or delete and re-create this one (its cache starts"
                " empty)",
                "fieldPath": ".tls",
                "reason": "FieldValueForbidden",
            },
        ]
    },
)

CACHE = _obj(
    {
        "l1Bytes": {"type": "integer", "minimum": 0},
        "hostBytes": {
            "type": "integer",
            "minimum": 0,
            "description": "Host-memory tier between L1 and Redis (pinned on a GPU): what L1"
            " evicts for room is kept there while its TTL lasts, found before Redis. Count it"
            " in the pods' memory. 0 or unset: none.",
        },
        "kvDtype": {
            "type": "string",
            "enum": ["fp32", "bf16", "fp16", "int8"],
            "default": CacheSpec.kv_dtype,
        },
        "redis": REDIS,
        "retiredNamespaceGraceSeconds": {
            "type": "integer",
            "minimum": 0,
            "maximum": 604800,
            "default": CacheSpec.retired_namespace_grace_seconds,
        },
    }
)

TTL = _obj(
    {
        "mode": {"type": "string", "enum": ["auto", "fixed"], "default": TTLSpec.mode},
        "fixedSeconds": {
            "type": "number",
            "exclusiveMinimum": True,
            "minimum": 0,
            "maximum": 86400,
        },
        "factor": {**_at_least(0.1), "maximum": 100, "default": TTLSpec.factor},
        "minSeconds": {**_at_least(0.1), "default": TTLSpec.min_seconds},
        "maxSeconds": {
            "type": "number",
            "minimum": 1,
            "maximum": 86400,
            "default": TTLSpec.max_seconds,
        },
        "jitter": {"type": "number", "minimum": 0, "maximum": 0.5, "default": TTLSpec.jitter},
        "source": _obj(
            {
                "type": {
                    "type": "string",
                    "enum": ["pods", "prometheus"],
                    "default": TTLSpec.source,
                },
                "prometheus": _PROMETHEUS,
            }
        ),
        "intervalSeconds": {
            "type": "integer",
            "minimum": 5,
            "maximum": 3600,
            "default": TTLSpec.interval_seconds,
        },
    },
    None,
    **{
        "x-kubernetes-validations": [
            _rule(
                "self.mode != 'fixed' || has(self.fixedSeconds)",
                "is required when ttl.mode is fixed",
                ".fixedSeconds",
            ),
            _rule(
                "self.minSeconds <= self.maxSeconds",
                "must not exceed ttl.maxSeconds",
                ".minSeconds",
            ),
            _rule(
                "!has(self.source) || self.source.type != 'prometheus'"
                " || has(self.source.prometheus)",
                "is required when ttl.source.type is prometheus",
                ".source.prometheus",
            ),
        ]
    },
)

SERVICE = _obj(
    {
        "port": {
            "type": "integer",
            "minimum": 1,
            "maximum": 65535,
            "default": RankerSpec.port,
            "x-kubernetes-validations": [
                {"rule": "self != 8081", "message": "8081 is the rankers' admin port"}
            ],
        },
        "type": {
            "type": "string",
            "enum": ["ClusterIP", "NodePort", "LoadBalancer"],
            "default": RankerSpec.service_type,
        },
    }
)

ADMISSION = _obj(
    {
        "mode": {
            "type": "string",
            "enum": list(ADMISSION_MODES),
            "description": "shed (the rankers' default): a request a pod cannot serve"
            " before its deadline is refused at once (503, Retry-After) and work nobody"
            " waits for any more is dropped; drop: queue everything, drop only work nobody"
            " waits for; off: queue and compute everything.",
        },
        "defaultTimeoutMs": {
            "type": "integer",
            "minimum": 1,
            "maximum": 60000,
            "description": "The deadline of a request whose caller sends no"
            " x-kvrank-timeout-ms header (the rankers' default: 5000; answered 504 past it).",
        },
        "maxInflight": {
            "type": "integer",
            "minimum": 1,
            "maximum": 65536,
            "description": "Scoring requests one pod holds at once, waiting or computing;"
            " beyond it a request is refused (the rankers' default: 256).",
        },
        "budgetShare": {
            "type": "number",
            "exclusiveMinimum": True,
            "minimum": 0,
            "maximum": 1,
            "description": "The share of a request's remaining time a pod budgets for its"
            " estimated wait and model work: a request is admitted only when both fit in it,"
            " so admitted requests are answered in about this share of their deadline (the"
            " rankers' default: 0.25; 1 admits up to the very deadline, where under a spike"
            " work ends after its callers left).",
        },
        "queueProxy": _obj(
            {
                "enabled": {
                    "type": "boolean",
                    "default": False,
                    "description": "Run a queue proxy (stock Envoy, the routing image) in"
                    " each ranker pod, in front of the ranker.",
                },
                "maxInflight": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 4096,
                    "default": 16,
                    "description": "Scoring requests the proxy lets through to its ranker at"
                    " once, and as many gRPC calls (each protocol its own bound); one more is"
                    " answered at once, 503 (a gRPC call: RESOURCE_EXHAUSTED) with Retry-After"
                    " and x-kvrank-shed: queue, before the ranker's Python sees it.",
                },
                "resources": _core("ResourceRequirements", "The proxy container's resources."),
            },
            description="A queue proxy beside each ranker: under a spike the overflow is"
            " refused by Envoy instead of the ranker's event loop, which shares the"
            " interpreter with the model (about 0.94x of a CPU ranker's capacity answered in"
            " time at 4x it, against 0.85x without). Metrics and probes are not bounded."
            " Changing it rolls the pods.",
        ),
    },
    description="What one ranker pod takes on under a traffic spike. A field left out"
    " keeps the rankers' default; a change rolls the pods.",
)

ROUTING = _obj(
    {
        "mode": {
            "type": "string",
            "enum": list(ROUTING_MODES),
            "default": RoutingSpec.mode,
            "description": "none: the Service picks a pod at random, the canary's share is"
            " its share of the replicas. bundled: an Envoy router (operator-deployed) sends"
            " each user to one pod of its version by the routing header, so its K/V is in"
            " that pod's L1, and splits the canary's share per user. gateway: an HTTPRoute"
            " on routing.gateway and an Envoy Gateway BackendTrafficPolicy hashing on the"
            " header do the routing (Gateway API and Envoy Gateway must be installed).",
        },
        "header": {
            "type": "string",
            "pattern": "^[A-Za-z0-9-]{1,64}$",
            "default": RoutingSpec.header,
            "description": "Where callers send the user id (the rankers refuse a request"
            " whose header names another user than its body).",
        },
        "hashBalanceFactor": {
            "type": "integer",
            "minimum": 0,
            "maximum": 10000,
            "default": RoutingSpec.hash_balance_factor,
            "x-kubernetes-validations": [
                {"rule": "self == 0 || self >= 100", "message": "0 (unbounded) or at least 100"}
            ],
            "description": "Bounded load: no pod takes more than this percentage of the"
            " mean of in-flight requests; 0: unbounded.",
        },
        "replicas": {"type": "integer", "minimum": 1, "default": RoutingSpec.replicas},
        "image": {
            "type": "string",
            "minLength": 1,
            "maxLength": 512,
            "description": "Bundled: the router image. Default: the operator's --router-image"
            " (the chart's defaultImages.router).",
        },
        "resources": _core("ResourceRequirements", "The router containers' resources."),
        "clusterDomain": {"type": "string", "default": RoutingSpec.cluster_domain},
        "gateway": _obj(
            {
                "name": {"type": "string", "minLength": 1, "maxLength": 253},
                "namespace": {"type": "string", "maxLength": 63},
                "sectionName": {"type": "string", "maxLength": 253},
                "hostnames": {
                    "type": "array",
                    "maxItems": 16,
                    "items": {"type": "string", "maxLength": 253},
                },
            },
            ["name"],
            description="routing.mode gateway: the Gateway the HTTPRoute attaches to.",
        ),
    },
    description="How requests reach the ranker pods.",
)
ROUTING["x-kubernetes-validations"] = [
    {
        "rule": "self.mode != 'gateway' || has(self.gateway)",
        "message": "routing.mode gateway needs routing.gateway.name",
    }
]


SPEC = _obj(
    {
        "model": MODEL,
        "canary": CANARY,
        "cache": CACHE,
        "ttl": TTL,
        "service": SERVICE,
        "routing": ROUTING,
        "admission": ADMISSION,
    },
    ["model"],
    **{
        "x-kubernetes-validations": [
            _rule(
                "!has(self.canary) || self.canary.version != self.model.version",
                "must differ from model.version: a canary runs another model version",
                ".canary.version",
            ),
            _rule(
                "!has(self.canary) || self.canary.version == self.model.version"
                " || self.canary.version.replace('.', '-')"
                " != self.model.version.replace('.', '-')",
                VERSIONS_COLLIDE,
                ".canary.version",
            ),
        ]
    },
)

_TIME = {"type": "string", "format": "date-time"}
_NULLABLE_NUMBER = {"type": "number", "nullable": True}
PHASES = ["Starting", "Warming", "Progressing", "Manual", "Promoted", "Aborted"]
"""A canary's rollout phases (``state.Phase``; a test holds the two equal)."""
NAMESPACE_STATES = ["active", "retired", "purging", "purged"]
"""A cache namespace's states (``state.NamespaceState``; a test holds the two equal)."""
ROLES = ["stable", "canary"]
_CONDITION = _obj(
    {
        "type": {"type": "string", "maxLength": 316},
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "reason": {"type": "string", "maxLength": 1024},
        "message": {"type": "string", "maxLength": 32768},
        "observedGeneration": {"type": "integer", "minimum": 0},
        "lastTransitionTime": _TIME,
    },
    ["type", "status"],
)
_CHECK_RESULT = _obj(
    {
        "metric": {"type": "string"},
        "value": _NULLABLE_NUMBER,
        "max": {"type": "number"},
        "min": {"type": "number"},
        "samples": {"type": "integer"},
        "minSamples": {"type": "integer"},
        "result": {"type": "string", "enum": ["pass", "fail", "inconclusive"]},
    },
    ["metric", "result"],
)
STATUS = _obj(
    {
        "conditions": {
            "type": "array",
            "items": _CONDITION,
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
        "observedGeneration": {"type": "integer", "minimum": 0},
        "url": {"type": "string"},
        "replicas": {"type": "integer", "minimum": 0},
        "selector": {"type": "string"},
        "readyText": {"type": "string"},
        "versions": {
            "type": "array",
            "items": _obj(
                {
                    "version": {"type": "string"},
                    "role": {"type": "string", "enum": ROLES},
                    "replicas": {"type": "integer", "minimum": 0},
                    "readyReplicas": {"type": "integer", "minimum": 0},
                },
                ["version", "role"],
            ),
        },
        "canary": _obj(
            {
                "version": {"type": "string"},
                "phase": {"type": "string", "enum": PHASES},
                "since": {"type": "string"},
                "step": {"type": "integer", "minimum": 0},
                "message": {"type": "string"},
                "weight": {"type": "integer", "minimum": 0, "maximum": 100},
                "stepText": {"type": "string"},
                "checks": {"type": "array", "items": _CHECK_RESULT},
                "warmHitRatio": _NULLABLE_NUMBER,
                "warmRequests": {"type": "integer", "nullable": True},
                "reason": {"type": "string"},
                "ended": {"type": "boolean"},
            },
            ["version", "phase"],
        ),
        "ttl": _obj(
            {
                "seconds": {"type": "number"},
                "meanIntervalSeconds": _NULLABLE_NUMBER,
                "updatedAt": {"type": "string"},
                "source": {"type": "string", "enum": ["fixed", "pods", "prometheus"]},
            },
            ["seconds"],
        ),
        "hitRatio": _NULLABLE_NUMBER,
        "observedAt": {"type": "string"},
        "cacheNamespaces": {
            "type": "array",
            "items": _obj(
                {
                    "version": {"type": "string"},
                    "namespace": {"type": "string"},
                    "role": {"type": "string", "enum": ROLES},
                    "state": {"type": "string", "enum": NAMESPACE_STATES},
                    "since": {"type": "string"},
                    "purgeAfter": {"type": "string"},
                    "job": {"type": "string"},
                },
                ["version", "namespace", "state"],
            ),
        },
        "kopf": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    }
)

COLUMNS = [
    {"name": "Ready", "type": "string",
     "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
     "description": "Whether it serves: its Ready condition (True, False)"},
    {"name": "Pods", "type": "string", "jsonPath": ".status.readyText",
     "description": "Ready replicas of the serving versions / desired"},
    {"name": "URL", "type": "string", "jsonPath": ".status.url",
     "description": "Where callers score: the shared Service's in-cluster URL"},
    {"name": "Version", "type": "string", "jsonPath": ".spec.model.version",
     "description": "The stable model version"},
    {"name": "Canary", "type": "string", "jsonPath": ".spec.canary.version",
     "description": "The canary model version, while one rolls out"},
    {"name": "Weight", "type": "integer", "jsonPath": ".status.canary.weight",
     "description": "The canary's share of traffic now, in percent"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.canary.phase",
     "description": "The canary's rollout: Starting, Warming, Progressing, Manual, ..."},
    {"name": "Step", "type": "string", "jsonPath": ".status.canary.stepText",
     "description": "A progressive rollout's step (n/total)"},
    {"name": "TTL", "type": "number", "jsonPath": ".status.ttl.seconds",
     "description": "The cache TTL in force, in seconds"},
    {"name": "Hit-Ratio", "type": "number", "jsonPath": ".status.hitRatio",
     "description": "Requests served from a cache / requests, as last measured"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp",
     "description": "Since the RankerDeployment was created"},
]  # fmt: skip


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "plural": PLURAL,
                "singular": "rankerdeployment",
                "kind": KIND,
                "shortNames": ["rkd"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": described(
                            _obj({"spec": SPEC, "status": STATUS}, ["spec"])
                        )
                    },
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.model.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": COLUMNS,
                }
            ],
        },
    }
