"""Observability and cost: the chart's dashboard and alerts return data against a
Prometheus that scrapes the rankers and the operator as kube-prometheus-stack would, and a
RankerDeployment that does not change costs the API server no writes."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections import Counter
from datetime import datetime
from typing import Any

import httpx
import pytest
from chart import alert_rules, dashboard
from rankers import Ranker, Rankers, body
from release import api_writes
from stack import NS, Stack

pytestmark = [pytest.mark.kube, pytest.mark.slow, pytest.mark.e2e]

OPERATOR_WRITES = {
    "rankerdeployments",
    "deployments",
    "services",
    "configmaps",
    "secrets",
    "statefulsets",
    "jobs",
    "poddisruptionbudgets",
    "networkpolicies",
}
"""What the operator writes (of those, only workload controllers also write, and only their
``/status``)."""


def tuned(stack: Stack, rankers: Rankers, prefix: str, routed: bool = False) -> Ranker:
    """A ranker whose TTL the operator tunes from the run's TTL source, after returning and
    new users until the tuner has measured them (and at least 20 s); ``routed``: behind the
    bundled router."""
    ranker = rankers.new(prefix)
    doc = ranker.spec()
    doc["spec"]["ttl"] = {"mode": "auto", "intervalSeconds": 5, "source": stack.ttl_source()}
    if routed:
        doc["spec"]["routing"] = {"mode": "bundled", "image": stack.images.router}
    ranker.apply(doc)
    ranker.wait_ready(timeout=300)
    started, i = time.monotonic(), 0
    while time.monotonic() - started < 20 or not (ranker.status().get("ttl") or {}).get(
        "meanIntervalSeconds"
    ):
        assert time.monotonic() - started < 180, f"no TTL measured\n{stack.report()}"
        ranker.score(f"dash-{i % 5}" if i % 3 else f"dash-new-{i}", i)
        i += 1
        time.sleep(0.1)
    return ranker


def test_an_unchanged_ranker_deployment_costs_no_api_writes(stack: Stack, rankers: Rankers) -> None:
    """Its managed Redis, its Services and ConfigMap in place, the TTL tuner querying
    Prometheus every 5 s (and finding no requests): a minute of reconciles and measurements
    that change nothing writes nothing."""
    ranker = rankers.new("steady")
    doc = ranker.spec()
    doc["spec"]["ttl"] = {"mode": "auto", "intervalSeconds": 5, "source": stack.ttl_source()}
    ranker.apply(doc)
    ranker.wait_ready(timeout=300)
    ranker.wait_condition("CacheReady", timeout=180)
    settle_s = 20  # four of the tuner's measurements with nothing moving
    quiet: dict[str, Any] = {"status": None, "since": time.monotonic()}

    def settled() -> bool:
        now = ranker.status()
        if now != quiet["status"]:
            quiet.update(status=now, since=time.monotonic())
        return time.monotonic() - quiet["since"] >= settle_s

    stack.wait_for(settled, f"the status unchanged for {settle_s} s", 300)
    before, status_before = api_writes(stack, OPERATOR_WRITES), quiet["status"]
    time.sleep(60)  # resyncs of the RankerDeployment and twelve of the tuner's measurements
    after = api_writes(stack, OPERATOR_WRITES)
    writes = {
        k: after[k] - before.get(k, 0.0)
        for k in after
        if after[k] != before.get(k, 0.0) and not (k.endswith("/status") and "ranker" not in k)
    }
    now = ranker.status()
    changed = {k: v for k, v in now.items() if status_before.get(k) != v}
    assert writes == {}, f"writes in a minute of steady state: {writes}; status changes {changed}"
    assert (ranker.condition("TTLSource") or {}).get("reason") == "NoData", ranker.status()


def value_side(expr: str) -> str:
    """An alert's measured value: its expression up to the first comparison outside
    brackets and quotes (``rate(x[5m]) > 3 * rate(x[1h])`` → ``rate(x[5m])``)."""
    depth, quote, i = 0, "", 0
    while i < len(expr):
        ch, two = expr[i], expr[i : i + 2]
        if quote:
            i += 2 if ch == "\\" else 1
            quote = "" if ch == quote else quote
            continue
        if ch in "\"'`":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and (ch in "<>" or two in ("==", "!=")):
            return expr[:i].strip()
        i += 1
    return expr.strip()


def promql(stack: Stack, query: str) -> list[dict[str, Any]]:
    resp = httpx.get(f"{stack.prometheus_url}/api/v1/query", params={"query": query}, timeout=30)
    body = resp.json()
    assert body["status"] == "success", f"{query}: {body}"
    return list(body["data"]["result"])


def test_every_dashboard_panel_and_alert_query_returns_data(stack: Stack, rankers: Rankers) -> None:
    """The chart's dashboard and alerts against the Prometheus that scrapes the ranker pods
    and the operator as kube-prometheus-stack's monitors would: each template variable
    offers this RankerDeployment, every panel query returns a number (no panel left empty),
    every alert's measured value returns data, and every rule evaluates without error. The
    ranker is behind the bundled router, whose pods the same PodMonitor scrapes (Envoy's
    statistics: the router's panels)."""
    if stack.backend != "local":
        pytest.skip("the kind backend runs no Prometheus")
    ranker = tuned(stack, rankers, "dashboard", routed=True)  # the operator's series for it too
    time.sleep(3)  # the last requests scraped
    variables = {"$namespace": NS, "$instance": ranker.name, "$__rate_interval": "1m"}

    def grafana(text: str) -> str:  # what Grafana sends once the variables are chosen
        for name in sorted(variables, key=len, reverse=True):
            text = text.replace(name, variables[name])
        assert "$" not in text, text
        return text

    board = dashboard(stack.cluster)
    for var in board["templating"]["list"]:
        if var["type"] != "query":
            continue
        call = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["query"]["query"])
        assert call, var["query"]
        values = httpx.get(
            f"{stack.prometheus_url}/api/v1/label/{call[2]}/values",
            params={"match[]": grafana(call[1])},
            timeout=30,
        ).json()["data"]
        wanted = variables[f"${var['name']}"]
        assert wanted in values, f"variable {var['name']}: {values}"

    empty = []
    queries = 0
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            queries += 1
            result = promql(stack, grafana(target["expr"]))
            numbers = [float(r["value"][1]) for r in result]
            if not any(math.isfinite(v) for v in numbers):
                empty.append((panel["title"], target["refId"], target["expr"], result))
    assert queries >= 15 and empty == [], empty

    rules = alert_rules(stack.cluster)
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts) >= 8
    no_data = [a["alert"] for a in alerts if not promql(stack, value_side(a["expr"]))]
    assert no_data == [], no_data
    loaded = httpx.get(f"{stack.prometheus_url}/api/v1/rules", timeout=30).json()["data"]
    health = {
        r["name"]: (r["health"], r.get("lastError")) for g in loaded["groups"] for r in g["rules"]
    }
    assert set(health) == {a["alert"] for a in alerts}
    assert {k: v for k, v in health.items() if v[0] != "ok"} == {}


