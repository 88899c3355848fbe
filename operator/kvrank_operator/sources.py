"""What the operator observes of its rankers: the ranker pods' ``/metrics`` or Prometheus.

:func:`observe` reads the mean per-user request interval and the cache hit ratio.
:func:`tune_ttl` applies the TTL policy with hysteresis to the interval and rewrites the
ranker ConfigMap when the TTL changes (pods hot-reload it). It returns the status fields
to update (``ttl``, ``hitRatio``), or ``None`` when it is not yet due or nothing changed.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from kvrank_operator import manifests as m
from kvrank_operator.clock import iso, parse_iso
from kvrank_operator.errors import SpecError
from kvrank_operator.kube import Kube, Owner
from kvrank_operator.spec import RankerSpec, parse_spec
from kvrank_operator.ttl import HIT_RATIO_METRIC, INTERVAL_METRIC, next_ttl, parse_gauge

log = logging.getLogger("kvrank_operator.sources")
TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Observed:
    mean_interval_s: float | None = None
    """Mean per-user request interval, averaged over pods that measured one."""
    hit_ratio: float | None = None
    """Share of requests served from a cache, averaged over pods."""


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def from_pods(kube: Kube, spec: RankerSpec, name: str, ns: str) -> Observed:
    pods = kube.list(
        "v1",
        "Pod",
        ns,
        {"app.kubernetes.io/instance": name, "app.kubernetes.io/component": "ranker"},
    )
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
    return Observed(_mean(means), _mean(ratios))


def _query(url: str, query: str) -> float | None:
    full = f"{url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    try:
        with urllib.request.urlopen(full, timeout=TIMEOUT_S) as resp:
            doc = json.loads(resp.read())
    except (OSError, ValueError) as exc:
        log.warning("prometheus query failed: %s", exc)
        return None
    results = doc.get("data", {}).get("result", [])
    return float(results[0]["value"][1]) if results else None


def from_prometheus(url: str, name: str, ns: str) -> Observed:
    def avg(metric: str, cond: str) -> str:
        sel = f'{metric}{{kubernetes_namespace="{ns}",instance_name="{name}"}}'
        return f"avg({sel}{cond})"

    return Observed(
        _query(url, avg(INTERVAL_METRIC, " > 0")), _query(url, avg(HIT_RATIO_METRIC, ""))
    )


def observe(kube: Kube, spec: RankerSpec, name: str, ns: str) -> Observed:
    if spec.ttl.source == "prometheus" and spec.ttl.prometheus_url:
        return from_prometheus(spec.ttl.prometheus_url, name, ns)
    return from_pods(kube, spec, name, ns)


_MEASURED: dict[str, dt.datetime] = {}
"""RankerDeployment uid → when its pods were last measured (in memory: a measurement that
changes nothing writes nothing; after a restart, status.observedAt tells)."""


def next_measurement_in(body: dict[str, Any], now: dt.datetime) -> float:
    """Seconds until :func:`tune_ttl` is due to measure again (``inf``: never)."""
    try:
        spec = parse_spec(body.get("spec") or {})
    except SpecError:
        return math.inf
    last = _MEASURED.get(body["metadata"]["uid"])
    if last is None:
        return 0.0
    return spec.ttl.interval_seconds - (now - last).total_seconds()


def tune_ttl(kube: Kube, body: dict[str, Any], now: dt.datetime) -> dict[str, Any] | None:
    """Status fields to publish (``None``: nothing changed or nothing was due)."""
    meta, status = body["metadata"], body.get("status") or {}
    try:
        spec = parse_spec(body.get("spec") or {})
    except SpecError:
        return None
    current = status.get("ttl") or {}
    observed_at = _MEASURED.get(meta["uid"])
    if observed_at is None and (status.get("observedAt") or current.get("updatedAt")):
        observed_at = parse_iso(status.get("observedAt") or current["updatedAt"])
    fixed_changed = spec.ttl.mode == "fixed" and current.get("seconds") != spec.ttl.fixed_seconds
    due = not observed_at or (now - observed_at).total_seconds() >= spec.ttl.interval_seconds
    if not (due or fixed_changed):  # a new fixed TTL applies at once
        return None
    _MEASURED[meta["uid"]] = now
    seen = observe(kube, spec, meta["name"], meta["namespace"])
    out: dict[str, Any] = {}
    if seen.hit_ratio is not None and round(seen.hit_ratio, 3) != status.get("hitRatio"):
        out["hitRatio"] = round(seen.hit_ratio, 3)
    mean = seen.mean_interval_s if spec.ttl.mode == "auto" else None
    ttl = next_ttl(current.get("seconds"), mean, spec.ttl)
    if ttl is not None:
        owner = Owner("kvrank.io/v1alpha1", "RankerDeployment", meta["name"], meta["uid"])
        kube.apply(m.config_map(spec, meta["name"], meta["namespace"], ttl), owner)
        out["ttl"] = {
            "seconds": ttl,
            "meanIntervalSeconds": mean,
            "updatedAt": iso(now),
            "source": "fixed" if spec.ttl.mode == "fixed" else spec.ttl.source,
        }
    if not out:
        return None
    out["observedAt"] = iso(now)  # when the published values last changed
    return out
