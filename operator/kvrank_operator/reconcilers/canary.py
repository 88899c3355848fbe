"""The canary's rollout: measure it, advance it, promote or abort it.

The decisions are :mod:`kvrank_operator.rollout`'s (pure); this shell gives it whether the
canary is Ready and a way to read metrics windows, keeps its record for ``status.canary``
and the ``CanaryAnalysis`` condition, and sends the promotion. It returns the spec as the
rollout now applies it (weight at the current step, kept out of the Service while warming
up, gone once aborted), which the versions and cache-namespace reconcilers then follow.
"""

from __future__ import annotations

from collections.abc import Callable

from kvrank_operator import rollout
from kvrank_operator.analysis import Window, Windows
from kvrank_operator.crd import API_VERSION, KIND
from kvrank_operator.reconcilers.base import Pass, Report
from kvrank_operator.reconcilers.observe import Observed
from kvrank_operator.spec import RankerSpec
from kvrank_operator.state import ConditionUpdate, Rollout

CONDITION = "CanaryAnalysis"


def reconcile(
    p: Pass, live: RankerSpec, seen: Callable[[], Observed], windows: Windows
) -> tuple[Rollout | None, RankerSpec, Report]:
    """``live``: the spec as the rollout applied it when the pass began; ``seen``: the
    cluster as the pass began (read only when there is a canary)."""
    canary = p.spec.canary
    ready = False
    read: rollout.ReadWindow = _no_window
    if canary is not None:
        ready = seen().ready(live, canary.version, "canary")
        i = p.instance
        read = windows.reader(lambda: seen().pods, p.spec, i.name, i.namespace, i.uid, p.now)
    else:
        windows.close(p.instance.uid)
    decision = rollout.advance(p.spec, p.prior.rollout, ready, read, p.now)
    if decision.promote and canary is not None:
        patch = rollout.promotion(canary)
        p.kube.merge_patch(API_VERSION, KIND, p.instance.namespace, p.instance.name, patch)
    if decision.condition is None:
        report = Report(removed=(CONDITION,))
    else:
        report = Report(conditions=(ConditionUpdate(CONDITION, *decision.condition),))
    report += Report(events=tuple(decision.events), due_in=rollout.due_in(decision.canary))
    return decision.canary, rollout.effective(p.spec, decision.canary), report


def _no_window(key: str, since: object) -> Window:
    return Window(problem="no canary")
