"""RankerDeployments as a scenario handles them: a :class:`Ranker` per object (its spec, its
status and conditions, its Services, its managed Redis), made by the ``rankers`` fixture
(:class:`Rankers`) under a name no other scenario uses, and deleted after the scenario with
everything it owns. Plus the requests scenarios send (:func:`body`, :class:`Traffic`).
"""

from __future__ import annotations

import base64
import itertools
import json
import math
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from artifacts import MODEL_CONFIG
from stack import NS, REDIS_SELECTOR, REDIS_TLS_DIR, Stack

from kvrank.tools.workload import Workload, WorkloadSettings
from kvrank_operator.manifests.common import deployment_name, ranker_auth_secret, redis_name
from kvrank_operator.spec import namespace_for

ROOT = Path(__file__).resolve().parent.parent
CANDIDATES = 20
BODIES = [
    r.body
    for r in Workload(MODEL_CONFIG, WorkloadSettings(users=50, candidates=CANDIDATES)).requests(50)
]
PURGE_S = 360
"""From a canary's abort (or a promotion) to the old namespace purged: the version is removed
only once the other is Ready at all its replicas (a pod started in the canary's place: its
model loaded and warmed), then its pods drain (up to 25 s), then the purge Job's pod runs.
108 s to the last pod's removal and 123 s to the Job's end were seen beside the rest lane."""
NOWHERE = {"mode": "external", "url": "redis://nowhere.invalid:6379"}
"""An L2 that never answers: the rankers serve from L1 alone (for scenarios about anything
but Redis, which then start without a Redis Cluster of their own)."""


def body(user: str, i: int = 0) -> dict[str, Any]:
    """A scoring request of ``user`` (the i-th of the workload's histories)."""
    return {**BODIES[i % len(BODIES)], "user_id": user}


def example(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / name).read_text())
    return doc


