"""A process node: a small kubelet that runs the pods bound to it as local processes.

kwok makes pods *look* Running; this node makes them run. It registers a Node (never
managed by kwok), and for every pod the scheduler binds to it:

- gives the pod an IP from the pod network (``10.244.0.x``, what ``status.podIP`` and the
  EndpointSlices show; the API rejects loopback endpoints) and a loopback address
  (``127.0.1.x``) where its processes listen, so every pod can use its declared port (8080
  for each ranker). :meth:`ProcessNode.address` is the node's pod network: it maps a pod IP
  to where that pod answers, which is what a client on this host (a test, Prometheus'
  discovery) uses in place of kube-proxy;
- materialises its volumes (configMap, secret, hostPath, emptyDir, projected
  service-account token) under the pod's directory, and keeps configMap/secret files in
  sync as the objects change, as a kubelet does;
- starts each container whose image it knows (``images`` maps an image repository to the
  host command that plays the image's entrypoint), with the pod's env resolved (values,
  Secret/ConfigMap keys, downward API), and reports readiness from the container's real
  readiness probe; a container that exits is restarted per ``restartPolicy``; a Job's pod
  ends Succeeded or Failed with the real exit code;
- on deletion sends SIGTERM, waits the grace period, then removes the pod.

Three translations stand in for what a container runtime would isolate, and nothing more:
an env value or argument that is a path under a volume's ``mountPath`` points into the pod's
directory; the bind-all address ``0.0.0.0`` becomes the pod IP (a pod's own network
namespace has only that address; here, its loopback address); the in-cluster
service-account mount is offered as a kubeconfig in ``KUBECONFIG`` (same token, same CA),
because ``/var/run/secrets`` cannot be mounted per process. Pods with images it does not
know (e.g. ``redis`` in managed mode) are simulated the way kwok does: Running and Ready at
once, a Job's pod Succeeded.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from localkube.processes import die_with_parent

log = logging.getLogger("localkube.proclet")
POLL_S = 0.3
SYNC_S = 1.0
PROBE_TIMEOUT_S = 1.0
SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Container:
    name: str
    spec: dict[str, Any]
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    ready: bool = False
    exit_code: int | None = None
    simulated: bool = False
    started_at: str = field(default_factory=_now)


@dataclass
class PodRun:
    uid: str
    namespace: str
    name: str
    ip: str
    """Where the pod's processes listen (loopback)."""
    pod_ip: str
    """What the API shows (pod network)."""
    root: Path
    pod: dict[str, Any]
    containers: list[Container]
    phase: str = "Running"
    deleting_since: float | None = None
    last_status: Any = None
    last_sync: float = 0.0
    files: dict[Path, bytes] = field(default_factory=dict)

    @property
    def is_job(self) -> bool:
        return bool(self.pod["spec"].get("restartPolicy", "Always") != "Always")


