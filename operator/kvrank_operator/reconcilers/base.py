"""What every reconciler takes and gives back: the pass's inputs and a report.

Pure types. A reconciler never sets a condition's time or generation (the status writer
does, once per pass), never patches the status and never posts an Event itself.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

from kvrank_operator.kube import Kube
from kvrank_operator.manifests.desired import Desired
from kvrank_operator.spec import RankerSpec
from kvrank_operator.state import ConditionUpdate, Instance, Status

Event = tuple[str, str, str]
"""``(type, reason, message)``: an Event to post on the RankerDeployment."""


@dataclass(frozen=True)
class Pass:
    """One reconcile pass of one RankerDeployment: read once, shared by every reconciler."""

    kube: Kube
    instance: Instance
    spec: RankerSpec
    """The spec as written, parsed once for the whole pass."""
    prior: Status
    """The status as the pass found it."""
    now: dt.datetime


@dataclass(frozen=True)
class Report:
    """A reconciler's conditions, Events and next deadline."""

    conditions: tuple[ConditionUpdate, ...] = ()
    removed: tuple[str, ...] = ()
    """Condition types that no longer apply (their concern is switched off)."""
    events: tuple[Event, ...] = ()
    due_in: float = math.inf
    """Seconds until it wants a pass again without any API event (``inf``: none)."""

    def __add__(self, other: Report) -> Report:
        return Report(
            self.conditions + other.conditions,
            self.removed + other.removed,
            self.events + other.events,
            min(self.due_in, other.due_in),
        )


def send(p: Pass, desired: list[Desired]) -> list[Desired]:
    """Apply each desired object, and create each create-only one that is absent (never
    updating it); the create-only ones created now."""
    created = []
    for d in desired:
        if not d.create_only:
            p.kube.apply(d.obj, p.instance.owner)
        elif p.kube.create_if_absent(d.obj, p.instance.owner):
            created.append(d)
    return created