class Ranker:
    """One RankerDeployment of a scenario."""

    def __init__(self, stack: Stack, name: str) -> None:
        self.stack, self.name = stack, name

    def __repr__(self) -> str:
        return f"Ranker({self.name})"

    # ------------------------------------------------------------------ spec
    def spec(self, *, redis: bool = True, replicas: int | None = None) -> dict[str, Any]:
        """``examples/basic.yaml`` under this name, adapted to the run (see
        :meth:`Stack.adapt`); ``redis=False``: no Redis (L1 only)."""
        doc = self.stack.adapt(example("basic.yaml"))
        doc["metadata"]["name"] = self.name
        if not redis:
            doc["spec"]["cache"]["redis"] = dict(NOWHERE)
        if replicas is not None:
            doc["spec"]["model"]["replicas"] = replicas
        return doc

    def with_canary(
        self, doc: dict[str, Any], version: str | None, weight: int | None = 20, **rollout: Any
    ) -> dict[str, Any]:
        """``doc`` with ``version`` as its canary (``None``: none) at ``weight`` (``None``:
        a progressive rollout, ``rollout`` its steps and analysis)."""
        doc = json.loads(json.dumps(doc))
        doc["spec"].pop("canary", None)
        if version is not None:
            canary: dict[str, Any] = {"version": version, "uri": self.stack.model_uri(version)}
            if weight is not None:
                canary["weight"] = weight
            doc["spec"]["canary"] = {**canary, **rollout}
        return doc

    def serving(self, doc: dict[str, Any], version: str) -> dict[str, Any]:
        """``doc`` with ``version`` as its stable model."""
        doc = json.loads(json.dumps(doc))
        doc["spec"]["model"].update(version=version, uri=self.stack.model_uri(version))
        return doc

    def apply(self, doc: dict[str, Any], check: bool = True) -> Any:
        assert doc["metadata"]["name"] == self.name, doc["metadata"]
        return self.stack.apply(doc, check=check)

    def rkd(self, command: str, check: bool = True) -> Any:
        """``kubectl rkd COMMAND <this ranker>`` (the CompletedProcess)."""
        return self.stack.rkd(command, self.name, check=check)

    # ------------------------------------------------------------------ what it says
    def get(self) -> dict[str, Any] | None:
        return self.stack.get("rkd", self.name)

    def must_get(self) -> dict[str, Any]:
        return self.stack.must_get("rkd", self.name)

    def status(self) -> dict[str, Any]:
        return ((self.get() or {}).get("status")) or {}

    def condition(self, ctype: str) -> dict[str, Any] | None:
        for c in self.status().get("conditions", []):
            if c["type"] == ctype:
                return dict(c)
        return None

    def ready(self) -> bool:
        """Ready, and Ready about the current generation."""
        doc = self.get() or {}
        generation = doc.get("metadata", {}).get("generation")
        c = next((c for c in (doc.get("status") or {}).get("conditions", [])
                  if c["type"] == "Ready"), None)  # fmt: skip
        return bool(
            c and c["status"] == "True" and c.get("observedGeneration", generation) == generation
        )

    def wait_ready(self, what: str = "", timeout: float = 240) -> None:
        self.stack.wait_for(self.ready, f"{self.name} Ready{' ' + what if what else ''}", timeout)

    def wait_condition(self, ctype: str, status: str = "True", timeout: float = 120) -> Any:
        """Its ``ctype`` condition once at ``status``."""
        return self.stack.wait_for(
            lambda: (c := self.condition(ctype)) and c["status"] == status and c,
            f"{self.name}: {ctype} {status}",
            timeout,
        )

    def namespaces(self) -> dict[str, str]:
        """Cache namespace → state, from status.cacheNamespaces."""
        return {e["namespace"]: e["state"] for e in self.status().get("cacheNamespaces", [])}

    def wait_purged(self, version: str, timeout: float = PURGE_S) -> None:
        """Until ``version``'s cache namespace is purged (see :data:`PURGE_S`)."""
        namespace = self.cache_namespace(version)
        self.stack.wait_for(
            lambda: self.namespaces().get(namespace) == "purged", f"{namespace} purged", timeout
        )

    def rollout(self) -> dict[str, Any]:
        """status.canary: the progressive rollout's phase, step, checks."""
        return dict(self.status().get("canary") or {})

    def events(self, reason: str) -> list[str]:
        """The messages of this RankerDeployment's Events with ``reason``."""
        selector = f"reason={reason},involvedObject.name={self.name}"
        out = self.stack.kubectl(
            "get", "events", "-n", NS, "--field-selector", selector, "-o", "json"
        )
        return [e["message"] for e in json.loads(out)["items"]]

    # ------------------------------------------------------------------ what it owns
    def cache_namespace(self, version: str) -> str:
        """A version's cache namespace: named after this deployment and the version."""
        return namespace_for(self.name, NS, version)

    def version_name(self, version: str) -> str:
        """A version's Deployment and Service."""
        return deployment_name(self.name, version)

    def deployment(self, version: str) -> dict[str, Any] | None:
        return self.stack.get("deployment", self.version_name(version))

    def must_deployment(self, version: str) -> dict[str, Any]:
        return self.stack.must_get("deployment", self.version_name(version))

    def wait_gone(self, version: str, timeout: float = 120) -> None:
        self.stack.wait_for(
            lambda: self.deployment(version) is None, f"{self.version_name(version)} removed",
            timeout,
        )  # fmt: skip

    def ready_replicas(self, version: str) -> int:
        return int(((self.deployment(version) or {}).get("status") or {}).get("readyReplicas", 0))

    def pods(self, component: str = "ranker", version: str | None = None) -> list[dict[str, Any]]:
        selector = f"app.kubernetes.io/instance={self.name},app.kubernetes.io/component={component}"
        if version is not None:
            selector += f",kvrank.io/version={version}"
        return self.stack.select("pods", selector)

    # ------------------------------------------------------------------ traffic
    def score(self, user: str, i: int = 0, version: str | None = None) -> dict[str, Any]:
        """One request through the shared Service (or ``version``'s own), which must succeed
        with a finite score per candidate."""
        service = self.name if version is None else self.version_name(version)
        resp = self.stack.score(service, body(user, i))
        assert resp.status_code == 200, f"{service}: {resp.status_code} {resp.text[:500]}"
        out: dict[str, Any] = resp.json()
        assert len(out["scores"]) == CANDIDATES
        assert all(math.isfinite(s) for s in out["scores"])
        return out

    def warm(self, version: str, prefix: str, timeout: float = 90) -> None:
        """Score new users on ``version`` until its namespace holds entries in Redis.

        A pod can be Ready before its managed cluster has been bootstrapped (a Redis it cannot
        reach is a miss, and a miss it could not write leaves nothing behind), and a repeat
        user served from L1 writes nothing: only a new user's answer makes an entry."""
        self.wait_condition("CacheReady", timeout=timeout)
        users = itertools.count()
        self.stack.wait_for(
            lambda: (
                self.score(f"{prefix}-{version}-{next(users)}", version=version)
                and self.redis_keys(self.cache_namespace(version)) > 0
            ),
            f"{self.name}: entries of {version} in Redis",
            timeout,
        )

    def metrics(self) -> list[str]:
        return self.stack.metrics(self.name)

    # ------------------------------------------------------------------ its managed Redis
    def redis_pods(self) -> list[str]:
        """The running pods of its managed Redis Cluster."""
        pods = self.stack.select("pods", f"app.kubernetes.io/instance={self.name},{REDIS_SELECTOR}")
        return sorted(
            p["metadata"]["name"]
            for p in pods
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        )

    def redis_cli(self, pod: str, *args: str, check: bool = True, tls: bool = True) -> str:
        """``redis-cli`` inside one of its Redis pods, with the password from its Secret (and
        over TLS when the pod has its certificates, unless ``tls`` is false)."""
        quoted = " ".join(f"'{a}'" for a in args)
        ca = f"{REDIS_TLS_DIR}/ca.crt"
        use_tls = f'[ -f {ca} ] && tls="--tls --cacert {ca}"; ' if tls else ""
        script = f'tls=""; {use_tls}REDISCLI_AUTH="$REDIS_PASSWORD" redis-cli $tls {quoted}'
        return self.stack.kubectl("exec", "-n", NS, pod, "--", "sh", "-c", script, check=check)

    def redis_password(self, user: str = "default") -> str:
        """Its managed Redis's password of ``user``: ``default`` (the operator's) or
        ``ranker`` (the ACL user its rankers and purge Jobs authenticate as)."""
        name = (
            f"{redis_name(self.name)}-auth" if user == "default" else ranker_auth_secret(self.name)
        )
        secret = self.stack.must_get("secret", name)
        return base64.b64decode(secret["data"]["password"]).decode()

    def redis_keys(self, cache_ns: str) -> int:
        """Entries and head records of ``cache_ns`` in its Redis Cluster."""
        total = 0
        for pod in self.redis_pods():
            for pattern in (f"kvrank:{cache_ns}:*", f"kvrank-head:{cache_ns}:*"):
                out = self.redis_cli(pod, "--scan", "--pattern", pattern, check=False)
                total += len([line for line in out.splitlines() if line.strip()])
        return total

    def kill_redis_node(self) -> str:
        """Delete one of its Redis pods at once (its slots go dark); the StatefulSet brings it
        back empty. Returns the pod's name."""
        pod = self.redis_pods()[-1]
        self.stack.kubectl("delete", "pod", "-n", NS, pod, "--grace-period=0", "--force")
        return pod

    # ------------------------------------------------------------------ the end
    def owned(self) -> list[str]:
        """What of its objects still exists (``kind/name``), pods included."""
        selector = f"app.kubernetes.io/instance={self.name}"
        kinds = "deployments,services,configmaps,pdb,jobs,statefulsets,secrets,pods"
        out = self.stack.kubectl("get", kinds, "-n", NS, "-l", selector, "-o", "name")
        return out.split()

    def delete(self, timeout: float = 180) -> None:
        """Delete it and wait until nothing it owned is left (the next scenario starts on a
        node without its pods)."""
        self.stack.kubectl("delete", "rkd", self.name, "-n", NS, "--wait=false", check=False)
        self.stack.wait_for(lambda: self.get() is None, f"rkd/{self.name} gone", timeout)
        self.stack.wait_for(lambda: not self.owned(), f"what {self.name} owned gone", timeout)


