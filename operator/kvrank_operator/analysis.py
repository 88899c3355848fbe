"""Canary analysis: what the stable and canary versions did over a window, and the checks.

A window is a set of additive counts per version (:class:`Counts`: requests, cache hits,
responses, 5xx, latency and shadow-comparison histogram buckets), read either from the
ranker pods' ``/metrics`` — each pod's counters minus what they were when the window
opened — or from Prometheus (``increase(...[window])``). The same :func:`evaluate` judges
both: a check with too few samples, no data or NaN is **inconclusive**, never a pass.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from prometheus_client.parser import text_string_to_metric_families

from kvrank_common import CACHED_OUTCOMES, REQUESTS_METRIC
from kvrank_operator import manifests as m
from kvrank_operator.prometheus import Prometheus, QueryError
from kvrank_operator.spec import CHECKS, Check, PrometheusEndpoint, RankerSpec

SCORE_ROUTES = "/v1/score|/v2/models/.+/infer|/inference[.]GRPCInferenceService/ModelInfer"
"""The routes a ranker answers scoring requests on (a regular expression, fully matched as
PromQL does): the JSON API, the Open Inference Protocol's HTTP ``infer`` (with or without a
version) and its gRPC ``ModelInfer`` — a canary's errors count whichever protocol served them."""
_SCORING = re.compile(SCORE_ROUTES)
RESPONSES_METRIC = "kvrank_http_responses_total"
SHADOW_METRIC = "kvrank_shadow_requests_total"
TOPK_METRIC = "kvrank_shadow_topk_changed_total"
TIMEOUT_S = 3.0
Counts = dict[str, float]
"""Additive counts of one version over a window: ``requests``, ``cached``, ``responses``,
``errors``, ``shadow_sent``, ``shadow_topk_changed`` and histogram buckets as
``latency_le:<bound>``, ``delta_le:<bound>``, ``rank_le:<bound>`` (cumulative, like
Prometheus's ``le``)."""
HISTOGRAMS = {
    "kvrank_request_seconds_bucket": "latency_le",
    "kvrank_shadow_abs_delta_bucket": "delta_le",
    "kvrank_shadow_rank_correlation_bucket": "rank_le",
}


# --------------------------------------------------------------------------- counts


def counts_from_text(text: str) -> dict[str, Counts]:
    """model version → its counts, from one pod's Prometheus text exposition."""
    out: dict[str, Counts] = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            version = s.labels.get("model_version")
            if version is None:
                continue
            _add(out[version], s.name, s.labels, s.value)
    return dict(out)


def _add(c: Counts, name: str, labels: dict[str, str], value: float) -> None:
    def inc(key: str) -> None:
        c[key] = c.get(key, 0.0) + value

    if name == REQUESTS_METRIC and labels.get("outcome") != "none":
        inc("requests")
        if labels.get("outcome") in CACHED_OUTCOMES:
            inc("cached")
    elif name == RESPONSES_METRIC and _SCORING.fullmatch(labels.get("route", "")):
        inc("responses")
        if labels.get("code", "").startswith("5"):
            inc("errors")
    elif name == SHADOW_METRIC and labels.get("result") == "sent":
        inc("shadow_sent")
    elif name == TOPK_METRIC:
        inc("shadow_topk_changed")
    elif name in HISTOGRAMS:
        inc(f"{HISTOGRAMS[name]}:{_le(labels['le'])}")


def _le(bound: str) -> str:
    """One spelling per bucket bound (``1``, ``1.0`` and ``+Inf`` as the clients write them)."""
    return "+Inf" if math.isinf(float(bound)) else repr(float(bound))


def subtract(now: Counts, then: Counts) -> Counts:
    """What was counted between two readings of one pod; a counter that went down (the
    container restarted) counts from zero."""
    if any(now.get(k, 0.0) < v for k, v in then.items()):
        return dict(now)
    return {k: v - then.get(k, 0.0) for k, v in now.items()}


def total(parts: list[Counts]) -> Counts:
    out: Counts = defaultdict(float)
    for part in parts:
        for k, v in part.items():
            out[k] += v
    return dict(out)


