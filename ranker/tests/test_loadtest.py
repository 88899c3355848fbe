"""`kvrank loadtest` runs both servers side by side and reports what the cache did."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

KEYS = {
    "hit_ratio",
    "l1_hit_ratio",
    "l2_hit_ratio",
    "cache",
    "nocache",
    "p99_speedup",
    "qps",
    "user_encodes",
    "errors",
}


@pytest.mark.slow
@pytest.mark.redis
def test_smoke_loadtest_reports_cache_effects(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "kvrank"),
            "loadtest",
            "--profile",
            "smoke",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert set(report) >= KEYS
    assert report["errors"] == 0
    assert report["redis"] == "redis-server (local)"
    assert 0.5 < report["hit_ratio"] <= 1.0 and report["l2_hit_ratio"] > 0
    # 10 users: at most one full encode per user plus TTL/refresh re-encodes, never per request
    assert report["user_encodes"]["full"] < report["cache"]["requests"] / 2
    assert report["cache"]["p50_ms"] < report["nocache"]["p50_ms"]
    for side in ("cache", "nocache"):
        assert {"p50_ms", "p99_ms", "qps"} <= set(report[side])
