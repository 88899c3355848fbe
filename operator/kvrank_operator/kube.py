"""The one module that talks to the Kubernetes API.

Server-side apply (field manager ``kvrank-operator``) for every owned object, reads of
Deployment/Job status, Events, deletion. Objects get an owner reference to their
``RankerDeployment`` so garbage collection removes them with it. An object is sent only when
what the operator wants of it changed, or at least every ``REAPPLY_S`` (which also undoes
someone else's edits): a steady state costs reads, not writes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client, config
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError

log = logging.getLogger("kvrank_operator.kube")
FIELD_MANAGER = "kvrank-operator"
REAPPLY_S = 3600.0
"""An unchanged object is re-applied this often: an edit or deletion by someone else is
undone within the hour (at once for a missing Deployment, on any spec change and on an
operator restart), at one write per object per hour instead of one per resync."""
SERVED_RECHECK_S = 60.0
"""Whether the API server serves a kind that a CRD brings (a PodMonitor) is asked again this
often: a CRD installed later is noticed within a minute, at one read a minute."""


def merge_patch_between(old: Any, new: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``: changed keys, ``None``
    for a key ``new`` no longer has (merging a whole dict would keep the old one's extra
    keys), nested dicts patched key by key, lists replaced. A key absent from ``old`` and
    ``None`` in ``new`` is no change (merged, ``None`` means "absent")."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch: dict[str, Any] = {k: None for k in old if k not in new}
    for k, v in new.items():
        if k not in old:
            if v is not None:
                patch[k] = v
        elif old[k] != v:
            patch[k] = merge_patch_between(old[k], v)
    return patch


def load_client(kubeconfig: str | None = None) -> client.ApiClient:
    if kubeconfig:
        api: client.ApiClient = config.new_client_from_config(config_file=kubeconfig)
        return api
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


@dataclass
class Owner:
    api_version: str
    kind: str
    name: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


ObjectKey = tuple[str, str, str, str]
"""(apiVersion, kind, namespace, name)"""


@dataclass
class ApplyLedger:
    """What the operator last sent of each object, and when: an object whose wanted content
    is unchanged is sent again only after ``reapply_s``."""

    reapply_s: float = REAPPLY_S
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self._sent: dict[ObjectKey, tuple[str, float]] = {}

    @staticmethod
    def digest(obj: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()

    def needs_sending(self, key: ObjectKey, digest: str) -> bool:
        last = self._sent.get(key)
        return last is None or last[0] != digest or self.clock() - last[1] >= self.reapply_s

    def sent(self, key: ObjectKey, digest: str) -> None:
        self._sent[key] = (digest, self.clock())

    def forget(self, key: ObjectKey | None = None) -> None:
        """One object (deleted) or all of them (a new spec, an object found missing)."""
        if key is None:
            self._sent.clear()
        else:
            self._sent.pop(key, None)


class Kube:
    def __init__(self, api: client.ApiClient, ledger: ApplyLedger | None = None) -> None:
        self.api = api
        self.dyn = DynamicClient(api)
        self.ledger = ledger or ApplyLedger()
        self._resources: dict[tuple[str, str], Any] = {}
        self._served: dict[tuple[str, str], tuple[bool, float]] = {}

    def _res(self, api_version: str, kind: str) -> Any:
        key = (api_version, kind)
        if key not in self._resources:
            self._resources[key] = self.dyn.resources.get(api_version=api_version, kind=kind)
        return self._resources[key]

    def serves(self, api_version: str, kind: str) -> bool:
        """Whether the API server serves ``kind`` in ``api_version`` now (its group's
        resource list; no RBAC needed), asked at most every ``SERVED_RECHECK_S``."""
        key, now = (api_version, kind), self.ledger.clock()
        known = self._served.get(key)
        if known is not None and now - known[1] < SERVED_RECHECK_S:
            return known[0]
        try:
            group, version = api_version.split("/")
            listing = client.CustomObjectsApi(self.api).get_api_resources(group, version)
            served = any(r.kind == kind for r in listing.resources or [])
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            served = False
        self._served[key] = (served, now)
        return served

    def apply(self, obj: dict[str, Any], owner: Owner | None) -> bool:
        """Server-side apply as the operator's field manager; ``owner`` (when given) is
        garbage-collection's parent. An object applied with the same content less than
        ``REAPPLY_S`` ago is not sent again (a steady state costs no writes); returns
        whether a request was made."""
        if owner is not None:
            refs = [owner.reference()]
            obj = {**obj, "metadata": {**obj["metadata"], "ownerReferences": refs}}
        meta = obj["metadata"]
        key = (obj["apiVersion"], obj["kind"], meta.get("namespace") or "", meta["name"])
        digest = self.ledger.digest(obj)
        if not self.ledger.needs_sending(key, digest):
            return False
        self.dyn.server_side_apply(
            self._res(obj["apiVersion"], obj["kind"]),
            body=obj,
            name=meta["name"],
            namespace=meta.get("namespace"),
            field_manager=FIELD_MANAGER,
            force_conflicts=True,
        )
        self.ledger.sent(key, digest)
        return True

    def forget_applied(self) -> None:
        """Send every object again on the next apply, and ask again which kinds the API
        server serves."""
        self.ledger.forget()
        self._served.clear()

    def create_if_absent(self, obj: dict[str, Any], owner: Owner) -> bool:
        """Create ``obj`` unless it exists; ``True`` when it was created now."""
        existing = self.get(
            obj["apiVersion"], obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"]
        )
        if existing is not None:
            return False
        self.apply(obj, owner)
        return True

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return dict(self._res(api_version, kind).get(name=name, namespace=namespace).to_dict())
        except NotFoundError:
            return None

    def list(
        self, api_version: str, kind: str, namespace: str | None, selector: dict[str, str]
    ) -> list[dict[str, Any]]:
        """Objects matching ``selector`` in ``namespace`` (``None``: in every namespace)."""
        sel = ",".join(f"{k}={v}" for k, v in selector.items())
        items = self._res(api_version, kind).get(namespace=namespace, label_selector=sel).items
        return [dict(i.to_dict()) for i in items]

    def merge_patch(
        self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> None:
        self._res(api_version, kind).patch(
            body=patch,
            name=name,
            namespace=namespace,
            content_type="application/merge-patch+json",
        )

    def patch_status(
        self, api_version: str, kind: str, namespace: str, name: str, status: dict[str, Any]
    ) -> None:
        """Merge ``status`` into the object's status (its ``status`` subresource)."""
        self._res(api_version, kind).status.patch(
            body={"status": status},
            name=name,
            namespace=namespace,
            content_type="application/merge-patch+json",
        )

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        self.ledger.forget((api_version, kind, namespace, name))
        try:
            self._res(api_version, kind).delete(
                name=name, namespace=namespace, body={"propagationPolicy": "Background"}
            )
            return True
        except NotFoundError:
            return False
