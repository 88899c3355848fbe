"""TTL tuning: ``ttl = clamp(mean per-user request interval × factor, min, max)``.

Pure functions over metric samples, with hysteresis so a jittery measurement does not
rewrite the ConfigMap (and every pod's config) on each tick. Fetching the samples (pod
scrapes or a Prometheus query) lives in ``sources``.
"""

from __future__ import annotations

from kvrank_operator.spec import TTLSpec

HYSTERESIS = 0.10
"""Ignore a new TTL within ±10 % of the current one."""
INTERVAL_METRIC = "kvrank_user_interval_mean_seconds"


def parse_interval_means(text: str) -> list[float]:
    """Per-pod mean intervals from Prometheus text exposition (0 means "not measured")."""
    values = []
    for line in text.splitlines():
        if line.startswith(INTERVAL_METRIC + "{") or line.startswith(INTERVAL_METRIC + " "):
            value = float(line.rsplit(" ", 1)[1])
            if value > 0:
                values.append(value)
    return values


def target_ttl(mean_interval_s: float, spec: TTLSpec) -> float:
    return min(max(mean_interval_s * spec.factor, spec.min_s), spec.max_s)


def next_ttl(current: float | None, mean_interval_s: float | None, spec: TTLSpec) -> float | None:
    """The TTL to publish, or ``None`` to keep the current one."""
    if spec.mode == "fixed":
        return None if current == spec.fixed_s else spec.fixed_s
    if mean_interval_s is None:
        return None
    target = round(target_ttl(mean_interval_s, spec), 3)
    if current is not None and abs(target - current) <= HYSTERESIS * current:
        return None
    return target