def quantile(q: float, c: Counts, prefix: str) -> float | None:
    """``histogram_quantile`` as Prometheus computes it over the ``prefix`` buckets (linear
    within a bucket; the first bucket starts at 0 unless its bound is below; a rank in the
    +Inf bucket gives the highest finite bound); ``None`` without observations."""
    buckets = sorted(
        (float(k.split(":", 1)[1]), v) for k, v in c.items() if k.startswith(prefix + ":")
    )
    if len(buckets) < 2 or not math.isinf(buckets[-1][0]) or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    i = next(i for i, (_, count) in enumerate(buckets) if count >= rank)
    upper, count = buckets[i]
    if math.isinf(upper):
        return buckets[-2][0]
    if i == 0:
        if upper <= 0:
            return upper
        lower, below = 0.0, 0.0
    else:
        lower, below = buckets[i - 1]
    return lower + (upper - lower) * (rank - below) / (count - below) if count > below else upper


# --------------------------------------------------------------------------- windows


@dataclass
class Window:
    canary: Counts = field(default_factory=dict)
    stable: Counts = field(default_factory=dict)
    problem: str | None = None
    """Why nothing could be read (Prometheus unreachable, a query refused)."""


PodReadings = dict[str, dict[str, Counts]]
"""pod uid → model version → counts."""


def read_pods(pods: list[dict[str, Any]], spec: RankerSpec) -> PodReadings:
    """Every ranker pod's counters now (pods that do not answer are left out)."""
    out: PodReadings = {}
    for pod in pods:
        ip = (pod.get("status") or {}).get("podIP")
        if not ip or pod["metadata"].get("deletionTimestamp"):
            continue
        try:
            url = f"http://{ip}:{spec.port}/metrics"
            with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
                out[pod["metadata"]["uid"]] = counts_from_text(resp.read().decode())
        except OSError:
            continue
    return out


def pods_window(baseline: PodReadings, now: PodReadings, stable: str, canary: str) -> Window:
    """Counts since ``baseline`` was read, per version; a pod that started since counts
    from zero."""
    per_version: dict[str, list[Counts]] = defaultdict(list)
    for uid, versions in now.items():
        for version, counts in versions.items():
            then = baseline.get(uid, {}).get(version, {})
            per_version[version].append(subtract(counts, then))
    return Window(total(per_version[canary]), total(per_version[stable]))


