"""Scoring passes replayed from CUDA graphs against the same passes run eagerly, one process.

For a seed-fixed model of ``--size`` in each ``--dtypes``, and each number of users a pass
holds (``--users``) and candidates per user (``--candidates``): every user's K/V made once,
then the pass timed (``--repeat`` times after warm-up, synchronised) three ways — the model's
own ``score_many`` (eager, what a server runs without ``cuda_graphs``), and
:class:`~kvrank.model.graphs.BucketedPasses` (padded to its bucket and replayed from a CUDA
graph; on a CPU the same buffers run eagerly, which proves the script without a GPU). Per
case: p50 of each, the speed-up, and the largest |Δlogit| between the two (the model contract
bounds it). Prints a table and writes JSON; ``make bench-cuda`` runs it on a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from bench_serving_device import SIZES
from rich.console import Console
from rich.table import Table

from kvrank.data.synthetic import SyntheticWorld
from kvrank.model.graphs import BucketedPasses
from kvrank.model.onetrans import KV_TOLERANCES
from kvrank.model.ranker import RankerModel


def timed(fn: Callable[[], object], repeat: int, device: torch.device) -> float:
    """p50 ms of ``fn()`` over ``repeat`` calls after two (each synchronised on a GPU)."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(2):
        fn()
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def case(
    net: RankerModel, passes: BucketedPasses, users: int, c: int, repeat: int
) -> dict[str, Any]:
    world = SyntheticWorld(net.cfg)
    samples = [world.user(i, net.cfg.max_events) for i in range(users)]  # full windows
    requests = [
        (net.encode_user(s.features), world.candidates(s, c, i)[0]) for i, s in enumerate(samples)
    ]
    eager = net.score_many(requests)
    bucketed = passes.score_many(requests)
    diff = max(float((a - b).abs().max()) for a, b in zip(eager, bucketed, strict=True))
    e_ms = timed(lambda: net.score_many(requests), repeat, net.device)
    g_ms = timed(lambda: passes.score_many(requests), repeat, net.device)
    return {
        "users": users,
        "candidates": c,
        "eager_p50_ms": e_ms,
        "graphs_p50_ms": g_ms,
        "speedup": e_ms / g_ms,
        "max_abs_dlogit": diff,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    rows = []
    for dtype in args.dtypes.split(","):
        torch.manual_seed(0)
        cfg = SIZES[args.size].model_copy(update={"compute_dtype": dtype})
        net = RankerModel(cfg, f"{args.size}-{dtype}").eval().to(device)
        passes = BucketedPasses(net)
        for users in (int(u) for u in args.users.split(",")):
            for c in (int(x) for x in args.candidates.split(",")):
                row = {"dtype": dtype, **case(net, passes, users, c, args.repeat)}
                if row["max_abs_dlogit"] > KV_TOLERANCES[dtype]:
                    raise SystemExit(f"{row}: the bucketed pass is off by more than {dtype} allows")
                rows.append(row)
        rows[-1]["graphs_captured"] = passes.captured
    return {
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "replayed": device.type == "cuda",
        "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
        "torch": torch.__version__,
        "rows": rows,
    }


def show(report: dict[str, Any]) -> None:
    how = "replayed from CUDA graphs" if report["replayed"] else "bucketed, eager (no GPU)"
    table = Table(title=f"{report['settings']['size']} scoring passes: eager vs {how}")
    for col in ("dtype", "users", "C", "eager ms", "bucketed ms", "speed-up", "max |Δlogit|"):
        table.add_column(col, justify="right")
    for r in report["rows"]:
        table.add_row(
            r["dtype"], str(r["users"]), str(r["candidates"]), f"{r['eager_p50_ms']:.2f}",
            f"{r['graphs_p50_ms']:.2f}", f"{r['speedup']:.2f}×", f"{r['max_abs_dlogit']:.1e}",
        )  # fmt: skip
    Console().print(table)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=sorted(SIZES), default="production")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--users", default="1,8,32")
    p.add_argument("--candidates", default="50,100,200")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    report = run(args)
    show(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
