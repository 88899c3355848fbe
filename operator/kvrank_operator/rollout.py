"""Progressive delivery of a canary: warm-up on shadow traffic, analysed steps, promote or
abort. Pure: the spec, the rollout's status and a way to read a metrics window in; the new
status, Events, and whether to promote out.

A rollout (``status.canary``) goes through these phases::

    Starting ──▶ Warming ──▶ Progressing (step 1 … n) ──▶ Promoted
        │           │               │
        │           └──▶ Manual     └──▶ Aborted
        └──▶ Progressing / Manual (no warm-up)

- **Starting**: the canary's pods start. With a warm-up they get no real traffic (the shared
  Service selects the stable version only, which keeps all its replicas) but the stable
  pods already mirror ``canary.shadow.sample`` of their requests to them.
- **Warming**: the canary is Ready; it keeps taking shadow traffic only, until its hit ratio
  reaches ``warmup.hitRatio`` over ``warmup.minRequests`` requests — or ``timeoutSeconds``
  pass. Then it joins the shared Service.
- **Progressing**: at step *i*'s weight. Every check of ``canary.analysis`` is measured
  over the step: one that fails aborts at once; all passing once ``pauseSeconds`` have gone
  by moves to the next step, or after the last promotes. A check without enough samples (no
  data, NaN) is *inconclusive*: the step waits, and aborts ``inconclusiveTimeoutSeconds``
  after its pause — it never passes. ``canary.paused`` holds a step (no step on, no timeout)
  until it is set false again; a failing check still aborts.
  ``canary.skipToStep`` (a person's ``kubectl rkd promote``) moves a rollout before that
  step there at once, its checks and pause skipped — a warming canary joins at step 1, one
  past the last step promotes.
- **Manual** (no steps): the canary stays at ``canary.weight`` until a person promotes it.
- **Promoted**: with ``canary.promotion: spec`` (the default) the operator rewrites the spec
  (``model`` ← the canary, ``canary`` removed): the same path as a manual promote. With
  ``promotion: status`` (GitOps) it never writes the spec: the record says Promoted and the
  canary serves as the stable version (:func:`promoted`) until the spec names it as the
  model — a commit the user makes in Git. **Aborted**: the canary is removed and its cache
  namespace purged; the spec keeps the canary until a person changes or removes it. Once the
  spec has no canary the ended rollout stays in the status (``ended: true``); a canary put
  back, the same version included, starts a new rollout.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvrank_operator.analysis import Window, evaluate, ratio
from kvrank_operator.clock import iso, parse_iso
from kvrank_operator.spec import CanarySpec, RankerSpec
from kvrank_operator.state import Phase, Rollout

STARTING, WARMING, PROGRESSING, MANUAL = (
    Phase.STARTING,
    Phase.WARMING,
    Phase.PROGRESSING,
    Phase.MANUAL,
)
PROMOTED, ABORTED = Phase.PROMOTED, Phase.ABORTED
ACTIVE = (STARTING, WARMING, PROGRESSING)
"""Phases the operator drives (and re-measures every ``ANALYSIS_INTERVAL_S``)."""
ANALYSIS_INTERVAL_S = 5.0
PROMOTE_RETRY_S = 60.0
"""After promoting, the spec rewrite is sent again until it arrives, this long at most."""

ReadWindow = Callable[[str, dt.datetime], Window]
"""``(window key, opened at) → counts since then``: the same key returns the same window
growing; a new key opens a new one."""
Event = tuple[str, str, str]


@dataclass
class Decision:
    canary: Rollout | None
    """The new ``status.canary`` (``None``: no rollout to show)."""
    events: list[Event] = field(default_factory=list)
    promote: bool = False
    """Rewrite the spec: the canary becomes the stable version (``promotion: spec``)."""
    condition: tuple[bool, str, str] | None = None
    """``CanaryAnalysis`` condition (ok, reason, message); ``None``: remove it."""


def effective(spec: RankerSpec, rollout: Rollout | None) -> RankerSpec:
    """The spec as the rollout applies it now: the canary's weight at the current step, kept
    out of the Service while it warms up, gone once aborted."""
    c = spec.canary
    if c is None:
        return spec
    mine = rollout if rollout is not None and rollout.version == c.version else None
    phase = mine.phase if mine is not None else STARTING
    if phase is ABORTED:
        return dataclasses.replace(spec, canary=None)
    if phase is PROMOTED and c.promotion == "status":
        return promoted(spec, c)
    weight, serving = c.weight, True
    if c.steps:
        weight = c.steps[_step_of(c, mine) - 1].weight
    if phase in (STARTING, WARMING) and c.warmup is not None:
        serving = False
    return dataclasses.replace(spec, canary=dataclasses.replace(c, weight=weight, serving=serving))


def promoted(spec: RankerSpec, c: CanarySpec) -> RankerSpec:
    """The spec with the canary as the stable version (what a promotion makes it)."""
    model = dataclasses.replace(
        spec.model, version=c.version, uri=c.uri, sha256=c.sha256, image=c.image or spec.model.image
    )
    return dataclasses.replace(spec, model=model, canary=None)


def due_in(rollout: Rollout | None) -> float:
    """Seconds until the rollout wants measuring again (``inf``: it does not)."""
    if rollout is not None and rollout.phase in ACTIVE:
        return ANALYSIS_INTERVAL_S
    return float("inf")


def advance(
    spec: RankerSpec,
    prior: Rollout | None,
    canary_ready: bool,
    read: ReadWindow,
    now: dt.datetime,
) -> Decision:
    """The rollout one step on from ``prior`` (``status.canary``)."""
    c = spec.canary
    if c is None:  # keep how the last rollout ended; a canary removed by hand leaves none
        if prior is not None and prior.phase in (PROMOTED, ABORTED):
            return Decision(
                dataclasses.replace(prior, ended=True), condition=_last_condition(prior)
            )
        return Decision(None)
    events: list[Event] = []
    rollout = prior
    if rollout is not None and (rollout.ended or _promoted_long_ago(c, rollout, now)):
        rollout = None  # a canary in the spec again (a retry, or an old spec re-applied)
    if rollout is None or rollout.version != c.version:
        rollout = Rollout(c.version, STARTING, iso(now))
        plan = ", ".join(f"{s.weight}%" for s in c.steps) or f"{c.weight}% until promoted"
        warm = " after a warm-up on shadow traffic" if c.warmup else ""
        events.append(("Normal", "RolloutStarted", f"canary {c.version}: {plan}{warm}"))
    if rollout.phase in (PROMOTED, ABORTED):  # promoted: rewrite the spec until it arrives
        promote = rollout.phase is PROMOTED and c.promotion == "spec"
        return Decision(rollout, events, promote=promote, condition=_last_condition(rollout))
    if rollout.phase is STARTING and canary_ready:
        rollout = _enter(rollout, WARMING if c.warmup else _after_warmup(c), now)
    elif rollout.phase is WARMING:
        rollout = _warm(c, rollout, read, now, events)
    elif rollout.phase is PROGRESSING:
        return _analyse(c, rollout, read, now, events)
    rollout = _show(c, rollout)
    message = {
        STARTING: f"canary {c.version} starting",
        WARMING: f"canary {c.version} warming up on shadow traffic",
        PROGRESSING: f"canary {c.version} at step {rollout.step_text}",
        MANUAL: f"canary {c.version} at {c.weight}%: promote or remove it in the spec",
    }.get(rollout.phase, rollout.message)
    rollout = dataclasses.replace(rollout, message=message)
    return Decision(rollout, events, condition=(True, rollout.phase.value, message))


def _step_of(c: CanarySpec, rollout: Rollout | None) -> int:
    """The rollout's step, 1 … len(steps) (a record from before the steps changed is held
    to them)."""
    step = rollout.step if rollout is not None else 1
    return min(max(step or 1, 1), len(c.steps))


def _after_warmup(c: CanarySpec) -> Phase:
    return PROGRESSING if c.steps else MANUAL


def _enter(rollout: Rollout, phase: Phase, now: dt.datetime) -> Rollout:
    step = max(1, rollout.step) if phase is PROGRESSING else rollout.step
    return dataclasses.replace(rollout, phase=phase, since=iso(now), checks=(), step=step)


def _show(c: CanarySpec, rollout: Rollout) -> Rollout:
    """The fields ``kubectl get rkd`` shows: weight in force, step as ``i/n``."""
    if rollout.phase in (STARTING, WARMING) and c.warmup is not None:
        weight = 0
    elif c.steps and rollout.phase in (PROGRESSING, PROMOTED, ABORTED):
        weight = c.steps[_step_of(c, rollout) - 1].weight
    else:
        weight = c.weight
    step_text = f"{rollout.step}/{len(c.steps)}" if c.steps else rollout.step_text
    return dataclasses.replace(rollout, weight=weight, step_text=step_text)


def _warm(
    c: CanarySpec,
    rollout: Rollout,
    read: ReadWindow,
    now: dt.datetime,
    events: list[Event],
) -> Rollout:
    assert c.warmup is not None
    if c.skip_to_step >= 1:
        why = f"canary {c.version} joins: warm-up ended by canary.skipToStep"
        events.append(("Normal", "WarmupSkipped", why))
        return _enter(rollout, _after_warmup(c), now)
    since = parse_iso(rollout.since)
    w = read(f"{c.version}/warmup", since)
    requests = w.canary.get("requests", 0.0)
    hits = ratio(w.canary.get("cached", 0.0), requests)
    rollout = dataclasses.replace(
        rollout,
        warm_hit_ratio=None if hits is None else round(hits, 3),
        warm_requests=int(requests),
    )
    shown = "no requests" if hits is None else f"{hits:.3f} over {requests:.0f} requests"
    if hits is not None and requests >= c.warmup.min_requests and hits >= c.warmup.hit_ratio:
        why = f"hit ratio {shown} (threshold {c.warmup.hit_ratio:g})"
        events.append(("Normal", "CanaryWarm", f"canary {c.version} warm: {why}; joins"))
        return _enter(rollout, _after_warmup(c), now)
    if (now - since).total_seconds() >= c.warmup.timeout_seconds:
        why = f"hit ratio {shown} after {c.warmup.timeout_seconds}s" + (
            f" ({w.problem})" if w.problem else ""
        )
        events.append(("Warning", "WarmupTimedOut", f"canary {c.version} joins cold: {why}"))
        return _enter(rollout, _after_warmup(c), now)
    return rollout


def _analyse(
    c: CanarySpec,
    rollout: Rollout,
    read: ReadWindow,
    now: dt.datetime,
    events: list[Event],
) -> Decision:
    step = _step_of(c, rollout)
    elapsed = (now - parse_iso(rollout.since)).total_seconds()
    w = read(f"{c.version}/step-{step}", parse_iso(rollout.since))
    results = evaluate(c.analysis.checks, w)
    rollout = _show(
        c, dataclasses.replace(rollout, step=step, checks=tuple(r.status() for r in results))
    )
    where = f"step {step}/{len(c.steps)} at {c.steps[step - 1].weight}%"
    failed = [r for r in results if r.verdict == "fail"]
    waiting = [r for r in results if r.verdict == "inconclusive"]
    pause = c.steps[step - 1].pause_seconds
    problem = f" ({w.problem})" if w.problem else ""
    if c.skip_to_step > step:  # a person's move: the step's checks and pause are skipped
        return _skip(c, rollout, now, events, where)
    if failed:
        return _abort(c, rollout, now, events, "AnalysisFailed", where, failed[0].describe())
    if c.paused:  # held by a person: no timeout, no step on; a failing check aborts still
        verdict = "waiting for data" if waiting else "checks pass"
        message = f"{where}: paused ({verdict}); set canary.paused false to go on"
        held = dataclasses.replace(rollout, message=message)
        return Decision(held, events, condition=(True, "Paused", message))
    if waiting and elapsed >= pause + c.analysis.inconclusive_timeout_seconds:
        why = "; ".join(r.describe() for r in waiting) + problem
        return _abort(c, rollout, now, events, "Inconclusive", where, f"no verdict: {why}")
    if waiting or elapsed < pause:
        if waiting:
            message = f"{where}: waiting for data: {'; '.join(r.describe() for r in waiting)}"
            message += problem
        else:
            message = f"{where}: checks pass, pause ends in {pause - elapsed:.0f}s"
        reason = "Inconclusive" if waiting else "Analysing"
        return Decision(
            dataclasses.replace(rollout, message=message),
            events,
            condition=(not waiting, reason, message),
        )
    passed = "; ".join(r.describe() for r in results)
    if step == len(c.steps):
        return _promote(c, rollout, now, events, f"after {where}: {passed}")
    events.append(("Normal", "StepPassed", f"canary {c.version} {where} passed: {passed}"))
    return _to_step(c, rollout, step + 1, now, events)


def _skip(
    c: CanarySpec, rollout: Rollout, now: dt.datetime, events: list[Event], where: str
) -> Decision:
    """``canary.skipToStep`` ahead of the rollout: there at once, or promoted past the end."""
    if c.skip_to_step > len(c.steps):
        return _promote(c, rollout, now, events, f"at {where}: skipToStep past the last step")
    target = c.skip_to_step
    events.append(("Normal", "StepSkipped", f"canary {c.version} {where} skipped to {target}"))
    return _to_step(c, rollout, target, now, events)


def _to_step(
    c: CanarySpec, rollout: Rollout, step: int, now: dt.datetime, events: list[Event]
) -> Decision:
    rollout = _show(c, dataclasses.replace(rollout, step=step, since=iso(now), checks=()))
    message = f"canary {c.version} at step {rollout.step_text}"
    return Decision(
        dataclasses.replace(rollout, message=message),
        events,
        condition=(True, "Analysing", message),
    )


def _promote(
    c: CanarySpec, rollout: Rollout, now: dt.datetime, events: list[Event], why: str
) -> Decision:
    message = f"promoted canary {c.version} {why}"
    events.append(("Normal", "CanaryPromoted", message))
    done = dataclasses.replace(rollout, phase=PROMOTED, since=iso(now), message=message)
    promote = c.promotion == "spec"
    return Decision(done, events, promote=promote, condition=(True, PROMOTED.value, message))


def _abort(
    c: CanarySpec,
    rollout: Rollout,
    now: dt.datetime,
    events: list[Event],
    reason: str,
    where: str,
    why: str,
) -> Decision:
    message = f"aborted canary {c.version} at {where}: {why}"
    events.append(("Warning", "RolloutAborted", message))
    aborted = dataclasses.replace(
        rollout, phase=ABORTED, since=iso(now), reason=reason, message=message
    )
    return Decision(aborted, events, condition=(False, reason, message))


def _promoted_long_ago(c: CanarySpec, rollout: Rollout, now: dt.datetime) -> bool:
    """A promoted canary still in a rewritten spec long after: someone put it back (with
    ``promotion: status`` it stays in the spec by design)."""
    if rollout.phase is not PROMOTED or c.promotion == "status":
        return False
    return (now - parse_iso(rollout.since)).total_seconds() > PROMOTE_RETRY_S


def _last_condition(rollout: Rollout) -> tuple[bool, str, str]:
    if rollout.phase is PROMOTED:
        return True, PROMOTED.value, rollout.message
    return False, rollout.reason or ABORTED.value, rollout.message


def promotion(canary: CanarySpec) -> dict[str, Any]:
    """The spec patch that promotes ``canary``: ``model`` takes its version, artifact and (when
    it brought one) its image, and the canary block goes."""
    model: dict[str, Any] = {"version": canary.version, "uri": canary.uri, "sha256": canary.sha256}
    if canary.image:  # the canary's model code becomes the stable's with it
        model["image"] = canary.image
    return {"spec": {"model": model, "canary": None}}
