"""Typed view of a ``RankerDeployment`` spec, and the checks the schema cannot express.

:func:`parse_spec` turns the (schema-validated, defaulted) ``spec`` dict into frozen
dataclasses; semantic problems raise :class:`SpecError` naming the field. Pure: no API.
Every default lives here, once, on the dataclasses: the CRD's schema takes its ``default``
values from them (``crd.py``) and the parser falls back to them for a spec the API server
did not default (tests, dry runs).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from kubernetes.utils import parse_quantity as kubernetes_quantity

from kvrank_common import ADMISSION_MODES, TTL_FACTOR, TTL_JITTER, TTL_MAX_S, TTL_MIN_S
from kvrank_operator import __version__
from kvrank_operator.errors import SpecError

DEFAULT_IMAGE = f"ghcr.io/kvrank/ranker:{__version__}"
ROUTER_IMAGE = f"ghcr.io/kvrank/router:{__version__}"
REDIS_IMAGE = "redis:7.2"
HOST_PATH_REFUSED = (
    "must not be a hostPath: a ranker would read the node's files (Pod Security restricted"
    " refuses it too); put the artifacts in a PersistentVolumeClaim, an image or a store"
)
URL_WITH_PASSWORD = r"^rediss?://[^/@]*:[^/@]*@"
"""A Redis URL whose user part carries a password (``redis://:secret@host``)."""
URL_PASSWORD_MESSAGE = (
    "must not carry a password (it would be shown in the rankers' ConfigMap, their"
    " /admin/config and the purge Job's arguments): put it in a Secret and name it in"
    " cache.redis.passwordSecretRef"
)


@dataclass(frozen=True)
class Defaults:
    """What the operator supplies where a spec is silent (its command line; the chart's
    ``defaultImages`` and ``podIds``), set once for a site instead of on every
    RankerDeployment: the images a spec that names none runs (``--ranker-image``,
    ``--redis-image``, ``--router-image``), and whether pods leave their ids to the
    platform (``--platform-ids``)."""

    ranker: str = DEFAULT_IMAGE
    redis: str = REDIS_IMAGE
    router: str = ROUTER_IMAGE
    platform_ids: bool = False
    """No ``runAsUser``/``runAsGroup``/``fsGroup`` on the pods the operator makes: OpenShift's
    restricted-v2 SCC assigns them from the namespace's range (and refuses pods that fix
    others). ``model.pod.securityContext`` set in a spec still wins."""
    operator_namespace: str | None = None
    """Where the operator's own pods run (``POD_NAMESPACE``): a managed Redis admits them from
    there only. ``None`` (an operator outside the cluster): pods so labelled in any namespace."""


ROUTING_HEADER = "X-KVRank-User"
"""The header callers put the user id in (the rankers' ``routing_header`` default)."""
MODELS_MOUNT = "/models"
FETCHED_SCHEMES = ("http://", "https://", "s3://", "gs://")
"""The artifact URIs a ranker downloads at start."""
IMAGE_SCHEME = "oci://"
"""A model image: the artifact under :data:`IMAGE_MODEL_DIR` inside an OCI image (KServe's
modelcar layout), mounted read-only into the pod as an image volume — pulled by the node and
cached there like any image, nothing downloaded by the ranker."""
IMAGE_MODEL_DIR = "/models"
"""Where a model image holds its artifact (config.json + model.safetensors)."""
IMAGE_REFERENCE = (
    r"^oci://[a-z0-9]([a-z0-9._:-]*[a-z0-9])?(/[a-z0-9]([a-z0-9._-]*[a-z0-9])?)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$"
)
"""An ``oci://`` model URI: ``oci://`` and an image reference (registry/repository, a tag
and/or a digest). The CRD checks the same pattern."""


@dataclass(frozen=True)
class PodSettings:
    """What platforms set on every ranker pod: registry credentials, identity, policy labels,
    scheduling priority and runtime, the user the image runs as, how long it may start."""

    image_pull_secrets: list[str] = field(default_factory=list)
    service_account_name: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    priority_class_name: str | None = None
    runtime_class_name: str | None = None
    run_as_user: int | None = None
    """Overrides the image's user; the CRD admits only non-root ids (Pod Security
    ``restricted`` stays satisfied)."""
    run_as_group: int | None = None
    fs_group: int | None = None
    startup_period_seconds: int = 5
    startup_failure_threshold: int = 120
    """period × threshold: 10 minutes to download, load and warm up a model."""


GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class ModelSpec:
    version: str
    uri: str
    image: str = DEFAULT_IMAGE
    replicas: int = 2
    resources: dict[str, Any] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    affinity: dict[str, Any] = field(default_factory=dict)
    env: list[dict[str, str]] = field(default_factory=list)
    volume: dict[str, Any] = field(default_factory=dict)
    """A Kubernetes volume source holding the artifacts, mounted read-only at /models."""
    external_replicas: bool = False
    """An autoscaler owns the Deployments' replicas: the operator never sets them."""
    pod: PodSettings = field(default_factory=PodSettings)
    sha256: str | None = None
    """Of the artifact's weights file: pods refuse an artifact that does not match."""

    @property
    def requests_gpu(self) -> bool:
        """The pods ask for an NVIDIA GPU (requests or limits ``nvidia.com/gpu`` > 0)."""
        for part in ("limits", "requests"):
            amount = (self.resources.get(part) or {}).get(GPU_RESOURCE)
            if amount is not None and str(amount).strip() not in ("", "0"):
                return True
        return False


@dataclass(frozen=True)
class ShadowSpec:
    """Stable pods mirror a sampled share of their answered requests to the canary, which
    warms its cache with them; the stable pods compare the two score vectors."""

    sample: float = 0.1
    top_k: int = 10


@dataclass(frozen=True)
class WarmupSpec:
    """The canary takes shadow traffic only until its hit ratio reaches ``hit_ratio`` over at
    least ``min_requests`` requests, or ``timeout_seconds`` pass; then it joins the Service."""

    hit_ratio: float = 0.8
    min_requests: int = 100
    timeout_seconds: int = 600


@dataclass(frozen=True)
class StepSpec:
    weight: int
    pause_seconds: int = 60
    """The step's analysis window: it passes no sooner than this after it began."""


@dataclass(frozen=True)
class Check:
    """One analysis threshold: ``max`` or ``min`` (``bound``) on a metric measured over the
    step, judged only once ``min_samples`` samples (requests) back it."""

    bound: Literal["max", "min"]
    value: float
    min_samples: int = 50
    quantile: float | None = None
    """For the histogram metrics (score delta, rank correlation): which quantile."""


CHECKS: dict[str, tuple[Literal["max", "min"], float | None, str]] = {
    "p99LatencyRatio": ("max", None, "canary p99 latency / stable p99 latency"),
    "errorRatio": ("max", None, "canary 5xx responses / canary responses"),
    "hitRatio": ("min", None, "canary requests served from a cache / canary requests"),
    "scoreDelta": ("max", 0.99, "quantile of |stable score - canary score| per candidate"),
    "rankCorrelation": ("min", 0.1, "quantile of Spearman's rho of the two orderings"),
    "topKChangedRatio": ("max", None, "share of mirrored requests whose top-k set changed"),
}
"""Every analysis metric: its bound, default quantile and what it measures."""
SHADOW_CHECKS = ("scoreDelta", "rankCorrelation", "topKChangedRatio")
"""Measured on mirrored requests: they need ``canary.shadow``."""


@dataclass(frozen=True)
class PrometheusEndpoint:
    """A Prometheus-compatible query API and what reaching it takes. The files are paths in
    the operator's pod (a mounted Secret, or its own service-account token where the proxy
    in front of Prometheus accepts it); the token is read at every query, so a rotated
    token is picked up."""

    url: str
    bearer_token_file: str | None = None
    ca_file: str | None = None
    """PEM bundle the server's certificate must chain to (the system's CAs when unset)."""
    headers: dict[str, str] = field(default_factory=dict)
    """Sent with every query: a tenant (``X-Scope-OrgID`` for Mimir, Cortex, Thanos)."""


@dataclass(frozen=True)
class AnalysisSpec:
    checks: dict[str, Check] = field(default_factory=dict)
    """metric name (a key of :data:`CHECKS`) → its threshold."""
    inconclusive_timeout_seconds: int = 300
    """A step still without enough data this long after its pause ended aborts: no data is
    never a pass."""
    source: Literal["pods", "prometheus"] = "pods"
    prometheus: PrometheusEndpoint | None = None


@dataclass(frozen=True)
class CanarySpec:
    version: str
    uri: str
    weight: int = 10
    replicas: int | None = None
    sha256: str | None = None
    shadow: ShadowSpec | None = None
    warmup: WarmupSpec | None = None
    image: str | None = None
    """The canary's own ranker image (new model code); None: ``model.image``."""
    steps: tuple[StepSpec, ...] = ()
    """Empty: the canary stays at ``weight`` until a person promotes or removes it."""
    analysis: AnalysisSpec = field(default_factory=AnalysisSpec)
    promotion: Literal["spec", "status"] = "spec"
    """How a passed rollout promotes: ``spec`` rewrites the spec (``model`` ← the canary, the
    canary block removed), as a person would with kubectl; ``status`` never writes the spec
    (GitOps: Argo CD or Flux would revert it) — the operator records the promotion in
    ``status.canary`` and serves the canary as the stable version until the spec says so."""
    paused: bool = False
    """Hold a stepped rollout at its step: it neither advances nor promotes (a failing check
    still aborts). Resuming moves on at once if the step's pause is over and its checks pass."""
    skip_to_step: int = 0
    """A person's move of a stepped rollout (``kubectl rkd promote`` writes it): while the
    rollout is before this step it goes there at once (ending a warm-up for step 1), and past
    the last step it promotes; 0: none. It belongs to this canary version (the API server
    refuses a version change that keeps it)."""
    serving: bool = True
    """Not in the CRD: ``False`` while the rollout keeps the canary out of the shared Service
    (starting, warming up); the stable version then keeps all its replicas."""


@dataclass(frozen=True)
class RedisSpec:
    mode: Literal["managed", "external"] = "managed"
    shards: int = 3
    replicas_per_shard: int = 1
    memory: str = "1Gi"
    image: str = REDIS_IMAGE
    resources: dict[str, Any] = field(default_factory=dict)
    """Empty: memory requested and limited to ``memory`` (the data set's ceiling)."""
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    affinity: dict[str, Any] = field(default_factory=dict)
    persistence: bool = False
    url: str | None = None
    cluster: bool = False
    password_secret: tuple[str, str] | None = None  # (name, key)
    tls: bool = False
    """External: the URL is ``rediss://``. Managed: every connection to and between the
    nodes is TLS, with a Secret the operator generates unless ``tls_secret`` names one."""
    tls_secret: str | None = None


@dataclass(frozen=True)
class CacheSpec:
    l1_bytes: int | None = None
    """The rankers' L1 budget; ``None``: theirs by device (half a GPU's free memory)."""
    kv_dtype: str = "bf16"
    redis: RedisSpec = field(default_factory=RedisSpec)
    retired_namespace_grace_seconds: int = 300
    """A retired stable version's entries stay this long: a rollback within finds them warm."""
    host_bytes: int = 0
    """The host-memory tier between L1 and Redis (the ranker's ``host_bytes``); 0: none."""


@dataclass(frozen=True)
class TTLSpec:
    """The TTL policy. ``fixed_seconds``, ``factor``, ``min_seconds``, ``max_seconds`` and
    ``jitter`` are the ranker's own ``ttl`` settings (same names, same meaning: they go into
    the pods' config file as they are); the rest steers the operator's tuning."""

    mode: Literal["auto", "fixed"] = "auto"
    fixed_seconds: float | None = None
    factor: float = TTL_FACTOR
    """A user returning within ~3 mean intervals still finds their entry."""
    min_seconds: float = TTL_MIN_S
    max_seconds: float = TTL_MAX_S
    jitter: float = TTL_JITTER
    source: Literal["pods", "prometheus"] = "pods"
    prometheus: PrometheusEndpoint | None = None
    interval_seconds: int = 30
    """How often the operator measures and, when it moved, rewrites the TTL."""

    def ranker_settings(self, fixed_seconds: float | None) -> dict[str, Any]:
        """The ``ttl`` section of the pods' config file."""
        keys = ("factor", "min_seconds", "max_seconds", "jitter")
        return {"fixed_seconds": fixed_seconds, **{k: getattr(self, k) for k in keys}}


@dataclass(frozen=True)
class GatewayRef:
    """The Gateway (Gateway API) a ``routing.mode: gateway`` HTTPRoute attaches to."""

    name: str = ""
    namespace: str = ""
    """Empty: the RankerDeployment's namespace."""
    section_name: str = ""
    """A listener of that Gateway; empty: all of them."""
    hostnames: tuple[str, ...] = ()


ROUTING_MODES = ("none", "bundled", "gateway")


@dataclass(frozen=True)
class RoutingSpec:
    """How requests reach the ranker pods. ``none``: the shared Service picks a pod at
    random (kube-proxy), the canary's share is its share of the replicas. ``bundled``: the
    shared Service fronts an Envoy router the operator deploys, which sends each user (by
    ``header``) to one pod of its version and splits the canary's share per user.
    ``gateway``: an HTTPRoute on the cluster's Gateway and an Envoy Gateway
    BackendTrafficPolicy hashing on ``header`` do the same (see ``manifests.gateway``)."""

    mode: Literal["none", "bundled", "gateway"] = "none"
    header: str = ROUTING_HEADER
    hash_balance_factor: int = 150
    """Bounded load: no pod takes more than this percentage of the mean (≥ 100)."""
    replicas: int = 2
    image: str = ROUTER_IMAGE
    resources: dict[str, Any] = field(default_factory=dict)
    cluster_domain: str = "cluster.local"
    """The cluster's DNS domain: the router finds each version's pods by name."""
    gateway: GatewayRef = field(default_factory=GatewayRef)


@dataclass(frozen=True)
class QueueProxySpec:
    """A queue proxy beside each ranker (``manifests.queue_proxy``): Envoy holding at most
    ``max_inflight`` scoring requests in flight to it, refusing the overflow itself."""

    enabled: bool = False
    max_inflight: int = 16
    resources: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AdmissionSpec:
    """What one ranker pod takes on under a spike (the rankers' ``admission`` settings: see
    ``kvrank.admission``). A field left out keeps the ranker's own default; a changed one
    rolls the pods (it reaches them as an environment variable)."""

    mode: str | None = None
    default_timeout_ms: int | None = None
    max_inflight: int | None = None
    budget_share: float | None = None
    queue_proxy: QueueProxySpec = field(default_factory=QueueProxySpec)

    def ranker_env(self) -> list[dict[str, str]]:
        named = (
            ("KVRANK_ADMISSION_MODE", self.mode),
            ("KVRANK_ADMISSION_DEFAULT_TIMEOUT_MS", self.default_timeout_ms),
            ("KVRANK_ADMISSION_MAX_INFLIGHT", self.max_inflight),
            ("KVRANK_ADMISSION_BUDGET_SHARE", self.budget_share),
        )
        return [{"name": name, "value": str(v)} for name, v in named if v is not None]


@dataclass(frozen=True)
class RankerSpec:
    model: ModelSpec
    canary: CanarySpec | None
    cache: CacheSpec
    ttl: TTLSpec
    port: int = 8080
    service_type: str = "ClusterIP"
    routing: RoutingSpec = field(default_factory=RoutingSpec)
    admission: AdmissionSpec = field(default_factory=AdmissionSpec)
    platform_ids: bool = False
    """Not in the CRD: the operator's :attr:`Defaults.platform_ids`."""
    operator_namespace: str | None = None
    """Not in the CRD: the operator's :attr:`Defaults.operator_namespace`."""

    def ids(self, uid: int) -> int | None:
        """The uid (and gid) a pod of ours runs as: ``uid``, or ``None`` where the platform
        assigns them."""
        return None if self.platform_ids else uid

    def artifact_of(self, role: str) -> tuple[str, str | None]:
        """(uri, sha256) of the stable or the canary version."""
        if role == "canary" and self.canary is not None:
            return self.canary.uri, self.canary.sha256
        return self.model.uri, self.model.sha256

    def image_of(self, role: str) -> str:
        """The ranker image of the stable or the canary version (a canary may bring new
        model code in an image of its own)."""
        if role == "canary" and self.canary is not None and self.canary.image:
            return self.canary.image
        return self.model.image

    def versions(self) -> list[tuple[str, str]]:
        """(version, role) of every live version, stable first."""
        out = [(self.model.version, "stable")]
        if self.canary is not None:
            out.append((self.canary.version, "canary"))
        return out

    def replicas_of(self, role: str, total: int | None = None) -> int:
        """Replica split: the canary gets ``weight`` % of the total unless set explicitly."""
        stable = self.model.replicas if total is None else total
        if self.canary is None:
            return stable
        if role == "stable" and not self.canary.serving:
            return stable
        if role == "canary":
            if self.canary.replicas is not None:
                return self.canary.replicas
            return max(1, round(stable * self.canary.weight / 100)) if self.canary.weight else 0
        return (
            stable
            if self.canary.replicas is not None
            else max(1, stable - self.replicas_of("canary", stable))
        )


def parse_quantity(quantity: str | int) -> int:
    """Bytes in a Kubernetes quantity (``512Mi``, ``1.5Gi``, ``1073741824``), as the
    Kubernetes client reads it; ``ValueError`` for anything else (``2GB``)."""
    return int(kubernetes_quantity(quantity))  # type: ignore[no-untyped-call]


VERSION_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,40}[a-z0-9])?$"
VERSION_MAX = 42  # what VERSION_PATTERN admits
CACHE_NAMESPACE_MAX = 63  # it labels the purge Job (a label value)
_OWNER_SLUG = CACHE_NAMESPACE_MAX - 1 - VERSION_MAX - 9  # "<slug>-<8 hex>.<version>"


