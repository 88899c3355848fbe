"""A pass's inputs for a concern's tests: a parsed spec, its context and an observation,
without a cluster (a concern's ``report`` reads only what it is given, unless it acts)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from kvrank_operator.reconcilers.base import Context, Fresh, Pass
from kvrank_operator.reconcilers.observe import Observed, ObservedRedis
from kvrank_operator.spec import parse_spec
from kvrank_operator.state import Instance, Status

NOW = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.UTC)
INSTANCE = Instance("feed", "prod", "uid-1", 1)
STABLE = {"model": {"version": "v1", "uri": "/models/v1", "replicas": 2}}


def pass_of(
    spec: dict[str, Any], prior: Status | None = None, **context: Any
) -> tuple[Pass, Context]:
    """A pass of ``spec`` with no API client: a concern that calls the API fails loudly."""
    parsed = parse_spec(spec)
    p = Pass(None, INSTANCE, parsed, prior or Status(), NOW)  # type: ignore[arg-type]
    return p, Context(
        INSTANCE, parsed, None, frozenset(), Fresh("pw", "rpw", "key", None), **context
    )


def deployment(ready: int, want: int | None = None, generation: int = 1) -> dict[str, Any]:
    """A Deployment as the API reports it: rolled out to ``generation`` with ``ready`` pods."""
    want = ready if want is None else want
    status = {"observedGeneration": generation, "readyReplicas": ready, "updatedReplicas": ready}
    return {"metadata": {"name": "d", "generation": generation}, "spec": {"replicas": want},
            "status": status}  # fmt: skip


def observed(
    deployments: dict[str, dict[str, Any]] | None = None,
    *,
    redis: ObservedRedis | None = None,
    failures: dict[str, str] | None = None,
    router_ready: int = 0,
) -> Observed:
    return Observed(deployments or {}, set(), failures or {}, set(), redis, [], router_ready)
