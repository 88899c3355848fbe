"""What every object of a ``RankerDeployment`` shares: names, labels, mounts, and the
security settings Pod Security ``restricted`` admits. Pure: no API calls."""

from __future__ import annotations

import re
from typing import Any

from kvrank_common import RANKER_REDIS_USER
from kvrank_operator import __version__
from kvrank_operator.certs import CA_FILE
from kvrank_operator.spec import RankerSpec, RedisSpec, parse_quantity

NAME = "kvrank-ranker"
CONFIG_MOUNT = "/etc/kvrank"
CONFIG_FILE = f"{CONFIG_MOUNT}/ranker.yaml"
PASSWORD_FILE = f"{CONFIG_MOUNT}/redis/password"
ENTRY_SECRET_FILE = f"{CONFIG_MOUNT}/cache-key/secret"
"""Where rankers read the deployment's cache-entry secret (its Secret: :func:`entry_secret`)."""
MODEL_CACHE_MOUNT = "/var/cache/kvrank"
REDIS_PORT = 6379
TLS_DIR = "/run/redis-tls"
"""Where Redis pods mount their TLS Secret (and its clients only its ``ca.crt``)."""
TLS_CA_FILE = f"{TLS_DIR}/{CA_FILE}"
ADMIN_PORT = 8081
"""The rankers' /admin/* port: on the pods only, never behind the scoring Service; the
pods' NetworkPolicy admits only pods labelled :data:`ADMIN_ACCESS_LABEL` to it."""
PROBE_PORT = 8082
"""The ranker's probes, answered on a thread of their own (never behind scoring work)."""
GRPC_PORT = 8001
"""The rankers' Open Inference Protocol gRPC port (Triton's and KServe's): the scoring
Service's ``grpc`` port — through the bundled router when there is one (it routes gRPC by
the same user key), else straight to the rankers (a queue proxy carries HTTP only)."""
ADMIN_ACCESS_LABEL = "kvrank.io/ranker-admin"
"""A pod labelled ``kvrank.io/ranker-admin: "true"`` in a ranker's namespace may reach the
rankers' admin port (invalidate a user, read the config in force); no other pod may."""
JOB_STORAGE = {"ephemeral-storage": "16Mi"}, {"ephemeral-storage": "64Mi"}
"""(requests, limits): the Jobs write nothing but their log."""
BOOTSTRAP_RESOURCES = {
    "requests": {"cpu": "50m", "memory": "32Mi", **JOB_STORAGE[0]},
    "limits": {"memory": "128Mi", **JOB_STORAGE[1]},
}
PURGE_RESOURCES = {
    "requests": {"cpu": "100m", "memory": "512Mi", **JOB_STORAGE[0]},
    "limits": {"memory": "1Gi", **JOB_STORAGE[1]},
}
"""``kvrank cache purge`` runs from the ranker image and loads torch with the cache code
(about 700 MB resident, measured)."""


def with_defaults(
    resources: dict[str, Any], requests: dict[str, str], limits: dict[str, str] | None = None
) -> dict[str, Any]:
    """``resources`` (the user's) with the defaults for what the user left unset: a default
    request only for a resource neither requested nor limited (a limit alone is also the
    request), a default limit only where none is set, never below the request."""
    out = {part: dict(amounts) for part, amounts in resources.items()}
    req, lim = out.setdefault("requests", {}), out.setdefault("limits", {})
    for name, amount in requests.items():
        if name not in req and name not in lim:
            req[name] = amount
    for name, amount in (limits or {}).items():
        if name not in lim:
            floor = req.get(name)
            lim[name] = floor if floor and _above(floor, amount) else amount
    return {part: amounts for part, amounts in out.items() if amounts}


def _above(a: str, b: str) -> bool:
    """``a > b`` as quantities (a form this cannot read is taken as above: the user's)."""
    try:
        return parse_quantity(a) > parse_quantity(b)
    except ValueError:
        return True


def network_policy(
    name: str, namespace: str, meta_labels: dict[str, str], selector: dict[str, Any],
    ingress: list[dict[str, Any]],
) -> dict[str, Any]:  # fmt: skip
    """An ingress NetworkPolicy (no rules: nothing may connect; the field is then left out,
    as the API server stores it). Egress stays open: rankers fetch artifacts and reach Redis,
    Jobs reach Redis, wherever those are."""
    spec: dict[str, Any] = {"podSelector": selector, "policyTypes": ["Ingress"]}
    if ingress:
        spec["ingress"] = ingress
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": meta_labels},
        "spec": spec,
    }


NO_API_TOKEN = {"automountServiceAccountToken": False}
"""For pods that never call the Kubernetes API (rankers, Redis, the Jobs, the router): no
ServiceAccount token mounted for a compromised process to use."""


def restricted_pod(uid: int | None, fs_group: int | None = None) -> dict[str, Any]:
    """Pod-level security that Pod Security ``restricted`` admits; ``uid`` (also the gid)
    ``None``: the platform assigns the ids (:meth:`RankerSpec.ids`)."""
    ctx: dict[str, Any] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    if uid is not None:
        ctx["runAsUser"] = ctx["runAsGroup"] = uid
    if fs_group is not None:
        ctx["fsGroup"] = fs_group
    return ctx


