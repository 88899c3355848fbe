"""``kvrank bench``: every scoring mode side by side in one process, printed and as JSON.

Modes: ``nocache_batched`` (the C full sequences batched in chunks — serving without a cache,
done well: every speed-up is reported against it first), ``nocache_serial`` (C separate full
forwards, second), ``miss`` (encode the user, then score), ``hit`` (score
from cached K/V), ``hit_int8`` (the same from INT8 K/V), ``incremental`` (append a few events,
then score). Latencies are p50/p99 over repetitions after warm-up; machines are noisy, so
the headline figures are ratios measured in the same run. Exactness and INT8 quality are
measured here too. No assertions: this reports, tests decide.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvrank.bench import flops, peak, plots
from kvrank.bench.l2 import l2_round_trip, served_l2_hits
from kvrank.data.synthetic import SyntheticWorld
from kvrank.model.artifact import load_model
from kvrank.model.config import PRODUCTION, PRODUCTION_COMPACT, QUICK, ComputeDType, ModelConfig
from kvrank.model.inputs import UserFeatures
from kvrank.model.kv import UserKV
from kvrank.model.ranker import RankerModel
from kvrank.progress import Bars, bars
from kvrank.train import HELD_OUT_OFFSET, TrainSettings, auc, evaluate, held_out, train

console = Console()
INCREMENT_EVENTS = 4
SERVED_CANDIDATES = 100
"""Candidates of the L2 hits served in the L2 section (the checks' and the tag's share)."""


@dataclass(frozen=True)
class Profile:
    cfg: ModelConfig
    candidates: tuple[int, ...]
    reps: int  # repetitions of the fast modes
    slow_reps: int  # repetitions of the no-cache modes
    train_steps: int  # for the INT8 AUC check when no --model is given
    eval_users: int
    compact: ModelConfig  # pyramid + candidate_layers config for the memory figure


PROFILES = {
    "quick": Profile(
        QUICK,
        (100,),
        reps=30,
        slow_reps=3,
        train_steps=60,
        eval_users=150,
        compact=QUICK.model_copy(update={"pyramid": (64, 16), "candidate_layers": 1}),
    ),
    "production": Profile(
        PRODUCTION,
        (50, 100, 200),
        reps=10,
        slow_reps=1,
        train_steps=0,
        eval_users=60,
        compact=PRODUCTION_COMPACT,
    ),
}


def _in_dtype(prof: Profile, compute_dtype: ComputeDType) -> Profile:
    return dataclasses.replace(
        prof,
        cfg=prof.cfg.model_copy(update={"compute_dtype": compute_dtype}),
        compact=prof.compact.model_copy(update={"compute_dtype": compute_dtype}),
    )


def _timed(fn: Callable[[], object], reps: int, warmup: int = 1) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _summary(ms: list[float], flop: int, kv_bytes: int) -> dict[str, float]:
    return {
        "p50_ms": statistics.median(ms),
        "p99_ms": float(np.percentile(ms, 99)),
        "rps": 1e3 / statistics.mean(ms),
        "flops": float(flop),
        "achieved_tflops": flop / statistics.median(ms) / 1e9,
        "kv_bytes": float(kv_bytes),
        "reps": float(len(ms)),
    }


def _kv_bytes(model: RankerModel, world: SyntheticWorld, layers: str = "all") -> dict[str, int]:
    u = world.user(0, n_events=model.cfg.max_events).features
    return {
        dt: model.encode_user(u, kv_dtype=dt, layers=layers).nbytes  # type: ignore[arg-type]
        for dt in ("fp32", "bf16", "fp16", "int8")
    }


def _measure_c(model: RankerModel, world: SyntheticWorld, c: int, prof: Profile) -> dict[str, Any]:
    cfg = model.cfg
    u = world.user(7, n_events=cfg.max_events - INCREMENT_EVENTS)
    new = world.user(8, n_events=INCREMENT_EVENTS).features.events
    cands, _, _ = world.candidates(u, c, 7)
    f = u.features
    kv = model.encode_user(f)
    kv8 = model.encode_user(f, kv_dtype="int8")
    modes = {
        "nocache_batched": (
            lambda: model.forward_full(f, cands),
            prof.slow_reps,
            flops.full_flops(cfg, c),
            0,
        ),
        "nocache_serial": (
            lambda: model.forward_full(f, cands, batched=False),
            prof.slow_reps,
            flops.full_flops(cfg, c),
            0,
        ),
        "miss": (
            lambda: model.score(model.encode_user(f), cands),
            prof.reps,
            flops.encode_flops(cfg) + flops.score_flops(cfg, c),
            kv.nbytes,
        ),
        "hit": (lambda: model.score(kv, cands), prof.reps, flops.score_flops(cfg, c), kv.nbytes),
        "hit_int8": (
            lambda: model.score(kv8, cands),
            prof.reps,
            flops.score_flops(cfg, c),
            kv8.nbytes,
        ),
        "incremental": (
            lambda: model.score(model.extend_user(kv, new), cands),
            prof.reps,
            flops.extend_flops(cfg, INCREMENT_EVENTS) + flops.score_flops(cfg, c),
            kv.nbytes,
        ),
    }
    results = {}
    for name, (fn, reps, flop, nbytes) in modes.items():
        results[name] = _summary(_timed(fn, reps), flop, nbytes)
    full = model.forward_full(f, cands)
    return {
        "candidates": c,
        "modes": results,
        **_speedups(results),
        "max_abs_diff_fp32": float((model.score(kv, cands) - full).abs().max()),
        "int8_max_abs_logit_diff_this_user": float((model.score(kv8, cands) - full).abs().max()),
    }


def _speedups(results: dict[str, Any]) -> dict[str, float]:
    """p50 ratios of the no-cache baselines to the cached paths: batched (the baseline a
    team without a K/V cache would run) first, serial second."""
    return {
        f"speedup_{path}_vs_nocache_{base}": (
            results[f"nocache_{base}"]["p50_ms"] / results[path]["p50_ms"]
        )
        for base in ("batched", "serial")
        for path in ("hit", "miss")
    }


def _int8_quality(model: RankerModel, world: SyntheticWorld, users: int) -> dict[str, float]:
    data = held_out(world, users, 32)
    cache: dict[int, tuple[UserKV, UserKV]] = {}

    def kvs(u: Any) -> tuple[UserKV, UserKV]:
        key = id(u)
        if key not in cache:
            cache[key] = (model.encode_user(u.features), model.encode_user(u.features, "int8"))
        return cache[key]

    base = evaluate(lambda u, c: model.score(kvs(u)[0], c), data)
    q8 = evaluate(lambda u, c: model.score(kvs(u)[1], c), data)
    diff = max(
        float((model.score(kvs(u)[0], c) - model.score(kvs(u)[1], c)).abs().max())
        for u, c, _ in data
    )
    return {
        "auc_fp32": base.auc,
        "auc_int8": q8.auc,
        "auc_delta": q8.auc - base.auc,
        "max_abs_logit_diff": diff,
        "impressions": float(base.n),
    }


def _slid(
    model: RankerModel, user: UserFeatures, window: int, increments: tuple[int, ...]
) -> Iterator[tuple[int, UserKV, UserKV]]:
    """Encode ``user``'s first ``window`` events (a full window), then add the rest one
    event at a time, each increment sliding the window; after ``n`` of them for each ``n``
    of ``increments``, yield ``n``, the extended K/V and a full encode of the same history."""
    kv, done = model.encode_user(user.with_events(user.events.slice(0, window))), 0
    for n in increments:
        for e in range(window + done, window + n):
            kv = model.extend_user(kv, user.events.slice(e, e + 1))
        done = n
        yield n, kv, model.encode_user(user.with_events(user.events.slice(0, window + n)))


def drift_table(
    model: RankerModel,
    world: SyntheticWorld,
    increments: tuple[int, ...] = (1, 5, 10, 25, 50, 100, 200),
    users: int = 3,
) -> list[dict[str, float]]:
    """|Δlogit| of incremental K/V vs a full re-encode, after n one-event increments
    applied to a user whose window is already full (so every increment slides it)."""
    cfg, rows = model.cfg, []
    worst: dict[int, list[float]] = {n: [] for n in increments}
    for i in range(users):
        base = world.user(500 + i, n_events=cfg.max_events).features
        extra = world.user(600 + i, n_events=max(increments)).features.events
        cands, _, _ = world.candidates(world.user(500 + i), 50, 500 + i)
        user = base.with_events(base.events.cat(extra))
        for n, kv, ref in _slid(model, user, cfg.max_events, increments):
            worst[n].append(float((model.score(kv, cands) - model.score(ref, cands)).abs().max()))
    for n in increments:
        rows.append(
            {
                "increments": float(n),
                "max_abs_logit_diff": max(worst[n]),
                "mean_max_abs_logit_diff": statistics.mean(worst[n]),
            }
        )
    return rows


def approximate_increments(
    model: RankerModel,
    world: SyntheticWorld,
    users: int,
    increments: tuple[int, ...] = (1, 10, 50),
    cands: int = 32,
) -> list[dict[str, float]]:
    """What ``incremental: approximate`` costs in ranking quality.

    Held-out users whose window is full receive n one-event increments, each sliding it
    (so none is exact); their labelled candidates are scored from the extended K/V and
    from a full encode of the same history. AUC over every impression both ways, and the
    largest |Δlogit|. ``refresh_every`` (50) bounds n in serving.
    """
    n_max, window = max(increments), model.cfg.max_events
    samples, slides = [], []
    for i in range(users):
        u = world.user(HELD_OUT_OFFSET + i, n_events=window + n_max)
        c, y, _ = world.candidates(u, cands, HELD_OUT_OFFSET + i)
        samples.append((c, y))
        slides.append(_slid(model, u.features, window, increments))
    rows = []
    for n in increments:
        approx, exact, labels, worst = [], [], [], 0.0
        for (c, y), slide in zip(samples, slides, strict=True):
            _, kv, full = next(slide)
            a, b = model.score(kv, c), model.score(full, c)
            worst = max(worst, float((a - b).abs().max()))
            approx.append(a.cpu().numpy())
            exact.append(b.cpu().numpy())
            labels.append(y)
        y_all = np.concatenate(labels)
        auc_exact, auc_approx = (
            auc(y_all, np.concatenate(exact)),
            auc(y_all, np.concatenate(approx)),
        )
        rows.append(
            {
                "increments": float(n),
                "auc_exact": auc_exact,
                "auc_approximate": auc_approx,
                "auc_delta": auc_approx - auc_exact,
                "max_abs_logit_diff": worst,
                "impressions": float(len(y_all)),
            }
        )
    return rows


def _machine(device: str) -> dict[str, str]:
    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_threads": str(torch.get_num_threads()),
        "torch": torch.__version__,
        "device": device,
    }
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _model_for(prof: Profile, device: str, model_dir: Path | None) -> tuple[RankerModel, str]:
    if model_dir is not None:
        return load_model(model_dir, device), f"artifact {model_dir}"
    if prof.train_steps:
        console.print(f"training a {prof.train_steps}-step model for the INT8 AUC check …")
        fp32 = prof.cfg.model_copy(update={"compute_dtype": "fp32"})
        m = train(fp32, TrainSettings(steps=prof.train_steps, time_budget_s=25.0))
        if prof.cfg.compute_dtype != "fp32":  # trained in fp32, served in the lower precision
            weights = m.state_dict()
            m = RankerModel(prof.cfg, m.version)
            m.load_state_dict(weights)  # cast to the model's own dtype
        return m.to(device).eval(), f"trained {prof.train_steps} steps"
    torch.manual_seed(0)
    return RankerModel(prof.cfg, "bench").to(device).eval(), "random init (seed 0)"


def _measure_all(
    prof: Profile, device: str, counts: list[int] | None, model_dir: Path | None, shown: Bars
) -> tuple[RankerModel, str, SyntheticWorld, dict[str, Any], dict[str, float]]:
    """The model, then every mode at each candidate count, then INT8's quality: what takes
    the time, one bar step each."""
    cs = counts or prof.candidates
    shown.add("bench", "the model", len(cs) + 2)
    model, origin = _model_for(prof, device, model_dir)
    world = SyntheticWorld(model.cfg, 0)
    per_c = {}
    for c in cs:
        shown.advance("bench", description=f"every mode at C={c}")
        per_c[str(c)] = _measure_c(model, world, c, prof)
    shown.advance("bench", description="INT8 quality")
    quality = _int8_quality(model, world, prof.eval_users)
    shown.advance("bench")
    return model, origin, world, per_c, quality


def run_bench(
    profile: str,
    device: str,
    counts: list[int] | None,
    json_out: Path | None,
    plot: Path | None,
    model_dir: Path | None,
    redis_url: str | None = None,
    compact_model_dir: Path | None = None,
    compute_dtype: ComputeDType = "fp32",
) -> dict[str, Any]:
    """``compact_model_dir``: a trained artifact of the profile's compact config, on which
    approximate increments are scored (the quick profile uses its own trained model when
    none is given). ``compute_dtype``: the dtype the profile's models are built in."""
    prof = _in_dtype(PROFILES[profile], compute_dtype)
    start = time.monotonic()
    with bars() as shown:
        model, origin, world, per_c, quality = _measure_all(prof, device, counts, model_dir, shown)
    compact = RankerModel(prof.compact, "bench").to(device).eval()
    kv_bytes = _kv_bytes(model, world)
    kv_bytes.update({f"{k}_compact": v for k, v in _kv_bytes(compact, world, "scoring").items()})
    primary = per_c[max(per_c, key=int)]
    hit = primary["modes"]["hit"]
    report: dict[str, Any] = {
        "profile": profile,
        "machine": _machine(device),
        "model": origin,
        "shapes": {
            **model.cfg.model_dump(mode="json"),
            "compact": prof.compact.model_dump(mode="json"),
        },
        "candidates": primary["candidates"],
        "modes": primary["modes"],
        **{k: v for k, v in primary.items() if k.startswith("speedup_")},
        "max_abs_diff_fp32": max(r["max_abs_diff_fp32"] for r in per_c.values()),
        "hit_throughput": peak.throughput(hit["achieved_tflops"], device, model.cfg.compute_dtype),
        "int8_max_abs_logit_diff": quality["max_abs_logit_diff"],
        "int8_auc_delta": quality["auc_delta"],
        "int8_quality": quality,
        "kv_bytes_per_user": kv_bytes,
        "per_candidates": per_c,
        "drift": drift_table(model, world) if profile == "quick" else [],
        "approximate_increments": _increments(prof, model, origin, compact_model_dir, device),
        "l2_round_trip": _l2(redis_url, model, compact, world),
        "elapsed_s": time.monotonic() - start,
    }
    _print(report)
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(report, indent=2) + "\n")
    if plot:
        _plot(report, plot)
    return report


