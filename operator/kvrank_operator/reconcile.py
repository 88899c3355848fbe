"""Level-based reconciliation of one ``RankerDeployment``: desired objects → API, status.

Each call recomputes everything from the spec and the observed state, so it is safe to run
again at any time (after an operator restart, on a timer, on every change). Ordering rules:
a version's Deployment is removed only once the current stable version is Ready; a retired
cache namespace is purged (by a Job) only after its grace period, an aborted canary's at
once. Returns the new ``status`` and the Events to post; it never patches the status itself.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvrank_operator import manifests as m
from kvrank_operator.clock import iso, parse_iso
from kvrank_operator.errors import SpecError
from kvrank_operator.kube import Kube, Owner
from kvrank_operator.redis_cluster import Health
from kvrank_operator.spec import RankerSpec, namespace_for, parse_spec

API = "kvrank.io/v1alpha1"


@dataclass
class Outcome:
    status: dict[str, Any]
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)


def set_condition(
    status: dict[str, Any],
    ctype: str,
    ok: bool,
    reason: str,
    message: str,
    generation: int,
    now: dt.datetime,
) -> None:
    conds = status.setdefault("conditions", [])
    value = "True" if ok else "False"
    for c in conds:
        if c["type"] == ctype:
            if c["status"] != value:
                c["lastTransitionTime"] = iso(now)
            c.update(status=value, reason=reason, message=message, observedGeneration=generation)
            return
    conds.append(
        {
            "type": ctype,
            "status": value,
            "reason": reason,
            "message": message,
            "observedGeneration": generation,
            "lastTransitionTime": iso(now),
        }
    )


RedisHealthCheck = Callable[[list[str], str | None, int, int], Health]
"""``(ip:port of each pod, password, expected nodes, replicas per shard) → Health`` (and
heal a step)."""


def reconcile(
    kube: Kube,
    body: dict[str, Any],
    now: dt.datetime,
    redis_health: RedisHealthCheck | None = None,
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
        set_condition(status, "Degraded", True, "InvalidSpec", str(exc), gen, now)
        set_condition(
            status, "Progressing", False, "InvalidSpec", "fix the spec to continue", gen, now
        )
        out.events.append(("Warning", "InvalidSpec", f"{exc}; nothing was changed or deleted"))
        return out
    set_condition(status, "Degraded", False, "SpecValid", "spec is valid", gen, now)
    _apply_objects(kube, spec, name, ns, owner, status, out)
    deps = {
        d["metadata"]["labels"].get("kvrank.io/version"): d
        for d in kube.list(
            "apps/v1",
            "Deployment",
            ns,
            {"app.kubernetes.io/instance": name, "app.kubernetes.io/component": "ranker"},
        )
    }
    live = dict(spec.versions())
    stable_ready = _ready(
        deps.get(spec.model.version), _want(spec, deps, spec.model.version, "stable")
    )
    for version, dep in deps.items():
        if version not in live and stable_ready:
            kube.delete("apps/v1", "Deployment", ns, dep["metadata"]["name"])
            kube.delete("v1", "Service", ns, m.deployment_name(name, str(version)))
            out.events.append(
                (
                    "Normal",
                    "VersionRemoved",
                    f"removed model version {version}: stable {spec.model.version} is Ready",
                )
            )
    _namespaces(kube, spec, name, ns, owner, status, out, now)
    _status(spec, name, deps, live, stable_ready, status, gen, now)
    cache = _cache_ready(kube, spec, name, ns, redis_health)
    set_condition(status, "CacheReady", cache.ok, cache.reason, cache.message, gen, now)
    for action in cache.actions:
        out.events.append(("Normal", "RedisHealing", action))
    return out


def _cache_ready(
    kube: Kube, spec: RankerSpec, name: str, ns: str, redis_health: RedisHealthCheck | None
) -> Health:
    if spec.cache.redis.mode == "external":
        return Health(True, "External", "external Redis (validated, passed through)")
    sts = kube.get("apps/v1", "StatefulSet", ns, m.redis_name(name)) or {}
    want = (sts.get("spec") or {}).get("replicas", 0)
    ready = (sts.get("status") or {}).get("readyReplicas") or 0
    job = kube.get("batch/v1", "Job", ns, f"{m.redis_name(name)}-bootstrap") or {}
    formed = bool((job.get("status") or {}).get("succeeded"))
    if not formed or redis_health is None:
        ok = bool(want) and ready >= want and formed
        return Health(
            ok,
            "Ready" if ok else "Waiting",
            f"managed Redis Cluster: {ready}/{want} nodes ready, "
            + ("cluster formed" if formed else "bootstrap pending"),
        )
    # formed once: from now on trust what the nodes say, not the Job
    pods = kube.list("v1", "Pod", ns, m.labels(name, "redis"))
    addrs = sorted(
        f"{p['status']['podIP']}:{m.REDIS_PORT}"
        for p in pods
        if (p.get("status") or {}).get("podIP") and not p["metadata"].get("deletionTimestamp")
    )
    secret = kube.get("v1", "Secret", ns, f"{m.redis_name(name)}-auth") or {}
    encoded = (secret.get("data") or {}).get("password")
    password = base64.b64decode(encoded).decode() if encoded else None
    r = spec.cache.redis
    health = redis_health(
        addrs, password, want or r.shards * (1 + r.replicas_per_shard), r.replicas_per_shard
    )
    health.message = f"managed Redis Cluster: {health.message}"
    return health


def _apply_objects(
    kube: Kube,
    spec: RankerSpec,
    name: str,
    ns: str,
    owner: Owner,
    status: dict[str, Any],
    out: Outcome,
) -> None:
    ttl = (status.get("ttl") or {}).get("seconds")
    kube.apply(m.config_map(spec, name, ns, ttl), owner)
    if spec.cache.redis.mode == "managed":
        secret_name = f"{m.redis_name(name)}-auth"
        existing = kube.get("v1", "Secret", ns, secret_name)
        objs = m.managed_redis(spec, name, ns, secrets.token_urlsafe(24))
        for obj in objs:
            if obj["kind"] == "Secret":
                if existing is None:
                    kube.apply(obj, owner)
                    out.events.append(
                        ("Normal", "RedisPasswordCreated", f"generated Secret {secret_name}")
                    )
            elif obj["kind"] == "Job":
                kube.create_if_absent(obj, owner)  # Job templates are immutable
            else:
                kube.apply(obj, owner)
    for version, role in spec.versions():
        uri = spec.model.uri if role == "stable" else spec.canary.uri  # type: ignore[union-attr]
        dep = m.deployment(spec, name, ns, version, uri, spec.replicas_of(role), role)
        if spec.model.external_replicas:
            dep["spec"].pop("replicas")  # the autoscaler's field: never claim it
        kube.apply(dep, owner)
    for svc in m.services(spec, name, ns):
        kube.apply(svc, owner)
    kube.apply(m.pod_disruption_budget(name, ns), owner)


def _want(spec: RankerSpec, deps: dict[Any, dict[str, Any]], version: str, role: str) -> int:
    """Desired replicas: from the spec, or from the Deployment when an autoscaler owns it."""
    if spec.model.external_replicas:
        return int(((deps.get(version) or {}).get("spec") or {}).get("replicas") or 1)
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


def _namespaces(
    kube: Kube,
    spec: RankerSpec,
    name: str,
    ns: str,
    owner: Owner,
    status: dict[str, Any],
    out: Outcome,
    now: dt.datetime,
) -> None:
    entries: list[dict[str, Any]] = status.setdefault("cacheNamespaces", [])
    by_version = {e["version"]: e for e in entries}
    live = dict(spec.versions())
    for version, role in live.items():
        e = by_version.get(version)
        if e is None or e["state"] != "active":
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
        elif e["role"] != role:
            e["role"] = role
    for e in entries:
        if e["version"] in live or e["state"] in ("purged",):
            continue
        if e["state"] == "active":
            aborted = e["role"] == "canary"
            grace = _grace(spec, e)
            e.update(
                state="retired", since=iso(now), purgeAfter=iso(now + dt.timedelta(seconds=grace))
            )
            out.events.append(
                (
                    "Normal",
                    "CacheNamespaceRetired",
                    f"namespace {e['namespace']} retired ("
                    + ("canary aborted" if aborted else f"purge in {grace}s")
                    + ")",
                )
            )
        if e["state"] == "retired" and _still_serving(kube, name, ns, e["version"]):
            # a pod of the retired version (even one draining) would write new entries into
            # the namespace after the purge: the grace period counts from its last pod
            e["purgeAfter"] = iso(now + dt.timedelta(seconds=_grace(spec, e)))
        elif e["state"] == "retired" and parse_iso(e["purgeAfter"]) <= now:
            job = m.purge_job(spec, name, ns, e["namespace"])
            kube.create_if_absent(job, owner)
            e.update(state="purging", job=job["metadata"]["name"])
            out.events.append(
                (
                    "Normal",
                    "CacheNamespacePurging",
                    f"purging namespace {e['namespace']} (Job {e['job']})",
                )
            )
        if e["state"] == "purging":
            found = kube.get("batch/v1", "Job", ns, e["job"])
            if found and (found.get("status") or {}).get("succeeded"):
                e.update(state="purged", since=iso(now))
                out.events.append(
                    ("Normal", "CacheNamespacePurged", f"namespace {e['namespace']} purged")
                )


def _grace(spec: RankerSpec, entry: dict[str, Any]) -> int:
    """An aborted canary's entries are worthless at once; a retired stable's are kept for a
    grace period (a rollback within it finds them warm)."""
    return 0 if entry["role"] == "canary" else spec.cache.retired_namespace_grace_seconds


def _still_serving(kube: Kube, name: str, ns: str, version: str) -> bool:
    return bool(kube.list("v1", "Pod", ns, m.version_labels(name, version)))


def _status(
    spec: RankerSpec,
    name: str,
    deps: dict[Any, dict[str, Any]],
    live: dict[str, str],
    stable_ready: bool,
    status: dict[str, Any],
    gen: int,
    now: dt.datetime,
) -> None:
    versions: list[dict[str, Any]] = []
    all_ready = True
    for version, role in live.items():
        want = _want(spec, deps, version, role)
        st = (deps.get(version) or {}).get("status") or {}
        ready = st.get("readyReplicas") or 0
        ok = _ready(deps.get(version), want)
        all_ready &= ok
        versions.append(
            {"version": version, "role": role, "replicas": want, "readyReplicas": ready}
        )
    leftovers = [v for v in deps if v not in live]
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
    if spec.canary is not None:
        canary_ok = any(
            v["role"] == "canary" and v["readyReplicas"] >= v["replicas"] for v in versions
        )
        set_condition(
            status,
            "CanaryReady",
            canary_ok,
            "Ready" if canary_ok else "Waiting",
            f"canary {spec.canary.version} at weight {spec.canary.weight}",
            gen,
            now,
        )
    else:
        status["conditions"] = [c for c in status["conditions"] if c["type"] != "CanaryReady"]