class Windows:
    """Opens and reads the windows a rollout asks for (``rollout.ReadWindow``).

    From pods: the counters each pod had when a window opened are kept here, in memory (one
    open window per RankerDeployment); after an operator restart the window reopens, so a
    step's analysis starts over — never judged on what it did not see. From Prometheus: the
    window is ``increase()`` over the seconds since it opened."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[str, PodReadings]] = {}
        """RankerDeployment uid → (window key, every pod's counters when it opened)."""

    def reader(
        self,
        pods: Callable[[], list[dict[str, Any]]],
        spec: RankerSpec,
        name: str,
        ns: str,
        uid: str,
        now: dt.datetime,
    ) -> Callable[[str, dt.datetime], Window]:
        """``pods``: the instance's ranker pods as the pass observed them."""
        assert spec.canary is not None
        stable, canary, a = spec.model.version, spec.canary.version, spec.canary.analysis

        def read(key: str, since: dt.datetime) -> Window:
            if a.source == "prometheus" and a.prometheus is not None:
                seconds = (now - since).total_seconds()
                return prometheus_window(a.prometheus, name, ns, stable, canary, seconds)
            readings = read_pods(pods(), spec)
            opened = self._open.get(uid)
            if opened is None or opened[0] != key:
                self._open[uid] = opened = (key, readings)
            return pods_window(opened[1], readings, stable, canary)

        return read

    def close(self, uid: str) -> None:
        self._open.pop(uid, None)


def prometheus_window(
    endpoint: PrometheusEndpoint, name: str, ns: str, stable: str, canary: str, seconds: float
) -> Window:
    """Counts over the last ``seconds`` from Prometheus (the series a PodMonitor gives the
    ranker pods; see ``manifests.PROMETHEUS_SELECTOR``)."""
    window = Window()
    with Prometheus(endpoint) as prometheus:
        for version, target in ((canary, window.canary), (stable, window.stable)):
            for key, query in _window_queries(ns, name, version, seconds).items():
                try:
                    rows = prometheus.query(query)
                except QueryError as exc:
                    return Window(problem=f"{exc.reason}: {exc.message}")
                for labels, value in rows:
                    _add_prometheus(target, key, labels, value)
    return window


def _window_queries(ns: str, name: str, version: str, seconds: float) -> dict[str, str]:
    """What :func:`prometheus_window` asks for one version: counter increases by label."""
    rng = f"[{max(1, int(seconds))}s]"
    sel = _selector(ns, name, model_version=version)
    score = _selector(ns, name, model_version=version)[:-1] + f',route=~"{SCORE_ROUTES}"}}'
    return {
        "requests": f"sum by (outcome) (increase({REQUESTS_METRIC}{sel}{rng}))",
        "responses": f"sum by (code) (increase({RESPONSES_METRIC}{score}{rng}))",
        "shadow": f"sum by (result) (increase({SHADOW_METRIC}{sel}{rng}))",
        "topk": f"sum(increase({TOPK_METRIC}{sel}{rng}))",
        **{
            prefix: f"sum by (le) (increase({metric}{sel}{rng}))"
            for metric, prefix in HISTOGRAMS.items()
        },
    }


def _selector(ns: str, name: str, **labels: str) -> str:
    """One RankerDeployment's series (``manifests.PROMETHEUS_SELECTOR``), more labels."""
    extra = "".join(f',{k}="{v}"' for k, v in labels.items())
    return m.PROMETHEUS_SELECTOR.format(ns=ns, name=name)[:-1] + extra + "}"


def _add_prometheus(c: Counts, key: str, labels: dict[str, str], value: float) -> None:
    if not math.isfinite(value):
        return
    if key == "requests":
        _add(c, REQUESTS_METRIC, labels, value)
    elif key == "responses":
        # the query kept the scoring routes only (SCORE_ROUTES) and summed them: any one of
        # those routes stands for them here
        _add(c, RESPONSES_METRIC, {**labels, "route": "/v1/score"}, value)
    elif key == "shadow":
        _add(c, SHADOW_METRIC, labels, value)
    elif key == "topk":
        _add(c, TOPK_METRIC, labels, value)
    else:
        bucket = f"{key}:{_le(labels['le'])}"
        c[bucket] = c.get(bucket, 0.0) + value


# --------------------------------------------------------------------------- checks


@dataclass(frozen=True)
class Result:
    metric: str
    check: Check
    value: float | None
    samples: float

    @property
    def verdict(self) -> Literal["pass", "fail", "inconclusive"]:
        if self.value is None or not math.isfinite(self.value):
            return "inconclusive"
        if self.samples < self.check.min_samples:
            return "inconclusive"
        ok = (
            self.value <= self.check.value
            if self.check.bound == "max"
            else (self.value >= self.check.value)
        )
        return "pass" if ok else "fail"

    def describe(self) -> str:
        shown = "no data" if self.value is None else f"{self.value:.4g}"
        q = f" (q{self.check.quantile:g})" if self.check.quantile is not None else ""
        return (
            f"{self.metric}{q} {shown}, {self.check.bound} {self.check.value:g},"
            f" {self.samples:.0f}/{self.check.min_samples} samples"
        )

    def status(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "value": None if self.value is None else round(self.value, 6),
            self.check.bound: self.check.value,
            "samples": int(self.samples),
            "minSamples": self.check.min_samples,
            "result": self.verdict,
        }


def ratio(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


RATIOS = {
    "errorRatio": ("canary", "errors", "responses"),
    "hitRatio": ("canary", "cached", "requests"),
    "topKChangedRatio": ("stable", "shadow_topk_changed", "shadow_sent"),  # stable pods compare
}
"""Checks that are a ratio of two counts: (whose counts, part, whole = the samples)."""


def measure(metric: str, check: Check, w: Window) -> Result:
    """One check's value over the window and the samples behind it."""
    c, s = w.canary, w.stable
    q = check.quantile if check.quantile is not None else 0.5
    if metric == "p99LatencyRatio":
        mine, theirs = quantile(0.99, c, "latency_le"), quantile(0.99, s, "latency_le")
        value = mine / theirs if mine is not None and theirs else None
        samples = min(c.get("latency_le:+Inf", 0.0), s.get("latency_le:+Inf", 0.0))
        return Result(metric, check, value, samples)
    if metric in RATIOS:
        side, part, whole = RATIOS[metric]
        counts = c if side == "canary" else s
        samples = counts.get(whole, 0.0)
        return Result(metric, check, ratio(counts.get(part, 0.0), samples), samples)
    sent = s.get("shadow_sent", 0.0)  # the stable pods compare
    if metric == "scoreDelta":
        return Result(metric, check, quantile(q, s, "delta_le"), sent)
    if metric == "rankCorrelation":
        return Result(metric, check, quantile(q, s, "rank_le"), sent)
    raise ValueError(f"unknown analysis metric {metric!r} (known: {', '.join(CHECKS)})")


def evaluate(checks: dict[str, Check], w: Window) -> list[Result]:
    return [measure(metric, check, w) for metric, check in checks.items()]
