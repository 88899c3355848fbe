"""kopf wiring: what wakes a RankerDeployment's reconciler, and error mapping.

Each RankerDeployment has one reconciler (a kopf daemon) that runs
:func:`reconcile.reconcile` (level-based), writes what changed of the status and posts the
Events. Process state reaches handlers in kopf's ``memo``: the operator's
(:class:`OperatorContext`, ``memo.operator``: its client, options and metrics) and each
RankerDeployment's own (``memo.reconcile``, what its passes remember).

The reconciler runs when something it depends on changes — the spec, or an owned
Deployment, StatefulSet, Job or Pod (watched with a server-side label selector, so the
operator never sees anyone else's objects) — when a deadline it set passes (a retired cache
namespace's purge, the TTL tuner's next measurement), and otherwise every ``RESYNC_S`` (a
Redis node's health is no API event). Nothing here reconciles by itself, and a steady state
costs no writes: only changed objects are applied and only changed status fields are sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from kvrank_operator import crd
from kvrank_operator.kube import Kube, merge_patch_between
from kvrank_operator.metrics import OperatorMetrics
from kvrank_operator.reconcile import Memory, Options, reconcile
from kvrank_operator.reconcilers.base import Event
from kvrank_operator.reconcilers.observe import Owned

log = logging.getLogger("kvrank_operator")
RESYNC_S = 30.0
"""A RankerDeployment that nothing woke is reconciled this often: the managed Redis's health
(asked of its nodes, not the API) and any watch event the operator missed."""
SETTLE_S = 0.5
"""After a wake-up, wait this long for the rest of a burst (a rollout changes a Deployment,
its ReplicaSet's pods and their readiness within moments): one reconcile for all of it."""
RETRY_S = 5.0
"""After a failed reconcile (the API answered with an error), try again this soon."""
OWNED = (("apps", "v1", "deployments"), ("apps", "v1", "statefulsets"), ("batch", "v1", "jobs"))
OWNED_SELECTOR = "app.kubernetes.io/managed-by=kvrank-operator"
INSTANCE_LABEL = "app.kubernetes.io/instance"


@dataclass
class OperatorContext:
    """The operator process's shared state, handed to every handler in kopf's ``memo``
    (``memo.operator``): set up once by the command line."""

    kube: Kube
    options: Options = field(default_factory=Options)
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics.create)
    wakers: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    """(namespace, name) → the event that RankerDeployment's reconciler waits on."""


def _context(memo: Any) -> OperatorContext:
    context: OperatorContext = memo.operator
    return context


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kvrank.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kvrank.io", key="last-handled-configuration"
    )
    settings.peering.standalone = True
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.posting.level = logging.INFO
    for group, version, plural in (*OWNED, ("", "v1", "pods")):
        # the API server filters: the operator watches its own objects, not the cluster's
        settings.watching.label_selectors[group, version, plural] = OWNED_SELECTOR
    _upgrade_crd(_context(memo).kube)


def _upgrade_crd(kube: Kube, timeout_s: float = 30.0) -> None:
    """Bring the installed CRD to this operator's schema. ``helm upgrade`` never touches a
    chart's ``crds/``, so the new operator applies its own (RBAC: ``patch`` on this one CRD
    only; the first install still comes from the chart). Waits until it is Established:
    kopf resolves the resources it serves right after this, once."""
    body = crd.crd()
    try:
        kube.apply(body, owner=None)
    except ApiException as exc:
        log.error("could not apply the RankerDeployment CRD (%s %s)", exc.status, exc.reason)
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = kube.get(body["apiVersion"], body["kind"], "", body["metadata"]["name"]) or {}
        conditions = (got.get("status") or {}).get("conditions") or []
        if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
            log.info("RankerDeployment CRD at this operator's schema (%s)", crd.VERSION)
            return
        time.sleep(0.2)
    log.error("the RankerDeployment CRD is not Established after %.0f s", timeout_s)


# ------------------------------------------------------------------------ wake-ups


def _wake(memo: Any, namespace: str | None, name: str | None) -> None:
    waker = _context(memo).wakers.get((namespace or "", name or ""))
    if waker is not None:
        waker.set()


@kopf.on.update(crd.GROUP, crd.VERSION, crd.PLURAL, field="spec")
def spec_changed(meta: kopf.Meta, memo: kopf.Memo, **_: Any) -> None:
    _context(memo).kube.forget_applied()  # a new spec: send everything once
    _wake(memo, meta.namespace, meta.name)


def _owned_changed(meta: kopf.Meta, memo: kopf.Memo, **_: Any) -> None:
    _wake(memo, meta.namespace, meta.labels.get(INSTANCE_LABEL))


for _group, _version, _plural in OWNED:
    kopf.on.event(_group, _version, _plural, labels={INSTANCE_LABEL: kopf.PRESENT})(_owned_changed)
kopf.on.event("", "v1", "pods", labels={INSTANCE_LABEL: kopf.PRESENT})(_owned_changed)


# ------------------------------------------------------------------------- indexes

OwnedIndex = kopf.Index[tuple[str, str], dict[str, Any]]
"""A RankerDeployment's (namespace, name) → its owned objects of one kind, as watched."""


