"""The cache's Prometheus collector: reads the tiers' counters and state at scrape time.

The tiers keep plain monotonic totals (no Prometheus objects on the request path, nothing
reset); this collector turns them into metric families when ``/metrics`` is read. The
process-constant labels (model version, cache namespace) are bound once, here.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvrank.cache.entry import Reason
from kvrank.cache.host import HostStore
from kvrank.cache.l1 import L1Store
from kvrank.cache.redis_store import RedisStore
from kvrank.cache.tiered import TieredCache
from kvrank_common import INTERVAL_METRIC

CONSTANT_LABELS = ("model_version", "cache_namespace")
"""``cache_namespace``, not ``namespace``: Prometheus adds a ``namespace`` target label (the
pod's Kubernetes namespace), which would push this one aside to ``exported_namespace``."""


class CacheCollector(Collector):
    """The cache's lookups, single-flight and TTL, and the state of the tiers the server
    built it from (their own counters: L1's and the host tier's bytes and evictions, Redis's
    errors and bytes read)."""

    def __init__(
        self,
        cache: TieredCache,
        l1: L1Store,
        l2: RedisStore | None,
        host: HostStore | None = None,
    ) -> None:
        self.cache, self.l1, self.l2, self.host = cache, l1, l2, host
        self.values = [cache.settings.model_version, cache.settings.namespace]

    def collect(self) -> Iterator[Metric]:
        yield from self._lookups()
        yield from self._flight()
        yield from self._l1()
        yield from self._l2()
        yield from self._ttl()

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=CONSTANT_LABELS)
        family.add_metric(self.values, value)
        return family

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=CONSTANT_LABELS)
        family.add_metric(self.values, value)
        return family

    def _lookups(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "kvrank_cache_lookups",
            "Cache lookups on the request path by tier and result",
            labels=[*CONSTANT_LABELS, "tier", "result"],
        )
        for (tier, result), n in sorted(self.cache.stats.lookups.items()):
            family.add_metric([*self.values, tier, result], n)
        yield family
        corrupt = CounterMetricFamily(
            "kvrank_cache_corrupt_entries",
            "Cache entries refused, by reason (deleted and served as misses): a shared"
            " tier's that do not open, any tier's whose scores were not finite (scores)",
            labels=[*CONSTANT_LABELS, "reason"],
        )
        for reason in Reason:  # every reason, so a rate over a new one starts at 0
            n = self.cache.stats.corrupt.get(reason.value, 0)
            corrupt.add_metric([*self.values, reason.value], n)
        yield corrupt
        yield self._counter(
            "kvrank_cache_l2_writes_dropped",
            "New entries kept in L1 only: too many L2 writes were still in flight",
            self.cache.stats.writes_dropped,
        )

    def _flight(self) -> Iterator[Metric]:
        stats = self.cache.flight.stats
        family = CounterMetricFamily(
            "kvrank_singleflight",
            "Stampede protection: in-process sharing and waits on another pod's lock",
            labels=[*CONSTANT_LABELS, "event"],
        )
        events = {
            "shared": stats.shared,
            "remote_wait": stats.remote_waits,
            "remote_hit": stats.remote_hits,
            "remote_timeout": stats.remote_timeouts,
        }
        for event, n in events.items():
            family.add_metric([*self.values, event], n)
        yield family

    def _l1(self) -> Iterator[Metric]:
        l1 = self.l1
        yield self._gauge("kvrank_l1_bytes", "Bytes held by L1", l1.nbytes)
        yield self._gauge("kvrank_l1_budget_bytes", "Bytes L1 may hold", l1.budget_bytes)
        yield self._gauge("kvrank_l1_entries", "Entries held by L1", len(l1))
        yield self._counter("kvrank_l1_evictions", "L1 evictions", l1.stats.evictions)
        host = self.host
        if host is not None:  # the host-memory tier: L1's evictions, while they have TTL left
            yield self._gauge("kvrank_host_bytes", "Bytes held by the host tier", host.nbytes)
            yield self._gauge("kvrank_host_entries", "Entries held by the host tier", len(host))
            yield self._counter(
                "kvrank_host_evictions", "Host tier evictions (gone for good)", host.stats.evictions
            )

    def _l2(self) -> Iterator[Metric]:
        l2 = self.l2
        errors = l2.stats.errors if l2 is not None else 0
        is_open = l2 is not None and l2.breaker.state == "open"
        yield self._counter("kvrank_redis_errors", "Redis errors and timeouts", errors)
        read = l2.stats.bytes_read if l2 is not None else 0
        yield self._counter("kvrank_redis_read_bytes", "Entry bytes read from Redis", read)
        yield self._gauge(
            "kvrank_redis_circuit_open", "1 while the L2 breaker is open", float(is_open)
        )

    def _ttl(self) -> Iterator[Metric]:
        ttl = self.cache.ttl
        yield self._gauge("kvrank_cache_ttl_seconds", "TTL applied to new entries", ttl.current())
        yield self._gauge(
            INTERVAL_METRIC,
            "Mean per-user request interval (each user weighted equally); 0 until measured",
            ttl.tracker.mean() or 0.0,
        )
