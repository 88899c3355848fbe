"""The cache TTL: measured from request intervals (``ttl.mode: auto``) or fixed.

Every ``ttl.intervalSeconds`` it reads the mean per-user request interval (from the ranker
pods or Prometheus, :mod:`kvrank_operator.sources`), applies the policy with hysteresis
(:func:`kvrank_operator.ttl_policy.next_ttl`) and returns the TTL in force: an input of the
ranker ConfigMap, which the versions reconciler alone writes (pods hot-reload it). It also
publishes the hit ratio and the ``TTLSource`` condition, which says why no interval could
be measured (never only a log line).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass

from kvrank_operator.clock import iso, parse_iso
from kvrank_operator.reconcilers.base import Pass, Report
from kvrank_operator.sources import Measured, Pods, measure
from kvrank_operator.spec import RankerSpec
from kvrank_operator.state import ConditionUpdate, TTLStatus
from kvrank_operator.ttl_policy import next_ttl

SOURCE = "TTLSource"


@dataclass(frozen=True)
class Tuned:
    """The TTL tuner's part of the status."""

    ttl: TTLStatus | None
    hit_ratio: float | None
    observed_at: str | None
    """When these values last changed."""
    measured: bool = False
    """This pass measured (not stored: the process remembers when, for the next pass)."""


def reconcile(
    p: Pass, live: RankerSpec, measured_at: dt.datetime | None, pods: Pods
) -> tuple[Tuned, Report]:
    """``measured_at``: when this process last measured this instance (``None`` after a
    start: the status tells when its values last changed); ``pods``: the ranker pods as the
    pass observed them (read only when the source is the pods and a measurement is due)."""
    prior = p.prior
    kept = Tuned(prior.ttl, prior.hit_ratio, prior.observed_at)
    last = measured_at or _last_change(p)
    spec = live.ttl
    fixed_changed = spec.mode == "fixed" and _seconds(kept) != spec.fixed_seconds
    elapsed = (p.now - last).total_seconds() if last else None
    if not fixed_changed and elapsed is not None and elapsed < spec.interval_seconds:
        return kept, Report(due_in=spec.interval_seconds - elapsed)  # a new fixed TTL: at once
    measured = measure(pods, live, p.instance.name, p.instance.namespace)
    tuned, report = _tune(p, live, measured, kept)
    return dataclasses.replace(tuned, measured=True), report + Report(due_in=spec.interval_seconds)


def _tune(p: Pass, live: RankerSpec, measured: Measured, kept: Tuned) -> tuple[Tuned, Report]:
    spec = live.ttl
    if spec.mode == "auto":
        report = Report(conditions=(source_condition(measured, live),))
        changed = _differs(p, report.conditions[0])
    else:  # a fixed TTL reads no source: no condition about one
        report = Report(removed=(SOURCE,))
        changed = p.prior.condition(SOURCE) is not None
    ratio = round(measured.hit_ratio, 3) if measured.hit_ratio is not None else kept.hit_ratio
    changed |= ratio != kept.hit_ratio
    mean = measured.mean_interval_s if spec.mode == "auto" else None
    seconds = next_ttl(_seconds(kept), mean, spec)
    ttl = kept.ttl
    if seconds is not None:
        source = "fixed" if spec.mode == "fixed" else spec.source
        ttl = TTLStatus(seconds, mean, iso(p.now), source)
        why = f"mean interval {mean}s, {source}"
        report += Report(events=(("Normal", "TTLUpdated", f"cache TTL now {seconds}s ({why})"),))
    if not (changed or seconds is not None):
        return kept, report
    return Tuned(ttl, ratio, iso(p.now)), report


def source_condition(measured: Measured, live: RankerSpec) -> ConditionUpdate:
    """``TTLSource`` from one measurement."""
    if measured.problem is None:
        # no number here: a message that changes with every measurement is a write each time
        message = f"request intervals measured from {live.ttl.source}"
        return ConditionUpdate(SOURCE, True, "Measured", message)
    reason, message = measured.problem
    return ConditionUpdate(SOURCE, False, reason, message)


def _differs(p: Pass, u: ConditionUpdate) -> bool:
    c = p.prior.condition(u.type)
    return c is None or (c.ok, c.reason, c.message) != (u.ok, u.reason, u.message)


def _seconds(t: Tuned) -> float | None:
    return t.ttl.seconds if t.ttl is not None else None


def _last_change(p: Pass) -> dt.datetime | None:
    stamp = p.prior.observed_at or (p.prior.ttl.updated_at if p.prior.ttl else None)
    return parse_iso(stamp) if stamp else None
