"""A ranker sizes torch's thread pool by its cgroup's CPU quota, not by the node's cores."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from kvrank.cpus import cpu_quota, usable_cpus


def _v1(root: Path, path: str, quota: int, period: int = 100_000) -> None:
    d = root / "cpu,cpuacct" / path.lstrip("/")
    d.mkdir(parents=True)
    (d / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (d / "cpu.cfs_period_us").write_text(f"{period}\n")


def test_a_v1_quota_is_read_at_the_process_own_cgroup(tmp_path) -> None:
    _v1(tmp_path, "/", -1)  # the hierarchy's root: no limit
    _v1(tmp_path, "/kubepods/pod1/c1", 150_000)
    own = "12:cpu,cpuacct:/kubepods/pod1/c1\n11:memory:/kubepods/pod1/c1\n"
    assert cpu_quota(tmp_path, own) == 1.5
    assert cpu_quota(tmp_path, "12:cpu,cpuacct:/\n") is None  # the root's -1


def test_a_container_sees_its_own_cgroup_at_the_mount_root(tmp_path) -> None:
    _v1(tmp_path, "/", 50_000)  # the path /proc names is the host's, absent in here
    assert cpu_quota(tmp_path, "4:cpu,cpuacct:/kubepods/burstable/pod9/abc\n") == 0.5


def test_a_v2_quota_and_its_absence(tmp_path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    (tmp_path / "cpu.max").write_text("max 100000\n")
    (tmp_path / "pods" / "p").mkdir(parents=True)
    (tmp_path / "pods" / "p" / "cpu.max").write_text("250000 100000\n")
    assert cpu_quota(tmp_path, "0::/pods/p\n") == 2.5
    assert cpu_quota(tmp_path, "0::/\n") is None


def test_whole_cpus_at_least_one_never_more_than_the_cores() -> None:
    cores = len(os.sched_getaffinity(0))
    assert usable_cpus(0.5) == 1
    assert usable_cpus(1.9) == 1
    assert usable_cpus(1000.0) == cores


V1_CPU = Path("/sys/fs/cgroup/cpu")


@pytest.mark.skipif(
    not os.access(V1_CPU, os.W_OK), reason="needs a writable cgroup v1 cpu hierarchy (root)"
)
def test_a_process_in_a_half_core_cgroup_sizes_its_pool_to_one_thread() -> None:
    """A real cgroup with a real quota, as the kubelet makes for a 500m limit."""
    group = V1_CPU / f"kvrank-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "cpu.cfs_quota_us").write_text("50000")
        code = "from kvrank.cpus import cpu_quota, usable_cpus; print(cpu_quota(), usable_cpus())"
        out = subprocess.run(
            [
                "sh",
                "-c",
                f'echo $$ > {group}/cgroup.procs && exec "$0" -c "$1"',
                sys.executable,
                code,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert out == ["0.5", "1"], out
    finally:
        group.rmdir()
