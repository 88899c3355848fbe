"""The concerns of a RankerDeployment, in the order their objects are applied.

Each is a module with the two functions of :class:`~kvrank_operator.reconcilers.base.Concern`;
the operator's pass (:mod:`kvrank_operator.reconcile`) and ``kvrank-operator render``
(:mod:`kvrank_operator.render`) both loop over this tuple, so what is rendered is what is
applied. Adding a concern is one module and one line here.
"""

from __future__ import annotations

from kvrank_operator.manifests.desired import Desired
from kvrank_operator.reconcilers import (
    cache_namespaces,
    managed_redis,
    monitoring,
    routing,
    versions,
)
from kvrank_operator.reconcilers.base import Concern, Context

CONCERNS: tuple[Concern, ...] = (managed_redis, versions, monitoring, routing, cache_namespaces)


def desired(c: Context) -> list[Desired]:
    """Every object the concerns want applied, in order."""
    return [d for concern in CONCERNS for d in concern.desired(c)]
