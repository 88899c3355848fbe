"""One read of what the cluster reports about a RankerDeployment, shared by the reconcilers.

Deployments and pods per model version, finished purge Jobs, the managed Redis's nodes, the
router's readiness. It reads; it never decides or writes. A pass reads at most twice: for
the deciders when one needs it (the canary's readiness and metrics, the TTL's intervals
from the pods), and after the apply for every concern's report.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Protocol

from kvrank_operator import manifests as m
from kvrank_operator.certs import CA_FILE
from kvrank_operator.kube import Kube
from kvrank_operator.manifests.gateway import ROUTE_API
from kvrank_operator.manifests.router import router_selector
from kvrank_operator.spec import RankerSpec


class Lister(Protocol):
    """Where the instance's Deployments, pods and Jobs are listed from: the API server
    (:class:`~kvrank_operator.kube.Kube`) or what the operator's watches hold (:class:`Owned`)."""

    def list(
        self, api_version: str, kind: str, namespace: str | None, selector: dict[str, str]
    ) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class Owned:
    """An instance's Deployments, pods and Jobs as the operator's watches last reported them
    (kopf's indexes, copied between two passes): listed without an API request."""

    objects: tuple[dict[str, Any], ...]
    KINDS = frozenset({("apps/v1", "Deployment"), ("v1", "Pod"), ("batch/v1", "Job")})

    def list(
        self, api_version: str, kind: str, namespace: str | None, selector: dict[str, str]
    ) -> list[dict[str, Any]]:
        if (api_version, kind) not in self.KINDS:
            raise ValueError(f"{kind} ({api_version}) is not watched")
        return [
            o
            for o in self.objects
            if (o.get("apiVersion"), o.get("kind")) == (api_version, kind)
            and (namespace is None or o["metadata"].get("namespace") == namespace)
            and selector.items() <= (o["metadata"].get("labels") or {}).items()
        ]


@dataclass(frozen=True)
class ObservedRedis:
    want: int
    ready: int
    formed: bool
    """The bootstrap Job succeeded once: from then on the nodes themselves are asked."""
    addresses: list[str]
    password: str | None
    tls_ca: str | None = None
    """The CA certificate (PEM) its nodes' TLS certificates are signed by; ``None``: no TLS."""
    ranker_password: str | None = None
    """The password of the ACL user its rankers authenticate as (``None``: no such Secret)."""


@dataclass(frozen=True)
class Observed:
    deployments: dict[str, dict[str, Any]]
    """model version → its Deployment (old ones included)."""
    writing: set[str]
    """Cache namespaces some pod still writes into (its ``KVRANK_NAMESPACE``), draining
    pods included."""
    start_failures: dict[str, str]
    """version → why one of its pods failed to start (its termination message's last line)."""
    finished_jobs: set[str]
    """Purge Jobs that succeeded."""
    redis: ObservedRedis | None
    """``None`` for an external Redis."""
    pods: list[dict[str, Any]]
    """The instance's ranker pods (every version, draining ones included)."""
    router_ready: int = 0
    """Ready router pods (``routing.mode: bundled``)."""
    route: dict[str, Any] | None = None
    """The HTTPRoute as the Gateway API reports it (``routing.mode: gateway``)."""

    def want(self, spec: RankerSpec, version: str, role: str) -> int:
        """Desired replicas: from the spec, or from the Deployment when an autoscaler owns
        it."""
        if spec.model.external_replicas:
            dep = self.deployments.get(version) or {}
            return int((dep.get("spec") or {}).get("replicas") or 1)
        return spec.replicas_of(role)

    def ready(self, spec: RankerSpec, version: str, role: str) -> bool:
        """The version's Deployment has rolled out and has all its replicas Ready."""
        dep = self.deployments.get(version)
        if dep is None:
            return False
        want = self.want(spec, version, role)
        st = dep.get("status") or {}
        return (
            st.get("observedGeneration", 0) >= dep["metadata"].get("generation", 0)
            and (st.get("readyReplicas") or 0) >= want
            and (st.get("updatedReplicas") or 0) >= want
        )

    def ready_replicas(self, version: str) -> int:
        status = (self.deployments.get(version) or {}).get("status") or {}
        return int(status.get("readyReplicas") or 0)


