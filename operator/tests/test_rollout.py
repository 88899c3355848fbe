"""The rollout's decisions and the analysis behind them, on metric windows built from the
rankers' own metric objects: warm-up, steps, promote, abort on drift, and "no data is never
a pass". The same rollouts run on real pods in the end-to-end scenarios."""

from __future__ import annotations

import datetime as dt
import json
import re
import time
import urllib.parse
import urllib.request
from typing import Any

import numpy as np
import pytest
import yaml
from prometheus_client import generate_latest, start_http_server

from kvrank.metrics import CACHED_OUTCOMES, OUTCOMES, SCORING_ROUTES, Metrics
from kvrank.server.shadow import ShadowConfig, ShadowMirror, compare
from kvrank.tools.processes import PrometheusServer, free_port
from kvrank_operator import manifests as m
from kvrank_operator import rollout
from kvrank_operator.analysis import (
    Window,
    counts_from_text,
    evaluate,
    pods_window,
    prometheus_window,
    quantile,
    total,
)
from kvrank_operator.errors import SpecError
from kvrank_operator.kube import merge_patch_between
from kvrank_operator.spec import Check, PrometheusEndpoint, parse_spec
from kvrank_operator.state import Rollout

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
CANARY: dict[str, Any] = {
    "version": "v2",
    "uri": "/models/v2",
    "shadow": {"sample": 0.2},
    "warmup": {"hitRatio": 0.7, "minRequests": 100, "timeoutSeconds": 300},
    "steps": [{"weight": 20, "pauseSeconds": 60}, {"weight": 50, "pauseSeconds": 60}],
    "analysis": {
        "scoreDelta": {"max": 0.01, "minSamples": 50},
        "rankCorrelation": {"min": 0.95, "minSamples": 50},
        "errorRatio": {"max": 0.01, "minSamples": 50},
        "inconclusiveTimeoutSeconds": 120,
    },
}


def spec_with(**canary: Any) -> Any:
    return parse_spec(
        {"model": {"version": "v1", "uri": "/models/v1", "replicas": 4}, "canary": CANARY | canary}
    )


def pod_text(
    version: str,
    requests: int = 0,
    hits: int = 0,
    errors: int = 0,
    compared: int = 0,
    drift: float = 0.0,
) -> str:
    """One pod's /metrics as a ranker serving ``version`` writes it: ``requests`` answered
    (``hits`` from a cache, ``errors`` with a 500) and ``compared`` mirrored requests whose
    canary scores are off by ``drift``."""
    metrics = Metrics(version, f"v-{version}")
    for i in range(requests):
        metrics.observe_request("l1" if i < hits else "miss", {"total": 5.0})
        route = SCORING_ROUTES[i % len(SCORING_ROUTES)]
        metrics.observe_response(route, 500 if i < errors else 200)
    shadow = ShadowMirror(
        lambda: ShadowConfig(), metrics.registry, {"model_version": version}, own_version=version
    )
    stable = [0.9, 0.5, 0.3, 0.1]
    canary = [s + drift * (i % 2 * 2 - 1) for i, s in enumerate(stable)]  # ±drift
    for _ in range(compared):
        delta, rho, changed = compare(np.array(stable), np.array(canary), 2)
        for d in delta:
            shadow.delta.observe(float(d))
        shadow.rank.observe(rho)
        shadow.topk_changed.inc(changed)
        shadow.results["sent"].inc()
    return generate_latest(metrics.registry).decode()


def window(stable: str = "", canary: str = "", problem: str | None = None) -> Window:
    counts = {**counts_from_text(stable), **counts_from_text(canary)}
    return Window(counts.get("v2", {}), counts.get("v1", {}), problem)


class Script:
    """Hands out the window a test sets for each key, and records what was asked."""

    def __init__(self) -> None:
        self.windows: dict[str, Window] = {}
        self.asked: list[str] = []

    def __call__(self, key: str, since: dt.datetime) -> Window:
        self.asked.append(key)
        return self.windows.get(key, Window())


def run(spec: Any, state: Any, script: Script, at: float, ready: bool = True) -> Any:
    return rollout.advance(spec, state, ready, script, T0 + dt.timedelta(seconds=at))


