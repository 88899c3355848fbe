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
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from kvrank_operator import manifests as m
from kvrank_operator.clock import iso, parse_iso
from kvrank_operator.conditions import set_condition
from kvrank_operator.errors import SpecError
from kvrank_operator.kube import Kube, Owner
from kvrank_operator.rollout import effective
from kvrank_operator.spec import RankerSpec, parse_spec
from kvrank_operator.ttl import (
    HIT_RATIO_METRIC,
    INTERVAL_METRIC,
    REQUESTS_METRIC,
    next_ttl,
    parse_gauge,
)

log = logging.getLogger("kvrank_operator.sources")
TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Observed:
    mean_interval_s: float | None = None
    """Mean per-user request interval, averaged over pods that measured one."""
    hit_ratio: float | None = None
    """Share of requests served from a cache, averaged over pods."""
    problem: tuple[str, str] | None = None
    """``(reason, message)`` when no interval could be measured: the ``TTLSource``
    condition says why (never only a log line)."""


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def from_pods(kube: Kube, spec: RankerSpec, name: str, ns: str) -> Observed:
    pods = kube.list(
        "v1",
        "Pod",
        ns,
        m.ranker_selector(name),
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
    problem = None
    if not means:
        why = f"none of {len(pods)} ranker pods has measured a user's request interval yet"
        problem = ("NoData", why)
    return Observed(_mean(means), _mean(ratios), problem)


Problem = tuple[str, str]


def instant_query(url: str, query: str) -> tuple[float | None, Problem | None]:
    """One instant query's first value, or why there is none."""
    full = f"{url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    try:
        with urllib.request.urlopen(full, timeout=TIMEOUT_S) as resp:
            doc = json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # Prometheus answers a bad query with 400
        return None, ("QueryFailed", f"{query}: HTTP {exc.code} from {url}")
    except (OSError, ValueError) as exc:
        return None, ("PrometheusUnreachable", f"{url}: {exc}")
    results = doc.get("data", {}).get("result", [])
    if not results:
        return None, ("NoData", f"no series for {query} (is a PodMonitor scraping the pods?)")
    value = float(results[0]["value"][1])
    if not math.isfinite(value):  # 0/0 of a ratio of rates without traffic: NaN
        return None, ("NoData", f"{query} is {value} (no requests in its window?)")
    return value, None


HIT_RATIO_WINDOW = "2m"
"""The hit ratio published is over this window (a lifetime ratio could not show a drop)."""


def from_prometheus(url: str, name: str, ns: str) -> Observed:
    sel = m.PROMETHEUS_SELECTOR.format(ns=ns, name=name)
    cached = f'{sel[:-1]},outcome=~"l1|l2|incremental"}}'
    served = f'{sel[:-1]},outcome!="none"}}'
    window = HIT_RATIO_WINDOW
    mean, problem = instant_query(url, f"avg({INTERVAL_METRIC}{sel} > 0)")
    ratio, _ = instant_query(
        url,
        f"sum(rate({REQUESTS_METRIC}{cached}[{window}]))"
        f" / sum(rate({REQUESTS_METRIC}{served}[{window}]))",
    )
    return Observed(mean, ratio, problem)


def observe(kube: Kube, spec: RankerSpec, name: str, ns: str) -> Observed:
    if spec.ttl.source == "prometheus" and spec.ttl.prometheus_url:
        return from_prometheus(spec.ttl.prometheus_url, name, ns)
    return from_pods(kube, spec, name, ns)


_MEASURED: dict[str, dt.datetime] = {}
"""RankerDeployment uid → when its pods were last measured (in memory: a measurement that
changes nothing writes nothing; after a restart, status.observedAt tells)."""


def source_condition(
    status: dict[str, Any], seen: Observed, spec: RankerSpec, generation: int, now: dt.datetime
) -> list[dict[str, Any]]:
    """The conditions with ``TTLSource`` set from this measurement."""
    copy = {"conditions": [dict(c) for c in status.get("conditions") or []]}
    if seen.problem is None:
        # no number here: a message that changes with every measurement is a write each time
        message = f"request intervals measured from {spec.ttl.source}"
        set_condition(copy, "TTLSource", True, "Measured", message, generation, now)
    else:
        reason, message = seen.problem
        set_condition(copy, "TTLSource", False, reason, message, generation, now)
    conditions: list[dict[str, Any]] = copy["conditions"]
    return conditions


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
        spec = effective(parse_spec(body.get("spec") or {}), status.get("canary"))
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
    if spec.ttl.mode == "auto":
        conditions = source_condition(status, seen, spec, int(meta.get("generation", 1)), now)
    else:  # a fixed TTL reads no source: no condition about one
        conditions = [c for c in status.get("conditions") or [] if c["type"] != "TTLSource"]
    if conditions != (status.get("conditions") or []):
        out["conditions"] = conditions
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
