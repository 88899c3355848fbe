"""The process node: a pod bound to it runs as a local process with its args, env and volumes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from localkube.local import LocalCluster
from localkube.proclet import ProcessNode

pytestmark = [pytest.mark.kube, pytest.mark.slow]


def test_pod_paths_point_into_the_pod_but_the_host_entrypoint_stays(tmp_path: Path) -> None:
    # the entrypoint lies under /tmp on the host (as a checkout under /tmp does) while the
    # pod mounts an emptyDir at /tmp: the pod's own paths move into the pod, the entrypoint
    # must not
    assert str(tmp_path).startswith("/tmp/")
    entry = tmp_path / "entry.sh"
    entry.write_text('#!/bin/sh\necho "arg=$1"\ntouch "$MARKER"\nexec sleep 60\n')
    entry.chmod(0o755)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "entry", "namespace": "default"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "example.com/entry:1",
                    "args": ["/tmp/out"],
                    "env": [{"name": "MARKER", "value": "/tmp/marker"}],
                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                }
            ],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
        },
    }
    with LocalCluster(tmp_path / "cluster", nodes=()) as cluster:
        node = ProcessNode(
            cluster.kubeconfig,
            cluster.server,
            cluster.pki_dir / "ca.crt",
            tmp_path / "node",
            images={"example.com/entry": [str(entry)]},
        ).start()
        try:
            cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
            pod_tmp = tmp_path / "node" / "pods" / "default_entry" / "fs" / "tmp"
            deadline = time.monotonic() + 60
            while not (pod_tmp / "marker").exists():
                assert time.monotonic() < deadline, f"the pod never ran; node errors: {node.errors}"
                time.sleep(0.5)
            log = (tmp_path / "node" / "pods" / "default_entry" / "main.log").read_text()
            assert f"arg={pod_tmp}/out" in log
        finally:
            node.stop()