def cache_owner(instance: str, namespace: str) -> str:
    """What every cache namespace of one RankerDeployment starts with: its name made a
    dotless slug (its first 11 characters: room for the longest version) and a digest of
    ``<namespace>/<name>``, so that two RankerDeployments sharing one Redis (of the same name
    in two Kubernetes namespaces, or ``a.b`` beside ``a-b``) never share a key. A Redis ACL
    pattern ``~kvrank*:<owner>.*`` confines one deployment to its own keys."""
    digest = hashlib.sha256(f"{namespace}/{instance}".encode()).hexdigest()[:8]
    slug = re.sub(r"[^a-z0-9-]", "-", instance.lower())[:_OWNER_SLUG].strip("-")
    return f"{slug}-{digest}" if slug else digest


def namespace_for(instance: str, namespace: str, version: str) -> str:
    """The cache namespace of one model version of one RankerDeployment:
    ``<owner>.<version>``, the version verbatim (the CRD admits ``[a-z0-9.-]``, at most 42
    characters), so that two versions never share one (``1.0`` and ``1-0`` have their own)
    and a purge of one never touches another's keys."""
    return f"{cache_owner(instance, namespace)}.{version}"


VERSIONS_COLLIDE = (
    "differs from model.version only in '.' against '-': the two would share one Deployment"
    " and Service name (a version's objects are named with its dots made dashes); name the"
    " canary's version differently"
)


