"""The operator's one Prometheus client: instant queries for the TTL source
(:mod:`kvrank_operator.sources`) and canary analysis (:mod:`kvrank_operator.analysis`).

A production Prometheus sits behind auth: a TLS certificate from a private CA, a proxy that
wants a bearer token (kube-rbac-proxy, an OpenShift Thanos querier), a tenant header in
front of Mimir, Cortex or Thanos. :class:`~kvrank_operator.spec.PrometheusEndpoint` says
which; this module sends every query with them over httpx. The token file is read at each
query: a projected service-account token is rotated under a running operator.

A failure is a :class:`QueryError` whose ``reason`` becomes a condition's reason (the TTL
source) or an analysis window's problem, never an exception out of a reconcile.
"""

from __future__ import annotations

import math
import ssl
from pathlib import Path
from types import TracebackType

import httpx

from kvrank_operator.spec import PrometheusEndpoint

TIMEOUT_S = 3.0

Row = tuple[dict[str, str], float]
"""One series of an instant vector: its labels and its value."""


class QueryError(Exception):
    """Why a query has no answer: ``reason`` is ``PrometheusUnreachable`` (no connection,
    a TLS failure, an unreadable credential file), ``PrometheusUnauthorized`` (HTTP 401/403)
    or ``QueryFailed`` (any other refusal, a bad query's 400 included)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


class Prometheus:
    """Queries to one endpoint over one connection pool: ``with Prometheus(ep) as p:``."""

    def __init__(self, endpoint: PrometheusEndpoint, timeout_s: float = TIMEOUT_S) -> None:
        self.endpoint = endpoint
        self._problem: QueryError | None = None
        """Why no query can be sent (a CA file that cannot be read), raised by each."""
        verify: ssl.SSLContext | bool = True
        if endpoint.ca_file is not None:
            try:
                verify = ssl.create_default_context(cafile=endpoint.ca_file)
            except (OSError, ssl.SSLError) as exc:
                self._problem = QueryError(
                    "PrometheusUnreachable", f"caFile {endpoint.ca_file}: {exc}"
                )
        self._client = httpx.Client(
            base_url=endpoint.url.rstrip("/"),
            headers=endpoint.headers,
            verify=verify,
            timeout=timeout_s,
        )

    def __enter__(self) -> Prometheus:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._client.close()

    def query(self, promql: str) -> list[Row]:
        """An instant query's series; NaN and infinite values kept (callers decide)."""
        if self._problem is not None:
            raise self._problem
        url = self.endpoint.url
        try:
            resp = self._client.get("/api/v1/query", params={"query": promql}, headers=self._auth())
        except httpx.HTTPError as exc:
            raise QueryError("PrometheusUnreachable", f"{url}: {exc}") from exc
        if resp.status_code in (401, 403):
            raise QueryError(
                "PrometheusUnauthorized",
                f"HTTP {resp.status_code} from {url}: check the source's bearerTokenFile and"
                " headers",
            )
        if resp.status_code != 200:  # Prometheus answers a bad query with 400
            raise QueryError("QueryFailed", f"{promql}: HTTP {resp.status_code} from {url}")
        try:
            rows = resp.json()["data"]["result"]
            return [(r["metric"], float(r["value"][1])) for r in rows]
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise QueryError("QueryFailed", f"{promql}: not a vector from {url}: {exc}") from exc

    def first_value(self, promql: str) -> float:
        """The first series' value of a query that should have one finite value."""
        rows = self.query(promql)
        if not rows:
            raise QueryError(
                "NoData", f"no series for {promql} (is a PodMonitor scraping the pods?)"
            )
        value = rows[0][1]
        if not math.isfinite(value):  # 0/0 of a ratio of rates without traffic: NaN
            raise QueryError("NoData", f"{promql} is {value} (no requests in its window?)")
        return value

    def _auth(self) -> dict[str, str]:
        path = self.endpoint.bearer_token_file
        if path is None:
            return {}
        try:
            token = Path(path).read_text().strip()
        except OSError as exc:
            raise QueryError("PrometheusUnreachable", f"bearerTokenFile {path}: {exc}") from exc
        return {"Authorization": f"Bearer {token}"}