def test_an_answer_from_any_of_the_rankers_cache_tiers_counts_as_cached() -> None:
    """The host tier included: a canary warming through it is warming."""
    metrics = Metrics("v2", "v-v2")
    for outcome in OUTCOMES:
        metrics.observe_request(outcome, {"total": 5.0})
    counts = counts_from_text(generate_latest(metrics.registry).decode())["v2"]
    assert counts["cached"] == len(CACHED_OUTCOMES)
    assert counts["requests"] == len(OUTCOMES) - 1  # "none": served with the cache off


def test_counts_read_the_rankers_own_metrics() -> None:
    counts = counts_from_text(pod_text("v1", requests=10, hits=7, errors=4, compared=5))["v1"]
    assert counts["requests"] == 10 and counts["cached"] == 7
    assert counts["responses"] == 10 and counts["errors"] == 4  # one on each scoring route
    assert counts["shadow_sent"] == 5 and counts["latency_le:+Inf"] == 10
    # all 10 at 5 ms, in the (2 ms, 5 ms] bucket: the median interpolates within it
    assert quantile(0.5, counts, "latency_le") == pytest.approx(0.0035)


def test_a_pods_window_counts_since_it_opened_and_a_restarted_pod_from_zero() -> None:
    then = {"pod-a": counts_from_text(pod_text("v2", requests=50, hits=10))}
    now = {
        "pod-a": counts_from_text(pod_text("v2", requests=80, hits=40)),  # +30 requests, all hits
        "pod-b": counts_from_text(pod_text("v2", requests=5, hits=5)),  # started since
    }
    w = pods_window(then, now, "v1", "v2")
    assert w.canary["requests"] == 35 and w.canary["cached"] == 35
    restarted = {"pod-a": counts_from_text(pod_text("v2", requests=3, hits=0))}
    assert pods_window(then, restarted, "v1", "v2").canary["requests"] == 3


def test_quantiles_are_prometheus_histogram_quantile() -> None:
    c = {"x:0.1": 1.0, "x:0.5": 3.0, "x:1.0": 4.0, "x:+Inf": 4.0}
    assert quantile(0.5, c, "x") == pytest.approx(0.3)  # rank 2: halfway through (0.1, 0.5]
    assert quantile(0.25, c, "x") == pytest.approx(0.1)
    assert quantile(1.0, {**c, "x:+Inf": 8.0}, "x") == 1.0  # in +Inf: the highest bound
    assert quantile(0.5, {"x:1.0": 0.0, "x:+Inf": 0.0}, "x") is None
    assert total([{"a": 1.0}, {"a": 2.0, "b": 1.0}]) == {"a": 3.0, "b": 1.0}


def test_no_data_too_few_samples_and_nan_are_inconclusive_never_a_pass() -> None:
    check = Check("max", 0.01, min_samples=50)
    (empty,) = evaluate({"errorRatio": check}, Window())
    assert empty.verdict == "inconclusive" and "no data" in empty.describe()
    (few,) = evaluate({"errorRatio": check}, window(canary=pod_text("v2", requests=10)))
    assert few.verdict == "inconclusive" and "10/50 samples" in few.describe()
    (enough,) = evaluate({"errorRatio": check}, window(canary=pod_text("v2", requests=60)))
    assert enough.verdict == "pass" and enough.value == 0


def test_an_agreeing_canary_warms_up_then_passes_every_step_and_is_promoted() -> None:
    spec, script = spec_with(), Script()
    d = run(spec, None, script, 0, ready=False)
    assert d.canary.phase == "Starting" and d.events[0][1] == "RolloutStarted"
    live = rollout.effective(spec, d.canary)
    assert live.canary is not None and not live.canary.serving  # out of the Service
    assert live.replicas_of("stable") == 4 and live.replicas_of("canary") == 1
    d = run(spec, d.canary, script, 5)  # Ready
    assert d.canary.phase == "Warming"
    script.windows["v2/warmup"] = window(canary=pod_text("v2", requests=60, hits=50))
    d = run(spec, d.canary, script, 10)
    assert d.canary.phase == "Warming", "60 requests are fewer than minRequests"
    assert d.canary.warm_hit_ratio == pytest.approx(0.833, abs=1e-3)
    script.windows["v2/warmup"] = window(canary=pod_text("v2", requests=200, hits=180))
    d = run(spec, d.canary, script, 15)
    assert d.canary.phase == "Progressing" and d.canary.step_text == "1/2"
    assert [e[1] for e in d.events] == ["CanaryWarm"]
    live = rollout.effective(spec, d.canary)
    assert live.canary is not None and live.canary.serving and live.canary.weight == 20
    agreeing = window(
        stable=pod_text("v1", requests=400, compared=80),
        canary=pod_text("v2", requests=100, hits=90),
    )
    script.windows["v2/step-1"] = agreeing
    d = run(spec, d.canary, script, 30)
    assert d.canary.phase == "Progressing" and d.canary.step == 1, "the pause is 60 s"
    assert {c["result"] for c in d.canary.checks} == {"pass"}
    d = run(spec, d.canary, script, 76)
    assert d.canary.step == 2 and [e[1] for e in d.events] == ["StepPassed"]
    assert rollout.effective(spec, d.canary).canary.weight == 50  # type: ignore[union-attr]
    script.windows["v2/step-2"] = agreeing
    d = run(spec, d.canary, script, 140)
    assert d.canary.phase == "Promoted" and d.promote
    assert [e[1] for e in d.events] == ["CanaryPromoted"]
    assert d.condition[0] and d.condition[1] == "Promoted"


