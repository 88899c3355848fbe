"""Prometheus metrics of the scoring path (prefix ``kvrank_``): requests, stages, encodes.

One :class:`Metrics` object owns a private registry so tests and several in-process servers
never collide. Every series carries the process-constant labels (model version, cache
namespace), bound once when the object is made. The cache's own state (lookups, L1 size,
Redis errors, TTL) is not here: :class:`kvrank.cache.CacheCollector` reads it at scrape
time from the same registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvrank.admission import ABANDON_REASONS, ABANDON_STAGES, SHED_REASONS, Admission
from kvrank.cache import CONSTANT_LABELS
from kvrank_common import CACHED_OUTCOMES, HIT_RATIO_METRIC, REQUESTS_METRIC

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
INTERVAL_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)
STAGES = ("hash", "l1", "host", "l2", "encode", "extend", "score", "serde", "tag")
"""Parts of a request; the whole of it is ``kvrank_request_seconds`` (by outcome)."""
OUTCOMES = ("l1", "host", "l2", "incremental", "miss", "none")
PROTOCOLS = ("json", "v2-http", "v2-grpc")
"""How a scoring request came: ``/v1/score``'s JSON body, the Open Inference Protocol's
HTTP ``infer`` or its gRPC ``ModelInfer`` (the ``protocol`` label)."""
SCORE_ROUTE = "/v1/score"
INFER_ROUTES = ("/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer")
"""The Open Inference Protocol's scoring routes (templates, as the responses counter and
the access lines name them)."""
INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"
"""The route an inference over gRPC is counted and logged under."""
SCORING_ROUTES = (SCORE_ROUTE, *INFER_ROUTES, INFER_METHOD)
SCORE_CODES = ("200", "400", "412", "422", "500", "503", "504")
"""Responses of the scoring routes exported from the start: a series born at its first
response hides that response from Prometheus' ``increase()`` (a canary's first 5xx
included)."""
ENCODE_KINDS = ("full", "incremental")
BY_REFERENCE_RESULTS = ("served", "extended", "history_required")
PREFETCH_ROUTE = "/v1/prefetch"
PREFETCH_RESULTS = (*OUTCOMES, "dropped", "shed", "failed")
"""What became of a prefetch: the cache outcome of its lookup (``miss``: it made the entry),
``dropped`` (too many prefetches in flight), ``shed`` (the pod had no model time to spare:
scoring requests come first) or ``failed`` (an error, logged; the caller had its 202)."""


@dataclass
class Metrics:
    version: str
    namespace: str
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    readers: CollectorRegistry = field(default_factory=CollectorRegistry)
    """The collectors read at scrape time (not the counters and histograms): what an
    engine apart from its fronts answers a scrape with (see :mod:`kvrank.engine`)."""
    device: str = "cpu"
    """The torch device the model computes on (``kvrank_model_info``'s label)."""

    def __post_init__(self) -> None:
        names, values = list(CONSTANT_LABELS), (self.version, self.namespace)
        r = self.registry
        for runtime in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.add_reader(runtime)  # CPU, memory, open files, GC: the process's own health
        stage = Histogram(
            "kvrank_stage_seconds",
            "Latency per stage of a scoring request (the whole: kvrank_request_seconds)",
            [*names, "stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.stages = {s: stage.labels(*values, s) for s in STAGES}
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
            HIT_RATIO_METRIC,
            "Share of requests served from a cache since start (windowed: from"
            " kvrank_requests_total)",
            names,
            registry=r,
            multiprocess_mode="mostrecent",  # the engine's (see kvrank.engine)
        ).labels(*values)
        Gauge(
            "kvrank_model_info",
            "The model being served (always 1); its device says whether a GPU computes",
            [*names, "device"],
            registry=r,
            multiprocess_mode="max",
        ).labels(*values, self.device).set(1)
        self.queue_wait = Histogram(
            "kvrank_model_queue_wait_seconds",
            "Wait of each piece of model work for the model thread",
            names,
            buckets=LATENCY_BUCKETS,
            registry=r,
        ).labels(*values)
        self.batch_requests = Histogram(
            "kvrank_batch_requests",
            "Requests each scoring pass scored (continuous batching: those queued together)",
            names,
            buckets=BATCH_BUCKETS,
            registry=r,
        ).labels(*values)
        self._requests(names, values)
        self._http_and_prefetch(names, values)
        self._values = values
        self._served = 0
        self._cached = 0

    def _requests(self, names: list[str], values: tuple[str, str]) -> None:
        """Scoring requests and their latency, by cache outcome and protocol."""
        r = self.registry
        requests = Counter(
            REQUESTS_METRIC.removesuffix("_total"),
            "Scoring requests by outcome and protocol",
            [*names, "outcome", "protocol"],
            registry=r,
        )
        each = [(o, p) for o in OUTCOMES for p in PROTOCOLS]
        self.requests = {(o, p): requests.labels(*values, o, p) for o, p in each}
        latency = Histogram(
            "kvrank_request_seconds",
            "Scoring latency (the whole request) by cache outcome and protocol",
            [*names, "outcome", "protocol"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.latency = {(o, p): latency.labels(*values, o, p) for o, p in each}

    def _http_and_prefetch(self, names: list[str], values: tuple[str, str]) -> None:
        r = self.registry
        prefetches = Counter(
            "kvrank_prefetches",
            "Prefetches (user side only, ahead of a ranking request) by what became of them",
            [*names, "result"],
            registry=r,
        )
        self.prefetches = {k: prefetches.labels(*values, k) for k in PREFETCH_RESULTS}
        by_reference = Counter(
            "kvrank_history_by_reference",
            "Scoring requests that sent their history by reference (a sequence hash), by"
            " result: served from the entry under it, extended (events_since: that entry"
            " extended with the events after it), or history_required (412, no model work)",
            [*names, "result"],
            registry=r,
        )
        self.by_reference = {k: by_reference.labels(*values, k) for k in BY_REFERENCE_RESULTS}
        self._responses = Counter(
            "kvrank_http_responses",
            "HTTP responses by route and status code (errors included)",
            [*names, "route", "code"],
            registry=r,
        )
        for route in SCORING_ROUTES:  # at 0 from the start: increase() sees their first ones
            for code in SCORE_CODES:
                self._responses.labels(*values, route, code)
        self._response_children: dict[tuple[str, int], Counter] = {}
        """``(route, code)`` → its counter: ``labels()`` takes a lock and checks every value
        each call, on every answer (a shed one too); routes × codes are few."""

    def add_reader(self, collector: Collector) -> None:
        """Export what ``collector`` reads at scrape time."""
        self.registry.register(collector)
        self.readers.register(collector)

    def watch_admission(self, admission: Admission, queue_depth: Callable[[], int]) -> None:
        """Export admission control's state (read at scrape time)."""
        self.add_reader(AdmissionCollector(admission, queue_depth, list(self._values)))

    def observe_response(self, route: str, code: int) -> None:
        child = self._response_children.get((route, code))
        if child is None:
            child = self._responses.labels(*self._values, route, str(code))
            self._response_children[(route, code)] = child
        child.inc()

    def observe_request(
        self, outcome: str, timings_ms: dict[str, float], protocol: str = "json"
    ) -> None:
        self.requests[outcome, protocol].inc()
        self.latency[outcome, protocol].observe(timings_ms["total"] / 1e3)
        for stage, ms in timings_ms.items():
            if stage != "total":
                self.stages[stage].observe(ms / 1e3)
        self._served += 1
        self._cached += outcome in CACHED_OUTCOMES
        self.hit_ratio.set(self._cached / self._served)


class AdmissionCollector(Collector):
    """Admission control's state at scrape time: what an autoscaler scales on (requests in
    the pod, model work queued, the wait a new request would face) and what was refused."""

    def __init__(self, admission: Admission, queue_depth: Callable[[], int], values: list[str]):
        self.admission, self.queue_depth, self.values = admission, queue_depth, values

    def collect(self) -> Iterator[Metric]:
        a, labels = self.admission, list(CONSTANT_LABELS)
        gauges = {
            "kvrank_inflight_requests": ("Admitted scoring requests in the pod", a.inflight),
            "kvrank_model_queue_depth": ("Model work queued for its thread", self.queue_depth()),
            "kvrank_estimated_wait_seconds": ("A new request's wait", a.estimated_wait_s()),
            "kvrank_request_model_seconds": ("Model time per request (mean)", a.cost_s),
            "kvrank_event_loop_lag_seconds": ("How far behind the event loop runs", a.loop_lag_s),
            "kvrank_caller_patience_seconds": (
                "The deadline given to callers that send none, learned from those that left"
                " (0: none left lately; the default deadline applies)",
                a.patience.estimate_s() or 0.0,
            ),
        }
        for name, (doc, value) in gauges.items():
            gauge = GaugeMetricFamily(name, doc, labels=labels)
            gauge.add_metric(self.values, value)
            yield gauge
        shed = CounterMetricFamily(
            "kvrank_shed_requests",
            "Requests refused before any model work (503), by reason",
            labels=[*labels, "reason"],
        )
        for reason in SHED_REASONS:
            shed.add_metric([*self.values, reason], a.stats.shed[reason])
        yield shed
        dropped = CounterMetricFamily(
            "kvrank_abandoned_requests",
            "Admitted requests whose work was dropped uncomputed, by reason and stage",
            labels=[*labels, "reason", "stage"],
        )
        for reason in ABANDON_REASONS:
            for stage in ABANDON_STAGES:
                dropped.add_metric([*self.values, reason, stage], a.stats.abandoned[reason, stage])
        yield dropped
        left = CounterMetricFamily(
            "kvrank_callers_left",
            "Scoring requests whose caller disconnected before the answer (their work still"
            " queued is dropped: kvrank_abandoned_requests)",
            labels=labels,
        )
        left.add_metric(self.values, a.stats.left)
        yield left
