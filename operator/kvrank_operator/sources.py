"""What the operator measures of its rankers: the ranker pods' ``/metrics`` or Prometheus.

:func:`measure` reads the mean per-user request interval and the cache hit ratio, or says
why it could not (``Measured.problem``). It decides nothing: the TTL reconciler
(:mod:`kvrank_operator.reconcilers.ttl`) turns the measurement into a TTL.
"""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvrank_common import CACHED_OUTCOMES, HIT_RATIO_METRIC, INTERVAL_METRIC, REQUESTS_METRIC
from kvrank_operator import manifests as m
from kvrank_operator.prometheus import Prometheus, QueryError
from kvrank_operator.spec import PrometheusEndpoint, RankerSpec
from kvrank_operator.ttl_policy import parse_gauge

log = logging.getLogger("kvrank_operator.sources")
TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Measured:
    """One measurement of a deployment's rankers (the pods' or Prometheus' view)."""

    mean_interval_s: float | None = None
    """Mean per-user request interval, averaged over pods that measured one."""
    hit_ratio: float | None = None
    """Share of requests served from a cache, averaged over pods."""
    problem: tuple[str, str] | None = None
    """``(reason, message)`` when no interval could be measured: the ``TTLSource``
    condition says why (never only a log line)."""


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


Pods = Callable[[], list[dict[str, Any]]]
"""The instance's ranker pods, as the pass observed them (read only when called)."""


def from_pods(pods: list[dict[str, Any]], spec: RankerSpec) -> Measured:
    """Each ranker pod's ``/metrics``, scraped."""
    means: list[float] = []
    ratios: list[float] = []
    for pod in pods:
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            continue
        try:
            with urllib.request.urlopen(
                f"http://{ip}:{spec.port}/metrics", timeout=TIMEOUT_S
            ) as resp:
                text = resp.read().decode()
        except OSError as exc:
            log.debug("scrape %s failed: %s", ip, exc)
            continue
        means += parse_gauge(text, INTERVAL_METRIC, positive=True)
        ratios += parse_gauge(text, HIT_RATIO_METRIC)
    problem = None
    if not means:
        why = f"none of {len(pods)} ranker pods has measured a user's request interval yet"
        problem = ("NoData", why)
    return Measured(_mean(means), _mean(ratios), problem)


HIT_RATIO_WINDOW = "2m"
"""The hit ratio published is over this window (a lifetime ratio could not show a drop)."""


def from_prometheus(endpoint: PrometheusEndpoint, name: str, ns: str) -> Measured:
    sel = m.PROMETHEUS_SELECTOR.format(ns=ns, name=name)
    cached = f'{sel[:-1]},outcome=~"{"|".join(CACHED_OUTCOMES)}"}}'
    served = f'{sel[:-1]},outcome!="none"}}'
    window = HIT_RATIO_WINDOW
    with Prometheus(endpoint) as prometheus:
        mean, problem = _value(prometheus, f"avg({INTERVAL_METRIC}{sel} > 0)")
        ratio, _ = _value(
            prometheus,
            f"sum(rate({REQUESTS_METRIC}{cached}[{window}]))"
            f" / sum(rate({REQUESTS_METRIC}{served}[{window}]))",
        )
    return Measured(mean, ratio, problem)


def _value(prometheus: Prometheus, query: str) -> tuple[float | None, tuple[str, str] | None]:
    try:
        return prometheus.first_value(query), None
    except QueryError as exc:
        return None, (exc.reason, exc.message)


def measure(pods: Pods, spec: RankerSpec, name: str, ns: str) -> Measured:
    if spec.ttl.source == "prometheus" and spec.ttl.prometheus is not None:
        return from_prometheus(spec.ttl.prometheus, name, ns)
    return from_pods(pods(), spec)