SPIKE_S, DEADLINE_MS, FACTOR = 15.0, 1000, 4


async def _spike(url: str, bodies: list[bytes], rate: float) -> list[tuple[int, bool]]:
    """Open loop at ``rate`` for :data:`SPIKE_S`, each caller sending its 1 s deadline and
    waiting no longer: ``(status, shed answer carries Retry-After)`` per request (status 0:
    the caller gave up)."""
    import aiohttp

    from kvrank.admission import TIMEOUT_HEADER

    headers = {"content-type": "application/json", TIMEOUT_HEADER: str(DEADLINE_MS)}
    timeout = aiohttp.ClientTimeout(total=DEADLINE_MS / 1e3)
    out: list[tuple[int, bool]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(body: bytes) -> None:
            try:
                async with session.post(
                    f"{url}/v1/score", data=body, headers=headers, timeout=timeout
                ) as resp:
                    await resp.read()
                    out.append((resp.status, "retry-after" in resp.headers))
            except (aiohttp.ClientError, TimeoutError):
                out.append((0, False))

        start, tasks = time.monotonic(), []
        for i in range(int(rate * SPIKE_S)):
            delay = i / rate - (time.monotonic() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(bodies[i])))
        await asyncio.gather(*tasks)
    return out


def _answers(url: str) -> Counter[str]:
    """The pod's own count of its scoring answers by status code."""
    from kvrank.metrics import SCORE_ROUTE
    from kvrank.tools.processes import samples

    text = httpx.get(f"{url}/metrics", timeout=10).text
    return Counter(
        {
            code: int(
                sum(samples(text, "kvrank_http_responses_total", route=SCORE_ROUTE, code=code))
            )
            for code in ("200", "503", "504", "499")
        }
    )