def test_a_gitops_promotion_writes_no_spec_and_serves_the_canary_until_git_says_so() -> None:
    """``promotion: status``: Argo CD or Flux would revert a spec the operator rewrote, so
    the promotion lives in the status; the canary serves as the stable version until the
    spec in Git names it as the model."""
    spec, script = spec_with(warmup=None, promotion="status"), Script()
    agreeing = window(
        stable=pod_text("v1", requests=400, compared=80),
        canary=pod_text("v2", requests=100, hits=90),
    )
    script.windows["v2/step-1"] = script.windows["v2/step-2"] = agreeing
    d = run(spec, None, script, 0)
    d = run(spec, d.canary, script, 61)
    d = run(spec, d.canary, script, 122)
    assert d.canary is not None and d.canary.phase == "Promoted"
    assert not d.promote, "nothing to write into the spec"
    live = rollout.effective(spec, d.canary)
    assert live.canary is None and (live.model.version, live.model.uri) == ("v2", "/models/v2")
    assert live.replicas_of("stable") == 4  # all of it
    # the spec still has the canary long after: it stays promoted (no new rollout)
    later = run(spec, d.canary, script, 122 + 3600)
    assert later.canary is not None and later.canary.phase == "Promoted" and not later.events
    assert rollout.effective(spec, later.canary).model.version == "v2"
    # the commit in Git: model is the canary, the canary block is gone
    committed = parse_spec({"model": {"version": "v2", "uri": "/models/v2", "replicas": 4}})
    ended = run(committed, later.canary, script, 122 + 3700)
    assert ended.canary is not None and ended.canary.ended
    assert rollout.effective(committed, ended.canary) == committed
    # the default still rewrites the spec
    by_spec = spec_with(warmup=None)
    d = run(by_spec, None, script, 0)
    d = run(by_spec, run(by_spec, d.canary, script, 61).canary, script, 122)
    assert d.promote and rollout.effective(by_spec, d.canary).canary is not None


def test_an_unknown_promotion_mode_names_the_field() -> None:
    with pytest.raises(SpecError, match=r"canary\.promotion"):
        spec_with(promotion="git")


def test_a_drifting_canary_is_aborted_at_the_first_step_naming_metric_value_threshold() -> None:
    spec, script = spec_with(warmup=None, shadow={"sample": 0.2}), Script()
    d = run(spec, None, script, 0)
    assert d.canary.phase == "Progressing"  # no warm-up: straight to step 1
    script.windows["v2/step-1"] = window(
        stable=pod_text("v1", requests=400, compared=80, drift=0.2),
        canary=pod_text("v2", requests=100),
    )
    d = run(spec, d.canary, script, 10)  # before the pause ends: a failure aborts at once
    assert d.canary.phase == "Aborted" and not d.promote
    ok, reason, message = d.condition
    assert not ok and reason == "AnalysisFailed"
    assert "scoreDelta" in message and "max 0.01" in message and "0.2" in message, message
    assert d.events[-1][:2] == ("Warning", "RolloutAborted")
    assert rollout.effective(spec, d.canary).canary is None  # removed, namespace purged
    again = run(spec, d.canary, script, 20)
    assert again.canary.phase == "Aborted" and not again.events, "aborted stays aborted"
    without = parse_spec({"model": {"version": "v1", "uri": "/models/v1"}})
    removed = run(without, again.canary, script, 30)  # a person removes the canary
    assert removed.canary.phase == "Aborted" and removed.condition[1] == "AnalysisFailed"
    retry = run(spec, removed.canary, script, 40, ready=False)
    assert retry.canary.phase == "Starting", "the same canary put back: a new rollout"


