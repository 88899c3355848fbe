"""The one shape every concern of a pass has, and what it takes and gives back.

A pass has two phases (:mod:`kvrank_operator.reconcile`): the deciders (TTL, canary) settle
the spec as it applies now, then every concern (``concerns.CONCERNS``) says what it wants
applied from the pass's :class:`Context` (``desired``) and, once it is applied and the
cluster observed once, what it reports (``report``). A concern never sets a
condition's time or generation (the status writer does, once per pass), never patches the
status, never posts an Event itself and never reads another concern's report.
"""

from __future__ import annotations

import datetime as dt
import math
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from kubernetes.client.exceptions import ApiException

from kvrank_operator import manifests as m
from kvrank_operator.certs import redis_tls
from kvrank_operator.kube import Kube
from kvrank_operator.manifests.desired import Desired
from kvrank_operator.reconcilers.observe import Observed
from kvrank_operator.redis_cluster import AclUser, Health
from kvrank_operator.spec import RankerSpec
from kvrank_operator.state import CacheNamespace, ConditionUpdate, Instance, Serving, Status

Event = tuple[str, str, str]
"""``(type, reason, message)``: an Event to post on the RankerDeployment."""

HealthCheck = Callable[[list[str], str | None, int, int, str | None, Sequence[AclUser]], Health]
"""``(ip:port of each pod, password, expected nodes, replicas per shard, TLS CA or None, ACL
users every node must have) → Health`` (and heal a step, and set the users on every node)."""


@dataclass(frozen=True)
class Pass:
    """One reconcile pass of one RankerDeployment: read once, shared by every reconciler."""

    kube: Kube
    instance: Instance
    spec: RankerSpec
    """The spec as written, parsed once for the whole pass."""
    prior: Status
    """The status as the pass found it."""
    now: dt.datetime


@dataclass(frozen=True)
class Fresh:
    """Secret values generated for a pass, used only where their Secret does not exist yet
    (never replaced under running pods)."""

    redis_password: str
    """The managed Redis's ``default`` user's (the operator's)."""
    ranker_password: str
    """The managed Redis's ACL user's, which its rankers and purge Jobs authenticate as."""
    entry_key: str
    """The cache-entry secret the rankers sign L2 entries with."""
    redis_tls: dict[str, str] | None
    """A managed Redis's certificates when it runs TLS with no Secret of the user's."""

    @classmethod
    def generate(cls, spec: RankerSpec, instance: Instance, now: dt.datetime) -> Fresh:
        r = spec.cache.redis
        tls = None
        if r.mode == "managed" and r.tls and not r.tls_secret:  # half a millisecond
            name, ns = instance.name, instance.namespace
            tls = redis_tls(m.redis_name(name), m.tls_dns_names(name, ns), now)
        return cls(
            secrets.token_urlsafe(24), secrets.token_urlsafe(24), secrets.token_urlsafe(32), tls
        )


@dataclass(frozen=True)
class Context:
    """What the concerns want applied from: the same for the operator's pass and for
    ``kvrank-operator render`` (which has no cluster)."""

    instance: Instance
    live: RankerSpec
    """The spec as the rollout applies it now (the canary's weight at its step)."""
    ttl_s: float | None
    """The cache TTL in force (``None``: not measured yet)."""
    routed: frozenset[str]
    """Versions with a ready pod when the pass began: a canary gets router weight only then."""
    fresh: Fresh
    monitoring: m.PodMonitoring | None = None
    """A PodMonitor per RankerDeployment; ``None``: none."""
    redis_health: HealthCheck | None = None
    """Asks a formed managed Redis's nodes (and heals a step); ``None``: the StatefulSet
    alone says."""


@dataclass(frozen=True)
class Applied:
    """What applying one concern's desired objects did."""

    created: tuple[Desired, ...] = ()
    """Create-only objects that were absent and were created now."""
    unserved: tuple[str, ...] = ()
    """``Kind (apiVersion)`` of optional objects whose API this cluster does not serve."""
    refused: tuple[str, ...] = ()
    """``Kind name: API status reason`` of optional objects the API server refused."""
    writes: int = 0
    """Objects sent to the API server (an unchanged object applied moments ago is not)."""


@dataclass(frozen=True)
class Report:
    """A concern's conditions, Events, next deadline and its part of the status."""

    conditions: tuple[ConditionUpdate, ...] = ()
    removed: tuple[str, ...] = ()
    """Condition types that no longer apply (their concern is switched off)."""
    events: tuple[Event, ...] = ()
    due_in: float = math.inf
    """Seconds until it wants a pass again without any API event (``inf``: none)."""
    unready: tuple[tuple[str, str], ...] = ()
    """``(reason, message)`` for what keeps the instance from answering requests; the pass
    composes ``Ready`` from every concern's (what ``kubectl wait --for=condition=Ready``
    waits for is an instance that answers)."""
    serving: Serving | None = None
    """``status.serving`` (the versions' concern)."""
    cache_namespaces: tuple[CacheNamespace, ...] | None = None
    """``status.cacheNamespaces`` (the cache namespaces' concern)."""

    def __add__(self, other: Report) -> Report:
        return Report(
            self.conditions + other.conditions,
            self.removed + other.removed,
            self.events + other.events,
            min(self.due_in, other.due_in),
            self.unready + other.unready,
            other.serving if other.serving is not None else self.serving,
            other.cache_namespaces if other.cache_namespaces is not None else self.cache_namespaces,
        )


class Concern(Protocol):
    """One part of what a RankerDeployment owns (a module with these two functions)."""

    def desired(self, c: Context) -> list[Desired]:
        """What it wants applied, in order (pure: no cluster)."""
        ...

    def report(self, p: Pass, c: Context, seen: Observed, applied: Applied) -> Report:
        """What it reports from the one observation after the apply (and what it does that
        depends on what was observed: old versions removed, purge Jobs, a Redis healed)."""
        ...


def apply(p: Pass, desired: list[Desired]) -> Applied:
    """Apply each desired object, and create each create-only one that is absent (never
    updating it). An optional object (a third-party CRD's kind) whose API is not served or
    that the API server refuses is reported, not raised."""
    created: list[Desired] = []
    unserved: list[str] = []
    refused: list[str] = []
    writes = 0
    for d in desired:
        api = str(d.obj["apiVersion"])
        if d.optional and not p.kube.serves(api, d.kind):
            unserved.append(f"{d.kind} ({api})")
            continue
        try:
            if not d.create_only:
                writes += p.kube.apply(d.obj, p.instance.owner)
            elif p.kube.create_if_absent(d.obj, p.instance.owner):
                created.append(d)
                writes += 1
        except ApiException as exc:
            if not d.optional:
                raise
            refused.append(f"{d.kind} {d.obj['metadata']['name']}: API {exc.status} {exc.reason}")
    return Applied(tuple(created), tuple(unserved), tuple(refused), writes)
