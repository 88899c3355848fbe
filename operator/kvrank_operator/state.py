"""The operator's state of one ``RankerDeployment``, typed and immutable.

What the operator remembers between passes lives in the resource's ``status`` (so a
restarted operator, or another replica, carries on where the last one stopped). This module
is the one place that reads it (``Status.from_storage``) and writes it
(``Status.for_storage``), as kopf keeps its own handler state: small frozen types, states
as enums, never a bare string compared in four modules. It also names the instance a pass
is about (:class:`Instance`). Pure: no API calls, no clock.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kvrank_operator.clock import iso, parse_iso
from kvrank_operator.crd import API_VERSION, KIND
from kvrank_operator.kube import Owner


@dataclass(frozen=True)
class Instance:
    """Which ``RankerDeployment`` a pass is about."""

    name: str
    namespace: str
    uid: str
    generation: int

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Instance:
        meta = body["metadata"]
        return cls(meta["name"], meta["namespace"], meta["uid"], int(meta.get("generation", 1)))

    @property
    def owner(self) -> Owner:
        """The owner reference every object of this instance carries."""
        return Owner(API_VERSION, KIND, self.name, self.uid)


# ------------------------------------------------------------------------- conditions


@dataclass(frozen=True)
class ConditionUpdate:
    """What a reconciler says of one condition type; the time and generation are added
    when it is written (:func:`with_conditions`)."""

    type: str
    ok: bool
    reason: str
    message: str


@dataclass(frozen=True)
class Condition:
    """One entry of ``status.conditions``, the Kubernetes way."""

    type: str
    ok: bool
    reason: str
    message: str
    observed_generation: int
    last_transition_time: str

    @classmethod
    def from_storage(cls, doc: Mapping[str, Any]) -> Condition:
        return cls(
            doc["type"],
            doc["status"] == "True",
            doc.get("reason", ""),
            doc.get("message", ""),
            int(doc.get("observedGeneration", 0)),
            doc.get("lastTransitionTime", ""),
        )

    def for_storage(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "status": "True" if self.ok else "False",
            "reason": self.reason,
            "message": self.message,
            "observedGeneration": self.observed_generation,
            "lastTransitionTime": self.last_transition_time,
        }


def with_conditions(
    current: Iterable[Condition],
    updates: Iterable[ConditionUpdate],
    removed: Iterable[str],
    generation: int,
    now: dt.datetime,
) -> tuple[Condition, ...]:
    """``current`` with ``updates`` set and the ``removed`` types gone: one entry per type,
    in the order they first appeared; ``lastTransitionTime`` moves only when the status
    flips."""
    by_type = {c.type: c for c in current}
    for u in updates:
        before = by_type.get(u.type)
        flipped = before is None or before.ok != u.ok
        since = iso(now) if flipped or before is None else before.last_transition_time
        by_type[u.type] = Condition(u.type, u.ok, u.reason, u.message, generation, since)
    gone = set(removed)
    return tuple(c for t, c in by_type.items() if t not in gone)


# -------------------------------------------------------------------- cache namespaces


class NamespaceState(StrEnum):
    """Where a cache namespace is in its life: a live version's is ``ACTIVE``; a version
    gone leaves it ``RETIRED`` (kept for a grace period, so a rollback finds it warm), then
    ``PURGING`` (a Job deletes its keys) and ``PURGED``."""

    ACTIVE = "active"
    RETIRED = "retired"
    PURGING = "purging"
    PURGED = "purged"


@dataclass(frozen=True)
class CacheNamespace:
    """One model version's cache namespace (an entry of ``status.cacheNamespaces``)."""

    version: str
    namespace: str
    role: str
    """``stable`` or ``canary``: the role the version had when it was last live."""
    state: NamespaceState
    since: str
    """When it entered ``state`` (RFC 3339)."""
    purge_after: str | None = None
    """``RETIRED``: when its purge is due."""
    job: str | None = None
    """``PURGING``: the purge Job's name."""

    @classmethod
    def from_storage(cls, doc: Mapping[str, Any]) -> CacheNamespace:
        return cls(
            doc["version"],
            doc["namespace"],
            doc.get("role", "stable"),
            NamespaceState(doc["state"]),
            doc["since"],
            doc.get("purgeAfter"),
            doc.get("job"),
        )

    def for_storage(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "version": self.version,
            "namespace": self.namespace,
            "role": self.role,
            "state": self.state.value,
            "since": self.since,
        }
        if self.purge_after is not None:
            out["purgeAfter"] = self.purge_after
        if self.job is not None:
            out["job"] = self.job
        return out

    def purge_due_in(self, now: dt.datetime) -> float | None:
        """Seconds until a retired namespace's purge is due (a deadline no API event
        announces); ``None`` in any other state."""
        if self.state is not NamespaceState.RETIRED or self.purge_after is None:
            return None
        return (parse_iso(self.purge_after) - now).total_seconds()


