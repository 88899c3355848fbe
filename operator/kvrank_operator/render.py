"""What the operator would apply for a RankerDeployment, without a cluster.

The concerns the operator's pass loops over (``reconcilers.concerns.CONCERNS``), asked what
they want for the spec as its first pass applies it (no rollout yet: a canary at its first
step, out of the Service and the router while it warms up; the TTL a fixed mode sets, none
for ``auto`` until measured). What the operator decides from what it observes —
old versions removed, purge Jobs, a Redis cluster healed — is not here, nor the owner
reference the API server's uid makes. Secrets keep their keys, never their values: the
password and certificates are generated per cluster and create-only.

For review, diffs and manifest linters (``make lint`` runs kube-score over every example). The
spec is first checked against the CRD's schema as the API server would check it
(:mod:`~kvrank_operator.schema_check`): a misspelt field is an error here, not a default.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from kvrank_operator import manifests as m
from kvrank_operator.crd import SPEC
from kvrank_operator.errors import DocumentError
from kvrank_operator.reconcilers.base import Context, Fresh
from kvrank_operator.reconcilers.concerns import desired
from kvrank_operator.rollout import effective
from kvrank_operator.schema_check import problems
from kvrank_operator.spec import Defaults, parse_spec
from kvrank_operator.state import Instance
from kvrank_operator.ttl_policy import next_ttl

REDACTED = "<redacted: generated in the cluster>"
KIND = ("kvrank.io/v1alpha1", "RankerDeployment")


def render(
    doc: Mapping[str, Any],
    namespace: str | None = None,
    monitoring: m.PodMonitoring | None = None,
    defaults: Defaults | None = None,
) -> list[dict[str, Any]]:
    """The objects, in the order the operator applies them; raises
    :class:`~kvrank_operator.errors.DocumentError` for a document that is not one or whose
    spec the CRD's schema refuses (an unknown field, a wrong type, a value out of its enum or
    bounds: every such field named), :class:`~kvrank_operator.errors.SpecError` naming a
    spec field the operator would refuse."""
    if (doc.get("apiVersion"), doc.get("kind")) != KIND:
        got = f"{doc.get('apiVersion')}/{doc.get('kind')}"
        raise DocumentError("kind", f"{got} is not a {KIND[1]} ({KIND[0]})")
    meta = doc.get("metadata") or {}
    if not meta.get("name"):
        raise DocumentError("metadata.name", "required")
    name, ns = str(meta["name"]), namespace or meta.get("namespace") or "default"
    found = problems(doc.get("spec"), SPEC, "spec")
    if found:  # what the API server's schema refuses (or, for an unknown field, drops)
        field, _, problem = found[0].partition(": ")
        more = f" (and {len(found) - 1} more: {'; '.join(found[1:])})" if len(found) > 1 else ""
        raise DocumentError(field, problem + more)
    spec = parse_spec(doc.get("spec") or {}, defaults or Defaults())
    live = effective(spec, None)
    instance = Instance(name, ns, uid="", generation=1)
    fresh = Fresh.generate(live, instance, dt.datetime.now(dt.UTC))  # then redacted
    ttl = next_ttl(None, None, live.ttl)
    c = Context(instance, live, ttl, frozenset(), fresh, monitoring)
    return [redacted(d.obj) for d in desired(c)]


def redacted(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] != "Secret":
        return obj
    out = dict(obj)
    for field in ("data", "stringData"):
        if field in out:
            out[field] = {key: REDACTED for key in out[field]}
    return out
