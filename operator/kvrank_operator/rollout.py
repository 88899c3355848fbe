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
  after its pause — it never passes.
- **Manual** (no steps): the canary stays at ``canary.weight`` until a person promotes it.
- **Promoted**: the operator rewrites the spec (``model`` ← the canary, ``canary`` removed):
  the same path as a manual promote. **Aborted**: the canary is removed and its cache
  namespace purged; the spec keeps the canary until a person changes or removes it. Once the
  spec has no canary the ended rollout stays in the status (``ended: true``); a canary put
  back, the same version included, starts a new rollout.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvrank_operator.analysis import Window, evaluate, ratio
from kvrank_operator.clock import iso, parse_iso
from kvrank_operator.spec import CanarySpec, RankerSpec

STARTING, WARMING, PROGRESSING, MANUAL = "Starting", "Warming", "Progressing", "Manual"
PROMOTED, ABORTED = "Promoted", "Aborted"
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
    canary: dict[str, Any] | None
    """The new ``status.canary`` (``None``: no rollout to show)."""
    events: list[Event] = field(default_factory=list)
    promote: bool = False
    """Rewrite the spec: the canary becomes the stable version."""
    condition: tuple[bool, str, str] | None = None
    """``CanaryAnalysis`` condition (ok, reason, message); ``None``: remove it."""


def effective(spec: RankerSpec, rollout: Mapping[str, Any] | None) -> RankerSpec:
    """The spec as the rollout applies it now: the canary's weight at the current step, kept
    out of the Service while it warms up, gone once aborted."""
    c = spec.canary
    if c is None:
        return spec
    mine = rollout if rollout and rollout.get("version") == c.version else {}
    phase = mine.get("phase", STARTING)
    if phase == ABORTED:
        return dataclasses.replace(spec, canary=None)
    weight, serving = c.weight, True
    if c.steps:
        weight = c.steps[_step_of(c, mine) - 1].weight
    if phase in (STARTING, WARMING) and c.warmup is not None:
        serving = False
    return dataclasses.replace(spec, canary=dataclasses.replace(c, weight=weight, serving=serving))


def due_in(rollout: Mapping[str, Any] | None) -> float:
    """Seconds until the rollout wants measuring again (``inf``: it does not)."""
    if rollout and rollout.get("phase") in ACTIVE:
        return ANALYSIS_INTERVAL_S
    return float("inf")


def advance(
    spec: RankerSpec,
    prior: Mapping[str, Any] | None,
    canary_ready: bool,
    read: ReadWindow,
    now: dt.datetime,
) -> Decision:
    """The rollout one step on from ``prior`` (``status.canary``, never changed here)."""
    rollout = dict(prior) if prior else None
    c = spec.canary
    if c is None:  # keep how the last rollout ended; a canary removed by hand leaves none
        if rollout and rollout.get("phase") in (PROMOTED, ABORTED):
            return Decision({**rollout, "ended": True}, condition=_last_condition(rollout))
        return Decision(None)
    events: list[Event] = []
    if rollout and (rollout.get("ended") or _promoted_long_ago(rollout, now)):
        rollout = None  # a canary in the spec again (a retry, or an old spec re-applied)
    if rollout is None or rollout.get("version") != c.version:
        rollout = {"version": c.version, "phase": STARTING, "step": 0, "since": iso(now)}
        plan = ", ".join(f"{s.weight}%" for s in c.steps) or f"{c.weight}% until promoted"
        warm = " after a warm-up on shadow traffic" if c.warmup else ""
        events.append(("Normal", "RolloutStarted", f"canary {c.version}: {plan}{warm}"))
    phase = rollout["phase"]
    if phase in (PROMOTED, ABORTED):  # promoted: rewrite the spec until the new one arrives
        promote = phase == PROMOTED
        return Decision(rollout, events, promote=promote, condition=_last_condition(rollout))
    if phase == STARTING and canary_ready:
        _enter(rollout, WARMING if c.warmup else _after_warmup(c), now)
    elif phase == WARMING:
        _warm(c, rollout, read, now, events)
    elif phase == PROGRESSING:
        return _analyse(c, rollout, read, now, events)
    _show(c, rollout)
    message = {
        STARTING: f"canary {c.version} starting",
        WARMING: f"canary {c.version} warming up on shadow traffic",
        PROGRESSING: f"canary {c.version} at step {rollout.get('stepText')}",
        MANUAL: f"canary {c.version} at {c.weight}%: promote or remove it in the spec",
    }.get(rollout["phase"], rollout.get("message", ""))
    rollout["message"] = message
    return Decision(rollout, events, condition=(True, rollout["phase"], message))


def _step_of(c: CanarySpec, rollout: Mapping[str, Any]) -> int:
    """The rollout's step, 1 … len(steps) (a record from before the steps changed is held
    to them)."""
    return min(max(int(rollout.get("step") or 1), 1), len(c.steps))


def _after_warmup(c: CanarySpec) -> str:
    return PROGRESSING if c.steps else MANUAL


def _enter(rollout: dict[str, Any], phase: str, now: dt.datetime) -> None:
    rollout.update(phase=phase, since=iso(now), checks=[])
    if phase == PROGRESSING:
        rollout["step"] = max(1, int(rollout.get("step") or 0))


