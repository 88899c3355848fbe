"""Where the operator learns request intervals: the ranker pods' ``/metrics`` or Prometheus.

:func:`tune_ttl` fetches the mean per-user interval, applies the TTL policy with
hysteresis, and rewrites the ranker ConfigMap when the TTL changes (pods hot-reload it);
it returns the new ``status.ttl`` or ``None`` when nothing changed or it is not yet due.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import urllib.parse
import urllib.request
from typing import Any

from kvrank_operator import manifests as m
from kvrank_operator.errors import SpecError
from kvrank_operator.kube import Kube, Owner
from kvrank_operator.spec import RankerSpec, parse_spec
from kvrank_operator.ttl import INTERVAL_METRIC, next_ttl, parse_interval_means

log = logging.getLogger("kvrank_operator.sources")
TIMEOUT_S = 3.0


def from_pods(kube: Kube, spec: RankerSpec, name: str, ns: str) -> float | None:
    pods = kube.list(
        "v1",
        "Pod",
        ns,
        {"app.kubernetes.io/instance": name, "app.kubernetes.io/component": "ranker"},
    )
    means = []
    for pod in pods:
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            continue
        try:
            with urllib.request.urlopen(
                f"http://{ip}:{spec.port}/metrics", timeout=TIMEOUT_S
            ) as resp:
                means += parse_interval_means(resp.read().decode())
        except OSError as exc:
            log.debug("scrape %s failed: %s", ip, exc)
    return sum(means) / len(means) if means else None


def from_prometheus(url: str, name: str, ns: str) -> float | None:
    query = (
        f'avg({INTERVAL_METRIC}{{kubernetes_namespace="{ns}",instance_name="{name}"}} > 0)'
        f" or avg({INTERVAL_METRIC} > 0)"
    )
    full = f"{url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    try:
        with urllib.request.urlopen(full, timeout=TIMEOUT_S) as resp:
            doc = json.loads(resp.read())
    except (OSError, ValueError) as exc:
        log.warning("prometheus query failed: %s", exc)
        return None
    results = doc.get("data", {}).get("result", [])
    return float(results[0]["value"][1]) if results else None


def tune_ttl(kube: Kube, body: dict[str, Any], now: dt.datetime) -> dict[str, Any] | None:
    meta = body["metadata"]
    try:
        spec = parse_spec(body.get("spec") or {})
    except SpecError:
        return None
    current = (body.get("status") or {}).get("ttl") or {}
    updated = current.get("updatedAt")
    if updated and spec.ttl.mode == "auto":
        age = (
            now - dt.datetime.strptime(updated, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
        ).total_seconds()
        if age < spec.ttl.interval_s:
            return None
    mean = None
    if spec.ttl.mode == "auto":
        if spec.ttl.source == "prometheus" and spec.ttl.prometheus_url:
            mean = from_prometheus(spec.ttl.prometheus_url, meta["name"], meta["namespace"])
        else:
            mean = from_pods(kube, spec, meta["name"], meta["namespace"])
    ttl = next_ttl(current.get("seconds"), mean, spec.ttl)
    if ttl is None:
        return None
    owner = Owner("kvrank.io/v1alpha1", "RankerDeployment", meta["name"], meta["uid"])
    kube.apply(m.config_map(spec, meta["name"], meta["namespace"], ttl), owner)
    return {
        "seconds": ttl,
        "meanIntervalSeconds": mean,
        "updatedAt": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "source": "fixed" if spec.ttl.mode == "fixed" else spec.ttl.source,
    }
