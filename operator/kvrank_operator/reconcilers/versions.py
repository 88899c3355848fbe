"""The model versions' serving objects: ConfigMap, Deployments, Services, disruption budget.

``desired``: the set for the spec as the rollout applies it (the TTL in force is one of its
inputs: the ConfigMap has this one writer). ``report`` removes a version that is no longer
live — only once the stable version is Ready, so nothing is removed under traffic — and
reports ``Progressing``, ``CanaryReady`` and ``RankersStarted`` with the counts ``kubectl
get`` and the scale subresource read; while a version is not Ready, the instance is not.
"""

from __future__ import annotations

from kvrank_operator import manifests as m
from kvrank_operator.manifests.desired import Desired
from kvrank_operator.reconcilers.base import Applied, Context, Event, Pass, Report
from kvrank_operator.reconcilers.observe import Observed
from kvrank_operator.spec import RankerSpec
from kvrank_operator.state import ConditionUpdate, Serving, VersionStatus


def desired(c: Context) -> list[Desired]:
    i = c.instance
    return m.desired_rankers(c.live, i.name, i.namespace, c.ttl_s, c.fresh.entry_key)


def report(p: Pass, c: Context, seen: Observed, applied: Applied) -> Report:
    live = c.live
    events: tuple[Event, ...] = tuple(
        (
            "Normal",
            "CacheKeyCreated",
            f"generated Secret {d.obj['metadata']['name']} (the cache-entry secret)",
        )
        for d in applied.created
    )
    if seen.ready(live, live.model.version, "stable"):
        events += _remove_old_versions(p, live, seen)
    serving = _serving(p, live, seen)
    conditions, unready = _conditions(live, seen, serving)
    return Report(conditions, _removed(live), events, unready=unready, serving=serving)


def _remove_old_versions(p: Pass, live: RankerSpec, seen: Observed) -> tuple[Event, ...]:
    versions = dict(live.versions())
    ns, name = p.instance.namespace, p.instance.name
    events: list[Event] = []
    for version, dep in seen.deployments.items():
        if version in versions:
            continue
        p.kube.delete("apps/v1", "Deployment", ns, dep["metadata"]["name"])
        p.kube.delete("v1", "Service", ns, m.deployment_name(name, version))
        if live.routing.mode == "bundled":  # its headless Service, for the router
            p.kube.delete("v1", "Service", ns, m.pods_service(name, version))
        why = f"removed model version {version}: stable {live.model.version} is Ready"
        events.append(("Normal", "VersionRemoved", why))
    return tuple(events)


def _serving(p: Pass, live: RankerSpec, seen: Observed) -> Serving:
    versions = tuple(
        VersionStatus(version, role, seen.want(live, version, role), seen.ready_replicas(version))
        for version, role in live.versions()
    )
    total = sum(v.replicas for v in versions)
    ready = sum(v.ready_replicas for v in versions)
    return Serving(
        versions=versions,
        replicas=ready,
        selector=",".join(f"{k}={v}" for k, v in m.ranker_selector(p.instance.name).items()),
        ready_text=f"{ready}/{total}",
        url=f"http://{p.instance.name}.{p.instance.namespace}.svc:{live.port}",
    )


def _conditions(
    live: RankerSpec, seen: Observed, serving: Serving
) -> tuple[tuple[ConditionUpdate, ...], tuple[tuple[str, str], ...]]:
    live_versions = {version for version, _ in live.versions()}
    all_ready = all(seen.ready(live, v.version, v.role) for v in serving.versions)
    leftovers = [v for v in seen.deployments if v not in live_versions]
    ready = all_ready and not leftovers
    waiting = [v.version for v in serving.versions if v.ready_replicas < v.replicas]
    if ready:
        msg = "all versions Ready"
    elif not all_ready:
        msg = f"waiting for {', '.join(waiting) or 'rollout'}"
    else:
        msg = f"removing old versions {leftovers}"
    unready: tuple[tuple[str, str], ...] = () if ready else (("Waiting", msg),)
    out = [ConditionUpdate("Progressing", not ready, "Rolling" if not ready else "Stable", msg)]
    if live.canary is not None:
        ok = any(v.role == "canary" and v.ready_replicas >= v.replicas for v in serving.versions)
        message = f"canary {live.canary.version} at weight {live.canary.weight}"
        out.append(ConditionUpdate("CanaryReady", ok, "Ready" if ok else "Waiting", message))
    failing = {v: why for v, why in seen.start_failures.items() if v in live_versions}
    message = "; ".join(f"{v}: {why}" for v, why in sorted(failing.items()))
    out.append(
        ConditionUpdate(
            "RankersStarted",
            not failing,
            "StartFailed" if failing else "Started",
            message or "no ranker pod failed to start",
        )
    )
    return tuple(out), unready


def _removed(live: RankerSpec) -> tuple[str, ...]:
    return ("CanaryReady",) if live.canary is None else ()