def restricted_container() -> dict[str, Any]:
    """Container-level security that Pod Security ``restricted`` admits (and a read-only root)."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


PART_OF = "kvrank"
_LABEL_VALUE = re.compile(r"[^A-Za-z0-9._-]")


def selector(instance: str, component: str = "ranker") -> dict[str, str]:
    """The labels that select an instance's objects of one component. They never change: a
    Deployment's and a StatefulSet's selector is immutable, and lists by these find objects
    any operator version made."""
    return {
        "app.kubernetes.io/name": NAME,
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": "kvrank-operator",
    }


def labels(instance: str, component: str = "ranker", version: str | None = None) -> dict[str, str]:
    """Kubernetes' recommended labels: the selecting ones, ``part-of: kvrank`` and
    ``version``: what the object runs (a model version, Redis's image tag), else the kvrank
    release that made it."""
    return {
        **selector(instance, component),
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/version": label_value(version or __version__),
    }


def label_value(text: str) -> str:
    """``text`` as a label value: at most 63 of ``[A-Za-z0-9._-]``, alphanumeric at both ends."""
    return _LABEL_VALUE.sub("-", text)[:63].strip("._-")


def image_tag(image: str) -> str:
    """An image reference's tag (``redis:7.2@sha256:…`` → ``7.2``), else its digest."""
    name, _, digest = image.partition("@")
    last = name.rsplit("/", 1)[-1]
    return last.partition(":")[2] or digest or "latest"


def ranker_selector(instance: str) -> dict[str, str]:
    """The labels that select every ranker pod of ``instance`` (any model version)."""
    return {"app.kubernetes.io/instance": instance, "app.kubernetes.io/component": "ranker"}


def version_selector(instance: str, version: str) -> dict[str, str]:
    """The labels that select one model version's ranker pods."""
    return {**selector(instance), "kvrank.io/version": version}


def version_labels(instance: str, version: str) -> dict[str, str]:
    """One model version's objects: the recommended labels (``version`` the model's) and
    ``kvrank.io/version`` (the exact string; a label value may have lost characters)."""
    return {**labels(instance, version=version), "kvrank.io/version": version}


def deployment_name(instance: str, version: str) -> str:
    """A version's Deployment and Service: a DNS label (a Service name has no dots, so
    ``v2.1`` is ``v2-1`` here, as in its cache namespace)."""
    return f"{instance}-{version.replace('.', '-')}"[:63].rstrip("-")


def redis_name(instance: str) -> str:
    return f"{instance}-redis"


def ranker_auth_secret(instance: str) -> str:
    """The managed Redis's Secret holding the password of the ACL user its rankers and
    purge Jobs authenticate as (``kvrank_common.RANKER_REDIS_USER``)."""
    return f"{redis_name(instance)}-ranker-auth"


def redis_url(spec: RankerSpec, instance: str, namespace: str) -> tuple[str, bool]:
    """The L2 endpoint rankers use, and whether it is a cluster."""
    r = spec.cache.redis
    if r.mode == "external":
        assert r.url is not None
        return r.url, r.cluster
    host = f"{redis_name(instance)}-0.{redis_name(instance)}-headless.{namespace}.svc"
    scheme = "rediss" if r.tls else "redis"
    return f"{scheme}://{RANKER_REDIS_USER}@{host}:{REDIS_PORT}", True


def tls_secret_name(instance: str, r: RedisSpec) -> str | None:
    """The managed Redis's TLS Secret (the user's, or the one the operator generates);
    ``None`` without TLS or for an external Redis (its clients trust the system's CAs)."""
    if r.mode != "managed" or not r.tls:
        return None
    return r.tls_secret or f"{redis_name(instance)}-tls"


def tls_ca_mount(instance: str, r: RedisSpec) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(volume, mount) of the managed Redis's CA certificate alone, for its clients."""
    secret = tls_secret_name(instance, r)
    if secret is None:
        return None
    items = [{"key": CA_FILE, "path": CA_FILE}]
    volume = {"name": "redis-tls", "secret": {"secretName": secret, "items": items}}
    return volume, {"name": "redis-tls", "mountPath": TLS_DIR, "readOnly": True}


def entry_secret_name(instance: str) -> str:
    """The Secret holding ``instance``'s cache-entry secret (key ``secret``)."""
    return f"{instance}-cache-key"


def entry_secret(instance: str, namespace: str, secret: str) -> dict[str, Any]:
    """The cache-entry secret every ranker pod of ``instance`` (every version) tags and checks
    its L2 entries with: a pod of another RankerDeployment, or anyone holding only the Redis
    password, cannot make an entry these pods serve. Created once, never replaced by the
    operator; to rotate it, put a new secret on the first line of the key ``secret`` and keep
    the old one on the second until every pod has restarted."""
    meta = {"name": entry_secret_name(instance), "namespace": namespace, "labels": labels(instance)}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "Opaque",
        "stringData": {"secret": secret},
    }


def password_secret(spec: RankerSpec, instance: str) -> tuple[str, str] | None:
    """(Secret, key) of the password the rankers and purge Jobs give Redis: on a managed
    Redis their ACL user's, never the ``default`` user's the operator keeps."""
    r = spec.cache.redis
    if r.mode == "managed":
        return ranker_auth_secret(instance), "password"
    return r.password_secret