def _by_instance(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[tuple[str, str], dict[str, Any]]:
    return {(namespace or "", labels.get(INSTANCE_LABEL, "")): copy.deepcopy(dict(body))}


OWNED_INDEXES = {
    "owned_deployments": ("apps", "v1", "deployments"),
    "owned_pods": ("", "v1", "pods"),
    "owned_jobs": ("batch", "v1", "jobs"),
}
"""What a pass observes, kept as the watches report it (a steady pass lists nothing)."""
for _id, (_group, _version, _plural) in OWNED_INDEXES.items():
    kopf.index(_group, _version, _plural, id=_id, labels={INSTANCE_LABEL: kopf.PRESENT})(
        _by_instance
    )


def _owned(key: tuple[str, str], *indexes: OwnedIndex) -> Owned:
    """The instance's objects the watches hold now, copied in the event loop (which alone
    updates the indexes) for a pass that runs in a thread."""
    return Owned(tuple(obj for index in indexes for obj in (index.get(key) or ())))


# ---------------------------------------------------------------------- reconciler


@kopf.daemon(crd.GROUP, crd.VERSION, crd.PLURAL, cancellation_timeout=30.0)
async def reconciler(
    body: kopf.Body,
    stopped: kopf.DaemonStopped,
    memo: kopf.Memo,
    **kwargs: Any,
) -> None:
    """One RankerDeployment's reconcile loop, from its creation (or the operator's start)
    until its deletion. kopf hands the indexes over by their ids, among ``kwargs``."""
    indexes: list[OwnedIndex] = [kwargs[i] for i in OWNED_INDEXES]
    context = _context(memo)
    key = (body.metadata.namespace or "", body.metadata.name or "")
    waker = context.wakers[key] = asyncio.Event()
    loop = _Loop(context, memo.setdefault("reconcile", Memory()))
    trigger = "start"
    # at 0 from the start: an alert on increase() sees the first abort too
    metrics = context.metrics
    metrics.events.labels(*key, "CanaryAborted")
    try:
        while not stopped:
            waker.clear()
            snapshot = copy.deepcopy(dict(body))  # kopf updates the body as events arrive
            owned = _owned(key, *indexes)
            delay, events = await asyncio.to_thread(loop.once, snapshot, trigger, owned)
            for etype, reason, message in events:
                (kopf.warn if etype == "Warning" else kopf.info)(
                    body, reason=reason, message=message
                )
                metrics.events.labels(*key, reason).inc()
            status = {**(snapshot.get("status") or {}), **loop.written}
            _publish_ttl_source(metrics, key, status)
            woken = await _sleep(waker, stopped, delay)
            trigger = "event" if woken else "resync"
            if woken:
                await asyncio.sleep(SETTLE_S)
    finally:
        context.wakers.pop(key, None)
        with contextlib.suppress(KeyError):
            metrics.ttl_source_ok.remove(*key)


def _publish_ttl_source(
    metrics: OperatorMetrics, key: tuple[str, str], status: dict[str, Any]
) -> None:
    for c in status.get("conditions") or []:
        if c["type"] == "TTLSource":
            metrics.ttl_source_ok.labels(*key).set(1.0 if c["status"] == "True" else 0.0)


async def _sleep(waker: asyncio.Event, stopped: kopf.DaemonStopped, delay: float) -> bool:
    """Until ``delay`` passes, the reconciler is woken or stopped; whether it was woken."""
    wait = asyncio.ensure_future(waker.wait())
    stop = asyncio.ensure_future(stopped.wait())
    try:
        await asyncio.wait({wait, stop}, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (wait, stop):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return waker.is_set()


@dataclass
class _Loop:
    """One RankerDeployment's reconciler between its passes."""

    context: OperatorContext
    memory: Memory
    written: dict[str, Any] = field(default_factory=dict)
    """Status fields this loop wrote (the body kopf hands over may lag behind)."""

    def once(
        self, body: dict[str, Any], trigger: str, owned: Owned | None = None
    ) -> tuple[float, tuple[Event, ...]]:
        """Reconcile and send what changed of the status; returns the seconds until the
        next deadline and the Events to post."""
        started = time.monotonic()
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        current = {**(body.get("status") or {}), **self.written}
        kube, metrics = self.context.kube, self.context.metrics
        try:
            outcome = reconcile(
                kube,
                {**body, "status": current},
                dt.datetime.now(dt.UTC),
                self.memory,
                self.context.options,
                owned,
            )
            status = outcome.status.for_storage()
            # kopf keeps its own field in the status: never the reconciler's to remove
            mine = {k: v for k, v in current.items() if k != "kopf" and v is not None}
            patch = merge_patch_between(mine, status)
            if patch:
                kube.patch_status(crd.API_VERSION, crd.KIND, ns, name, patch)
                self.written.update({k: status.get(k) for k in patch})
        except ApiException as exc:
            metrics.reconciles.labels(trigger, "error").inc()
            log.warning(  # the API's own words say what it refused
                "reconcile of %s/%s: Kubernetes API %s %s: %s",
                ns,
                name,
                exc.status,
                exc.reason,
                str(exc.body or "")[:500],
            )
            return RETRY_S, ()
        except Exception:  # a bug must not leave this RankerDeployment unmanaged until a restart
            metrics.reconciles.labels(trigger, "error").inc()
            log.exception("reconcile of %s/%s failed", ns, name)
            return RETRY_S, ()
        finally:
            metrics.reconcile_seconds.observe(time.monotonic() - started)
        metrics.reconciles.labels(trigger, "ok").inc()
        return max(0.0, min(RESYNC_S, outcome.due_in)), outcome.events