class Rankers:
    """The ``rankers`` fixture: RankerDeployments under names of their own (``prefix-N``),
    each deleted after the scenario that made it."""

    _numbers = itertools.count(1)

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.made: list[Ranker] = []

    def new(self, prefix: str) -> Ranker:
        ranker = Ranker(self.stack, f"{prefix}-{next(self._numbers)}")
        self.made.append(ranker)
        return ranker

    def from_example(self, name: str) -> Ranker:
        """``examples/<name>`` applied as it is (its own name, nothing adapted to the run)."""
        path = ROOT / "examples" / name
        ranker = Ranker(self.stack, example(name)["metadata"]["name"])
        self.made.append(ranker)
        self.stack.kubectl("apply", "-n", NS, "-f", str(path))
        return ranker

    def create(self, prefix: str, *, redis: bool = True, replicas: int | None = None) -> Ranker:
        """A new RankerDeployment from ``examples/basic.yaml``, applied and Ready."""
        ranker = self.new(prefix)
        ranker.apply(ranker.spec(redis=redis, replicas=replicas))
        ranker.wait_ready(timeout=300)
        return ranker

    def delete_all(self) -> None:
        for ranker in self.made:
            self.stack.kubectl("delete", "rkd", ranker.name, "-n", NS, "--wait=false", check=False)
        for ranker in self.made:
            ranker.delete()


class Traffic:
    """Clients of a ranker's shared Service, from a thread: a few hot users over and over
    (the same history each time, as a user between two events), every answer or failure
    recorded as ``(status, model version, cache outcome)``."""

    def __init__(self, ranker: Ranker, users: int = 8, pause_s: float = 0.05) -> None:
        self.ranker, self.users, self.pause_s = ranker, users, pause_s
        self.results: list[tuple[int, str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        stack = self.ranker.stack
        for i in itertools.count():
            if self._stop.is_set():
                return
            user = i % self.users
            try:
                resp = stack.score(self.ranker.name, body(f"hot-{user}", user), timeout=30)
            except httpx.HTTPError as exc:
                self.results.append((0, "", f"{type(exc).__name__}: {exc}"))
                continue
            doc = resp.json() if resp.status_code == 200 else {}
            self.results.append(
                (resp.status_code, doc.get("model_version", ""), doc.get("cache", resp.text[:200]))
            )
            time.sleep(self.pause_s)

    def failures(self) -> list[tuple[int, str, str]]:
        return [r for r in self.results if r[0] != 200]
