"""How many CPUs this process may use: its cgroup's CPU quota, not the host's core count.

torch sizes its intra-op pool by the cores it sees — the node's, in a container. A pod
limited to half a core on a 64-core node would then run 64 threads that spin and share 50 ms
of CPU per 100 ms period: the quota is spent in a few milliseconds and every thread of the
process, the event loop answering health checks and shedding load included, is throttled
for the rest of the period. So a ranker sizes its pool by its quota (what Go's automaxprocs
does for GOMAXPROCS). Both cgroup versions; a controller found neither at this process's own
cgroup path nor at the mount's root (a container's view of its cgroup) counts as no limit.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_paths(proc_cgroup: str) -> tuple[str | None, str | None]:
    """``(cgroup v2 path, cgroup v1 cpu controller path)`` from ``/proc/self/cgroup``."""
    v2 = v1 = None
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _first(candidates: list[Path]) -> Path | None:
    return next((p for p in candidates if p.is_file()), None)


def cpu_quota(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> float | None:
    """The CPUs the cgroup's CFS quota allows (``0.5`` for a 500m limit); ``None`` when
    there is no quota or no cgroup to read."""
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
    v2, v1 = _own_paths(proc_cgroup)
    if (root / "cgroup.controllers").is_file():  # the unified hierarchy (cgroup v2)
        found = _first([root / (v2 or "/").lstrip("/") / "cpu.max", root / "cpu.max"])
        if found is None:
            return None
        max_us, period_us = found.read_text().split()[:2]
        return None if max_us == "max" else int(max_us) / int(period_us)
    for mount in (root / "cpu", root / "cpu,cpuacct"):
        found = _first(
            [mount / (v1 or "/").lstrip("/") / "cpu.cfs_quota_us", mount / "cpu.cfs_quota_us"]
        )
        if found is not None:
            quota_us = int(found.read_text())
            period = int((found.parent / "cpu.cfs_period_us").read_text())
            return None if quota_us <= 0 else quota_us / period
    return None


def usable_cpus(quota: float | None = None) -> int:
    """Whole CPUs to size a thread pool by: the quota rounded down (at least one), never
    more than the cores this process may be scheduled on."""
    cores = len(os.sched_getaffinity(0))
    quota = cpu_quota() if quota is None else quota
    return cores if quota is None else max(1, min(cores, math.floor(quota)))
