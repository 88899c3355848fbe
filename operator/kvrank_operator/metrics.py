"""The operator process's Prometheus metrics, in a registry of its own.

Nothing registers at import: the command line makes one :class:`OperatorMetrics` per process
(served on ``--metrics-port``) and hands it to the handlers (kopf's ``memo``) and the leader
election, so a test makes as many as it likes and reads each one's own values.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)

RD_LABELS = ("rankerdeployment_namespace", "rankerdeployment")
"""A RankerDeployment's labels: not ``namespace``, which Prometheus sets to the operator
pod's."""


@dataclass(frozen=True)
class OperatorMetrics:
    registry: CollectorRegistry
    reconciles: Counter
    reconcile_seconds: Histogram
    events: Counter
    ttl_source_ok: Gauge
    leader: Gauge

    @classmethod
    def create(cls) -> OperatorMetrics:
        """A registry with the operator's metrics and the process's (CPU, memory, GC)."""
        r = CollectorRegistry()
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            r.register(collector)
        return cls(
            registry=r,
            reconciles=Counter(
                "kvrank_operator_reconciles",
                "Reconciles by trigger and result",
                ["trigger", "result"],
                registry=r,
            ),
            reconcile_seconds=Histogram(
                "kvrank_operator_reconcile_seconds", "Reconcile latency", registry=r
            ),
            events=Counter(
                "kvrank_operator_events",
                "Events posted, by RankerDeployment and reason",
                [*RD_LABELS, "reason"],
                registry=r,
            ),
            ttl_source_ok=Gauge(
                "kvrank_operator_ttl_source_ok",
                "1 while the TTL tuner reads request intervals (TTLSource condition True),"
                " else 0; absent without ttl.mode auto",
                RD_LABELS,
                registry=r,
            ),
            leader=Gauge(
                "kvrank_operator_leader",
                "1 while this replica holds the Lease and reconciles, else 0",
                registry=r,
            ),
        )