def _show(c: CanarySpec, rollout: dict[str, Any]) -> None:
    """The fields ``kubectl get rkd`` shows: weight in force, step as ``i/n``."""
    if rollout["phase"] in (STARTING, WARMING) and c.warmup is not None:
        rollout["weight"] = 0
    elif c.steps and rollout["phase"] in (PROGRESSING, PROMOTED, ABORTED):
        rollout["weight"] = c.steps[_step_of(c, rollout) - 1].weight
    else:
        rollout["weight"] = c.weight
    if c.steps:
        rollout["stepText"] = f"{rollout.get('step') or 0}/{len(c.steps)}"


def _warm(
    c: CanarySpec,
    rollout: dict[str, Any],
    read: ReadWindow,
    now: dt.datetime,
    events: list[Event],
) -> None:
    assert c.warmup is not None
    since = parse_iso(rollout["since"])
    w = read(f"{c.version}/warmup", since)
    requests = w.canary.get("requests", 0.0)
    hits = ratio(w.canary.get("cached", 0.0), requests)
    rollout["warmHitRatio"] = None if hits is None else round(hits, 3)
    rollout["warmRequests"] = int(requests)
    shown = "no requests" if hits is None else f"{hits:.3f} over {requests:.0f} requests"
    if hits is not None and requests >= c.warmup.min_requests and hits >= c.warmup.hit_ratio:
        why = f"hit ratio {shown} (threshold {c.warmup.hit_ratio:g})"
        events.append(("Normal", "CanaryWarm", f"canary {c.version} warm: {why}; joins"))
        _enter(rollout, _after_warmup(c), now)
    elif (now - since).total_seconds() >= c.warmup.timeout_seconds:
        why = f"hit ratio {shown} after {c.warmup.timeout_seconds}s" + (
            f" ({w.problem})" if w.problem else ""
        )
        events.append(("Warning", "WarmupTimedOut", f"canary {c.version} joins cold: {why}"))
        _enter(rollout, _after_warmup(c), now)


def _analyse(
    c: CanarySpec,
    rollout: dict[str, Any],
    read: ReadWindow,
    now: dt.datetime,
    events: list[Event],
) -> Decision:
    step = rollout["step"] = _step_of(c, rollout)
    since = parse_iso(rollout["since"])
    elapsed = (now - since).total_seconds()
    w = read(f"{c.version}/step-{step}", since)
    results = evaluate(c.analysis.checks, w)
    rollout["checks"] = [r.status() for r in results]
    _show(c, rollout)
    where = f"step {step}/{len(c.steps)} at {c.steps[step - 1].weight}%"
    failed = [r for r in results if r.verdict == "fail"]
    waiting = [r for r in results if r.verdict == "inconclusive"]
    pause = c.steps[step - 1].pause_seconds
    if failed:
        return _abort(c, rollout, now, events, "AnalysisFailed", where, failed[0].describe())
    if waiting and elapsed >= pause + c.analysis.inconclusive_timeout_seconds:
        why = "; ".join(r.describe() for r in waiting) + (f" ({w.problem})" if w.problem else "")
        return _abort(c, rollout, now, events, "Inconclusive", where, f"no verdict: {why}")
    if waiting or elapsed < pause:
        if waiting:
            why = "; ".join(r.describe() for r in waiting)
            message = f"{where}: waiting for data: {why}" + (f" ({w.problem})" if w.problem else "")
        else:
            message = f"{where}: checks pass, pause ends in {pause - elapsed:.0f}s"
        rollout["message"] = message
        reason = "Inconclusive" if waiting else "Analysing"
        return Decision(rollout, events, condition=(not waiting, reason, message))
    passed = "; ".join(r.describe() for r in results)
    if step == len(c.steps):
        rollout.update(phase=PROMOTED, since=iso(now))
        message = f"promoted canary {c.version} after {where}: {passed}"
        rollout["message"] = message
        events.append(("Normal", "CanaryPromoted", message))
        return Decision(rollout, events, promote=True, condition=(True, PROMOTED, message))
    events.append(("Normal", "StepPassed", f"canary {c.version} {where} passed: {passed}"))
    rollout.update(step=step + 1, since=iso(now), checks=[])
    _show(c, rollout)
    message = f"canary {c.version} at step {rollout['stepText']}"
    rollout["message"] = message
    return Decision(rollout, events, condition=(True, "Analysing", message))


def _abort(
    c: CanarySpec,
    rollout: dict[str, Any],
    now: dt.datetime,
    events: list[Event],
    reason: str,
    where: str,
    why: str,
) -> Decision:
    message = f"aborted canary {c.version} at {where}: {why}"
    rollout.update(phase=ABORTED, since=iso(now), reason=reason, message=message)
    events.append(("Warning", "RolloutAborted", message))
    return Decision(rollout, events, condition=(False, reason, message))


def _promoted_long_ago(rollout: dict[str, Any], now: dt.datetime) -> bool:
    if rollout.get("phase") != PROMOTED:
        return False
    return (now - parse_iso(rollout["since"])).total_seconds() > PROMOTE_RETRY_S


def _last_condition(rollout: dict[str, Any]) -> tuple[bool, str, str]:
    if rollout["phase"] == PROMOTED:
        return True, PROMOTED, rollout.get("message", "")
    return False, rollout.get("reason", ABORTED), rollout.get("message", "")


def promotion(canary: CanarySpec) -> dict[str, Any]:
    """The spec patch that promotes ``canary``: ``model`` takes its version, artifact and (when
    it brought one) its image, and the canary block goes."""
    model: dict[str, Any] = {"version": canary.version, "uri": canary.uri, "sha256": canary.sha256}
    if canary.image:  # the canary's model code becomes the stable's with it
        model["image"] = canary.image
    return {"spec": {"model": model, "canary": None}}
