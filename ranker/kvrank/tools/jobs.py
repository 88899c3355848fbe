"""The ``train`` and ``demo`` jobs behind the CLI: orchestration and console output only.

Each job composes library pieces (training, artifacts, the load test) and prints a
readable summary with rich. The maths lives elsewhere; this module must not grow any.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from kvrank.data.synthetic import SyntheticWorld
from kvrank.model.artifact import save_model
from kvrank.model.config import PRODUCTION, PRODUCTION_COMPACT, QUICK, ModelConfig
from kvrank.model.ranker import RankerModel
from kvrank.progress import bars
from kvrank.train import TrainSettings, evaluate, held_out, train

console = Console()
PROFILE_CONFIGS: dict[str, ModelConfig] = {
    "quick": QUICK,
    "production": PRODUCTION,
    "production-compact": PRODUCTION_COMPACT,
}


def train_and_save(
    out: Path,
    profile: str,
    steps: int,
    version: str,
    seed: int,
    batch_users: int = 32,
    time_budget_s: float = 110.0,
) -> RankerModel:
    cfg = PROFILE_CONFIGS[profile]
    start = time.monotonic()
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"training {profile} model", total=steps)
        model = train(
            cfg,
            TrainSettings(
                steps=steps, seed=seed, batch_users=batch_users, time_budget_s=time_budget_s
            ),
            version,
            progress=lambda step, loss: bar.update(
                task, completed=step + 1, description=f"training (loss {loss:.3f})"
            ),
        )
    elapsed = time.monotonic() - start
    data = held_out(SyntheticWorld(cfg, seed), 300, 16)
    result = evaluate(lambda u, c: model.score(model.encode_user(u.features), c), data)
    # the same held-out impressions scored from INT8 K/V: what quantising the cache costs
    int8 = evaluate(lambda u, c: model.score(model.encode_user(u.features, "int8"), c), data)
    save_model(
        model,
        out,
        {
            "auc": result.auc,
            "logloss": result.logloss,
            "auc_int8_kv": int8.auc,
            "auc_delta_int8": int8.auc - result.auc,
            "train_s": elapsed,
            "steps": steps,
            "batch_users": batch_users,
            "profile": profile,
        },
    )
    console.print(
        f"trained in {elapsed:.0f} s — held-out AUC {result.auc:.4f}, log-loss"
        f" {result.logloss:.3f} over {result.n} impressions; from INT8 K/V AUC {int8.auc:.4f}"
        f" (Δ {int8.auc - result.auc:+.5f}) → {out}"
    )
    return model


def _print_load(summary: dict[str, Any], title: str) -> None:
    c, n, a = summary["cache"], summary["nocache_batched"], summary["nocache_batched_alone"]
    table = Table(title=title)
    for col in ("", "with cache", "without cache (batched)", "without, one at a time"):
        table.add_column(col, justify="right" if col else "left")
    for row, key, fmt in (
        ("requests", "requests", "{}"),
        ("errors", "errors", "{}"),
        ("p50 ms", "p50_ms", "{:.1f}"),
        ("p99 ms", "p99_ms", "{:.1f}"),
        ("QPS", "qps", "{:.1f}"),
    ):
        table.add_row(row, *(fmt.format(side[key]) for side in (c, n, a)))
    table.add_row(
        "hit ratio (L1 / L2 / incremental)",
        f"{c['hit_ratio']:.2f} ({c['l1_hit_ratio']:.2f} / {c['l2_hit_ratio']:.2f} /"
        f" {c['incremental_ratio']:.2f})",
        "—",
        "—",
    )
    table.add_row(
        "oracle hit ratio (unbounded cache)",
        f"{summary['oracle_hit_ratio']:.2f} (reached {summary['hit_ratio_vs_oracle']:.1%})",
        "—",
        "—",
    )
    enc = summary["user_encodes"]
    table.add_row(
        "full user encodes",
        f"{enc['full']:.0f} (saved {enc['saved']:.0f})",
        f"{n['requests']} × C forwards",
        f"{a['requests']} × C forwards",
    )
    table.add_row("L1 memory", f"{summary['l1_bytes'] / 2**20:.1f} MiB", "—", "—")
    console.print(table)
    console.print(
        f"vs the batched no-cache server under the same load: p99 speed-up"
        f" {summary['p99_speedup_vs_batched']:.1f}×, p50 {summary['p50_speedup_vs_batched']:.1f}×"
        f" (vs its requests alone: p99 {summary['p99_speedup_vs_batched_alone']:.1f}×, p50"
        f" {summary['p50_speedup_vs_batched_alone']:.1f}×) — L2: {summary['redis']}"
    )


def run_loadtest(
    profile: str,
    model: Path | None,
    json_out: Path | None,
    workload: dict[str, Any] | None = None,
    pods: int = 2,
    source: str = "synthetic",
    protocol: str = "json",
) -> dict[str, Any]:
    """``workload``: knobs that replace the profile's (``None`` values keep its own);
    ``protocol``: how requests are sent (:data:`~kvrank.tools.callers.PROTOCOLS`;
    ``json-ref``: the cached side's by reference when unchanged)."""
    from dataclasses import replace

    from kvrank.tools.loadtest import PROFILES, run_load

    knobs = {k: v for k, v in (workload or {}).items() if v is not None}
    prof = PROFILES[profile]
    settings = replace(prof.workload, **knobs)
    sides = {
        "cache": ("cached pods", prof.cache_requests),
        "nocache": ("no-cache pods, batched", prof.cache_requests),
        "alone": ("no-cache pod alone", prof.alone_requests),
    }
    with bars() as shown:
        for name, (description, total) in sides.items():
            shown.add(name, description, total)
        run = run_load(
            profile,
            model,
            workload=settings,
            pods=pods,
            source=source,
            protocol=protocol,
            on_result=lambda side, _result: shown.advance(side),
        )
    title = f"kvrank loadtest — {profile} profile, {source} workload, {protocol}"
    _print_load(run.summary, title)
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(run.summary, indent=2) + "\n")
    return run.summary


