"""Where the TTL tuner reads request intervals, and what it says when it cannot: a real
Prometheus (Debian's) asked the queries the operator sends; an empty answer or an
unreachable server becomes the ``TTLSource`` condition with a reason, never just a log
line. (The full chain — ranker pods scraped with PodMonitor labels, the TTL converging — is
the end-to-end suite's.)"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest

from kvrank.tools.processes import PrometheusServer, free_port
from kvrank_operator.sources import Observed, from_prometheus, instant_query, source_condition
from kvrank_operator.spec import parse_spec

NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus"), {"scrape_configs": []})
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def test_no_series_is_no_data_naming_the_query_and_its_podmonitor_labels(prometheus: str) -> None:
    seen = from_prometheus(prometheus, "feed", "prod")
    assert seen.mean_interval_s is None and seen.problem is not None
    reason, message = seen.problem
    assert reason == "NoData"
    assert 'namespace="prod"' in message and 'app_kubernetes_io_instance="feed"' in message


def test_an_unreachable_prometheus_says_so() -> None:
    seen = from_prometheus(f"http://127.0.0.1:{free_port()}", "feed", "prod")
    assert seen.problem is not None and seen.problem[0] == "PrometheusUnreachable"


def test_the_condition_tells_why_and_flips_once_intervals_are_measured() -> None:
    spec = parse_spec({"model": {"version": "v1", "uri": "/m"}})
    missing = source_condition({}, Observed(problem=("NoData", "no series")), spec, 3, NOW)
    (c,) = missing
    assert (c["type"], c["status"], c["reason"], c["observedGeneration"]) == (
        "TTLSource",
        "False",
        "NoData",
        3,
    )
    later = NOW + dt.timedelta(minutes=1)
    measured = source_condition({"conditions": missing}, Observed(2.0, 0.9), spec, 3, later)
    (c,) = measured
    assert (c["status"], c["reason"]) == ("True", "Measured")
    assert c["lastTransitionTime"] != missing[0]["lastTransitionTime"]
    # measured again: nothing changes, so nothing is written
    again = source_condition({"conditions": measured}, Observed(2.5, 0.8), spec, 3, later)
    assert again == measured


def test_a_ratio_without_traffic_is_no_data_not_nan(prometheus: str) -> None:
    # a NaN in the status would make every status patch a 400 (JSON has no NaN)
    value, problem = instant_query(prometheus, "vector(0) / vector(0)")
    assert value is None and problem is not None and problem[0] == "NoData"
    assert instant_query(prometheus, "vector(0.75)") == (0.75, None)