def _increments(
    prof: Profile, model: RankerModel, origin: str, compact_dir: Path | None, device: str
) -> dict[str, Any]:
    if compact_dir is not None:
        model, origin = load_model(compact_dir, device), f"artifact {compact_dir}"
    elif not prof.train_steps:
        return {}  # a random-init model's AUC says nothing
    rows = approximate_increments(model, SyntheticWorld(model.cfg, 0), prof.eval_users // 2)
    return {"model": origin, "rows": rows}


def _l2(
    url: str | None, model: RankerModel, compact: RankerModel, world: SyntheticWorld
) -> dict[str, Any]:
    if url is None:
        return {}
    user = world.user(3, n_events=model.cfg.max_events)
    entries = {
        "bf16": model.encode_user(user.features, kv_dtype="bf16"),
        "int8_compact": compact.encode_user(user.features, kv_dtype="int8", layers="scoring"),
    }
    cands = world.candidates(user, SERVED_CANDIDATES, 1)[0]
    served = served_l2_hits(url, model, entries["bf16"], cands)
    return {**l2_round_trip(url, entries), "served_bf16": served}


def _print(r: dict[str, Any]) -> None:
    for c, res in r["per_candidates"].items():
        dtype = r["shapes"]["compute_dtype"]
        t = Table(title=f"{r['profile']} profile, C={c}, {r['machine']['device']}, {dtype}")
        for col in ("mode", "p50 ms", "p99 ms", "req/s", "GFLOP", "KV bytes"):
            t.add_column(col, justify="right" if col != "mode" else "left")
        for name, m in res["modes"].items():
            t.add_row(
                name,
                f"{m['p50_ms']:.2f}",
                f"{m['p99_ms']:.2f}",
                f"{m['rps']:.1f}",
                f"{m['flops'] / 1e9:.3f}",
                f"{int(m['kv_bytes']):,}",
            )
        console.print(t)
        console.print(
            f"speed-up vs batched no-cache: hit {res['speedup_hit_vs_nocache_batched']:.1f}×,"
            f" miss {res['speedup_miss_vs_nocache_batched']:.1f}× (vs serial: hit"
            f" {res['speedup_hit_vs_nocache_serial']:.1f}×), max |Δlogit| cached vs full"
            f" ({dtype}) {res['max_abs_diff_fp32']:.2e}"
        )
    tp = r["hit_throughput"]
    of_peak = (
        f" of a {tp['peak_tflops']:g} TFLOP/s peak ({tp['math']}): {tp['fraction_of_peak']:.1%}"
        if tp["peak_tflops"]
        else " (no published peak for this device)"
    )
    console.print(
        f"hit path at C={r['candidates']}: {tp['achieved_tflops']:.4f} TFLOP/s achieved on"
        f" {escape(tp['device_name'])}{of_peak}"
    )
    q = r["int8_quality"]
    console.print(
        f"INT8: max |Δlogit| {q['max_abs_logit_diff']:.2e}, AUC {q['auc_fp32']:.4f} →"
        f" {q['auc_int8']:.4f} (Δ {q['auc_delta']:+.4f}) — model: {escape(r['model'])}"
    )
    console.print(
        "KV bytes per user: " + ", ".join(f"{k} {v:,}" for k, v in r["kv_bytes_per_user"].items())
    )
    _print_l2(r["l2_round_trip"])
    for row in r["drift"]:
        console.print(
            f"drift after {int(row['increments'])} sliding increments: max |Δlogit|"
            f" {row['max_abs_logit_diff']:.2e}"
        )
    inc = r["approximate_increments"]
    for row in inc.get("rows", []):
        console.print(
            f"approximate increments ×{int(row['increments'])}: AUC {row['auc_exact']:.4f} →"
            f" {row['auc_approximate']:.4f} (Δ {row['auc_delta']:+.5f}), max |Δlogit|"
            f" {row['max_abs_logit_diff']:.2e} — model: {escape(inc['model'])}"
        )


def _print_l2(round_trips: dict[str, dict[str, Any]]) -> None:
    round_trips = dict(round_trips)
    served = round_trips.pop("served_bf16", None)
    for name, rt in round_trips.items():
        console.print(
            f"L2 round trip {name}: {rt['entry_bytes']:,} B, put p50 {rt['put_p50_ms']:.2f} ms,"
            f" get p50 {rt['get_p50_ms']:.2f} ms, get p99 {rt['get_p99_ms']:.2f} ms"
            f" (plain asyncio GET of the bytes: p50 {rt['plain_asyncio_get_p50_ms']:.2f} ms);"
            f" opening it (checks, tag, tensors) {rt['open_p50_ms']:.3f} ms, the tag alone"
            f" {rt['tag_p50_ms']:.3f} ms = {rt['tag_share_of_get']:.1%} of the get"
        )
    if served:
        s = served
        console.print(
            f"An L2 hit served (bf16, {s['entry_bytes']:,} B, C={s['candidates']}): tag checked"
            f" first {s['hit_inline_p50_ms']:.2f} ms, beside the scoring"
            f" {s['hit_beside_p50_ms']:.2f} ms ({s['beside_vs_inline']:.2f}x); checks"
            f" {s['checks_p50_ms']:.3f} ms, tag {s['tag_p50_ms']:.3f} ms, the answer's wait"
            f" for it {s['tag_wait_p50_ms']:.3f} ms: checks + tag {s['share_inline']:.2%} of"
            f" a hit checked first, {s['share_beside']:.2%} beside (served: {s['served']})"
        )


def _plot(r: dict[str, Any], path: Path) -> None:
    cs = sorted(r["per_candidates"], key=int)
    fig, ax = plots.figure()
    for mode in r["modes"]:
        ax.plot(
            [int(c) for c in cs],
            [r["per_candidates"][c]["modes"][mode]["p50_ms"] for c in cs],
            marker="o",
            label=mode,
        )
    ax.set_xlabel("candidates per request (C)")
    ax.set_ylabel("p50 latency (ms, log)")
    ax.set_yscale("log")
    ax.set_title(f"kvrank bench — {r['profile']} profile on {r['machine']['device']}")
    plots.save(fig, ax, path)
