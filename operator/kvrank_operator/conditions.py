"""Status conditions of a RankerDeployment, set the Kubernetes way: one entry per type,
``lastTransitionTime`` moved only when the status flips, ``observedGeneration`` on each.
Pure: a status dict in, the same dict changed."""

from __future__ import annotations

import datetime as dt
from typing import Any

from kvrank_operator.clock import iso


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