def observe(
    kube: Kube, spec: RankerSpec, name: str, ns: str, owned: Owned | None = None
) -> Observed:
    """Everything the reconcilers decide on, read once: Deployments, pods and Jobs from
    ``owned`` when given, else listed from the API server."""
    lists: Lister = owned if owned is not None else kube
    deployments = {
        str(d["metadata"]["labels"].get("kvrank.io/version")): d
        for d in lists.list("apps/v1", "Deployment", ns, m.ranker_selector(name))
    }
    pods = lists.list("v1", "Pod", ns, m.selector(name))
    writing = {cache_ns for p in pods if (cache_ns := cache_namespace(p)) is not None}
    failures = {
        str(p["metadata"]["labels"].get("kvrank.io/version")): why
        for p in pods
        if (why := start_failure(p)) is not None
    }
    finished = {
        j["metadata"]["name"]
        for j in lists.list("batch/v1", "Job", ns, m.selector(name, "purge"))
        if (j.get("status") or {}).get("succeeded")
    }
    managed = spec.cache.redis.mode == "managed"
    redis = _observe_redis(kube, lists, spec, name, ns) if managed else None
    router_ready, route = 0, None
    if spec.routing.mode == "bundled":
        # listed, not read by name: the operator may list Deployments, not get them
        routers = lists.list("apps/v1", "Deployment", ns, router_selector(name))
        router_ready = sum(int((d.get("status") or {}).get("readyReplicas") or 0) for d in routers)
    elif spec.routing.mode == "gateway" and kube.serves(ROUTE_API, "HTTPRoute"):
        route = kube.get(ROUTE_API, "HTTPRoute", ns, name)
    return Observed(deployments, writing, failures, finished, redis, pods, router_ready, route)


def cache_namespace(pod: dict[str, Any]) -> str | None:
    """The cache namespace a ranker pod writes into, as its spec sets it."""
    for container in pod.get("spec", {}).get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == "KVRANK_NAMESPACE" and env.get("value"):
                return str(env["value"])
    return None


def start_failure(pod: dict[str, Any]) -> str | None:
    """Why a pod's ranker keeps failing to start (the last line of its termination
    message), or ``None``."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("ready"):
            continue
        for state in (status.get("state") or {}, status.get("lastState") or {}):
            ended = state.get("terminated") or {}
            if ended.get("exitCode"):
                lines = [ln for ln in (ended.get("message") or "").splitlines() if ln.strip()]
                reason = _log_message(lines[-1]) if lines else ended.get("reason") or "exited"
                return f"{reason[:300]} (exit code {ended['exitCode']})"
    return None


def _log_message(line: str) -> str:
    """A log line's message: the ``message`` of a JSON line (the ranker's format), else the
    line."""
    try:
        doc = json.loads(line)
    except ValueError:
        return line
    return str(doc.get("message", line)) if isinstance(doc, dict) else line


def _observe_redis(
    kube: Kube, lists: Lister, spec: RankerSpec, name: str, ns: str
) -> ObservedRedis:
    sts = kube.get("apps/v1", "StatefulSet", ns, m.redis_name(name)) or {}
    job = kube.get("batch/v1", "Job", ns, f"{m.redis_name(name)}-bootstrap") or {}
    formed = bool((job.get("status") or {}).get("succeeded"))
    addresses: list[str] = []
    password = ranker_password = None
    tls_ca = None
    if formed:
        pods = lists.list("v1", "Pod", ns, m.selector(name, "redis"))
        addresses = sorted(
            f"{p['status']['podIP']}:{m.REDIS_PORT}"
            for p in pods
            if (p.get("status") or {}).get("podIP") and not p["metadata"].get("deletionTimestamp")
        )
        password = _secret_value(kube, ns, f"{m.redis_name(name)}-auth", "password")
        ranker = m.ranker_auth_secret(name)
        ranker_password = _secret_value(kube, ns, ranker, "password")
        tls_secret = m.tls_secret_name(name, spec.cache.redis)
        tls_ca = _secret_value(kube, ns, tls_secret, CA_FILE) if tls_secret else None
    return ObservedRedis(
        want=(sts.get("spec") or {}).get("replicas", 0),
        ready=(sts.get("status") or {}).get("readyReplicas") or 0,
        formed=formed,
        addresses=addresses,
        password=password,
        tls_ca=tls_ca,
        ranker_password=ranker_password,
    )


def _secret_value(kube: Kube, ns: str, name: str, key: str) -> str | None:
    secret = kube.get("v1", "Secret", ns, name) or {}
    encoded = (secret.get("data") or {}).get(key)
    return base64.b64decode(encoded).decode() if encoded else None
