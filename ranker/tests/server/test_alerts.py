"""The chart's alerts against a real Prometheus scraping a real ranker, labelled as a
kube-prometheus-stack PodMonitor labels it: stopping Redis under traffic fires
``KvrankRedisBreakerOpen`` for that pod, while every request still succeeds (a cache
failure is a miss). The rules are the ones ``helm template`` renders."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from kvrank.tools.processes import PrometheusServer

pytestmark = pytest.mark.redis
CHART = Path(__file__).resolve().parents[3] / "charts" / "kvrank-operator"
SERVED = ("--api-versions", "monitoring.coreos.com/v1")  # as a cluster with prometheus-operator
POD_LABELS = {  # what a PodMonitor with the chart's podTargetLabels gives a ranker pod
    "namespace": "ranking",
    "pod": "feed-ranker-v1-7d9f-abcde",
    "app_kubernetes_io_instance": "feed-ranker",
    "kvrank_io_version": "v1",
}


def rendered_rules(out: Path, **values: str) -> Path:
    from localkube.local import binaries

    sets = [
        a
        for k, v in {"monitoring.rules.enabled": "true", **values}.items()
        for a in ("--set", f"{k}={v}")
    ]
    rendered = subprocess.run(
        [str(binaries() / "helm"), "template", "rel", str(CHART), *SERVED, *sets],
        capture_output=True,
        text=True,
        check=True,
        env={"HELM_CACHE_HOME": str(out / "helm"), "PATH": "/usr/bin:/bin"},
    ).stdout
    (rule,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "PrometheusRule"]
    path = out / "rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    check = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    return path


def firing(prom: PrometheusServer, name: str) -> list[dict[str, Any]]:
    return [a for a in prom.alerts() if a["labels"]["alertname"] == name and a["state"] == "firing"]


@pytest.mark.slow
def test_stopping_redis_fires_the_breaker_alert_and_no_request_fails(
    spawn_redis, spawn_server, request_for, tmp_path: Path
) -> None:
    redis = spawn_redis()
    pod = spawn_server("--redis", redis.url)
    rules = rendered_rules(tmp_path, **{"monitoring.rules.breakerFor": "5s"})
    prom = PrometheusServer(
        tmp_path / "prometheus",
        {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {
                    "job_name": "ranking/feed-ranker",
                    "static_configs": [
                        {"targets": [pod.url.removeprefix("http://")], "labels": POD_LABELS}
                    ],
                }
            ],
        },
    ).start()
    statuses: list[int] = []
    stop = threading.Event()

    def traffic() -> None:  # users come back, some new: L1 hits, L2 reads and writes
        i = 0
        while not stop.is_set():
            _, _, body = request_for(user_id=f"user-{i % 40}")
            statuses.append(httpx.post(f"{pod.url}/v1/score", json=body, timeout=10).status_code)
            i += 1
            stop.wait(0.1)

    driver = threading.Thread(target=traffic, daemon=True)
    driver.start()
    try:
        time.sleep(8)  # Redis up: scraped, evaluated, quiet
        assert firing(prom, "KvrankRedisBreakerOpen") == []
        redis.stop()
        deadline = time.monotonic() + 90
        while not (alerts := firing(prom, "KvrankRedisBreakerOpen")):
            assert time.monotonic() < deadline, f"not firing: {prom.alerts()}"
            time.sleep(1)
        (alert,) = alerts
        assert alert["labels"]["pod"] == POD_LABELS["pod"]
        assert alert["labels"]["severity"] == "critical"
        assert "Redis unreachable" in alert["annotations"]["summary"]
    finally:
        stop.set()
        driver.join(timeout=30)
        prom.stop()
    assert statuses and set(statuses) == {200}, f"{len(statuses)} requests: {set(statuses)}"
