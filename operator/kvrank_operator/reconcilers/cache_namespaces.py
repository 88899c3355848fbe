"""Cache namespaces: one per live model version of a deployment, retired and purged once
the version is gone.

A live version's namespace is ``ACTIVE``. A version that leaves the spec retires its
namespace: a stable's is kept for ``cache.retiredNamespaceGraceSeconds`` (a rollback within
it finds the entries warm), an aborted canary's is worthless at once. The grace period
counts from the version's last pod (a draining pod would write into a purged namespace).
Then a Job deletes the namespace's keys (``PURGING``) and, once it succeeded, ``PURGED``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math

from kvrank_operator import manifests as m
from kvrank_operator.clock import iso, parse_iso
from kvrank_operator.manifests.desired import Desired
from kvrank_operator.reconcilers.base import Applied, Context, Event, Pass, Report
from kvrank_operator.reconcilers.observe import Observed
from kvrank_operator.spec import RankerSpec, namespace_for
from kvrank_operator.state import CacheNamespace, NamespaceState

ACTIVE, RETIRED = NamespaceState.ACTIVE, NamespaceState.RETIRED
PURGING, PURGED = NamespaceState.PURGING, NamespaceState.PURGED


def desired(c: Context) -> list[Desired]:
    return []  # purge Jobs are created as observed namespaces come due (``report``)


def report(p: Pass, c: Context, seen: Observed, applied: Applied) -> Report:
    live = c.live
    events: list[Event] = []
    wanted = {
        namespace_for(p.instance.name, p.instance.namespace, version): (version, role)
        for version, role in live.versions()
    }
    entries = _activate(p, wanted, events)
    entries = [e if e.namespace in wanted else _step(p, live, e, seen, events) for e in entries]
    due = [d for e in entries if (d := e.purge_due_in(p.now)) is not None]
    return Report(
        events=tuple(events), due_in=min(due, default=math.inf), cache_namespaces=tuple(entries)
    )


def _activate(
    p: Pass, wanted: dict[str, tuple[str, str]], events: list[Event]
) -> list[CacheNamespace]:
    """Every live version's namespace active in its current role. A version back after
    its namespace retired finds it again (warm within the grace period); a purge of it
    still running is stopped first (it would delete the new entries). A namespace named
    otherwise than it is now (an older operator's naming) is no longer wanted: it retires
    like any other, once no pod writes into it."""
    kept: list[CacheNamespace] = []
    for e in p.prior.cache_namespaces:
        if e.namespace not in wanted:
            kept.append(e)
        elif e.state is ACTIVE:
            kept.append(dataclasses.replace(e, role=wanted[e.namespace][1]))
        elif e.state is PURGING and e.job:
            p.kube.delete("batch/v1", "Job", p.instance.namespace, e.job)
            why = f"purge of namespace {e.namespace} stopped (Job {e.job}): its version is back"
            events.append(("Normal", "CachePurgeStopped", why))
    active = {e.namespace for e in kept if e.state is ACTIVE}
    for namespace, (version, role) in wanted.items():
        if namespace in active:
            continue
        kept.append(CacheNamespace(version, namespace, role, ACTIVE, iso(p.now)))
        why = f"{role} version {version} uses namespace {namespace}"
        events.append(("Normal", "CacheNamespaceActive", why))
    return kept


def _step(
    p: Pass, live: RankerSpec, e: CacheNamespace, seen: Observed, events: list[Event]
) -> CacheNamespace:
    """A namespace no live version uses, one state further where one is due."""
    if e.state is ACTIVE:
        e = _retire(live, e, p.now, events)
    if e.state is RETIRED and e.namespace in seen.writing:
        # a pod writing into it (even one draining) would leave new entries after the
        # purge: the grace period counts from its last pod
        return dataclasses.replace(e, purge_after=_purge_after(live, e, p.now))
    if e.state is RETIRED and parse_iso(e.purge_after or e.since) <= p.now:
        job = m.purge_job(live, p.instance.name, p.instance.namespace, e.namespace, e.since)
        p.kube.create_if_absent(job, p.instance.owner)
        name = job["metadata"]["name"]
        why = f"purging namespace {e.namespace} (Job {name})"
        events.append(("Normal", "CacheNamespacePurging", why))
        return dataclasses.replace(e, state=PURGING, job=name)
    if e.state is PURGING and e.job in seen.finished_jobs:
        events.append(("Normal", "CacheNamespacePurged", f"namespace {e.namespace} purged"))
        return dataclasses.replace(e, state=PURGED, since=iso(p.now))
    return e


def _retire(
    live: RankerSpec, e: CacheNamespace, now: dt.datetime, events: list[Event]
) -> CacheNamespace:
    aborted = e.role == "canary"
    retired = dataclasses.replace(
        e, state=RETIRED, since=iso(now), purge_after=_purge_after(live, e, now)
    )
    why = "canary aborted" if aborted else f"purge in {_grace(live, e)}s"
    reason = "CanaryAborted" if aborted else "CacheNamespaceRetired"
    events.append(("Normal", reason, f"namespace {e.namespace} retired ({why})"))
    return retired


def _purge_after(live: RankerSpec, e: CacheNamespace, now: dt.datetime) -> str:
    return iso(now + dt.timedelta(seconds=_grace(live, e)))


def _grace(live: RankerSpec, e: CacheNamespace) -> int:
    """An aborted canary's entries are worthless at once; a retired stable's are kept for a
    grace period (a rollback within it finds them warm)."""
    return 0 if e.role == "canary" else live.cache.retired_namespace_grace_seconds
