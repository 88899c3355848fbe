"""Handing RankerDeployments over before the operator goes away (``helm uninstall``).

kopf puts a finalizer on every RankerDeployment (its reconciler daemon needs one); without a
running operator nothing would remove it, and deleting a RankerDeployment later would hang
forever. So the chart's pre-delete hook runs :func:`release_all`: stop the operator (scale
its Deployment to zero and wait for its pods to go, so it cannot put the finalizer back),
then remove the finalizer from every RankerDeployment it watched. The RankerDeployments and
everything they own keep running, unmanaged; deleting one afterwards garbage-collects its
objects as usual.
"""

from __future__ import annotations

import logging
import os
import time

from kvrank_operator import crd
from kvrank_operator.kube import Kube

log = logging.getLogger("kvrank_operator")
FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"
"""kopf's default finalizer (the operator keeps the default name)."""


def stop_operator(kube: Kube, namespace: str, name: str, timeout_s: float = 120.0) -> None:
    """Scale the operator's Deployment to zero and wait until none of its pods is left."""
    dep = kube.get("apps/v1", "Deployment", namespace, name)
    if dep is None:
        return
    kube.merge_patch("apps/v1", "Deployment", namespace, name, {"spec": {"replicas": 0}})
    selector = dep["spec"]["selector"]["matchLabels"]
    me = os.environ.get("HOSTNAME")  # never wait for the pod this runs in

    def running() -> list[str]:
        pods = kube.list("v1", "Pod", namespace, selector)
        return [p["metadata"]["name"] for p in pods if p["metadata"]["name"] != me]

    deadline = time.monotonic() + timeout_s
    while running():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the operator's pods in {namespace} did not stop in {timeout_s}s")
        time.sleep(1.0)


def release_finalizers(kube: Kube, namespaces: list[str]) -> int:
    """Remove the operator's finalizer from every RankerDeployment in ``namespaces`` (all
    namespaces when empty); returns how many were released."""
    released = 0
    scopes: list[str | None] = [*namespaces] if namespaces else [None]
    for ns in scopes:
        for rd in kube.list(crd.API_VERSION, crd.KIND, ns, {}):
            meta = rd["metadata"]
            finalizers = meta.get("finalizers") or []
            if FINALIZER not in finalizers:
                continue
            kept = [f for f in finalizers if f != FINALIZER]
            patch = {"metadata": {"finalizers": kept or None}}
            kube.merge_patch(crd.API_VERSION, crd.KIND, meta["namespace"], meta["name"], patch)
            log.info("released %s/%s", meta["namespace"], meta["name"])
            released += 1
    return released
