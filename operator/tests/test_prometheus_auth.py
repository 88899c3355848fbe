"""The TTL source and canary analysis reach a Prometheus behind auth, as most are: a real
Prometheus scraping a ranker-like target, in front of it a proxy that serves TLS from a
private CA and answers only a bearer token and a tenant header (what kube-rbac-proxy or a
Mimir gateway does). The operator's source settings carry the CA file, the token file and the
header; what is wrong among them is the condition's reason, not a traceback."""

from __future__ import annotations

import datetime as dt
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from kvrank.tools.processes import PrometheusServer, free_port
from kvrank_common import INTERVAL_METRIC, REQUESTS_METRIC
from kvrank_operator.analysis import prometheus_window
from kvrank_operator.certs import redis_tls
from kvrank_operator.sources import from_prometheus
from kvrank_operator.spec import PrometheusEndpoint, parse_spec

TENANT = ("X-Scope-OrgID", "team-a")


@dataclass
class Guarded:
    """The proxy's address and what it accepts (``token`` may be changed: a rotation)."""

    url: str
    ca_file: str
    token: str


def _proxy(
    upstream: str, guard: Guarded, tls: dict[str, str], workdir: Path
) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if (
                self.headers.get("Authorization") != f"Bearer {guard.token}"
                or self.headers.get(TENANT[0]) != TENANT[1]
            ):
                self.send_response(401)
                self.end_headers()
                return
            resp = httpx.get(f"{upstream}{self.path}", timeout=10)
            self.send_response(resp.status_code)
            self.send_header("Content-Type", resp.headers.get("content-type", "text/plain"))
            self.send_header("Content-Length", str(len(resp.content)))
            self.end_headers()
            self.wfile.write(resp.content)

        def log_message(self, *_: object) -> None:
            pass

    (workdir / "tls.crt").write_text(tls["tls.crt"])
    (workdir / "tls.key").write_text(tls["tls.key"])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(workdir / "tls.crt", workdir / "tls.key")
    server = ThreadingHTTPServer(("127.0.0.1", int(guard.url.rsplit(":", 1)[1])), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    return server


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    """A Prometheus that has scraped one ranker-like target of ``feed`` in ``prod`` (mean
    user interval 2.5 s, 8 of 10 requests from L1), behind the TLS + token proxy."""
    workdir = tmp_path_factory.mktemp("guarded")
    registry = CollectorRegistry()
    Gauge(INTERVAL_METRIC, "mean interval", registry=registry).set(2.5)
    requests = Counter(
        REQUESTS_METRIC.removesuffix("_total"),
        "requests",
        ["outcome", "model_version"],
        registry=registry,
    )
    for outcome in (
        "l1",
        "miss",
    ):  # series at zero before the first scrape: increase() counts from it
        requests.labels(outcome, "v2")
    target_port = free_port()
    target, target_thread = start_http_server(target_port, "127.0.0.1", registry)
    labels = {"namespace": "prod", "app_kubernetes_io_instance": "feed"}
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "rankers",
                "static_configs": [{"targets": [f"127.0.0.1:{target_port}"], "labels": labels}],
            }
        ],
    }
    prometheus = PrometheusServer(workdir / "prometheus", config).start()
    tls = redis_tls("prometheus", ["localhost"], dt.datetime.now(dt.UTC))
    (workdir / "ca.crt").write_text(tls["ca.crt"])
    guard = Guarded(f"https://localhost:{free_port()}", str(workdir / "ca.crt"), "token-1")
    proxy = _proxy(prometheus.url, guard, tls, workdir)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        scraped = f"count_over_time({INTERVAL_METRIC}[1m]) >= 2"
        deadline = time.monotonic() + 30
        while not httpx.get(
            f"{prometheus.url}/api/v1/query", params={"query": scraped}, timeout=5
        ).json()["data"]["result"]:
            assert time.monotonic() < deadline, "Prometheus did not scrape the target"
            time.sleep(0.5)
        for i in range(10):
            requests.labels("l1" if i < 8 else "miss", "v2").inc()
        time.sleep(3)  # scraped after the increments
        yield guard
    finally:
        proxy.shutdown()
        proxy.server_close()
        thread.join()
        prometheus.stop()
        target.shutdown()
        target.server_close()
        target_thread.join()


