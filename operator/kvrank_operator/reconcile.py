"""Level-based reconciliation of one ``RankerDeployment``, one pass down the layers:

1. **desired** — every object that should exist, built purely from the spec
   (:func:`kvrank_operator.manifests.desired_objects`);
2. **apply** — server-side apply of that set (create-only for Jobs and the generated Secret),
   and the PodMonitor when the operator runs with one and the cluster serves the kind;
3. **observe** — one read of what the cluster reports: Deployments, pods per version, purge
   Jobs, the managed Redis;
4. **act** on what was observed — remove a version's Deployment only once the stable
   version is Ready; retire a cache namespace and purge it (a Job) after its grace period,
   an aborted canary's at once;
5. **status** — conditions and counts from the same observation.

Each call recomputes everything, so it is safe to run again at any time (after an operator
restart, on a timer, on every change). Returns the new ``status`` and the Events to post;
it never patches the status itself.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from kvrank_operator import manifests as m
from kvrank_operator import rollout
from kvrank_operator.analysis import Window, Windows
from kvrank_operator.certs import CA_FILE, redis_tls
from kvrank_operator.clock import iso, parse_iso
from kvrank_operator.conditions import set_condition
from kvrank_operator.errors import SpecError
from kvrank_operator.kube import Kube, Owner
from kvrank_operator.redis_cluster import Health
from kvrank_operator.spec import RankerSpec, namespace_for, parse_spec

API = "kvrank.io/v1alpha1"


@dataclass
class Outcome:
    status: dict[str, Any]
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)


RedisHealthCheck = Callable[[list[str], str | None, int, int, str | None], Health]
"""``(ip:port of each pod, password, expected nodes, replicas per shard, TLS CA or None) →
Health`` (and heal a step)."""


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


@dataclass(frozen=True)
class Observed:
    deployments: dict[str, dict[str, Any]]
    """model version → its Deployment (old ones included)."""
    serving: set[str]
    """Versions that still have pods, draining ones included."""
    start_failures: dict[str, str]
    """version → why one of its pods failed to start (its termination message's last line)."""
    finished_jobs: set[str]
    """Purge Jobs that succeeded."""
    redis: ObservedRedis | None
    """``None`` for an external Redis."""


def reconcile(
    kube: Kube,
    body: dict[str, Any],
    now: dt.datetime,
    redis_health: RedisHealthCheck | None = None,
    monitoring: m.PodMonitoring | None = None,
) -> Outcome:
    meta = body["metadata"]
    name, ns, gen = meta["name"], meta["namespace"], int(meta.get("generation", 1))
    owner = Owner(API, "RankerDeployment", name, meta["uid"])
    status = copy.deepcopy(body.get("status") or {})
    status.pop("kopf", None)
    out = Outcome(status)
    try:
        spec = parse_spec(body.get("spec") or {})
    except SpecError as exc:
        return _invalid(out, exc, gen, now)
    set_condition(status, "Degraded", False, "SpecValid", "spec is valid", gen, now)
    live = rollout.effective(spec, status.get("canary"))
    _apply(kube, _desired(live, name, ns, status, now), owner, out)
    _pod_monitor(kube, monitoring, owner, ns, status, gen, now)
    seen = observe(kube, live, name, ns)
    if any(version not in seen.deployments for version, _ in live.versions()):
        kube.forget_applied()  # deleted by someone: apply everything again next time
    after = _rollout(kube, spec, live, seen, name, ns, meta, out, now)
    if after != live:  # a phase or step changed: its weight and Service apply now
        live = after
        _apply(kube, _desired(live, name, ns, status, now), owner, out)
        seen = observe(kube, live, name, ns)
    spec = live
    stable_ready = _ready(
        seen.deployments.get(spec.model.version), _want(spec, seen, spec.model.version, "stable")
    )
    if stable_ready:
        _remove_old_versions(kube, spec, name, ns, seen, out)
    _cache_namespaces(kube, spec, name, ns, owner, seen, out, now)
    _status(spec, name, seen, status, gen, now)
    cache = _cache_health(spec, seen.redis, redis_health)
    set_condition(status, "CacheReady", cache.ok, cache.reason, cache.message, gen, now)
    out.events += [("Normal", "RedisHealing", action) for action in cache.actions]
    return out


def _desired(
    spec: RankerSpec, name: str, ns: str, status: dict[str, Any], now: dt.datetime
) -> list[m.Desired]:
    ttl = (status.get("ttl") or {}).get("seconds")
    password = secrets.token_urlsafe(24)
    return m.desired_objects(spec, name, ns, ttl, password, _new_tls(spec, name, ns, now))


WINDOWS = Windows()


def _rollout(
    kube: Kube,
    spec: RankerSpec,
    live: RankerSpec,
    seen: Observed,
    name: str,
    ns: str,
    meta: dict[str, Any],
    out: Outcome,
    now: dt.datetime,
) -> RankerSpec:
    """Advance the canary's rollout (``status.canary``, the ``CanaryAnalysis`` condition);
    promote by rewriting the spec. Returns the spec as the rollout now applies it."""
    status, gen = out.status, int(meta.get("generation", 1))
    ready = False
    if spec.canary is not None:
        version = spec.canary.version
        ready = _ready(seen.deployments.get(version), _want(live, seen, version, "canary"))
        read = WINDOWS.reader(kube, spec, name, ns, meta["uid"], now)
    else:
        WINDOWS.close(meta["uid"])
        read = _no_window
    decision = rollout.advance(spec, status.get("canary"), ready, read, now)
    out.events += decision.events
    if decision.canary is None:
        status.pop("canary", None)
    else:
        status["canary"] = decision.canary
    if decision.condition is None:
        status["conditions"] = [
            c for c in status.get("conditions", []) if c["type"] != "CanaryAnalysis"
        ]
    else:
        set_condition(status, "CanaryAnalysis", *decision.condition, gen, now)
    if decision.promote and spec.canary is not None:
        kube.merge_patch(API, "RankerDeployment", ns, name, rollout.promotion(spec.canary))
    return rollout.effective(spec, decision.canary)


def _no_window(key: str, since: dt.datetime) -> Window:
    return Window(problem="no canary")


def purges_due_in(status: dict[str, Any], now: dt.datetime) -> list[float]:
    """Seconds until each retired cache namespace is due for its purge (a deadline no API
    event announces)."""
    return [
        (parse_iso(e["purgeAfter"]) - now).total_seconds()
        for e in status.get("cacheNamespaces", [])
        if e["state"] == "retired"
    ]


def _new_tls(spec: RankerSpec, name: str, ns: str, now: dt.datetime) -> dict[str, str] | None:
    """Fresh certificates for a managed Redis's TLS Secret, used only if it does not exist
    yet (like the password; generating them takes half a millisecond)."""
    r = spec.cache.redis
    if r.mode != "managed" or not r.tls or r.tls_secret:
        return None
    return redis_tls(m.redis_name(name), m.tls_dns_names(name, ns), now)


def _invalid(out: Outcome, exc: SpecError, gen: int, now: dt.datetime) -> Outcome:
    set_condition(out.status, "Degraded", True, "InvalidSpec", str(exc), gen, now)
    set_condition(
        out.status, "Progressing", False, "InvalidSpec", "fix the spec to continue", gen, now
    )
    out.events.append(("Warning", "InvalidSpec", f"{exc}; nothing was changed or deleted"))
    return out


# ------------------------------------------------------------------------------- apply


def _apply(kube: Kube, desired: list[m.Desired], owner: Owner, out: Outcome) -> None:
    for d in desired:
        if not d.create_only:
            kube.apply(d.obj, owner)
        elif kube.create_if_absent(d.obj, owner) and d.kind == "Secret":
            out.events.append(
                ("Normal", "RedisPasswordCreated", f"generated Secret {d.obj['metadata']['name']}")
            )


def _pod_monitor(
    kube: Kube,
    settings: m.PodMonitoring | None,
    owner: Owner,
    ns: str,
    status: dict[str, Any],
    gen: int,
    now: dt.datetime,
) -> None:
    """The instance's PodMonitor, and the ``Monitoring`` condition saying whether it exists
    or why not (no such CRD in the cluster, the API refused it). Without ``settings`` the
    operator manages no PodMonitor and the condition is removed."""
    if settings is None:
        status["conditions"] = [
            c for c in status.get("conditions", []) if c["type"] != "Monitoring"
        ]
        return
    if not kube.serves(m.POD_MONITOR_API, "PodMonitor"):
        why = (
            f"this cluster serves no {m.POD_MONITOR_API} PodMonitor: install the"
            " prometheus-operator CRDs (kube-prometheus-stack), or scrape the ranker pods by"
            " their prometheus.io/* annotations"
        )
        set_condition(status, "Monitoring", False, "PodMonitorCRDMissing", why, gen, now)
        return
    obj = m.pod_monitor(owner.name, ns, settings)
    try:
        kube.apply(obj, owner)
    except ApiException as exc:  # the rest of the reconcile does not depend on it
        why = f"PodMonitor {obj['metadata']['name']}: API {exc.status} {exc.reason}"
        set_condition(status, "Monitoring", False, "PodMonitorRefused", why, gen, now)
        return
    why = f"PodMonitor {obj['metadata']['name']} selects every ranker pod of this instance"
    set_condition(status, "Monitoring", True, "PodMonitorApplied", why, gen, now)


# ----------------------------------------------------------------------------- observe


def observe(kube: Kube, spec: RankerSpec, name: str, ns: str) -> Observed:
    """Everything the later steps decide on, read once."""
    deployments = {
        str(d["metadata"]["labels"].get("kvrank.io/version")): d
        for d in kube.list("apps/v1", "Deployment", ns, m.ranker_selector(name))
    }
    pods = kube.list("v1", "Pod", ns, m.labels(name))
    serving = {str(p["metadata"]["labels"].get("kvrank.io/version")) for p in pods}
    failures = {
        str(p["metadata"]["labels"].get("kvrank.io/version")): why
        for p in pods
        if (why := _start_failure(p)) is not None
    }
    finished = {
        j["metadata"]["name"]
        for j in kube.list("batch/v1", "Job", ns, m.labels(name, "purge"))
        if (j.get("status") or {}).get("succeeded")
    }
    redis = _observe_redis(kube, spec, name, ns) if spec.cache.redis.mode == "managed" else None
    return Observed(deployments, serving, failures, finished, redis)


def _start_failure(pod: dict[str, Any]) -> str | None:
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


def _observe_redis(kube: Kube, spec: RankerSpec, name: str, ns: str) -> ObservedRedis:
    sts = kube.get("apps/v1", "StatefulSet", ns, m.redis_name(name)) or {}
    job = kube.get("batch/v1", "Job", ns, f"{m.redis_name(name)}-bootstrap") or {}
    formed = bool((job.get("status") or {}).get("succeeded"))
    addresses: list[str] = []
    password = None
    tls_ca = None
    if formed:
        pods = kube.list("v1", "Pod", ns, m.labels(name, "redis"))
        addresses = sorted(
            f"{p['status']['podIP']}:{m.REDIS_PORT}"
            for p in pods
            if (p.get("status") or {}).get("podIP") and not p["metadata"].get("deletionTimestamp")
        )
        secret = kube.get("v1", "Secret", ns, f"{m.redis_name(name)}-auth") or {}
        encoded = (secret.get("data") or {}).get("password")
        password = base64.b64decode(encoded).decode() if encoded else None
        tls_ca = _tls_ca(kube, spec, name, ns)
    return ObservedRedis(
        want=(sts.get("spec") or {}).get("replicas", 0),
        ready=(sts.get("status") or {}).get("readyReplicas") or 0,
        formed=formed,
        addresses=addresses,
        password=password,
        tls_ca=tls_ca,
    )


def _tls_ca(kube: Kube, spec: RankerSpec, name: str, ns: str) -> str | None:
    secret_name = m.tls_secret_name(name, spec.cache.redis)
    if secret_name is None:
        return None
    secret = kube.get("v1", "Secret", ns, secret_name) or {}
    encoded = (secret.get("data") or {}).get(CA_FILE)
    return base64.b64decode(encoded).decode() if encoded else None


# --------------------------------------------------------------------------------- act


def _remove_old_versions(
    kube: Kube, spec: RankerSpec, name: str, ns: str, seen: Observed, out: Outcome
) -> None:
    """Only called once the stable version is Ready: nothing is removed under traffic."""
    live = dict(spec.versions())
    for version, dep in seen.deployments.items():
        if version in live:
            continue
        kube.delete("apps/v1", "Deployment", ns, dep["metadata"]["name"])
        kube.delete("v1", "Service", ns, m.deployment_name(name, version))
        out.events.append(
            (
                "Normal",
                "VersionRemoved",
                f"removed model version {version}: stable {spec.model.version} is Ready",
            )
        )


def _cache_namespaces(
    kube: Kube,
    spec: RankerSpec,
    name: str,
    ns: str,
    owner: Owner,
    seen: Observed,
    out: Outcome,
    now: dt.datetime,
) -> None:
    """One namespace per live version (active); one of a version gone is retired, then
    purged by a Job once nothing serves it and its grace period is over."""
    entries: list[dict[str, Any]] = out.status.setdefault("cacheNamespaces", [])
    live = dict(spec.versions())
    _activate(entries, live, out, now)
    for e in entries:
        if e["version"] in live or e["state"] == "purged":
            continue
        if e["state"] == "active":
            _retire(spec, e, out, now)
        if e["state"] == "retired" and e["version"] in seen.serving:
            # a pod of the retired version (even one draining) would write new entries into
            # the namespace after the purge: the grace period counts from its last pod
            e["purgeAfter"] = iso(now + dt.timedelta(seconds=_grace(spec, e)))
        elif e["state"] == "retired" and parse_iso(e["purgeAfter"]) <= now:
            job = m.purge_job(spec, name, ns, e["namespace"], e["since"])
            kube.create_if_absent(job, owner)
            e.update(state="purging", job=job["metadata"]["name"])
            out.events.append(
                (
                    "Normal",
                    "CacheNamespacePurging",
                    f"purging namespace {e['namespace']} (Job {e['job']})",
                )
            )
        elif e["state"] == "purging" and e["job"] in seen.finished_jobs:
            e.update(state="purged", since=iso(now))
            out.events.append(
                ("Normal", "CacheNamespacePurged", f"namespace {e['namespace']} purged")
            )


def _activate(
    entries: list[dict[str, Any]], live: dict[str, str], out: Outcome, now: dt.datetime
) -> None:
    by_version = {e["version"]: e for e in entries}
    for version, role in live.items():
        e = by_version.get(version)
        if e is not None and e["state"] == "active":
            e["role"] = role
            continue
        if e is not None:
            entries.remove(e)
        entries.append(
            {
                "version": version,
                "namespace": namespace_for(version),
                "role": role,
                "state": "active",
                "since": iso(now),
            }
        )
        out.events.append(
            (
                "Normal",
                "CacheNamespaceActive",
                f"{role} version {version} uses namespace {namespace_for(version)}",
            )
        )


def _retire(spec: RankerSpec, e: dict[str, Any], out: Outcome, now: dt.datetime) -> None:
    grace = _grace(spec, e)
    e.update(state="retired", since=iso(now), purgeAfter=iso(now + dt.timedelta(seconds=grace)))
    aborted = e["role"] == "canary"
    why = "canary aborted" if aborted else f"purge in {grace}s"
    reason = "CanaryAborted" if aborted else "CacheNamespaceRetired"
    out.events.append(("Normal", reason, f"namespace {e['namespace']} retired ({why})"))


def _grace(spec: RankerSpec, entry: dict[str, Any]) -> int:
    """An aborted canary's entries are worthless at once; a retired stable's are kept for a
    grace period (a rollback within it finds them warm)."""
    return 0 if entry["role"] == "canary" else spec.cache.retired_namespace_grace_seconds


def _want(spec: RankerSpec, seen: Observed, version: str, role: str) -> int:
    """Desired replicas: from the spec, or from the Deployment when an autoscaler owns it."""
    if spec.model.external_replicas:
        dep = seen.deployments.get(version) or {}
        return int((dep.get("spec") or {}).get("replicas") or 1)
    return spec.replicas_of(role)


def _ready(dep: dict[str, Any] | None, want: int) -> bool:
    if dep is None:
        return False
    st = dep.get("status") or {}
    return (
        st.get("observedGeneration", 0) >= dep["metadata"].get("generation", 0)
        and (st.get("readyReplicas") or 0) >= want
        and (st.get("updatedReplicas") or 0) >= want
    )


# ------------------------------------------------------------------------------ status


def _status(
    spec: RankerSpec,
    name: str,
    seen: Observed,
    status: dict[str, Any],
    gen: int,
    now: dt.datetime,
) -> None:
    live = dict(spec.versions())
    versions: list[dict[str, Any]] = []
    all_ready = True
    for version, role in live.items():
        want = _want(spec, seen, version, role)
        dep = seen.deployments.get(version)
        all_ready &= _ready(dep, want)
        ready = ((dep or {}).get("status") or {}).get("readyReplicas") or 0
        versions.append(
            {"version": version, "role": role, "replicas": want, "readyReplicas": ready}
        )
    leftovers = [v for v in seen.deployments if v not in live]
    status["versions"] = versions
    status["replicas"] = spec.model.replicas
    status["selector"] = f"app.kubernetes.io/instance={name},app.kubernetes.io/component=ranker"
    total = sum(v["replicas"] for v in versions)
    status["readyText"] = f"{sum(v['readyReplicas'] for v in versions)}/{total}"
    status["observedGeneration"] = gen
    ready = all_ready and not leftovers
    waiting = [v["version"] for v in versions if v["readyReplicas"] < v["replicas"]]
    if ready:
        msg = "all versions Ready"
    elif not all_ready:
        msg = f"waiting for {', '.join(waiting) or 'rollout'}"
    else:
        msg = f"removing old versions {leftovers}"
    set_condition(status, "Ready", ready, "AllReady" if ready else "Waiting", msg, gen, now)
    set_condition(
        status, "Progressing", not ready, "Rolling" if not ready else "Stable", msg, gen, now
    )
    _canary_condition(spec, versions, status, gen, now)
    failing = {v: why for v, why in seen.start_failures.items() if v in live}
    message = "; ".join(f"{v}: {why}" for v, why in sorted(failing.items()))
    set_condition(
        status,
        "RankersStarted",
        not failing,
        "StartFailed" if failing else "Started",
        message or "no ranker pod failed to start",
        gen,
        now,
    )


def _canary_condition(
    spec: RankerSpec,
    versions: list[dict[str, Any]],
    status: dict[str, Any],
    gen: int,
    now: dt.datetime,
) -> None:
    if spec.canary is None:
        status["conditions"] = [c for c in status["conditions"] if c["type"] != "CanaryReady"]
        return
    ok = any(v["role"] == "canary" and v["readyReplicas"] >= v["replicas"] for v in versions)
    message = f"canary {spec.canary.version} at weight {spec.canary.weight}"
    set_condition(status, "CanaryReady", ok, "Ready" if ok else "Waiting", message, gen, now)


def _cache_health(
    spec: RankerSpec, redis: ObservedRedis | None, redis_health: RedisHealthCheck | None
) -> Health:
    if redis is None:
        return Health(True, "External", "external Redis (validated, passed through)")
    if not redis.formed or redis_health is None:
        ok = bool(redis.want) and redis.ready >= redis.want and redis.formed
        return Health(
            ok,
            "Ready" if ok else "Waiting",
            f"managed Redis Cluster: {redis.ready}/{redis.want} nodes ready, "
            + ("cluster formed" if redis.formed else "bootstrap pending"),
        )
    # formed once: from now on trust what the nodes say, not the Job
    r = spec.cache.redis
    nodes = redis.want or r.shards * (1 + r.replicas_per_shard)
    health = redis_health(
        redis.addresses, redis.password, nodes, r.replicas_per_shard, redis.tls_ca
    )
    health.message = f"managed Redis Cluster: {health.message}"
    return health