OVERLOAD_ROWS = (
    ("offered", "offered"),
    ("answered in time (× capacity)", "in_time"),
    ("shed 503 (p50 / p99 ms)", "shed"),
    ("callers that gave up", "gave_up"),
    ("admitted p50 / p99 ms", "admitted"),
    ("scored for nobody", "scored_but_not_received"),
    ("dropped uncomputed", "dropped"),
    ("healthz max ms (failed)", "healthz"),
    ("RSS MB start → max", "rss"),
    ("recovered after s", "recovery_s"),
)


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f}"


def _overload_cell(key: str, m: dict[str, Any]) -> str:
    cells = {
        "in_time": f"{m['answered_in_time']} ({m['goodput_vs_capacity']:.2f}×)",
        "shed": f"{m['shed']} ({_ms(m['shed_p50_ms'])} / {_ms(m['shed_p99_ms'])})",
        "admitted": f"{_ms(m['admitted_p50_ms'])} / {_ms(m['admitted_p99_ms'])}",
        "dropped": f"{m['server']['dropped']:.0f}",
        "healthz": f"{_ms(m['healthz_max_ms'])} ({m['healthz_failures']})",
        "rss": f"{_ms(m['rss_mb_start'])} → {_ms(m['rss_mb_max'])}",
        "recovery_s": _ms(m["recovery_s"]),
    }
    return cells.get(key) or f"{m[key]:.0f}"


def run_overload_test(
    model: Path | None,
    json_out: Path | None,
    factor: float,
    duration_s: float,
    deadline_ms: int,
    candidates: int,
    sends_deadline: bool = True,
    fronts: int = 0,
) -> dict[str, Any]:
    import tempfile

    from kvrank.tools.loadtest import model_dir_for
    from kvrank.tools.overload import OverloadSettings, run_overload

    settings = OverloadSettings(
        factor,
        duration_s,
        deadline_ms,
        candidates,
        capacity_s=min(5.0, duration_s),
        sends_deadline=sends_deadline,
        fronts=fronts,
    )
    with tempfile.TemporaryDirectory(prefix="kvrank-overload-") as tmp:
        model_dir, source = model_dir_for(model, Path(tmp))
        console.print(f"model: {source}; measuring capacity, then {len(settings.modes)} spikes")
        summary = run_overload(model_dir, settings, Path(tmp))
    summary["model"] = source
    _print_overload(summary)
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _print_overload(summary: dict[str, Any]) -> None:
    s = summary["settings"]
    readings = " / ".join(f"{r:.1f}" for r in summary["capacity_readings_qps"])
    table = Table(
        title=f"kvrank loadtest — overload: {summary['offered_qps']:.0f}/s ({s['factor']:g}× the"
        f" miss capacity) for {s['duration_s']:g} s, {s['deadline_ms']} ms deadlines"
        f"{'' if s.get('sends_deadline', True) else ' (not sent)'}; capacity"
        f" {summary['capacity_qps']:.1f}/s (before / after: {readings}), idle"
        f" {summary['idle_ms']:.1f} ms"
    )
    modes = summary["modes"]
    table.add_column("")
    for mode in modes:
        table.add_column(f"admission {mode}", justify="right")

    for label, key in OVERLOAD_ROWS:
        table.add_row(label, *(_overload_cell(key, m) for m in modes.values()))
    console.print(table)