def test_a_paused_rollout_holds_its_step_without_timing_out_but_still_aborts_on_failure() -> None:
    agreeing = window(
        stable=pod_text("v1", requests=400, compared=80),
        canary=pod_text("v2", requests=100, hits=90),
    )
    spec, paused, script = spec_with(warmup=None), spec_with(warmup=None, paused=True), Script()
    script.windows["v2/step-1"] = agreeing
    d = run(paused, None, script, 0)
    for at in (61, 600, 7200):  # long past the pause and the inconclusive timeout
        d = run(paused, d.canary, script, at)
        assert d.canary.phase == "Progressing" and d.canary.step == 1 and not d.events
        assert d.condition[1] == "Paused" and "checks pass" in d.condition[2], d.condition
    assert rollout.effective(paused, d.canary).canary.weight == 20  # type: ignore[union-attr]
    script.windows["v2/step-1"] = Window(problem="no data")  # inconclusive: no timeout either
    d = run(paused, d.canary, script, 9000)
    assert d.canary.phase == "Progressing" and "waiting for data" in d.condition[2]
    script.windows["v2/step-1"] = agreeing
    resumed = run(spec, d.canary, script, 9001)  # the pause is long over: on at once
    assert resumed.canary.step == 2 and [e[1] for e in resumed.events] == ["StepPassed"]
    script.windows["v2/step-2"] = window(
        stable=pod_text("v1", requests=400, compared=80, drift=0.2),
        canary=pod_text("v2", requests=100),
    )
    failed = run(paused, resumed.canary, script, 9010)
    assert failed.canary.phase == "Aborted" and failed.condition[1] == "AnalysisFailed"


def test_skip_to_step_moves_the_rollout_there_once_then_promotes_past_the_last_step() -> None:
    """What ``kubectl rkd promote`` writes: each step skipped once (no data needed, the pause
    not waited), a warm-up ended by step 1, and a promotion one past the last step."""
    script = Script()  # no window has data: only the skips move the rollout
    d = run(spec_with(), None, script, 0)
    d = run(spec_with(), d.canary, script, 5)
    assert d.canary.phase == "Warming"
    d = run(spec_with(skipToStep=1), d.canary, script, 6)
    assert d.canary.phase == "Progressing" and d.canary.step == 1
    assert [e[1] for e in d.events] == ["WarmupSkipped"]
    d = run(spec_with(skipToStep=1), d.canary, script, 7)  # at that step: nothing more
    assert d.canary.step == 1 and not d.events
    for at in (8, 9, 10):  # step 2, however often the operator passes
        d = run(spec_with(skipToStep=2), d.canary, script, at)
        assert d.canary.phase == "Progressing" and d.canary.step == 2
    assert rollout.effective(spec_with(), d.canary).canary.weight == 50  # type: ignore[union-attr]
    d = run(spec_with(skipToStep=3), d.canary, script, 11)
    assert d.canary.phase == "Promoted" and d.promote
    assert [e[1] for e in d.events] == ["CanaryPromoted"] and "skipToStep" in d.events[0][2]


def test_skip_to_step_needs_steps_and_stays_within_one_past_the_last() -> None:
    for bad, says in ((0, "from 1 to 3"), (4, "from 1 to 3"), ("2", "from 1 to 3")):
        with pytest.raises(SpecError, match=says):
            spec_with(skipToStep=bad)
    with pytest.raises(SpecError, match=r"needs canary\.steps"):
        spec_with(steps=[], analysis={}, skipToStep=1)


def test_a_canary_without_data_waits_then_aborts_and_is_never_promoted() -> None:
    spec, script = spec_with(warmup=None), Script()
    d = run(spec, None, script, 0)
    script.windows["v2/step-1"] = Window(problem="Prometheus at http://p:9090 unreachable")
    for at in (30, 61, 150):  # past the pause, within the inconclusive timeout (60 + 120)
        d = run(spec, d.canary, script, at)
        assert d.canary.phase == "Progressing" and not d.promote
        ok, reason, message = d.condition
        assert not ok and reason == "Inconclusive" and "unreachable" in message, message
    d = run(spec, d.canary, script, 181)
    assert d.canary.phase == "Aborted" and d.condition[1] == "Inconclusive"
    assert not d.promote


