"""Run one container of a Kubernetes pod spec with ``docker run``, the way a kubelet would.

Only what the image tests need, and nothing relaxed: the user and fsGroup, a read-only root
filesystem, dropped capabilities and no privilege escalation from the securityContexts;
env; volume mounts (hostPath and host folders given for configMap/secret volumes as bind
mounts, emptyDir as tmpfs); the container's args after the image's entrypoint; a projected
ServiceAccount token at the in-cluster path. Networking is the host's (``hostNetwork``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def docker_run_args(
    pod: dict[str, Any],
    container: str,
    image: str,
    name: str,
    host_dirs: dict[str, Path] | None = None,
    service_account: Path | None = None,
    env: dict[str, str] | None = None,
) -> list[str]:
    """``docker run`` arguments (after ``docker``) for ``container`` of ``pod``.

    ``host_dirs`` gives the host folder behind each configMap/secret volume by name;
    ``service_account`` a folder with ``token``, ``ca.crt`` and ``namespace``."""
    spec = next(c for c in pod["containers"] if c["name"] == container)
    pod_sc = pod.get("securityContext") or {}
    sc = spec.get("securityContext") or {}
    args = ["run", "-d", "--name", name, "--network", "host"]
    uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
    if uid is not None:
        args += ["--user", str(uid)]
    if pod_sc.get("fsGroup") is not None:
        args += ["--group-add", str(pod_sc["fsGroup"])]
    if sc.get("readOnlyRootFilesystem"):
        args.append("--read-only")
    for cap in (sc.get("capabilities") or {}).get("drop", []):
        args += ["--cap-drop", cap]
    if sc.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    for var in spec.get("env", []):
        args += ["-e", f"{var['name']}={var['value']}"]
    for key, value in (env or {}).items():
        args += ["-e", f"{key}={value}"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in spec.get("volumeMounts", []):
        volume, target = volumes[mount["name"]], mount["mountPath"]
        if "emptyDir" in volume:
            args += ["--mount", f"type=tmpfs,destination={target},tmpfs-mode=1777"]
            continue
        if "hostPath" in volume:
            source = Path(volume["hostPath"]["path"])
        else:
            source = (host_dirs or {})[mount["name"]]
        readonly = ",readonly" if mount.get("readOnly") else ""
        args += ["--mount", f"type=bind,source={source},destination={target}{readonly}"]
    if service_account is not None and pod.get("automountServiceAccountToken", True):
        args += ["--mount", f"type=bind,source={service_account},destination={SA_MOUNT},readonly"]
    return [*args, image, *spec.get("args", [])]