def _canary_beside(raw: dict[str, Any], stable: str) -> CanarySpec:
    """The canary, whose version must name other objects and another cache than ``stable``."""
    canary = _canary(raw)
    if canary.version == stable:
        raise SpecError(
            "canary.version",
            f"equals model.version ({stable!r}); a canary must run a different model version",
        )
    if canary.version.replace(".", "-") == stable.replace(".", "-"):
        raise SpecError("canary.version", VERSIONS_COLLIDE)
    return canary


def parse_spec(spec: dict[str, Any], defaults: Defaults | None = None) -> RankerSpec:
    """The typed spec; an image the spec does not name is the operator's default."""
    images = defaults or Defaults()
    m = spec.get("model") or {}
    model = ModelSpec(
        version=_version(m, "model"),
        uri=_req(m, "uri", "model"),
        image=m.get("image", images.ranker),
        replicas=int(m.get("replicas", ModelSpec.replicas)),
        resources=m.get("resources") or {},
        node_selector=m.get("nodeSelector") or {},
        tolerations=m.get("tolerations") or [],
        affinity=m.get("affinity") or {},
        env=m.get("env") or [],
        volume=m.get("volume") or {},
        external_replicas=bool(m.get("externalReplicas", ModelSpec.external_replicas)),
        pod=_pod(m.get("pod") or {}),
        sha256=m.get("sha256"),
    )
    for fld, uri in (
        ("model.uri", model.uri),
        ("canary.uri", (spec.get("canary") or {}).get("uri")),
    ):
        if uri and uri.startswith(IMAGE_SCHEME) and not re.match(IMAGE_REFERENCE, uri):
            raise SpecError(fld, f"{uri!r} is not oci:// and an image reference")
        if uri and "://" in uri and not uri.startswith((*FETCHED_SCHEMES, IMAGE_SCHEME)):
            raise SpecError(
                fld,
                f"scheme {uri.split('://', 1)[0]!r} is not supported: use a path in"
                " model.volume (or baked into the image), an http(s):// URL, s3://bucket/prefix,"
                " gs://bucket/prefix or oci://<model image>",
            )
    if "hostPath" in model.volume:
        raise SpecError("model.volume", HOST_PATH_REFUSED)
    if model.volume and not model.uri.startswith(MODELS_MOUNT + "/"):
        raise SpecError(
            "model.uri",
            f"must be a path under {MODELS_MOUNT}/ when model.volume"
            " is set (the volume is mounted there)",
        )
    canary = _canary_beside(spec["canary"], model.version) if spec.get("canary") else None
    cache = _cache(spec.get("cache") or {}, images.redis)
    ttl = _ttl(spec.get("ttl") or {})
    svc = spec.get("service") or {}
    return RankerSpec(
        model,
        canary,
        cache,
        ttl,
        int(svc.get("port", RankerSpec.port)),
        svc.get("type", RankerSpec.service_type),
        _routing(spec.get("routing") or {}, images.router),
        _admission(spec.get("admission") or {}),
        platform_ids=images.platform_ids,
        operator_namespace=images.operator_namespace,
    )