class ProcessNode:
    """Start with :meth:`start`; :meth:`stop` terminates every process it started."""

    def __init__(
        self,
        kubeconfig: Path,
        server: str,
        ca: Path,
        workdir: Path,
        images: dict[str, list[str]],
        name: str = "proc-node-0",
        gpus: int = 8,
        ip_prefix: str = "127.0.1.",
        pod_ip_prefix: str = "10.244.0.",
    ) -> None:
        self.name = name
        self.server, self.ca = server, ca
        self.workdir = workdir
        self.images = images
        self.gpus = gpus
        self.ip_prefix = ip_prefix
        self.pod_ip_prefix = pod_ip_prefix
        self._next_ip = 2
        self.api = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))  # type: ignore[no-untyped-call]
        self.runs: dict[str, PodRun] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"proclet-{name}", daemon=True)
        self.errors: list[str] = []

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> ProcessNode:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._register()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        for run in list(self.runs.values()):
            self._terminate(run, grace=5.0)
        self.runs.clear()

    def pod_log(self, namespace: str, pod: str, lines: int = 40) -> str:
        parts = []
        for log_file in sorted((self.workdir / "pods" / f"{namespace}_{pod}").glob("*.log")):
            text = log_file.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"----- {namespace}/{pod} {log_file.stem} -----\n" + "\n".join(text))
        return "\n".join(parts)

    def logs(self, lines: int = 25) -> str:
        parts = [f"process node errors: {self.errors[-5:]}"] if self.errors else []
        for run in self.runs.values():
            parts.append(self.pod_log(run.namespace, run.name, lines))
        return "\n".join(parts)

    def address(self, pod_ip: str) -> str:
        """The loopback address where the pod with ``pod_ip`` listens."""
        if not pod_ip.startswith(self.pod_ip_prefix):
            raise KeyError(f"{pod_ip} is not on {self.name}'s pod network")
        return self.ip_prefix + pod_ip[len(self.pod_ip_prefix) :]

    def kill_container(self, namespace: str, pod: str, sig: int = signal.SIGKILL) -> None:
        """What an OOM kill or a crash does: the process dies, the node restarts it."""
        for run in self.runs.values():
            if (run.namespace, run.name) == (namespace, pod):
                for c in run.containers:
                    if c.proc is not None:
                        c.proc.send_signal(sig)
                return
        raise KeyError(f"no running pod {namespace}/{pod} on {self.name}")

    # ------------------------------------------------------------------ the node
    def _register(self) -> None:
        capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(self.gpus)}
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": {
                    "kubernetes.io/hostname": self.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "nvidia.com/gpu.present": "true",
                },
            },
            "spec": {},
        }
        with contextlib.suppress(ApiException):
            self.api.create_node(body)  # type: ignore[arg-type]
        status = {
            "status": {
                "capacity": capacity,
                "allocatable": capacity,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "ProcessNodeReady",
                        "message": "pods run as local processes",
                        "lastHeartbeatTime": _now(),
                        "lastTransitionTime": _now(),
                    }
                ],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                "nodeInfo": {
                    "architecture": "amd64",
                    "operatingSystem": "linux",
                    "kubeletVersion": "proclet",
                    "containerRuntimeVersion": "process://",
                    "kernelVersion": "",
                    "kubeProxyVersion": "",
                    "osImage": "localhost",
                    "machineID": "",
                    "systemUUID": "",
                    "bootID": "",
                },
            }
        }
        self.api.patch_node_status(self.name, status)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as exc:  # keep the node alive; the failure is reported in logs()
                self.errors.append(f"{type(exc).__name__}: {exc}")
                log.exception("process node tick failed")
            self._stop.wait(POLL_S)

    def _tick(self) -> None:
        pods = self.api.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.name}"
        ).items
        seen = set()
        for pod_obj in pods:
            pod = self.api.api_client.sanitize_for_serialization(pod_obj)
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            run = self.runs.get(uid)
            if pod["metadata"].get("deletionTimestamp"):
                self._delete(run, pod)
                continue
            if run is None:
                if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    continue
                run = self._admit(pod)
            run.pod = pod
            self._supervise(run)
        for uid in [u for u in self.runs if u not in seen]:  # force-deleted
            self._terminate(self.runs.pop(uid), grace=0.0)

    # ------------------------------------------------------------------ pods
    def _admit(self, pod: dict[str, Any]) -> PodRun:
        meta = pod["metadata"]
        ip, pod_ip = f"{self.ip_prefix}{self._next_ip}", f"{self.pod_ip_prefix}{self._next_ip}"
        self._next_ip = self._next_ip + 1 if self._next_ip < 254 else 2
        root = self.workdir / "pods" / f"{meta['namespace']}_{meta['name']}"
        shutil.rmtree(root, ignore_errors=True)
        (root / "fs").mkdir(parents=True)
        containers = [Container(c["name"], c) for c in pod["spec"]["containers"]]
        run = PodRun(
            meta["uid"], meta["namespace"], meta["name"], ip, pod_ip, root, pod, containers
        )
        self.runs[run.uid] = run
        self._sync_volumes(run)
        for c in containers:
            self._start_container(run, c)
        return run

    def _supervise(self, run: PodRun) -> None:
        if run.phase in ("Succeeded", "Failed"):
            self._report(run)
            return
        if time.monotonic() - run.last_sync > SYNC_S:
            self._sync_volumes(run)
        policy = run.pod["spec"].get("restartPolicy", "Always")
        for c in run.containers:
            if c.simulated:
                c.ready = True
                if run.is_job:
                    c.exit_code = 0
                continue
            assert c.proc is not None
            code = c.proc.poll()
            if code is None:
                c.ready = self._probe(run, c)
                continue
            c.ready = False
            if policy == "Always" or (policy == "OnFailure" and code != 0):
                c.restarts += 1
                self._start_container(run, c)
            else:
                c.exit_code = code
        if run.is_job and all(c.exit_code is not None for c in run.containers):
            run.phase = "Succeeded" if all(c.exit_code == 0 for c in run.containers) else "Failed"
        self._report(run)

    def _delete(self, run: PodRun | None, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        if run is not None:
            grace = float(meta.get("deletionGracePeriodSeconds") or 0)
            if run.deleting_since is None:
                run.deleting_since = time.monotonic()
                for c in run.containers:
                    c.ready = False
                    if c.proc is not None and c.proc.poll() is None:
                        c.proc.terminate()
                self._report(run)
            alive = [c for c in run.containers if c.proc is not None and c.proc.poll() is None]
            if alive and time.monotonic() - run.deleting_since < grace:
                return
            self._terminate(self.runs.pop(run.uid), grace=0.0)
        with contextlib.suppress(ApiException):  # the kubelet's final, forced delete
            self.api.delete_namespaced_pod(
                meta["name"],
                meta["namespace"],
                body=client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta["uid"])
                ),
            )

    def _terminate(self, run: PodRun, grace: float) -> None:
        for c in run.containers:
            if c.proc is not None and c.proc.poll() is None:
                c.proc.terminate()
        deadline = time.monotonic() + grace
        for c in run.containers:
            if c.proc is None:
                continue
            try:
                c.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait()

    # ------------------------------------------------------------------ containers
    def _start_container(self, run: PodRun, c: Container) -> None:
        image = c.spec["image"]
        repo = image.rsplit("@", 1)[0]
        if ":" in repo.rsplit("/", 1)[-1]:
            repo = repo.rsplit(":", 1)[0]
        entry = self.images.get(repo)
        if entry is None:
            c.simulated = True
            return
        # like a container runtime: `command` replaces the entrypoint, `args` follow it; only
        # the pod's own words are container paths (the entrypoint is a host path, which may
        # well lie under a mountPath such as /tmp)
        spec_cmd = [self._translate(run, c, a) for a in c.spec.get("command") or []]
        args = [self._translate(run, c, a) for a in c.spec.get("args") or []]
        cmd = [*(spec_cmd or entry), *args]
        env = self._env(run, c)
        out = (run.root / f"{c.name}.log").open("ab")
        try:
            c.proc = subprocess.Popen(
                cmd,
                cwd=run.root / "fs",
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,  # a crashed test run leaves no pod behind
            )
        finally:
            out.close()
        c.started_at = _now()

    def _env(self, run: PodRun, c: Container) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(run.root / "fs"),
            "HOSTNAME": run.name,
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
        if (run.root / "kubeconfig").exists():
            env["KUBECONFIG"] = str(run.root / "kubeconfig")
        for item in c.spec.get("env") or []:
            if "value" in item:
                env[item["name"]] = self._translate(run, c, str(item["value"]))
                continue
            src = item.get("valueFrom") or {}
            value = self._value_from(run, src)
            if value is not None:
                env[item["name"]] = value
        return env

    def _value_from(self, run: PodRun, src: dict[str, Any]) -> str | None:
        if "secretKeyRef" in src:
            ref = src["secretKeyRef"]
            data = self.api.read_namespaced_secret(ref["name"], run.namespace).data or {}
            return base64.b64decode(data[ref["key"]]).decode() if ref["key"] in data else None
        if "configMapKeyRef" in src:
            ref = src["configMapKeyRef"]
            cm = self.api.read_namespaced_config_map(ref["name"], run.namespace).data or {}
            return cm.get(ref["key"])
        if "fieldRef" in src:
            path = src["fieldRef"]["fieldPath"]
            fields = {
                "metadata.name": run.name,
                "metadata.namespace": run.namespace,
                "status.podIP": run.pod_ip,
                "spec.nodeName": self.name,
                "spec.serviceAccountName": run.pod["spec"].get("serviceAccountName", "default"),
            }
            return fields.get(path)
        return None

    def _translate(self, run: PodRun, c: Container, value: str) -> str:
        if value == "0.0.0.0":
            return run.ip
        mounts = sorted(
            c.spec.get("volumeMounts") or [], key=lambda m: len(m["mountPath"]), reverse=True
        )
        for mount in mounts:
            mp = mount["mountPath"].rstrip("/")
            if value == mp or value.startswith(mp + "/"):
                return str(self._mount_dir(run, mount)) + value[len(mp) :]
        return value

    def _mount_dir(self, run: PodRun, mount: dict[str, Any]) -> Path:
        volume = self._volume(run, mount["name"])
        if volume is not None and "hostPath" in volume:
            return Path(str(volume["hostPath"]["path"]))
        return run.root / "fs" / str(mount["mountPath"]).lstrip("/")

    def _volume(self, run: PodRun, name: str) -> dict[str, Any] | None:
        for v in run.pod["spec"].get("volumes") or []:
            if v["name"] == name:
                return dict(v)
        return None

    def _probe(self, run: PodRun, c: Container) -> bool:
        probe = (c.spec.get("readinessProbe") or {}).get("httpGet")
        if not probe:
            return True
        port = probe["port"]
        if isinstance(port, str):
            port = next(p["containerPort"] for p in c.spec.get("ports", []) if p["name"] == port)
        url = f"http://{run.ip}:{port}{probe.get('path', '/')}"
        try:
            with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as resp:
                return bool(200 <= resp.status < 400)
        except OSError:
            return False

    # ------------------------------------------------------------------ volumes
    def _sync_volumes(self, run: PodRun) -> None:
        run.last_sync = time.monotonic()
        for c in run.containers:
            for mount in c.spec.get("volumeMounts") or []:
                volume = self._volume(run, mount["name"])
                if volume is None or "hostPath" in volume:
                    continue
                target = self._mount_dir(run, mount)
                target.mkdir(parents=True, exist_ok=True)
                for rel, data in self._volume_files(run, volume).items():
                    path = target / rel
                    if run.files.get(path) != data:
                        path.parent.mkdir(parents=True, exist_ok=True)
                        tmp = path.with_name(f".{path.name}.tmp")
                        tmp.write_bytes(data)
                        tmp.replace(path)  # atomic, like the kubelet's symlink swap
                        run.files[path] = data

    def _volume_files(self, run: PodRun, volume: dict[str, Any]) -> dict[str, bytes]:
        if "configMap" in volume:
            src = volume["configMap"]
            try:
                data = {
                    k: v.encode()
                    for k, v in (
                        self.api.read_namespaced_config_map(src["name"], run.namespace).data or {}
                    ).items()
                }
            except ApiException:
                return {}
            return _items(data, src.get("items"))
        if "secret" in volume:
            src = volume["secret"]
            try:
                raw = self.api.read_namespaced_secret(src["secretName"], run.namespace).data or {}
            except ApiException:
                return {}
            return _items({k: base64.b64decode(v) for k, v in raw.items()}, src.get("items"))
        if "projected" in volume and run.pod["spec"].get("serviceAccountName"):
            return self._service_account_files(run)
        return {}

    def _service_account_files(self, run: PodRun) -> dict[str, bytes]:
        """The projected token mount, and the same credentials as a kubeconfig."""
        if (run.root / "kubeconfig").exists():
            return {}
        sa = run.pod["spec"]["serviceAccountName"]
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[],
                expiration_seconds=3600,
                bound_object_ref=client.V1BoundObjectReference(
                    api_version="v1", kind="Pod", name=run.name, uid=run.uid
                ),
            )
        )
        issued = self.api.create_namespaced_service_account_token(sa, run.namespace, request)
        token = str(issued.status.token)  # type: ignore[union-attr]
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "in-cluster",
                    "cluster": {"server": self.server, "certificate-authority": str(self.ca)},
                }
            ],
            "users": [{"name": sa, "user": {"token": token}}],
            "contexts": [
                {
                    "name": sa,
                    "context": {"cluster": "in-cluster", "user": sa, "namespace": run.namespace},
                }
            ],
            "current-context": sa,
        }
        (run.root / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
        return {
            "token": token.encode(),
            "ca.crt": self.ca.read_bytes(),
            "namespace": run.namespace.encode(),
        }

    # ------------------------------------------------------------------ status
    def _report(self, run: PodRun) -> None:
        ready = run.phase == "Running" and all(c.ready for c in run.containers)
        statuses = []
        for c in run.containers:
            state: dict[str, Any]
            if c.exit_code is not None:
                state = {
                    "terminated": {
                        "exitCode": c.exit_code,
                        "reason": "Completed" if c.exit_code == 0 else "Error",
                        "startedAt": c.started_at,
                        "finishedAt": _now(),
                    }
                }
            else:
                state = {"running": {"startedAt": c.started_at}}
            statuses.append(
                {
                    "name": c.name,
                    "image": c.spec["image"],
                    "imageID": "",
                    "ready": c.ready,
                    "started": c.exit_code is None,
                    "restartCount": c.restarts,
                    "state": state,
                }
            )
        key = (run.phase, ready, tuple((s["ready"], s["restartCount"]) for s in statuses))
        if key == run.last_status:
            return
        flag = "True" if ready else "False"
        status = {
            "phase": run.phase,
            "hostIP": "127.0.0.1",
            "podIP": run.pod_ip,
            "podIPs": [{"ip": run.pod_ip}],
            "startTime": run.containers[0].started_at,
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": flag, "lastTransitionTime": _now()},
                {"type": "Ready", "status": flag, "lastTransitionTime": _now()},
            ],
            "containerStatuses": statuses,
        }
        try:
            self.api.patch_namespaced_pod_status(run.name, run.namespace, {"status": status})
        except ApiException as exc:
            if exc.status != 404:
                raise
        run.last_status = key


def _items(data: dict[str, bytes], items: list[dict[str, str]] | None) -> dict[str, bytes]:
    if not items:
        return data
    return {i["path"]: data[i["key"]] for i in items if i["key"] in data}