# ------------------------------------------------------------------------------- TTL


@dataclass(frozen=True)
class TTLStatus:
    """The cache TTL in force (``status.ttl``): what the ranker ConfigMap carries."""

    seconds: float
    mean_interval_seconds: float | None
    """The measured mean per-user request interval it was derived from (``None``: fixed)."""
    updated_at: str
    source: str
    """``fixed``, ``pods`` or ``prometheus``."""

    @classmethod
    def from_storage(cls, doc: Mapping[str, Any]) -> TTLStatus | None:
        if doc.get("seconds") is None:
            return None
        return cls(
            float(doc["seconds"]),
            doc.get("meanIntervalSeconds"),
            doc.get("updatedAt", ""),
            doc.get("source", ""),
        )

    def for_storage(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "meanIntervalSeconds": self.mean_interval_seconds,
            "updatedAt": self.updated_at,
            "source": self.source,
        }


# ---------------------------------------------------------------------------- status

_ROLLOUT_KEYS = {
    "step_text": "stepText",
    "warm_hit_ratio": "warmHitRatio",
    "warm_requests": "warmRequests",
}
"""Field → status key, where they differ."""


class Phase(StrEnum):
    """Where a canary's rollout is (see :mod:`kvrank_operator.rollout` for the moves)."""

    STARTING = "Starting"
    WARMING = "Warming"
    PROGRESSING = "Progressing"
    MANUAL = "Manual"
    PROMOTED = "Promoted"
    ABORTED = "Aborted"