def _admission(a: dict[str, Any]) -> AdmissionSpec:
    admission = AdmissionSpec(
        mode=a.get("mode"),
        default_timeout_ms=_int_or_none(a.get("defaultTimeoutMs")),
        max_inflight=_int_or_none(a.get("maxInflight")),
        budget_share=None if a.get("budgetShare") is None else float(a["budgetShare"]),
        queue_proxy=_queue_proxy(a.get("queueProxy") or {}),
    )
    if admission.mode is not None and admission.mode not in ADMISSION_MODES:
        raise SpecError(
            "admission.mode", f"{admission.mode!r} is not one of {', '.join(ADMISSION_MODES)}"
        )
    return admission


def _queue_proxy(q: dict[str, Any]) -> QueueProxySpec:
    proxy = QueueProxySpec(
        enabled=bool(q.get("enabled", False)),
        max_inflight=int(q.get("maxInflight", QueueProxySpec.max_inflight)),
        resources=dict(q.get("resources") or {}),
    )
    if proxy.max_inflight < 1:
        raise SpecError("admission.queueProxy.maxInflight", f"{proxy.max_inflight} is below 1")
    return proxy


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _routing(r: dict[str, Any], image: str) -> RoutingSpec:
    routing = RoutingSpec(
        mode=r.get("mode", RoutingSpec.mode),
        header=r.get("header", RoutingSpec.header),
        hash_balance_factor=int(r.get("hashBalanceFactor", RoutingSpec.hash_balance_factor)),
        replicas=int(r.get("replicas", RoutingSpec.replicas)),
        image=r.get("image", image),
        resources=r.get("resources") or {},
        cluster_domain=r.get("clusterDomain", RoutingSpec.cluster_domain),
        gateway=GatewayRef(
            name=(gw := r.get("gateway") or {}).get("name", ""),
            namespace=gw.get("namespace", ""),
            section_name=gw.get("sectionName", ""),
            hostnames=tuple(gw.get("hostnames") or ()),
        ),
    )
    if routing.mode not in ROUTING_MODES:
        raise SpecError(
            "routing.mode", f"{routing.mode!r} is not one of {', '.join(ROUTING_MODES)}"
        )
    if routing.mode == "gateway" and not routing.gateway.name:
        raise SpecError("routing.gateway.name", "required with routing.mode gateway")
    if routing.hash_balance_factor and routing.hash_balance_factor < 100:
        raise SpecError(
            "routing.hashBalanceFactor",
            f"{routing.hash_balance_factor} is below 100 (a pod's share of the mean); 0: unbounded",
        )
    return routing