def test_a_warm_up_that_times_out_joins_cold_with_a_warning() -> None:
    spec, script = spec_with(), Script()
    d = run(spec, run(spec, None, script, 0).canary, script, 1)
    assert d.canary.phase == "Warming"
    script.windows["v2/warmup"] = window(canary=pod_text("v2", requests=500, hits=100))
    d = run(spec, d.canary, script, 302)
    assert d.canary.phase == "Progressing"
    assert d.events == [("Warning", "WarmupTimedOut", d.events[0][2])]
    assert "0.200 over 500 requests" in d.events[0][2]


def test_without_steps_the_canary_stays_at_its_weight_until_a_person_promotes() -> None:
    spec, script = spec_with(warmup=None, steps=[], analysis={}), Script()
    d = run(spec, None, script, 0)
    assert d.canary.phase == "Manual" and d.canary.weight == 10
    assert run(spec, d.canary, script, 3600).canary.phase == "Manual"
    assert not script.asked, "no analysis without steps"


def test_the_pods_config_and_services_follow_the_rollout() -> None:
    spec = spec_with()
    warming = rollout.effective(spec, Rollout.from_storage({"version": "v2", "phase": "Warming"}))
    doc = yaml.safe_load(m.ranker_config(warming, "feed", "prod", ttl_s=None))
    assert doc["shadow"] == {
        "url": "http://feed-v2.prod.svc:8080",
        "version": "v2",
        "sample": 0.2,
        "top_k": 10,
    }
    ShadowConfig.model_validate(doc["shadow"])  # what the rankers accept
    shared, *_ = m.services(warming, "feed", "prod")
    assert shared["spec"]["selector"]["kvrank.io/version"] == "v1"
    serving = rollout.effective(
        spec, Rollout.from_storage({"version": "v2", "phase": "Progressing", "step": 1})
    )
    shared, *_ = m.services(serving, "feed", "prod")
    assert "kvrank.io/version" not in shared["spec"]["selector"]
    aborted = rollout.effective(spec, Rollout.from_storage({"version": "v2", "phase": "Aborted"}))
    assert "shadow" not in yaml.safe_load(m.ranker_config(aborted, "feed", "prod", None))
    no_shadow = parse_spec(
        {
            "model": {"version": "v1", "uri": "/m"},
            "canary": CANARY | {"shadow": None, "warmup": None, "steps": [], "analysis": {}},
        }
    )
    assert "shadow" not in yaml.safe_load(m.ranker_config(no_shadow, "feed", "prod", None))