@pytest.mark.quiet_host
@pytest.mark.parametrize("queue_proxy", [False, True], ids=["ranker-alone", "queue-proxy"])
def test_a_pod_under_a_spike_sheds_stays_ready_and_its_queue_shows_in_prometheus(
    stack: Stack, rankers: Rankers, queue_proxy: bool
) -> None:
    """One ranker pod (half a CPU, L1 only: every new user a miss) offered 4x the misses it
    can compute for 15 s, callers with 1 s deadlines: it answers what it can in time (at
    least a fifth of its capacity), sheds the rest at once (503 with Retry-After: at most a
    tenth of the callers give up waiting), is neither restarted by its liveness probe nor
    taken out of its Service by its readiness probe, and Prometheus saw its queue — what an
    autoscaler would scale on. Alone (one process), the ranker sheds and Prometheus counts
    it; with the queue proxy beside it (``admission.queueProxy``) and the ranker an engine
    with two request fronts (``KVRANK_FRONTS=2``, what a pod of three cores or more gets),
    every refusal the ranker did not make is the proxy's, Prometheus reads the proxy's own
    statistics, and scrapes through the proxy are not refused. How much of the spike the
    proxy refuses depends on how many requests it holds in flight at once, which depends on
    the machine's speed (about half of the refusals in one run; none in a run on a slow VM):
    that is the benchmark's figure (``make bench-overload-front``); the refusal at the bound
    is made to happen, and asserted, in ``operator/tests/test_queue_proxy.py``."""
    from kvrank.tools.overload import measure_capacity

    if stack.backend != "local":
        pytest.skip("the kind backend runs no Prometheus")
    ranker, url = _spiked_pod(stack, rankers, queue_proxy)

    def bodies(first: int, n: int) -> list[bytes]:  # distinct users: each one a miss
        return [json.dumps(body(f"spike-{i}", i)).encode() for i in range(first, first + n)]

    capacity = asyncio.run(measure_capacity(url, bodies(0, 5000), 5.0))["capacity_qps"]
    rate = FACTOR * capacity
    began = time.time()
    before = _answers(url)
    outcomes = asyncio.run(_spike(url, bodies(5000, int(rate * SPIKE_S) + 1), rate))
    statuses = Counter(s for s, _ in outcomes)
    answers = _answers(url) - before  # a caller gone before it was read: none
    # the machine's other work (the rest of the suite) varies: the pod's capacity again just
    # after, and the spike judged against the lower of the two readings
    after = asyncio.run(measure_capacity(url, bodies(60_000, 5000), 5.0))["capacity_qps"]
    print(
        f"capacity {capacity:.0f}/s before, {after:.0f}/s after; offered {rate:.0f}/s for"
        f" {SPIKE_S:.0f} s: {statuses}; the pod's answers: {answers}"
    )
    assert statuses[503] > 0, f"not overloaded at {rate:.0f}/s: {statuses}"
    # what the callers saw: a fair share answered in time, the rest told at once — not left
    # waiting out their deadline (a pod whose event loop falls behind answers them too late)
    floor = 0.2 * min(capacity, after) * SPIKE_S
    assert statuses[200] >= floor, f"answered in time: {statuses} (< {floor:.0f})"
    assert statuses[0] <= 0.1 * len(outcomes), f"callers left without an answer: {statuses}"
    assert all(retry for s, retry in outcomes if s == 503), "a shed answer without Retry-After"
    if queue_proxy:  # the refusals beyond the ranker's own were the proxy's
        assert answers["503"] <= statuses[503], f"the ranker shed {answers}: {statuses}"
    _assert_it_stayed_in_service(ranker, began, queue_proxy)
    time.sleep(3)  # the last scrape
    _assert_prometheus_saw_its_queue(stack, ranker, began, queue_proxy)
    ranker.delete()