def _canary(c: dict[str, Any]) -> CanarySpec:
    shadow = warmup = None
    if (sh := c.get("shadow")) is not None:
        shadow = ShadowSpec(
            float(sh.get("sample", ShadowSpec.sample)), int(sh.get("topK", ShadowSpec.top_k))
        )
    if (w := c.get("warmup")) is not None:
        warmup = WarmupSpec(
            float(w.get("hitRatio", WarmupSpec.hit_ratio)),
            int(w.get("minRequests", WarmupSpec.min_requests)),
            int(w.get("timeoutSeconds", WarmupSpec.timeout_seconds)),
        )
        if shadow is None or shadow.sample <= 0:
            raise SpecError("canary.warmup", "needs canary.shadow: shadow traffic warms it")
    steps = tuple(
        StepSpec(int(s["weight"]), int(s.get("pauseSeconds", StepSpec.pause_seconds)))
        for s in c.get("steps") or []
    )
    analysis = _analysis(c.get("analysis") or {})
    if steps and not analysis.checks:
        raise SpecError(
            "canary.analysis",
            "needs at least one check when canary.steps are set (steps that pass on time"
            " alone would promote a canary nobody measured)",
        )
    unshadowed = [k for k in SHADOW_CHECKS if k in analysis.checks]
    if unshadowed and (shadow is None or shadow.sample <= 0):
        raise SpecError(
            f"canary.analysis.{unshadowed[0]}", "is measured on shadow traffic: set canary.shadow"
        )
    return CanarySpec(
        _version(c, "canary"),
        _req(c, "uri", "canary"),
        int(c.get("weight", CanarySpec.weight)),
        c.get("replicas"),
        c.get("sha256"),
        shadow,
        warmup,
        image=c.get("image"),
        steps=steps,
        analysis=analysis,
        paused=bool(c.get("paused", False)),
        promotion=_promotion(c.get("promotion", CanarySpec.promotion)),
        skip_to_step=_skip_to_step(c.get("skipToStep"), steps),
    )


