"""By hand: ``python -m localkube up DIR`` starts a detached cluster with its real node,
``down DIR`` stops it; ``images DIR`` builds the product's images the tests run (a private
``dockerd`` keeps its socket in DIR), so the suite's own build finds every layer cached.

``up`` prints ``export KUBECONFIG=…``; the component PIDs are kept in ``DIR/pids.json`` so
``down`` can stop them from another shell, then remove the node's containers, mounts,
cgroups and network (the host's routes and iptables are as before ``up``).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from localkube.engine import build_images, engine
from localkube.local import LocalCluster
from localkube.network import NodeNetwork
from localkube.node import cleanup
from localkube.processes import kill_groups


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("up", "down", "images"):
        print("usage: python -m localkube {up|down|images} DIR", file=sys.stderr)
        return 2
    action, workdir = argv[0], Path(argv[1]).resolve()
    if action == "images":
        with engine(workdir) as docker:
            print("\n".join(build_images(docker).all()))
        return 0
    pid_file = workdir / "pids.json"
    if action == "down":
        if pid_file.exists():
            kill_groups(json.loads(pid_file.read_text()))
            pid_file.unlink()
            print(f"local cluster in {workdir} stopped")
        else:
            print(f"no local cluster recorded in {workdir}")
        cleanup(workdir)
        NodeNetwork().teardown()
        return 0
    if pid_file.exists():
        print(f"a cluster is already recorded in {pid_file}; run 'down' first", file=sys.stderr)
        return 1
    shutil.rmtree(workdir, ignore_errors=True)  # a fresh etcd and fresh certificates
    cluster = LocalCluster(workdir, tie_to_parent=False).start(timeout=180)
    pid_file.write_text(json.dumps(cluster.supervisor.pids()))
    print(
        f"# local cluster ready in {cluster.startup_seconds:.1f}s; logs in {cluster.log_dir}",
        file=sys.stderr,
    )
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    print(f"export PATH={cluster.bin}:$PATH")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