def _spiked_pod(stack: Stack, rankers: Rankers, queue_proxy: bool) -> tuple[Ranker, str]:
    """The spike's pod, Ready (half a CPU, L1 only), and its URL; with ``queue_proxy``, the
    proxy beside it and an engine with two fronts in it."""
    ranker = rankers.new("spike-proxy" if queue_proxy else "spike")
    doc = ranker.spec(redis=False, replicas=1)
    doc["spec"]["model"]["resources"] = {"limits": {"nvidia.com/gpu": 1, "cpu": "500m"}}
    if queue_proxy:
        doc["spec"]["admission"] = {"queueProxy": {"enabled": True}}
        doc["spec"]["model"]["env"].append({"name": "KVRANK_FRONTS", "value": "2"})
    ranker.apply(doc)
    ranker.wait_ready(timeout=300)
    (url,) = stack.pod_urls(ranker.name)
    if queue_proxy:  # the spike meets an engine and its two fronts
        (pod,) = ranker.pods()
        logs = stack.kubectl("logs", "-n", NS, pod["metadata"]["name"], "-c", "ranker")
        assert logs.count("Application startup complete") == 2, logs[-3000:]
    return ranker, url


def _assert_it_stayed_in_service(ranker: Ranker, since: float, queue_proxy: bool) -> None:
    """Neither restarted by its liveness probe nor out of its Service (Ready) since ``since``."""
    (pod,) = ranker.pods()
    containers = {c["name"]: c for c in pod["status"]["containerStatuses"]}
    assert set(containers) == ({"ranker", "queue-proxy"} if queue_proxy else {"ranker"})
    restarts = {name: c["restartCount"] for name, c in containers.items()}
    assert set(restarts.values()) == {0}, f"liveness restarted it: {restarts}"
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    changed = datetime.fromisoformat(ready["lastTransitionTime"].replace("Z", "+00:00"))
    assert ready["status"] == "True" and changed.timestamp() < since, f"readiness: {ready}"


def _assert_prometheus_saw_its_queue(
    stack: Stack, ranker: Ranker, since: float, queue_proxy: bool
) -> None:
    """Prometheus has the pod's queue and in-flight requests since ``since`` above 0, and
    what was refused: the ranker's sheds, or (behind the queue proxy) Envoy's overflow
    counter, whose value depends on the machine's speed (read, not bounded)."""
    window = f"[{int(time.time() - since) + 5}s]"
    sel = f'namespace="{NS}", app_kubernetes_io_instance="{ranker.name}"'
    queries = [
        f"max_over_time(kvrank_model_queue_depth{{{sel}}}{window})",
        f"max_over_time(kvrank_inflight_requests{{{sel}}}{window})",
    ]
    if queue_proxy:  # what the proxy refused, from Envoy's own statistics
        proxy = f'{sel}, envoy_cluster_name="ranker"'
        queries.append(
            f"sum(increase(envoy_cluster_upstream_rq_active_overflow{{{proxy}}}{window}))"
        )
    else:  # behind the proxy the ranker may have shed nothing itself
        queries.append(f"sum(increase(kvrank_shed_requests_total{{{sel}}}{window}))")
    for i, query in enumerate(queries):
        values = [float(r["value"][1]) for r in promql(stack, query)]
        assert values, f"{query}: no series"
        # the proxy's refusals are read whatever their number (see above); the rest grew
        assert (queue_proxy and i == len(queries) - 1) or max(values) > 0, f"{query}: {values}"
