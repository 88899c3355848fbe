"""kopf wiring: which events trigger a reconcile, the timers, and error mapping.

Thin by design: every handler calls :func:`reconcile.reconcile` (level-based) and copies its
status and Events back. A ``SpecError`` never reaches kopf (it is a Degraded condition);
API errors become ``TemporaryError`` so kopf retries with back-off.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException
from prometheus_client import Counter, Histogram

from kvrank_operator import crd
from kvrank_operator.kube import Kube, load_client
from kvrank_operator.reconcile import reconcile
from kvrank_operator.redis_cluster import check_and_heal
from kvrank_operator.sources import tune_ttl

log = logging.getLogger("kvrank_operator")
RECONCILES = Counter(
    "kvrank_operator_reconciles", "Reconciles by trigger and result", ["trigger", "result"]
)
LATENCY = Histogram("kvrank_operator_reconcile_seconds", "Reconcile latency")
RESYNC_S = 5.0
"""Level-based resync: picks up pod readiness, grace periods and purge Jobs."""

_kube: Kube | None = None
KUBECONFIG: str | None = None


def kube() -> Kube:
    global _kube
    if _kube is None:
        _kube = Kube(load_client(KUBECONFIG))
    return _kube


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kvrank.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kvrank.io", key="last-handled-configuration"
    )
    settings.peering.standalone = True
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.posting.level = logging.INFO
    _upgrade_crd()


def _upgrade_crd() -> None:
    """Bring the installed CRD to this operator's schema. ``helm upgrade`` never touches a
    chart's ``crds/``, so the new operator applies its own (RBAC: ``patch`` on this one CRD
    only; the first install still comes from the chart)."""
    try:
        kube().apply(crd.crd(), owner=None)
    except ApiException as exc:
        log.error("could not apply the RankerDeployment CRD (%s %s)", exc.status, exc.reason)
    else:
        log.info("RankerDeployment CRD at this operator's schema (%s)", crd.VERSION)


def _run(trigger: str, body: kopf.Body, patch: kopf.Patch, logger: Any) -> None:
    started = time.monotonic()
    try:
        outcome = reconcile(
            kube(),
            dict(body),
            dt.datetime.now(dt.UTC),
            redis_health=check_and_heal,
        )
    except ApiException as exc:
        RECONCILES.labels(trigger, "error").inc()
        raise kopf.TemporaryError(f"Kubernetes API: {exc.status} {exc.reason}", delay=5) from exc
    finally:
        LATENCY.observe(time.monotonic() - started)
    RECONCILES.labels(trigger, "ok").inc()
    current = dict(body).get("status") or {}
    # only what changed: a steady state writes nothing (kopf sends no empty patch)
    patch.status.update({k: v for k, v in outcome.status.items() if current.get(k) != v})
    for etype, reason, message in outcome.events:
        (kopf.warn if etype == "Warning" else kopf.info)(body, reason=reason, message=message)


@kopf.on.resume(crd.GROUP, crd.VERSION, crd.PLURAL)
@kopf.on.create(crd.GROUP, crd.VERSION, crd.PLURAL)
@kopf.on.update(crd.GROUP, crd.VERSION, crd.PLURAL, field="spec")
def on_change(body: kopf.Body, patch: kopf.Patch, logger: Any, **_: Any) -> None:
    kube().forget_applied()  # a new spec, or the operator (re)starting: send everything
    _run("change", body, patch, logger)


@kopf.timer(crd.GROUP, crd.VERSION, crd.PLURAL, interval=RESYNC_S, initial_delay=RESYNC_S)
def resync(body: kopf.Body, patch: kopf.Patch, logger: Any, **_: Any) -> None:
    _run("timer", body, patch, logger)
    observed = tune_ttl(kube(), dict(body), dt.datetime.now(dt.UTC))
    if observed is None:
        return
    for key, value in observed.items():
        patch.status[key] = value
    tuned = observed.get("ttl")
    if tuned is not None:
        kopf.info(
            body,
            reason="TTLUpdated",
            message=f"cache TTL now {tuned['seconds']}s"
            f" (mean interval {tuned.get('meanIntervalSeconds')}s, {tuned['source']})",
        )
