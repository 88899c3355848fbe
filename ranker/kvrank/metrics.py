"""Prometheus metrics of the scoring path (prefix ``kvrank_``): requests, stages, encodes.

One :class:`Metrics` object owns a private registry so tests and several in-process servers
never collide. Every series carries the process-constant labels (model version, cache
namespace), bound once when the object is made. The cache's own state (lookups, L1 size,
Redis errors, TTL) is not here: :class:`kvrank.cache.CacheCollector` reads it at scrape
time from the same registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)

from kvrank.cache import CONSTANT_LABELS

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
INTERVAL_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)
STAGES = ("hash", "l1", "l2", "encode", "extend", "score", "serde")
"""Parts of a request; the whole of it is ``kvrank_request_seconds`` (by outcome)."""
OUTCOMES = ("l1", "l2", "incremental", "miss", "none")
CACHED_OUTCOMES = ("l1", "l2", "incremental")
SCORE_ROUTE = "/v1/score"
SCORE_CODES = ("200", "422", "500", "503")
"""Responses of the scoring route exported from the start: a series born at its first
response hides that response from Prometheus' ``increase()`` (a canary's first 5xx
included)."""
ENCODE_KINDS = ("full", "incremental")


@dataclass
class Metrics:
    version: str
    namespace: str
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    device: str = "cpu"
    """The torch device the model computes on (``kvrank_model_info``'s label)."""

    def __post_init__(self) -> None:
        names, values = list(CONSTANT_LABELS), (self.version, self.namespace)
        r = self.registry
        for runtime in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            r.register(runtime)  # CPU, memory, open files, GC: the process's own health
        requests = Counter(
            "kvrank_requests", "Scoring requests by outcome", [*names, "outcome"], registry=r
        )
        self.requests = {o: requests.labels(*values, o) for o in OUTCOMES}
        stage = Histogram(
            "kvrank_stage_seconds",
            "Latency per stage of a scoring request (the whole: kvrank_request_seconds)",
            [*names, "stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.stages = {s: stage.labels(*values, s) for s in STAGES}
        latency = Histogram(
            "kvrank_request_seconds",
            "Scoring latency (the whole request) by cache outcome",
            [*names, "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.latency = {o: latency.labels(*values, o) for o in OUTCOMES}
        encodes = Counter(
            "kvrank_user_encodes", "User-side computations by kind", [*names, "kind"], registry=r
        )
        self.encodes = {k: encodes.labels(*values, k) for k in ENCODE_KINDS}
        self.intervals = Histogram(
            "kvrank_request_interval_seconds",
            "Time between two requests of the same user",
            names,
            buckets=INTERVAL_BUCKETS,
            registry=r,
        ).labels(*values)
        self.hit_ratio = Gauge(
            "kvrank_cache_hit_ratio",
            "Share of requests served from a cache since start (windowed: from"
            " kvrank_requests_total)",
            names,
            registry=r,
        ).labels(*values)
        Gauge(
            "kvrank_model_info",
            "The model being served (always 1); its device says whether a GPU computes",
            [*names, "device"],
            registry=r,
        ).labels(*values, self.device).set(1)
        self._responses = Counter(
            "kvrank_http_responses",
            "HTTP responses by route and status code (errors included)",
            [*names, "route", "code"],
            registry=r,
        )
        for code in SCORE_CODES:  # at 0 from the start: increase() sees their first ones
            self._responses.labels(*values, SCORE_ROUTE, code)
        self._values = values
        self._served = 0
        self._cached = 0

    def observe_response(self, route: str, code: int) -> None:
        self._responses.labels(*self._values, route, str(code)).inc()

    def observe_request(self, outcome: str, timings_ms: dict[str, float]) -> None:
        self.requests[outcome].inc()
        self.latency[outcome].observe(timings_ms["total"] / 1e3)
        for stage, ms in timings_ms.items():
            if stage != "total":
                self.stages[stage].observe(ms / 1e3)
        self._served += 1
        self._cached += outcome in CACHED_OUTCOMES
        self.hit_ratio.set(self._cached / self._served)
