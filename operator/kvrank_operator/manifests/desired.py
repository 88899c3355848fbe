"""Everything a ``RankerDeployment`` should own right now: the apply sets, one per concern.

Pure: the typed spec, the TTL in force and freshly generated Redis secrets (a password and,
with TLS, certificates: used only if their Secrets do not exist yet) in; :class:`Desired`
objects out, in the order they are applied. What is removed (old versions) and what is
created over time (purge Jobs) depends on what is observed, so the reconciler decides those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvrank_operator.manifests.common import entry_secret
from kvrank_operator.manifests.ranker import (
    config_map,
    deployment,
    network_policies,
    pod_disruption_budget,
    services,
)
from kvrank_operator.manifests.redis import managed_redis
from kvrank_operator.spec import RankerSpec


@dataclass(frozen=True)
class Desired:
    obj: dict[str, Any]
    create_only: bool = False
    """Created when absent, never updated: Job templates are immutable, and a Secret's
    generated password or certificates must never be replaced under running pods."""
    optional: bool = False
    """A third-party CRD's kind (a PodMonitor, an HTTPRoute): where the cluster does not
    serve it or refuses it, its concern reports why instead of failing the pass."""

    @property
    def kind(self) -> str:
        return str(self.obj["kind"])


def desired_rankers(
    spec: RankerSpec, instance: str, namespace: str, ttl_s: float | None, entry_key: str
) -> list[Desired]:
    """The serving side: the cache-entry secret (``entry_key``: used only if its Secret does
    not exist yet), the ranker ConfigMap (with the TTL in force), one Deployment per live
    model version, the Services, the PodDisruptionBudget and the NetworkPolicies (of the
    rankers and the Jobs), in the order they are applied."""
    out = [
        Desired(entry_secret(instance, namespace, entry_key), create_only=True),
        Desired(config_map(spec, instance, namespace, ttl_s)),
    ]
    for version, role in spec.versions():
        uri, sha256 = spec.artifact_of(role)
        replicas = spec.replicas_of(role)
        dep = deployment(spec, instance, namespace, version, uri, replicas, role, sha256)
        if spec.model.external_replicas:
            dep["spec"].pop("replicas")  # the autoscaler's field: never claim it
        out.append(Desired(dep))
    out += [Desired(svc) for svc in services(spec, instance, namespace)]
    out.append(Desired(pod_disruption_budget(instance, namespace)))
    out += [Desired(policy) for policy in network_policies(spec, instance, namespace)]
    return out


def desired_redis(
    spec: RankerSpec,
    instance: str,
    namespace: str,
    passwords: tuple[str, str],
    tls: dict[str, str] | None = None,
) -> list[Desired]:
    """The managed Redis Cluster (none for an external Redis); its Secrets and bootstrap Job
    are created once, never updated."""
    if spec.cache.redis.mode != "managed":
        return []
    return [
        Desired(obj, create_only=obj["kind"] in ("Secret", "Job"))
        for obj in managed_redis(spec, instance, namespace, passwords, tls)
    ]