def _skip_to_step(value: Any, steps: tuple[StepSpec, ...]) -> int:
    if value is None:
        return 0
    if not steps:
        raise SpecError(
            "canary.skipToStep", "needs canary.steps (a canary without steps promotes whole)"
        )
    if not isinstance(value, int) or not 1 <= value <= len(steps) + 1:
        raise SpecError(
            "canary.skipToStep",
            f"must be a step from 1 to {len(steps) + 1} (past the last step: promote)",
        )
    return value


def _promotion(value: Any) -> Literal["spec", "status"]:
    if value == "spec":
        return "spec"
    if value == "status":
        return "status"
    raise SpecError("canary.promotion", f"{value!r} is not one of spec, status")


def _analysis(a: dict[str, Any]) -> AnalysisSpec:
    checks = {}
    for name, (bound, quantile, _) in CHECKS.items():
        if (doc := a.get(name)) is None:
            continue
        checks[name] = Check(
            bound,
            float(doc[bound]),
            int(doc.get("minSamples", Check.min_samples)),
            float(doc.get("quantile", quantile)) if quantile is not None else None,
        )
    src = a.get("source") or {}
    analysis = AnalysisSpec(
        checks,
        int(a.get("inconclusiveTimeoutSeconds", AnalysisSpec.inconclusive_timeout_seconds)),
        src.get("type", AnalysisSpec.source),
        _prometheus(src.get("prometheus")),
    )
    if analysis.source == "prometheus" and analysis.prometheus is None:
        raise SpecError(
            "canary.analysis.source.prometheus.url", "is required when the source is prometheus"
        )
    return analysis


