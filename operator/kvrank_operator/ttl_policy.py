"""TTL tuning: ``ttl = clamp(mean per-user request interval × factor, min, max)``.

Pure functions over metric samples, with hysteresis so a jittery measurement does not
rewrite the ConfigMap (and every pod's config) on each tick. Fetching the samples (pod
scrapes or a Prometheus query) lives in ``sources``.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from kvrank_common import INTERVAL_METRIC, clamp_ttl
from kvrank_operator.spec import TTLSpec

HYSTERESIS = 0.10
"""Ignore a new TTL within ±10 % of the current one."""


def parse_gauge(text: str, name: str, positive: bool = False) -> list[float]:
    """Every sample of gauge ``name`` in Prometheus text exposition (one per pod and label
    set); ``positive`` drops zeros, which rankers export for "not measured yet"."""
    return [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and (sample.value > 0 or not positive)
    ]


def parse_interval_means(text: str) -> list[float]:
    """Per-pod mean intervals from Prometheus text exposition (0 means "not measured")."""
    return parse_gauge(text, INTERVAL_METRIC, positive=True)


def target_ttl(mean_interval_s: float, spec: TTLSpec) -> float:
    return clamp_ttl(mean_interval_s, spec.factor, spec.min_seconds, spec.max_seconds)


def next_ttl(current: float | None, mean_interval_s: float | None, spec: TTLSpec) -> float | None:
    """The TTL to publish, or ``None`` to keep the current one."""
    if spec.mode == "fixed":
        return None if current == spec.fixed_seconds else spec.fixed_seconds
    if mean_interval_s is None:
        return None
    target = round(target_ttl(mean_interval_s, spec), 3)
    if current is not None and abs(target - current) <= HYSTERESIS * current:
        return None
    return target
