"""Where the TTL tuner reads request intervals, and what it says when it cannot: a real
Prometheus (Debian's) asked the queries the operator sends; an empty answer or an
unreachable server becomes the ``TTLSource`` condition with a reason, never just a log
line. (The full chain — ranker pods scraped with PodMonitor labels, the TTL converging — is
the end-to-end suite's.)"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator

import pytest
import yaml

from kvrank.tools.processes import PrometheusServer, free_port
from kvrank_operator.manifests import config_map
from kvrank_operator.prometheus import Prometheus, QueryError
from kvrank_operator.reconcilers.base import Pass
from kvrank_operator.reconcilers.ttl import reconcile as reconcile_ttl
from kvrank_operator.reconcilers.ttl import source_condition
from kvrank_operator.sources import Measured, from_prometheus
from kvrank_operator.spec import PrometheusEndpoint, parse_spec
from kvrank_operator.state import Condition, Instance, Status, with_conditions

NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusEndpoint]:
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus"), {"scrape_configs": []})
    server.start()
    try:
        yield PrometheusEndpoint(server.url)
    finally:
        server.stop()


def test_no_series_is_no_data_naming_the_query_and_its_podmonitor_labels(
    prometheus: PrometheusEndpoint,
) -> None:
    seen = from_prometheus(prometheus, "feed", "prod")
    assert seen.mean_interval_s is None and seen.problem is not None
    reason, message = seen.problem
    assert reason == "NoData"
    assert 'namespace="prod"' in message and 'app_kubernetes_io_instance="feed"' in message


def test_an_unreachable_prometheus_says_so() -> None:
    seen = from_prometheus(PrometheusEndpoint(f"http://127.0.0.1:{free_port()}"), "feed", "prod")
    assert seen.problem is not None and seen.problem[0] == "PrometheusUnreachable"


def _condition(
    before: tuple[Condition, ...], seen: Measured, at: dt.datetime
) -> tuple[Condition, ...]:
    spec = parse_spec({"model": {"version": "v1", "uri": "/m"}})
    return with_conditions(before, [source_condition(seen, spec)], [], 3, at)


def test_the_condition_tells_why_and_flips_once_intervals_are_measured() -> None:
    missing = _condition((), Measured(problem=("NoData", "no series")), NOW)
    (c,) = (x.for_storage() for x in missing)
    assert (c["type"], c["status"], c["reason"], c["observedGeneration"]) == (
        "TTLSource",
        "False",
        "NoData",
        3,
    )
    later = NOW + dt.timedelta(minutes=1)
    measured = _condition(missing, Measured(2.0, 0.9), later)
    (c,) = (x.for_storage() for x in measured)
    assert (c["status"], c["reason"]) == ("True", "Measured")
    assert c["lastTransitionTime"] != missing[0].last_transition_time
    # measured again: nothing changes, so nothing is written
    again = _condition(measured, Measured(2.5, 0.8), later + dt.timedelta(minutes=1))
    assert again == measured


def _no_pods() -> list[dict]:
    raise AssertionError("a Prometheus source reads no pods")


def _pass(spec: dict, status: Status) -> Pass:
    instance = Instance("feed", "prod", "uid-1", 3)
    return Pass(None, instance, parse_spec(spec), status, NOW)  # type: ignore[arg-type]


def test_the_tuner_measures_when_due_says_why_it_has_no_interval_and_waits_its_period(
    prometheus: PrometheusEndpoint,
) -> None:
    ttl = {"mode": "auto", "source": {"type": "prometheus", "prometheus": {"url": prometheus.url}}}
    spec = {"model": {"version": "v1", "uri": "/m"}, "ttl": {**ttl, "intervalSeconds": 60}}
    p = _pass(spec, Status())
    tuned, report = reconcile_ttl(p, p.spec, None, _no_pods)
    assert tuned.measured and tuned.ttl is None  # no interval measured: no TTL invented
    (c,) = report.conditions
    assert (c.type, c.ok, c.reason) == ("TTLSource", False, "NoData")
    assert report.due_in == 60
    # measured 20 s ago by this process: not due, nothing read, nothing changes
    later = dataclasses.replace(p, now=NOW + dt.timedelta(seconds=20))
    again, waiting = reconcile_ttl(later, p.spec, NOW, _no_pods)
    assert not again.measured and waiting.conditions == () and waiting.due_in == 40


def test_a_fixed_ttl_is_published_at_once_and_drops_the_source_condition(
    prometheus: PrometheusEndpoint,
) -> None:
    source = {"type": "prometheus", "prometheus": {"url": prometheus.url}}  # the hit ratio's
    ttl = {"mode": "fixed", "fixedSeconds": 42, "source": source}
    spec = {"model": {"version": "v1", "uri": "/m"}, "ttl": ttl}
    earlier = Condition("TTLSource", False, "NoData", "none", 2, "2026-11-30T11:00:00Z")
    p = _pass(spec, Status(conditions=(earlier,), observed_at="2026-11-30T11:59:50Z"))
    tuned, report = reconcile_ttl(p, p.spec, NOW, _no_pods)  # due or not: a new fixed TTL applies
    assert tuned.ttl is not None and (tuned.ttl.seconds, tuned.ttl.source) == (42, "fixed")
    assert report.removed == ("TTLSource",)
    assert [e[1] for e in report.events] == ["TTLUpdated"]
    # the ConfigMap the versions reconciler writes carries it
    cm = config_map(p.spec, "feed", "prod", tuned.ttl.seconds)
    assert yaml.safe_load(cm["data"]["ranker.yaml"])["ttl"]["fixed_seconds"] == 42


def test_a_ratio_without_traffic_is_no_data_not_nan(prometheus: PrometheusEndpoint) -> None:
    # a NaN in the status would make every status patch a 400 (JSON has no NaN)
    with Prometheus(prometheus) as client:
        with pytest.raises(QueryError) as nan:
            client.first_value("vector(0) / vector(0)")
        assert nan.value.reason == "NoData"
        assert client.first_value("vector(0.75)") == 0.75
        with pytest.raises(QueryError) as bad:
            client.first_value("sum(")
        assert bad.value.reason == "QueryFailed" and "sum(" in bad.value.message


def test_the_tuner_reads_the_names_a_ranker_exports() -> None:
    """The operator and the rankers share no code (an import contract keeps them apart), so
    the metric names the TTL tuner reads are checked here against a ranker's own exposition:
    a renamed gauge fails this test, not a cluster's TTL silently."""
    from prometheus_client import generate_latest

    from kvrank.cache import AdaptiveTTL, CacheCollector, CacheSettings, L1Store, l1_and_redis
    from kvrank.cache.adaptive_ttl import IntervalTracker
    from kvrank.metrics import Metrics
    from kvrank_common import HIT_RATIO_METRIC, INTERVAL_METRIC, REQUESTS_METRIC
    from kvrank_operator.ttl_policy import parse_gauge

    now = [100.0]
    tracker = IntervalTracker(min_samples=1, min_watch_s=0, clock=lambda: now[0])
    metrics, l1 = Metrics("v1", "v-v1"), L1Store(1000)
    cache = l1_and_redis(CacheSettings("v-v1", "v1", "fp"), l1, None, AdaptiveTTL(tracker=tracker))
    metrics.registry.register(CacheCollector(cache, l1, None))
    for user in ("a", "b", "a", "b"):  # each user returns after 2 s
        cache.ttl.observe(user)
        now[0] += 1.0
    metrics.observe_request("l1", {"total": 1.0})
    metrics.observe_request("miss", {"total": 1.0})
    text = generate_latest(metrics.registry).decode()
    assert parse_gauge(text, INTERVAL_METRIC, positive=True) == [2.0]
    assert parse_gauge(text, HIT_RATIO_METRIC) == [0.5]
    assert f"{REQUESTS_METRIC}{{" in text


def test_the_hit_ratio_counts_outcomes_a_ranker_labels_its_requests_with() -> None:
    """The hit ratio's numerator: cache outcomes a ranker serves from, each an ``outcome``
    label its requests carry (the misses and no-cache answers are not among them)."""
    from kvrank.metrics import OUTCOMES
    from kvrank_common import CACHED_OUTCOMES

    assert set(CACHED_OUTCOMES) < set(OUTCOMES)
    assert {"miss", "none"}.isdisjoint(CACHED_OUTCOMES)
