"""One artifact served by a real ``kvrank serve``: what a miss and an L1 hit cost a caller,
by each protocol a ranker speaks.

Every user (a distinct history filling the model's window) is asked twice by the JSON API:
the first request encodes the user (``miss``), the second scores from the K/V the ranker keeps
(``l1``). Then each user's L1 hit is sent once more by each other protocol, one protocol after
the other, as that protocol's callers send it (:mod:`kvrank.tools.callers`: ``json-ref``
names the history by the ETag of the user's JSON answer, ``v2-http`` sends binary tensors,
``v2-grpc`` a ``ModelInfer`` on the ranker's gRPC port). One request at a time: client p50/p99,
and what every answer was (status and cache outcome). ``kvrank bench --protocol`` and
``benchmarks/bench_serving_device.py`` (one artifact on several devices) run it.
"""

from __future__ import annotations

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

from kvrank.model.artifact import load_ranker, save_model
from kvrank.model.config import ComputeDType
from kvrank.model.contract import FeatureSpec
from kvrank.model.ranker import RankerModel
from kvrank.tools.callers import GRPC_PROTOCOLS, PROTOCOLS, Caller, encode
from kvrank.tools.processes import RankerProcess, free_port
from kvrank.tools.workload import Workload, WorkloadSettings, workload_model

WARMUP = 3
"""Requests of other users first: the first calls of a process pay for kernel selection."""


def check_protocols(protocols: tuple[str, ...]) -> None:
    """``json`` (the reference every other protocol's hit follows) and known names only."""
    unknown = set(protocols) - set(PROTOCOLS)
    if unknown or "json" not in protocols:
        raise ValueError(f"protocols: json and any of {', '.join(PROTOCOLS)}, not {protocols}")


def request_bodies(model_dir: Path, users: int, candidates: int) -> list[dict[str, Any]]:
    """One ``/v1/score`` body per distinct user, each history filling the model's window."""
    settings = WorkloadSettings(users=users, zipf_s=0.0, candidates=candidates, history_fill=1.0)
    pool = [r.body for r in Workload(workload_model(model_dir), settings).requests(users)]
    return [{**body, "user_id": f"user-{i}"} for i, body in enumerate(pool)]


def serve_and_ask(
    model_dir: Path,
    device: str,
    requests: list[dict[str, Any]],
    workdir: Path,
    protocols: tuple[str, ...] = ("json",),
) -> dict[str, Any]:
    """``requests`` sent twice each (miss, then hit) to a fresh ranker on ``device``, then
    once more by each other protocol in ``protocols`` (L1 hits); the answers' scores too."""
    check_protocols(protocols)
    spec = load_ranker(model_dir).features
    grpc_port = free_port()
    ranker = RankerProcess.start(
        model_dir, workdir, "--device", device, "--grpc-port", str(grpc_port), timeout_s=300.0
    )
    try:
        with httpx.Client(timeout=120.0) as client:
            for i in range(WARMUP):
                _ask(client, ranker.url, {**requests[i % len(requests)], "user_id": f"warm-{i}"})
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
    return _report(device, first, again, by_protocol)


def _report(
    device: str,
    first: list[tuple[float, dict[str, Any]]],
    again: list[tuple[float, dict[str, Any]]],
    by_protocol: dict[str, dict[str, Any]],
) -> dict[str, Any]:
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


def bench_served(
    profile: str,
    compute_dtype: ComputeDType,
    device: str,
    protocols: tuple[str, ...],
    model_dir: Path | None,
    candidates: int,
    json_out: Path | None,
    users: int = 20,
) -> dict[str, Any]:
    """``kvrank bench --protocol``'s served step: ``model_dir`` (or a seed-fixed model of the
    bench profile, in ``compute_dtype``) served on ``device``, ``users`` users asked by JSON
    (miss, hit) and each of ``protocols`` (hit); printed, and added to ``json_out`` (the
    bench's report) as ``served``."""
    from kvrank.bench.runner import PROFILES

    workdir = Path(tempfile.mkdtemp(prefix="kvrank-served-"))
    if model_dir is None:
        torch.manual_seed(0)
        cfg = PROFILES[profile].cfg.model_copy(update={"compute_dtype": compute_dtype})
        model_dir = save_model(RankerModel(cfg, f"{profile}-{compute_dtype}-seed0"), workdir / "m")
    requests = request_bodies(model_dir, users, candidates)
    served = serve_and_ask(model_dir, device, requests, workdir, protocols)
    del served["scores"]
    served.update(users=users, candidates=candidates)
    table = Table(title=f"served on {device}: {users} users, C={candidates} (client ms)")
    for col in ("request", "p50", "p99", "answers"):
        table.add_column(col, justify="right" if col in ("p50", "p99") else "left")
    rows = {"json miss": {**served["miss"], "answers": served["cache_first"]}}
    rows.update({f"{p} hit": hits for p, hits in served["hit_by_protocol"].items()})
    for name, row in rows.items():
        p50, p99 = f"{row['p50_ms']:.2f}", f"{row['p99_ms']:.2f}"
        table.add_row(name, p50, p99, ", ".join(row["answers"]))
    Console().print(table)
    if json_out is not None:
        report = json.loads(json_out.read_text()) if json_out.exists() else {}
        json_out.write_text(json.dumps({**report, "served": served}, indent=2) + "\n")
    return served