@dataclass(frozen=True)
class Rollout:
    """The canary's rollout (``status.canary``); its moves are :mod:`kvrank_operator.rollout`'s."""

    version: str
    phase: Phase
    since: str
    """When it entered ``phase`` (or its current step)."""
    step: int = 0
    """1 … len(steps) while progressing; 0 before."""
    message: str = ""
    weight: int | None = None
    """The canary's traffic share in force (``kubectl get``'s Weight column)."""
    step_text: str | None = None
    """``i/n`` (``kubectl get``'s Step column)."""
    checks: tuple[Mapping[str, Any], ...] | None = None
    """The current step's analysis, one entry per check."""
    warm_hit_ratio: float | None = None
    warm_requests: int | None = None
    reason: str | None = None
    """Why it was aborted."""
    ended: bool = False
    """The spec no longer has the canary: the record only says how the rollout ended."""

    @classmethod
    def from_storage(cls, doc: Mapping[str, Any]) -> Rollout:
        get = {f.name: doc.get(_ROLLOUT_KEYS.get(f.name, f.name)) for f in dataclasses.fields(cls)}
        return cls(
            version=doc["version"],
            phase=Phase(doc.get("phase", Phase.STARTING)),
            since=doc.get("since", ""),
            step=int(doc.get("step") or 0),
            message=doc.get("message", ""),
            weight=get["weight"],
            step_text=get["step_text"],
            checks=None if get["checks"] is None else tuple(get["checks"]),
            warm_hit_ratio=get["warm_hit_ratio"],
            warm_requests=get["warm_requests"],
            reason=get["reason"],
            ended=bool(doc.get("ended")),
        )

    def for_storage(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None or (f.name == "ended" and not value):
                continue
            out[_ROLLOUT_KEYS.get(f.name, f.name)] = list(value) if f.name == "checks" else value
        out["phase"] = self.phase.value
        return out


@dataclass(frozen=True)
class VersionStatus:
    """One live model version as ``status.versions`` shows it."""

    version: str
    role: str
    replicas: int
    ready_replicas: int

    def for_storage(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "role": self.role,
            "replicas": self.replicas,
            "readyReplicas": self.ready_replicas,
        }


@dataclass(frozen=True)
class Serving:
    """What the scale subresource and ``kubectl get`` read: set by the versions
    reconciler from one observation."""

    versions: tuple[VersionStatus, ...]
    replicas: int
    """Ready ranker pods of every version: what the scale subresource reports as running
    (an autoscaler compares it with what it asked for in ``spec.model.replicas``)."""
    selector: str
    ready_text: str
    url: str = ""
    """Where callers in the cluster score: the shared Service's URL."""


@dataclass(frozen=True)
class Status:
    """Everything the operator keeps in a ``RankerDeployment``'s status."""

    conditions: tuple[Condition, ...] = ()
    cache_namespaces: tuple[CacheNamespace, ...] = ()
    rollout: Rollout | None = None
    ttl: TTLStatus | None = None
    hit_ratio: float | None = None
    observed_at: str | None = None
    """When the TTL tuner's published values last changed."""
    serving: Serving | None = None
    observed_generation: int | None = None

    @classmethod
    def from_storage(cls, doc: Mapping[str, Any] | None) -> Status:
        doc = doc or {}
        return cls(
            conditions=tuple(Condition.from_storage(c) for c in doc.get("conditions") or []),
            cache_namespaces=tuple(
                CacheNamespace.from_storage(e) for e in doc.get("cacheNamespaces") or []
            ),
            rollout=Rollout.from_storage(doc["canary"]) if doc.get("canary") else None,
            ttl=TTLStatus.from_storage(doc.get("ttl") or {}),
            hit_ratio=doc.get("hitRatio"),
            observed_at=doc.get("observedAt"),
            serving=_serving_from_storage(doc),
            observed_generation=doc.get("observedGeneration"),
        )

    def for_storage(self) -> dict[str, Any]:
        """The status as the API stores it; a field without a value is left out (a merge
        patch then removes it)."""
        out: dict[str, Any] = {}
        if self.conditions:
            out["conditions"] = [c.for_storage() for c in self.conditions]
        if self.cache_namespaces:
            out["cacheNamespaces"] = [e.for_storage() for e in self.cache_namespaces]
        if self.rollout is not None:
            out["canary"] = self.rollout.for_storage()
        if self.ttl is not None:
            out["ttl"] = self.ttl.for_storage()
        if self.hit_ratio is not None:
            out["hitRatio"] = self.hit_ratio
        if self.observed_at is not None:
            out["observedAt"] = self.observed_at
        if self.serving is not None:
            out["versions"] = [v.for_storage() for v in self.serving.versions]
            out["replicas"] = self.serving.replicas
            out["selector"] = self.serving.selector
            out["readyText"] = self.serving.ready_text
            if self.serving.url:
                out["url"] = self.serving.url
        if self.observed_generation is not None:
            out["observedGeneration"] = self.observed_generation
        return out

    def condition(self, ctype: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == ctype), None)


def _serving_from_storage(doc: Mapping[str, Any]) -> Serving | None:
    if "versions" not in doc:
        return None
    versions = tuple(
        VersionStatus(v["version"], v["role"], int(v["replicas"]), int(v["readyReplicas"]))
        for v in doc.get("versions") or []
    )
    return Serving(
        versions,
        int(doc.get("replicas") or 0),
        doc.get("selector", ""),
        doc.get("readyText", ""),
        doc.get("url", ""),
    )
