"""One model artifact served on each compute device, side by side: the same scores, and what
a miss and an L1 hit cost through HTTP.

For each device (``--devices``, e.g. ``cuda,cpu``) a real ``kvrank serve --device D`` loads
the same artifact (a seed-fixed model of the ``--size`` profile, untrained: timings and
equality do not depend on training). Every user (``--users``, distinct, their histories
filling the window) is asked twice: the first request encodes the user (``miss``), the
second scores from the K/V that pod keeps on its own device (``l1``). Per device: client-side
p50/p99 of each, the server's own ``total``, the cache outcome of every answer, and the
largest |Δscore| between the two answers for a user (the cache must not change a score).
Across devices: the largest |Δscore| of every answer against the first device's.

``--protocols`` (default: every one a ranker speaks) then sends each user's L1 hit once more
by each other protocol (:mod:`kvrank.tools.served`, which ``kvrank bench --protocol`` runs
too): client p50/p99 per protocol, and what every answer was.

Prints a table and writes JSON. Needs a GPU for ``cuda`` (a ``kvrank serve`` told to use one
that is missing exits, and so does this).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from kvrank.model.artifact import save_model
from kvrank.model.config import PRODUCTION, QUICK, TINY, ModelConfig
from kvrank.model.ranker import RankerModel
from kvrank.tools.callers import PROTOCOLS
from kvrank.tools.served import check_protocols, request_bodies, serve_and_ask

SIZES: dict[str, ModelConfig] = {"tiny": TINY, "quick": QUICK, "production": PRODUCTION}


def artifact(size: str, compute_dtype: str, out: Path) -> Path:
    torch.manual_seed(0)
    cfg = SIZES[size].model_copy(update={"compute_dtype": compute_dtype})
    return save_model(RankerModel(cfg, f"{size}-{compute_dtype}-seed0"), out)


def compare(rows: list[dict[str, Any]]) -> None:
    """Each device's answers against the first device's, in place."""
    ref = rows[0]["scores"]
    for row in rows:
        row["max_abs_diff_vs_" + rows[0]["device"]] = max(
            float(np.abs(np.array(a) - np.array(b)).max())
            for a, b in zip(row["scores"], ref, strict=True)
        )


def show(rows: list[dict[str, Any]], title: str) -> None:
    table = Table(title=title)
    ref = "max_abs_diff_vs_" + rows[0]["device"]
    columns = ("device", "miss p50", "miss p99", "hit p50", "hit p99", "server hit p50")
    for col in (*columns, "cache (1st / 2nd)", "|Δ| hit vs miss", f"|Δ| vs {rows[0]['device']}"):
        table.add_column(col, justify="left" if col in ("device", "cache (1st / 2nd)") else "right")
    for r in rows:
        table.add_row(
            r["device"],
            f"{r['miss']['p50_ms']:.2f}",
            f"{r['miss']['p99_ms']:.2f}",
            f"{r['hit']['p50_ms']:.2f}",
            f"{r['hit']['p99_ms']:.2f}",
            f"{r['server_total_hit_p50_ms']:.2f}",
            f"{','.join(r['cache_first'])} / {','.join(r['cache_again'])}",
            f"{r['max_abs_diff_hit_vs_miss']:.2e}",
            f"{r[ref]:.2e}",
        )
    Console(width=160).print(table)
    protocols = Table(title="L1 hits by protocol (client ms)")
    for col in ("device", "protocol", "p50", "p99", "answers"):
        protocols.add_column(col, justify="right" if col in ("p50", "p99") else "left")
    for r in rows:
        for name, hits in r["hit_by_protocol"].items():
            p50, p99 = f"{hits['p50_ms']:.2f}", f"{hits['p99_ms']:.2f}"
            protocols.add_row(r["device"], name, p50, p99, ", ".join(hits["answers"]))
    Console(width=160).print(protocols)


def run(
    size: str,
    compute_dtype: str,
    devices: list[str],
    users: int,
    candidates: int,
    protocols: tuple[str, ...] = ("json",),
) -> dict[str, Any]:
    """The whole comparison; the report :func:`main` writes (less the scores themselves)."""
    check_protocols(protocols)
    workdir = Path(tempfile.mkdtemp(prefix="kvrank-serving-device-"))
    model_dir = artifact(size, compute_dtype, workdir / "model")
    requests = request_bodies(model_dir, users, candidates)
    rows = [serve_and_ask(model_dir, device, requests, workdir, protocols) for device in devices]
    compare(rows)
    show(rows, f"{size} model ({compute_dtype}), C={candidates}, {users} users")
    return {
        "size": size,
        "compute_dtype": compute_dtype,
        "candidates": candidates,
        "users": users,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "devices": [{k: v for k, v in r.items() if k != "scores"} for r in rows],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="production")
    parser.add_argument("--compute-dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    parser.add_argument("--devices", default="cuda,cpu", help="comma-separated, first = reference")
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--candidates", type=int, default=100)
    parser.add_argument(
        "--protocols",
        default=",".join(PROTOCOLS),
        help=f"comma-separated, json first: the L1 hit by each of {', '.join(PROTOCOLS)}",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    devices, protocols = args.devices.split(","), tuple(args.protocols.split(","))
    report = run(args.size, args.compute_dtype, devices, args.users, args.candidates, protocols)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
