"""Prometheus metrics of the ranker process (prefix ``kvrank_``).

One :class:`Metrics` object owns a private registry so tests and several in-process servers
never collide. Counters/histograms are labelled by model version and cache namespace.
Gauges mirroring cache state are refreshed by :meth:`Metrics.collect_cache` at scrape time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
INTERVAL_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)
STAGES = ("hash", "l1", "l2", "encode", "extend", "score", "serde", "total")


@dataclass
class Metrics:
    version: str
    namespace: str
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        labels = ["model_version", "namespace"]
        r = self.registry
        self.requests = Counter(
            "kvrank_requests", "Scoring requests by outcome", [*labels, "outcome"], registry=r
        )
        self.lookups = Counter(
            "kvrank_cache_lookups",
            "Cache lookups by tier and result",
            [*labels, "tier", "result"],
            registry=r,
        )
        self.stage = Histogram(
            "kvrank_stage_seconds",
            "Latency per stage",
            [*labels, "stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.encodes = Counter(
            "kvrank_user_encodes", "User-side computations by kind", [*labels, "kind"], registry=r
        )
        self.flight = Counter(
            "kvrank_singleflight", "Singleflight outcomes", [*labels, "event"], registry=r
        )
        self.intervals = Histogram(
            "kvrank_request_interval_seconds",
            "Time between two requests of the same user",
            labels,
            buckets=INTERVAL_BUCKETS,
            registry=r,
        )
        self.interval_mean = Gauge(
            "kvrank_user_interval_mean_seconds",
            "Mean per-user request interval (each user weighted equally); 0 until measured",
            labels,
            registry=r,
        )
        self.ttl = Gauge(
            "kvrank_cache_ttl_seconds", "TTL applied to new entries", labels, registry=r
        )
        self.hit_ratio = Gauge(
            "kvrank_cache_hit_ratio", "Share of requests served from a cache", labels, registry=r
        )
        self.l1_bytes = Gauge("kvrank_l1_bytes", "Bytes held by L1", labels, registry=r)
        self.l1_entries = Gauge("kvrank_l1_entries", "Entries held by L1", labels, registry=r)
        self.l1_evictions = Counter("kvrank_l1_evictions", "L1 evictions", labels, registry=r)
        self.redis_errors = Counter(
            "kvrank_redis_errors", "Redis errors and timeouts", labels, registry=r
        )
        self.circuit = Gauge(
            "kvrank_redis_circuit_open", "1 while the L2 breaker is open", labels, registry=r
        )
        self._served = 0
        self._cached = 0

    def lbl(self) -> dict[str, str]:
        return {"model_version": self.version, "namespace": self.namespace}

    def observe_request(self, outcome: str) -> None:
        self.requests.labels(**self.lbl(), outcome=outcome).inc()
        self._served += 1
        self._cached += outcome in ("l1", "l2", "incremental")
        self.hit_ratio.labels(**self.lbl()).set(self._cached / self._served)

    def time_stage(self, stage: str, seconds: float) -> None:
        self.stage.labels(**self.lbl(), stage=stage).observe(seconds)