def test_a_dotted_version_gets_services_with_dns_label_names() -> None:
    spec = parse_spec({"model": {"version": "v2.1", "uri": "/m"}})
    names = [s["metadata"]["name"] for s in m.services(spec, "feed", "prod")]
    assert names == ["feed", "feed-v2-1"]
    assert all(re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", n) for n in names)


def series(url: str, query: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(
        f"{url}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    ) as r:
        return list(json.loads(r.read())["data"]["result"])


@pytest.mark.slow
def test_a_prometheus_window_counts_what_the_pods_did_in_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The queries the operator sends, against a real Prometheus scraping the rankers' own
    metric objects with the target labels a PodMonitor gives them."""
    registries = {"v1": Metrics("v1", "v-v1"), "v2": Metrics("v2", "v-v2")}
    shadow = ShadowMirror(
        lambda: ShadowConfig(), registries["v1"].registry, {"model_version": "v1"}, "v1"
    )
    servers, targets = [], []
    for metrics in registries.values():
        port = free_port()
        server, thread = start_http_server(port, "127.0.0.1", metrics.registry)
        servers.append((server, thread))
        labels = {"namespace": "prod", "app_kubernetes_io_instance": "feed"}
        targets.append({"targets": [f"127.0.0.1:{port}"], "labels": labels})
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "rankers", "static_configs": targets}],
    }
    prometheus = PrometheusServer(tmp_path / "prometheus", config).start()
    try:
        scraped = 'count_over_time(up{job="rankers"}[1m]) >= 2'
        deadline = time.monotonic() + 30
        while (
            len(series(prometheus.url, scraped)) < 2
        ):  # both scraped twice at zero: counted from here
            assert time.monotonic() < deadline, "Prometheus did not scrape the two targets"
            time.sleep(0.5)
        for i in range(30):
            registries["v2"].observe_request("l1" if i < 24 else "miss", {"total": 5.0})
            route = SCORING_ROUTES[(i + 1) % len(SCORING_ROUTES)]  # the 500s: v2 HTTP and gRPC
            registries["v2"].observe_response(route, 500 if i < 3 else 200)
            registries["v2"].observe_response("/v1/prefetch", 500)  # not a scoring answer
        for _ in range(12):
            delta, rho, _ = compare(np.array([0.9, 0.5]), np.array([0.9, 0.5]), 1)
            for d in delta:
                shadow.delta.observe(float(d))
            shadow.rank.observe(rho)
            shadow.results["sent"].inc()
        time.sleep(3)
        endpoint = PrometheusEndpoint(prometheus.url)
        w = prometheus_window(endpoint, "feed", "prod", "v1", "v2", 60)
        assert w.problem is None
        # increase() extrapolates towards the window's end (up to ~half a scrape interval
        # per side, proportionally): counts come out a little above, ratios cancel that
        assert 30 <= w.canary["requests"] <= 45
        assert w.canary["cached"] / w.canary["requests"] == pytest.approx(0.8, abs=0.01)
        assert w.canary["errors"] / w.canary["responses"] == pytest.approx(0.1, abs=0.01)
        assert 12 <= w.stable["shadow_sent"] <= 18
        checks = {"errorRatio": Check("max", 0.01, 20), "scoreDelta": Check("max", 0.01, 10, 0.99)}
        results = {r.metric: r for r in evaluate(checks, w)}
        assert results["scoreDelta"].value is not None and results["scoreDelta"].value <= 1e-7
        assert results["errorRatio"].verdict == "fail"  # 10 % 5xx against a 1 % maximum
        empty = prometheus_window(endpoint, "other", "prod", "v1", "v2", 60)
        assert empty.canary == {} and empty.problem is None  # no series: no data, no error
    finally:
        prometheus.stop()
        for server, thread in servers:
            server.shutdown()
            server.server_close()
            thread.join()
    gone = PrometheusEndpoint(f"http://127.0.0.1:{free_port()}")
    down = prometheus_window(gone, "feed", "prod", "v1", "v2", 60)
    assert down.problem is not None and down.problem.startswith("PrometheusUnreachable")


def test_status_patches_remove_what_a_new_rollout_no_longer_has() -> None:
    """A merge patch merges dicts: sending a new rollout whole would keep the last one's
    ``ended``/``reason``/``checks`` and restart it at every reconcile."""
    old = {"canary": {"version": "v1", "phase": "Aborted", "ended": True, "checks": [1]}, "x": 1}
    new = {"canary": {"version": "v1", "phase": "Starting", "step": 0, "warm": None}, "x": 1}
    patch = merge_patch_between(old, new)
    assert patch == {"canary": {"phase": "Starting", "ended": None, "checks": None, "step": 0}}
    assert merge_patch_between(new, new) == {}
    assert merge_patch_between({"canary": {"a": 1}}, {}) == {"canary": None}
    assert merge_patch_between({"l": [1, 2]}, {"l": [1]}) == {"l": [1]}  # lists: replaced


def test_ratio_checks_read_whose_counts_they_are() -> None:
    """Error and hit ratios are the canary's; the top-k share is the stable pods' comparison."""
    checks = {
        "errorRatio": Check("max", 0.01, 10),
        "hitRatio": Check("min", 0.5, 10),
        "topKChangedRatio": Check("max", 0.05, 10),
    }
    reordered = window(
        stable=pod_text("v1", requests=50, errors=50, compared=20, drift=0.5),  # top-2 moves
        canary=pod_text("v2", requests=40, hits=30, errors=2),
    )
    got = {r.metric: (r.value, r.samples) for r in evaluate(checks, reordered)}
    assert got == {"errorRatio": (0.05, 40), "hitRatio": (0.75, 40), "topKChangedRatio": (1.0, 20)}
    same = window(stable=pod_text("v1", compared=20), canary=pod_text("v2", requests=40))
    (topk,) = evaluate({"topKChangedRatio": checks["topKChangedRatio"]}, same)
    assert (topk.value, topk.verdict) == (0.0, "pass")
