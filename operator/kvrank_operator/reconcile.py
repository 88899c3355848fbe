"""Level-based reconciliation of one ``RankerDeployment``: one pass, in two phases.

The spec is parsed once; then

1. **decide** — the TTL tuner measures request intervals when due, and the canary's rollout
   advances, promotes or aborts (:mod:`~kvrank_operator.reconcilers.ttl`,
   :mod:`~kvrank_operator.reconcilers.canary`); they read the cluster once between them,
   and only when one needs it;
2. **act** — every concern (:data:`~kvrank_operator.reconcilers.concerns.CONCERNS`) applies
   what it wants for the spec as the rollout now applies it; the cluster is observed once
   (:mod:`~kvrank_operator.reconcilers.observe`); each concern reports from that.

This module composes the reports into the new :class:`~kvrank_operator.state.Status`
(``Ready`` from what every concern says keeps the instance from answering), the Events to
post and the next deadline. Each call recomputes everything, so it is safe to run again at
any time (after an operator restart, on a timer, on every change); it never patches the
status itself.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvrank_operator import manifests as m
from kvrank_operator import rollout
from kvrank_operator.analysis import Windows
from kvrank_operator.errors import SpecError
from kvrank_operator.kube import Kube
from kvrank_operator.reconcilers import canary, ttl
from kvrank_operator.reconcilers.base import (
    Context,
    Event,
    Fresh,
    HealthCheck,
    Pass,
    Report,
    apply,
)
from kvrank_operator.reconcilers.concerns import CONCERNS
from kvrank_operator.reconcilers.observe import Observed, Owned, observe
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

    redis_health: HealthCheck | None = None
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
    owned: Owned | None = None,
) -> Outcome:
    """One pass. ``owned``: the instance's Deployments, pods and Jobs as the operator's
    watches hold them (read instead of listing them, except right after a write)."""
    instance = Instance.from_body(body)
    prior = Status.from_storage(body.get("status"))
    try:
        spec = parse_spec(body.get("spec") or {}, options.defaults)
    except SpecError as exc:
        return _invalid(instance, prior, exc, now)
    return _pass(Pass(kube, instance, spec, prior, now), memory or Memory(), options, owned)


def _pass(p: Pass, memory: Memory, options: Options, owned: Owned | None) -> Outcome:
    before = rollout.effective(p.spec, p.prior.rollout)
    first = _Once(lambda: _observe_as(p, before, owned))
    tuned, report = ttl.reconcile(p, before, memory.measured_at, lambda: first().pods)
    if tuned.measured:
        memory.measured_at = p.now
    record, live, rolled = canary.reconcile(p, before, first, memory.windows)
    c = _context(p, live, tuned.ttl.seconds if tuned.ttl is not None else None, first, options)
    applied = [apply(p, concern.desired(c)) for concern in CONCERNS]
    seen = _after_apply(p, (before, live), first, sum(a.writes for a in applied), owned)
    if any(version not in seen.deployments for version, _ in live.versions()):
        p.kube.forget_applied()  # deleted by someone: apply everything again next time
    report += rolled
    for concern, did in zip(CONCERNS, applied, strict=True):
        report += concern.report(p, c, seen, did)
    composed = Report(conditions=(SPEC_VALID, ready_condition(report))) + report
    status = dataclasses.replace(
        p.prior,
        conditions=_conditions(p, composed),
        cache_namespaces=report.cache_namespaces or (),
        rollout=record,
        ttl=tuned.ttl,
        hit_ratio=tuned.hit_ratio,
        observed_at=tuned.observed_at,
        serving=report.serving,
        observed_generation=p.instance.generation,
    )
    return Outcome(status, report.events, report.due_in)


def _observe_as(p: Pass, live: RankerSpec, owned: Owned | None = None) -> Observed:
    return observe(p.kube, live, p.instance.name, p.instance.namespace, owned)


class _Once:
    """The cluster as the pass began, read on first use (a decider's)."""

    def __init__(self, read: Callable[[], Observed]) -> None:
        self._read = read
        self.value: Observed | None = None

    def __call__(self) -> Observed:
        if self.value is None:
            self.value = self._read()
        return self.value


def _after_apply(
    p: Pass, specs: tuple[RankerSpec, RankerSpec], first: _Once, writes: int, owned: Owned | None
) -> Observed:
    """What the concerns report from. After a write, the API server read again: what was
    just applied must show (a Deployment's new generation not rolled out yet is not Ready).
    Else the deciders' read when the spec they read for still applies, or the watches'."""
    before, live = specs
    if writes:
        return _observe_as(p, live)
    if first.value is not None and live == before:
        return first.value
    return _observe_as(p, live, owned)


def _context(
    p: Pass,
    live: RankerSpec,
    ttl_s: float | None,
    first: Callable[[], Observed],
    options: Options,
) -> Context:
    """The concerns' input. A canary gets router weight once it has a ready pod (read
    only when there is a canary: the stable version is always routed)."""
    routed: frozenset[str] = frozenset()
    if live.canary is not None:
        routed = frozenset(v for v, _ in live.versions() if first().ready_replicas(v) > 0)
    fresh = Fresh.generate(live, p.instance, p.now)
    return Context(p.instance, live, ttl_s, routed, fresh, options.monitoring, options.redis_health)


def ready_condition(report: Report) -> ConditionUpdate:
    """``Ready``: every concern's ``unready`` reasons, or none (what ``kubectl wait
    --for=condition=Ready`` waits for is an instance that answers)."""
    if not report.unready:
        return ConditionUpdate("Ready", True, "AllReady", "all versions Ready")
    message = "; ".join(why for _, why in report.unready)
    return ConditionUpdate("Ready", False, report.unready[0][0], message)


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