def _pod(p: dict[str, Any]) -> PodSettings:
    security = p.get("securityContext") or {}
    startup = p.get("startupProbe") or {}
    return PodSettings(
        image_pull_secrets=[s["name"] for s in p.get("imagePullSecrets") or []],
        service_account_name=p.get("serviceAccountName"),
        labels=dict(p.get("labels") or {}),
        annotations=dict(p.get("annotations") or {}),
        priority_class_name=p.get("priorityClassName"),
        runtime_class_name=p.get("runtimeClassName"),
        run_as_user=security.get("runAsUser"),
        run_as_group=security.get("runAsGroup"),
        fs_group=security.get("fsGroup"),
        startup_period_seconds=int(
            startup.get("periodSeconds", PodSettings.startup_period_seconds)
        ),
        startup_failure_threshold=int(
            startup.get("failureThreshold", PodSettings.startup_failure_threshold)
        ),
    )


def _cache(c: dict[str, Any], image: str) -> CacheSpec:
    r = c.get("redis") or {}
    mode = r.get("mode", RedisSpec.mode)
    secret = r.get("passwordSecretRef")
    redis = RedisSpec(
        mode=mode,
        shards=int(r.get("shards", RedisSpec.shards)),
        replicas_per_shard=int(r.get("replicasPerShard", RedisSpec.replicas_per_shard)),
        memory=str(r.get("memory", RedisSpec.memory)),
        image=r.get("image", image),
        resources=r.get("resources") or {},
        node_selector=r.get("nodeSelector") or {},
        tolerations=r.get("tolerations") or [],
        affinity=r.get("affinity") or {},
        persistence=bool(r.get("persistence", RedisSpec.persistence)),
        url=r.get("url"),
        cluster=bool(r.get("cluster", RedisSpec.cluster)),
        password_secret=(secret["name"], secret["key"]) if secret else None,
        tls=bool(r.get("tls", RedisSpec.tls)),
        tls_secret=r.get("tlsSecretName") or None,
    )
    try:
        if parse_quantity(redis.memory) <= 0:
            raise ValueError("not positive")
    except ValueError:
        raise SpecError(
            "cache.redis.memory", f"{redis.memory!r} is not a byte quantity such as 512Mi or 1Gi"
        ) from None
    if mode == "external" and not redis.url:
        raise SpecError("cache.redis.url", "is required when cache.redis.mode is external")
    if mode == "managed" and redis.url:
        raise SpecError("cache.redis.url", "must be empty when cache.redis.mode is managed")
    if redis.tls and redis.url and not redis.url.startswith("rediss://"):
        raise SpecError("cache.redis.url", "must use rediss:// when cache.redis.tls is true")
    if redis.url and re.match(URL_WITH_PASSWORD, redis.url):
        raise SpecError("cache.redis.url", URL_PASSWORD_MESSAGE)
    if redis.tls_secret and not (mode == "managed" and redis.tls):
        raise SpecError("cache.redis.tlsSecretName", "is only for a managed Redis with tls: true")
    return CacheSpec(
        int(c["l1Bytes"]) if c.get("l1Bytes") is not None else None,
        c.get("kvDtype", CacheSpec.kv_dtype),
        redis,
        int(c.get("retiredNamespaceGraceSeconds", CacheSpec.retired_namespace_grace_seconds)),
        int(c.get("hostBytes", CacheSpec.host_bytes)),
    )