def run_shadowtest(
    profile: str, sample: float, model: Path | None, json_out: Path | None
) -> dict[str, Any]:
    from kvrank.tools.loadtest import PROFILES
    from kvrank.tools.shadowload import PODS, run_shadow_load

    with bars() as shown:
        shown.add(
            "replay", "the same requests to every pod", PROFILES[profile].cache_requests * len(PODS)
        )
        summary = run_shadow_load(
            profile, sample, model, on_result=lambda _r: shown.advance("replay")
        )
    table = Table(title=f"kvrank shadowtest — {profile} profile, {sample:.0%} mirrored")
    for col in ("", *PODS):
        table.add_column(col, justify="right" if col else "left")
    for key, label in (("requests", "requests"), ("errors", "failed")):
        table.add_row(label, *(str(summary[p][key]) for p in PODS))
    for key in ("p50_ms", "p99_ms"):
        table.add_row(key.replace("_", " "), *(f"{summary[p][key]:.1f}" for p in PODS))
    console.print(table)
    m = summary["mirrored"]
    console.print(
        f"p99 vs off: shadow {summary['p99_ratio_shadow_vs_off']:.2f}×, canary down"
        f" {summary['p99_ratio_canary_down_vs_off']:.2f}×, noise (off again)"
        f" {summary['p99_ratio_noise_off_again_vs_off']:.2f}×; mirrored: sent"
        f" {m['shadow']['sent']:.0f}, dropped {m['shadow']['dropped']:.0f}; to the down canary:"
        f" errors {m['canary_down']['error']:.0f}, dropped {m['canary_down']['dropped']:.0f}"
    )
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def run_demo(model_dir: Path, report_dir: Path) -> None:
    from kvrank.tools.loadtest import PROFILES, run_load

    if (model_dir / "config.json").is_file():
        console.print(f"loaded model from {model_dir}")
    else:
        console.print(f"no artifact at {model_dir}: training the quick model first")
        train_and_save(model_dir, "quick", TrainSettings().steps, "v1", 0)
    prof = PROFILES["quick"]
    total = 2 * prof.cache_requests + prof.alone_requests
    with Progress(console=console) as bar:
        task = bar.add_task("replaying workload", total=total)
        run = run_load("quick", model_dir, on_result=lambda _n, _r: bar.advance(task))
    if "L1 only" in run.summary["redis"]:
        console.print("[yellow]redis-server is not installed: this run used L1 only[/]")
    _print_load(
        run.summary, "kvrank demo — two cache-enabled rankers sharing Redis vs. two without"
    )
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "summary.json").write_text(json.dumps(run.summary, indent=2) + "\n")
    _plot_demo(run, report_dir)
    console.print(f"report: {report_dir}/summary.json, latency_cdf.png, hit_ratio.png")


def _plot_demo(run: Any, out: Path) -> None:
    import numpy as np

    from kvrank.bench import plots

    fig, ax = plots.figure()
    for name, results in (
        ("with cache", run.cache_results),
        ("without cache (batched, same load)", run.nocache_results),
        ("without cache, one at a time", run.alone_results),
    ):
        lat = np.sort([r.latency_ms for r in results if r.status == 200])
        ax.plot(lat, np.arange(1, len(lat) + 1) / max(1, len(lat)), label=name)
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, log)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("Scoring latency CDF")
    plots.save(fig, ax, out / "latency_cdf.png")

    hits = np.array([r.outcome in ("l1", "l2", "incremental") for r in run.cache_results], float)
    window = max(10, len(hits) // 20)
    rolling = np.convolve(hits, np.ones(window) / window, mode="valid")
    fig, ax = plots.figure()
    ax.plot(np.arange(len(rolling)) + window, rolling)
    ax.axhline(0.7, color="red", linestyle="--", label="0.7: below, TTL or routing is wrong")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("request")
    ax.set_ylabel(f"hit ratio (rolling {window})")
    ax.set_title("Cache hit ratio over time")
    plots.save(fig, ax, out / "hit_ratio.png")
