"""Level-based reconciliation of one ``RankerDeployment``: one pass through the reconcilers.

The spec is parsed once; then, in order:

1. **TTL** — measure request intervals when due; the TTL in force is an input of the
   ranker ConfigMap (:mod:`~kvrank_operator.reconcilers.ttl`);
2. **apply** — the managed Redis's objects and the serving objects for the spec as the
   rollout applies it, then the PodMonitor;
3. **observe** — one read of what the cluster reports (:mod:`~kvrank_operator.reconcilers.observe`);
4. **rollout** — advance the canary; when that changes what serves, apply and observe again;
5. **act and report** — remove old versions once the stable is Ready, move cache
   namespaces on, report the Redis's health.

Each reconciler returns its part of the status; this module composes them into the new
:class:`~kvrank_operator.state.Status`, the Events to post and the next deadline. Each call
recomputes everything, so it is safe to run again at any time (after an operator restart,
on a timer, on every change); it never patches the status itself.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvrank_operator import manifests as m
from kvrank_operator import rollout
from kvrank_operator.analysis import Windows
from kvrank_operator.errors import SpecError
from kvrank_operator.kube import Kube
from kvrank_operator.reconcilers import (
    cache_namespaces,
    canary,
    managed_redis,
    monitoring,
    routing,
    ttl,
    versions,
)
from kvrank_operator.reconcilers.base import Event, Pass, Report
from kvrank_operator.reconcilers.observe import Observed, observe
from kvrank_operator.spec import Defaults, RankerSpec, parse_spec
from kvrank_operator.state import (
    Condition,
    ConditionUpdate,
    Instance,
    Status,
    with_conditions,
)

SPEC_VALID = ConditionUpdate("Degraded", False, "SpecValid", "spec is valid")


@dataclass
class Memory:
    """What one RankerDeployment's passes remember in this process (kopf's per-resource
    memo); lost on a restart by design: the status carries everything that must last."""

    measured_at: dt.datetime | None = None
    """When the TTL tuner last measured this instance."""
    windows: Windows = field(default_factory=Windows)
    """The rollout's open metrics window (the pods' counters when it opened)."""


@dataclass(frozen=True)
class Outcome:
    status: Status
    events: tuple[Event, ...] = ()
    due_in: float = float("inf")
    """Seconds until a deadline no API event announces (a purge, a measurement)."""


@dataclass(frozen=True)
class Options:
    """How the operator process runs the reconcilers (from its command line)."""

    redis_health: managed_redis.HealthCheck | None = None
    """Asks a formed managed Redis's nodes (and heals a step); ``None``: the StatefulSet
    alone says."""
    monitoring: m.PodMonitoring | None = None
    """A PodMonitor per RankerDeployment; ``None``: none."""
    defaults: Defaults = field(default_factory=Defaults)
    """What a spec leaves to the operator: images, ids."""


def reconcile(
    kube: Kube,
    body: Mapping[str, Any],
    now: dt.datetime,
    memory: Memory | None = None,
    options: Options = Options(),
) -> Outcome:
    instance = Instance.from_body(body)
    prior = Status.from_storage(body.get("status"))
    try:
        spec = parse_spec(body.get("spec") or {}, options.defaults)
    except SpecError as exc:
        return _invalid(instance, prior, exc, now)
    return _pass(Pass(kube, instance, spec, prior, now), memory or Memory(), options)


def _pass(p: Pass, memory: Memory, options: Options) -> Outcome:
    live = rollout.effective(p.spec, p.prior.rollout)
    tuned, report = ttl.reconcile(p, live, memory.measured_at)
    if tuned.measured:
        memory.measured_at = p.now
    ttl_s = tuned.ttl.seconds if tuned.ttl is not None else None
    report += managed_redis.apply(p)
    report += versions.apply(p, live, ttl_s)
    report += monitoring.reconcile(p, options.monitoring)
    seen = _observe(p, live)
    record, after, rolled = canary.reconcile(p, live, seen, memory.windows)
    report += rolled
    if after != live:  # a phase or step changed: its weight and Service apply now
        report += versions.apply(p, after, ttl_s)
        seen = _observe(p, after)
    report += routing.reconcile(p, after, seen)  # the router follows the canary's share
    serving, served = versions.reconcile(p, after, seen)
    namespaces, moved = cache_namespaces.reconcile(p, after, seen)
    report += served + moved + managed_redis.reconcile(p, seen.redis, options.redis_health)
    report = routing.fold_into_ready(report)
    status = dataclasses.replace(
        p.prior,
        conditions=_conditions(p, Report(conditions=(SPEC_VALID,)) + report),
        cache_namespaces=namespaces,
        rollout=record,
        ttl=tuned.ttl,
        hit_ratio=tuned.hit_ratio,
        observed_at=tuned.observed_at,
        serving=serving,
        observed_generation=p.instance.generation,
    )
    return Outcome(status, report.events, report.due_in)


def _observe(p: Pass, live: RankerSpec) -> Observed:
    seen = observe(p.kube, live, p.instance.name, p.instance.namespace)
    if any(version not in seen.deployments for version, _ in live.versions()):
        p.kube.forget_applied()  # deleted by someone: apply everything again next time
    return seen


def _conditions(p: Pass, report: Report) -> tuple[Condition, ...]:
    return with_conditions(
        p.prior.conditions, report.conditions, report.removed, p.instance.generation, p.now
    )


def _invalid(instance: Instance, prior: Status, exc: SpecError, now: dt.datetime) -> Outcome:
    updates = (
        ConditionUpdate("Degraded", True, "InvalidSpec", str(exc)),
        ConditionUpdate("Progressing", False, "InvalidSpec", "fix the spec to continue"),
    )
    conditions = with_conditions(prior.conditions, updates, (), instance.generation, now)
    event = ("Warning", "InvalidSpec", f"{exc}; nothing was changed or deleted")
    return Outcome(dataclasses.replace(prior, conditions=conditions), (event,))