def _prometheus(p: dict[str, Any] | None) -> PrometheusEndpoint | None:
    if not p or not p.get("url"):
        return None
    return PrometheusEndpoint(
        p["url"],
        p.get("bearerTokenFile"),
        p.get("caFile"),
        {str(k): str(v) for k, v in (p.get("headers") or {}).items()},
    )


def _ttl(t: dict[str, Any]) -> TTLSpec:
    src = t.get("source") or {}
    ttl = TTLSpec(
        mode=t.get("mode", TTLSpec.mode),
        fixed_seconds=t.get("fixedSeconds"),
        factor=float(t.get("factor", TTLSpec.factor)),
        min_seconds=float(t.get("minSeconds", TTLSpec.min_seconds)),
        max_seconds=float(t.get("maxSeconds", TTLSpec.max_seconds)),
        jitter=float(t.get("jitter", TTLSpec.jitter)),
        source=src.get("type", TTLSpec.source),
        prometheus=_prometheus(src.get("prometheus")),
        interval_seconds=int(t.get("intervalSeconds", TTLSpec.interval_seconds)),
    )
    if ttl.mode == "fixed" and ttl.fixed_seconds is None:
        raise SpecError("ttl.fixedSeconds", "is required when ttl.mode is fixed")
    if ttl.min_seconds > ttl.max_seconds:
        raise SpecError(
            "ttl.minSeconds", f"{ttl.min_seconds} exceeds ttl.maxSeconds {ttl.max_seconds}"
        )
    if ttl.source == "prometheus" and ttl.prometheus is None:
        raise SpecError("ttl.source.prometheus.url", "is required when ttl.source is prometheus")
    return ttl


def _version(doc: dict[str, Any], parent: str) -> str:
    """A model version as the CRD admits it: it names objects and a cache namespace."""
    version = _req(doc, "version", parent)
    if not re.match(VERSION_PATTERN, version):
        raise SpecError(
            f"{parent}.version",
            f"{version!r} must be lower-case letters, digits, '.' and '-', starting and ending"
            f" with a letter or digit, at most {VERSION_MAX} characters",
        )
    return version


def _req(doc: dict[str, Any], key: str, parent: str) -> str:
    value = doc.get(key)
    if not value:
        raise SpecError(f"{parent}.{key}", "is required")
    return str(value)
