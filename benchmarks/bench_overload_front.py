"""A queue proxy in front of one ranker under a spike, side by side with the ranker alone.

The spike of ``kvrank loadtest --scenario overload`` (factor × one ranker's measured miss
capacity for a fixed time, distinct users, each caller sending its deadline and giving up
when it passes; admission control on in the ranker) sent two ways, to fresh servers that
alternate from round to round:

- ``direct``: to the ranker itself. Its event loop answers every request — the shed ones
  too (~80 % of a 4× spike) — and shares the interpreter lock with the model thread, which
  must take it back after each torch call.
- ``front``: through the stock Envoy binary on loopback holding at most ``--limit``
  requests in flight to the ranker — the queue proxy the operator runs beside each ranker
  with ``admission.queueProxy`` (its very bootstrap: ``kvrank_operator.manifests.queue_proxy``,
  what Knative's queue-proxy does for KServe's ``containerConcurrency``); one more is answered
  503 at once by Envoy (an upstream overflow, with ``Retry-After`` and ``x-kvrank-shed:
  queue``), never reaching Python.
  The ranker's own admission control still screens what gets through.

Each server's miss capacity is measured on it directly before its spike and after its
recovery (the yardstick is their mean, as in the overload scenario). Prints one row per
spike and writes JSON. Run by ``make bench-overload-front``; the tests run a short one.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kvrank.tools.loadtest import model_dir_for
from kvrank.tools.overload import (
    OverloadSettings,
    capacity_of,
    request_bodies,
    request_pool,
    server_counts,
    spike,
    summarize,
)
from kvrank.tools.processes import RankerProcess, free_port, stop_process, wait_answering
from kvrank_operator.manifests.queue_proxy import envoy_bootstrap

ENVOY = shutil.which("envoy", path=str(Path(sys.executable).parent))
"""The stock binary, installed next to this interpreter by ``make venv``."""
MODES = ("direct", "front")
ROW = (
    "goodput_vs_capacity",
    "answered_in_time",
    "shed",
    "shed_p50_ms",
    "shed_p99_ms",
    "admitted_p50_ms",
    "admitted_p99_ms",
    "gave_up",
    "scored_but_not_received",
    "healthz_max_ms",
    "rss_mb_start",
    "rss_mb_max",
    "recovery_s",
)


class Front:
    """One Envoy on loopback in front of ``ranker``; :meth:`start` returns once it proxies."""

    def __init__(
        self, workdir: Path, ranker: RankerProcess, limit: int, grpc_upstream: int | None = None
    ) -> None:
        """``grpc_upstream``: the ranker's gRPC port, proxied on :attr:`grpc_port` too."""
        if ENVOY is None:
            raise RuntimeError("no envoy binary next to this Python: make venv installs it")
        self.port, admin = free_port(), free_port()
        self.config = workdir / f"front-{self.port}.json"
        # what the operator runs beside each ranker with admission.queueProxy enabled
        self.stats_port, self.grpc_port = free_port(), free_port()
        grpc = (self.grpc_port, grpc_upstream) if grpc_upstream is not None else None
        bootstrap = envoy_bootstrap(
            self.port,
            ranker.port,
            limit,
            admin,
            self.stats_port,
            listen_address="127.0.0.1",
            grpc=grpc,
        )
        self.config.write_text(json.dumps(bootstrap))
        self.log = workdir / f"front-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> None:
        assert ENVOY is not None
        with self.log.open("wb") as log:
            cmd = [ENVOY, "-c", str(self.config), "--base-id", str(self.port), "--concurrency", "1"]
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        # the ranker's readiness, through the proxy
        wait_answering(f"{self.url}/readyz", self.proc, self.log, timeout_s)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)


def one_spike(
    mode: str,
    model_dir: Path,
    pool: list[dict[str, Any]],
    workdir: Path,
    settings: OverloadSettings,
    limit: int,
    label: str,
) -> dict[str, Any]:
    """A fresh ranker: its capacity, the spike sent ``mode``'s way, its capacity again."""
    ranker = RankerProcess.start(model_dir, workdir, env={"KVRANK_ADMISSION_MODE": "shed"})
    front = Front(workdir, ranker, limit) if mode == "front" else None
    try:
        before_cap = capacity_of(ranker.url, pool, f"{label}-before", settings)
        if front is not None:
            front.start()
        rate = settings.factor * before_cap["capacity_qps"]
        bodies = request_bodies(pool, int(rate * settings.duration_s) + 2000, f"{label}-spike")
        before = server_counts(ranker.url)
        # the callers and the health probes go the mode's way; memory is the ranker's
        target = dataclasses.replace(ranker, url=front.url) if front else ranker
        run = asyncio.run(spike(target, bodies, rate, settings, before_cap["idle_ms"]))
        after = server_counts(ranker.url)
        after_cap = capacity_of(ranker.url, pool, f"{label}-after", settings)
    finally:
        if front is not None:
            front.stop()
        ranker.stop()
    readings = [before_cap["capacity_qps"], after_cap["capacity_qps"]]
    server = {k: after[k] - before[k] for k in after}
    summary = summarize(run, server, settings, sum(readings) / 2)
    return {"mode": mode, "capacity_readings_qps": readings, **summary}


def run(settings: OverloadSettings, rounds: int, limit: int) -> dict[str, Any]:
    """``rounds`` rounds of both modes, which goes first alternating."""
    spikes = []
    with tempfile.TemporaryDirectory(prefix="kvrank-front-") as tmp:
        workdir = Path(tmp)
        model_dir, source = model_dir_for(None, workdir)
        pool = request_pool(model_dir, settings.candidates)
        for r in range(rounds):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                label = f"{r}-{mode}"
                row = one_spike(mode, model_dir, pool, workdir, settings, limit, label)
                spikes.append({"round": r, **row})
    means = {
        mode: sum(s["goodput_vs_capacity"] for s in spikes if s["mode"] == mode) / rounds
        for mode in MODES
    }
    return {
        "settings": dataclasses.asdict(settings),
        "limit": limit,
        "model": source,
        "spikes": spikes,
        "mean_goodput_vs_capacity": means,
    }


def _cell(value: Any) -> str:
    return "—" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)


def print_report(report: dict[str, Any]) -> None:
    s = report["settings"]
    table = Table(
        title=f"one ranker, {s['factor']:g}× its miss capacity for {s['duration_s']:g} s,"
        f" {s['deadline_ms']} ms deadlines: direct, or through a queue proxy holding"
        f" {report['limit']} in flight"
    )
    for col in ("round", "mode", "capacity before / after", *ROW):
        table.add_column(col, justify="right")
    for sp in report["spikes"]:
        readings = " / ".join(f"{c:.1f}" for c in sp["capacity_readings_qps"])
        table.add_row(str(sp["round"]), sp["mode"], readings, *(_cell(sp[k]) for k in ROW))
    Console(width=240).print(table)
    means = report["mean_goodput_vs_capacity"]
    print(
        "mean answered in time (× capacity): " + ", ".join(f"{m} {v:.2f}" for m, v in means.items())
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--limit", type=int, default=16, help="requests in flight to the ranker")
    parser.add_argument("--factor", type=float, default=4.0)
    parser.add_argument("--duration", type=float, default=15.0, help="seconds of spike")
    parser.add_argument("--capacity-seconds", type=float, default=5.0)
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args()
    settings = OverloadSettings(
        factor=args.factor, duration_s=args.duration, capacity_s=args.capacity_seconds
    )
    report = run(settings, args.rounds, args.limit)
    print_report(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