def _endpoint(
    guard: Guarded, tmp_path: Path, token: str | None, ca: bool = True
) -> PrometheusEndpoint:
    token_file = None
    if token is not None:
        (tmp_path / "token").write_text(f"{token}\n")  # as a mounted Secret holds it
        token_file = str(tmp_path / "token")
    return PrometheusEndpoint(guard.url, token_file, guard.ca_file if ca else None, dict([TENANT]))


@pytest.mark.slow
def test_the_ttl_source_measures_through_tls_a_token_and_a_tenant(
    guarded: Guarded, tmp_path: Path
) -> None:
    seen = from_prometheus(_endpoint(guarded, tmp_path, guarded.token), "feed", "prod")
    assert seen.problem is None
    assert seen.mean_interval_s == pytest.approx(2.5)


def test_canary_analysis_reads_its_window_through_the_same_client(
    guarded: Guarded, tmp_path: Path
) -> None:
    window = prometheus_window(
        _endpoint(guarded, tmp_path, guarded.token), "feed", "prod", "v1", "v2", 60
    )
    assert window.problem is None
    # increase() extrapolates towards the window's ends: the ratio is what holds exactly
    assert window.canary["requests"] >= 10
    assert window.canary["cached"] / window.canary["requests"] == pytest.approx(0.8, abs=0.01)


def test_a_missing_or_stale_token_is_unauthorized_and_a_rotated_one_is_read_again(
    guarded: Guarded, tmp_path: Path
) -> None:
    seen = from_prometheus(_endpoint(guarded, tmp_path, None), "feed", "prod")
    assert seen.problem is not None and seen.problem[0] == "PrometheusUnauthorized"
    assert "bearerTokenFile" in seen.problem[1]
    endpoint = _endpoint(guarded, tmp_path, "token-1")
    before = guarded.token
    try:
        guarded.token = "token-2"  # the proxy's side rotated first: the old token is refused
        stale = from_prometheus(endpoint, "feed", "prod")
        assert stale.problem is not None and stale.problem[0] == "PrometheusUnauthorized"
        Path(endpoint.bearer_token_file or "").write_text("token-2\n")  # the Secret updated
        assert from_prometheus(endpoint, "feed", "prod").mean_interval_s == pytest.approx(2.5)
    finally:
        guarded.token = before


def test_a_certificate_from_an_unknown_ca_is_refused_and_said(
    guarded: Guarded, tmp_path: Path
) -> None:
    seen = from_prometheus(_endpoint(guarded, tmp_path, guarded.token, ca=False), "feed", "prod")
    assert seen.problem is not None and seen.problem[0] == "PrometheusUnreachable"
    assert "CERTIFICATE_VERIFY_FAILED" in seen.problem[1]
    missing = PrometheusEndpoint(guarded.url, None, str(tmp_path / "absent.crt"))
    problem = prometheus_window(missing, "feed", "prod", "v1", "v2", 60).problem
    assert problem is not None and "caFile" in problem and "absent.crt" in problem


def test_the_spec_carries_the_endpoint_for_both_sources() -> None:
    source = {
        "type": "prometheus",
        "prometheus": {
            "url": "https://thanos-querier.openshift-monitoring.svc:9091",
            "bearerTokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token",
            "caFile": "/var/run/secrets/kubernetes.io/serviceaccount/service-ca.crt",
            "headers": {"X-Scope-OrgID": "ranking"},
        },
    }
    spec = parse_spec(
        {
            "model": {"version": "v1", "uri": "/m"},
            "ttl": {"source": source},
            "canary": {"version": "v2", "uri": "/m2", "analysis": {"source": source}},
        }
    )
    assert spec.canary is not None
    for endpoint in (spec.ttl.prometheus, spec.canary.analysis.prometheus):
        assert endpoint is not None
        assert endpoint.bearer_token_file == "/var/run/secrets/kubernetes.io/serviceaccount/token"
        assert endpoint.headers == {"X-Scope-OrgID": "ranking"}
