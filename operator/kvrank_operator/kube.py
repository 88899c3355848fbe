"""The one module that talks to the Kubernetes API.

Server-side apply (field manager ``kvrank-operator``) for every owned object, reads of
Deployment/Job status, Events, deletion. Objects get an owner reference to their
``RankerDeployment`` so garbage collection removes them with it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from kubernetes import client, config
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError

log = logging.getLogger("kvrank_operator.kube")
FIELD_MANAGER = "kvrank-operator"


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


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.dyn = DynamicClient(api)
        self._resources: dict[tuple[str, str], Any] = {}

    def _res(self, api_version: str, kind: str) -> Any:
        key = (api_version, kind)
        if key not in self._resources:
            self._resources[key] = self.dyn.resources.get(api_version=api_version, kind=kind)
        return self._resources[key]

    def apply(self, obj: dict[str, Any], owner: Owner | None) -> dict[str, Any]:
        """Server-side apply as the operator's field manager; ``owner`` (when given) is
        garbage-collection's parent."""
        if owner is not None:
            refs = [owner.reference()]
            obj = {**obj, "metadata": {**obj["metadata"], "ownerReferences": refs}}
        res = self._res(obj["apiVersion"], obj["kind"])
        out = self.dyn.server_side_apply(
            res,
            body=obj,
            name=obj["metadata"]["name"],
            namespace=obj["metadata"].get("namespace"),
            field_manager=FIELD_MANAGER,
            force_conflicts=True,
        )
        return dict(out.to_dict())

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

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        try:
            self._res(api_version, kind).delete(
                name=name, namespace=namespace, body={"propagationPolicy": "Background"}
            )
            return True
        except NotFoundError:
            return False
