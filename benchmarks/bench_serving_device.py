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
by each other protocol, one protocol after the other, as a caller of that protocol would
(:mod:`kvrank.tools.callers`: ``json-ref`` names the history by the ETag of the user's JSON
answer, ``v2-http`` sends binary tensors, ``v2-grpc`` a ``ModelInfer`` on the ranker's gRPC
port): client p50/p99 per protocol, and every answer must be a 200 from L1.

Prints a table and writes JSON. Needs a GPU for ``cuda`` (a ``kvrank serve`` told to use one
that is missing exits, and so does this).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from kvrank.model.artifact import save_model
from kvrank.model.config import PRODUCTION, QUICK, ModelConfig
from kvrank.model.contract import FeatureSpec
from kvrank.model.onetrans import feature_spec
from kvrank.model.ranker import RankerModel
from kvrank.tools.callers import GRPC_PROTOCOLS, PROTOCOLS, Caller, encode
from kvrank.tools.processes import RankerProcess, free_port
from kvrank.tools.workload import Workload, WorkloadSettings, workload_model

SIZES: dict[str, ModelConfig] = {"quick": QUICK, "production": PRODUCTION}
WARMUP = 3
"""Requests of other users first: the first calls of a process pay for kernel selection."""


def artifact(size: str, compute_dtype: str, out: Path) -> Path:
    torch.manual_seed(0)
    cfg = SIZES[size].model_copy(update={"compute_dtype": compute_dtype})
    return save_model(RankerModel(cfg, f"{size}-{compute_dtype}-seed0"), out)


def bodies(model_dir: Path, users: int, candidates: int) -> list[dict[str, Any]]:
    """One request per distinct user, each history filling the model's window."""
    settings = WorkloadSettings(users=users, zipf_s=0.0, candidates=candidates, history_fill=1.0)
    pool = [r.body for r in Workload(workload_model(model_dir), settings).requests(users)]
    return [{**body, "user_id": f"user-{i}"} for i, body in enumerate(pool)]


def _ask(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    resp = client.post(f"{url}/v1/score", json=body)
    ms = (time.perf_counter() - t0) * 1e3
    resp.raise_for_status()
    return ms, {**resp.json(), "etag": resp.headers.get("etag")}


async def _hits_by(
    protocol: str, target: str, requests: list[dict[str, Any]], etags: list[str], spec: FeatureSpec
) -> dict[str, Any]:
    """Each user's L1 hit by ``protocol`` (its bodies encoded before the clock starts), one
    at a time: client p50/p99, and every answer's status and cache outcome."""
    encoded = [encode(body, protocol, spec) for body in requests]
    ms, answers = [], []
    async with Caller(protocol, concurrency=1) as caller:
        for body, etag in zip(encoded, etags, strict=True):
            payload, headers = body.whole, dict(body.headers)
            if protocol == "json-ref":  # the history by the ETag its JSON answer named
                payload, headers = body.by_reference, {"If-Match": etag}
            t0 = time.perf_counter()
            status, outcome, _ = await caller.send(target, payload, headers)
            ms.append((time.perf_counter() - t0) * 1e3)
            answers.append(f"{status} {outcome}")
    return {**_stats(ms), "answers": sorted(set(answers))}


def _stats(ms: list[float]) -> dict[str, float]:
    return {"p50_ms": statistics.median(ms), "p99_ms": float(np.percentile(ms, 99))}


def serve_and_ask(
    model_dir: Path,
    device: str,
    requests: list[dict[str, Any]],
    workdir: Path,
    spec: FeatureSpec,
    protocols: tuple[str, ...] = ("json",),
) -> dict[str, Any]:
    """``requests`` sent twice each (miss, then hit) to a fresh ranker on ``device``, then
    once more by each other protocol in ``protocols`` (L1 hits)."""
    grpc_port = free_port()
    ranker = RankerProcess.start(
        model_dir, workdir, "--device", device, "--grpc-port", str(grpc_port), timeout_s=300.0
    )
    try:
        with httpx.Client(timeout=120.0) as client:
            for i in range(WARMUP):
                _ask(client, ranker.url, {**requests[i], "user_id": f"warmup-{i}"})
            first = [_ask(client, ranker.url, body) for body in requests]
            again = [_ask(client, ranker.url, body) for body in requests]
        etags = [a["etag"] for _, a in again]
        answered = sorted({f"200 {a['cache']}" for _, a in again})
        by_protocol = {"json": {**_stats([ms for ms, _ in again]), "answers": answered}}
        for protocol in (p for p in protocols if p != "json"):
            target = f"127.0.0.1:{grpc_port}" if protocol in GRPC_PROTOCOLS else ranker.url
            by_protocol[protocol] = asyncio.run(_hits_by(protocol, target, requests, etags, spec))
    finally:
        ranker.stop()
    scores = [np.array(a["scores"]) for _, a in first]
    return {
        "device": device,
        "miss": _stats([ms for ms, _ in first]),
        "hit": _stats([ms for ms, _ in again]),
        "server_total_miss_p50_ms": statistics.median(a["timings_ms"]["total"] for _, a in first),
        "server_total_hit_p50_ms": statistics.median(a["timings_ms"]["total"] for _, a in again),
        "cache_first": sorted({a["cache"] for _, a in first}),
        "cache_again": sorted({a["cache"] for _, a in again}),
        "hit_by_protocol": by_protocol,
        "max_abs_diff_hit_vs_miss": max(
            float(np.abs(np.array(a["scores"]) - s).max())
            for (_, a), s in zip(again, scores, strict=True)
        ),
        "scores": [s.tolist() for s in scores],
    }


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
    unknown = set(protocols) - set(PROTOCOLS)
    if unknown or "json" not in protocols:
        raise ValueError(f"protocols: json and any of {', '.join(PROTOCOLS)}, not {protocols}")
    workdir = Path(tempfile.mkdtemp(prefix="kvrank-serving-device-"))
    model_dir = artifact(size, compute_dtype, workdir / "model")
    requests = bodies(model_dir, users, candidates)
    spec = feature_spec(SIZES[size])
    rows = [
        serve_and_ask(model_dir, device, requests, workdir, spec, protocols) for device in devices
    ]
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
