"""``kvrank train --data movielens-100k``: train on real interactions, evaluate, and measure
what every cache shortcut costs on real users; print the tables and write JSON.

Orchestration and console output only: the data lives in :mod:`kvrank.data.movielens`, the
training and metrics in :mod:`kvrank.train`, the shortcut measurements in
:mod:`kvrank.bench.real_users`.
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from kvrank.bench import plots
from kvrank.bench.real_users import approximate_increments, compare, int8_entries, slid_targets
from kvrank.bench.timeline import ttl_curve
from kvrank.data import movielens
from kvrank.data.movielens_features import (
    MOVIELENS,
    MOVIELENS_COMPACT,
    NEGATIVES,
    MovieLensFeatures,
    Target,
)
from kvrank.model.artifact import save_model
from kvrank.model.config import ModelConfig
from kvrank.model.ranker import RankerModel
from kvrank.train import (
    TrainSettings,
    movielens_scores,
    popularity_scores,
    ranking_metrics,
    train_movielens,
)

console = Console()

INCREMENTS = (1, 10, 50)
COMPRESSIONS = (1.0, 1_000.0)
"""Replay clocks of the timeline: real time, and seven months in about five hours."""


@dataclass(frozen=True)
class RealDataRun:
    """What one run trains and measures (the CLI's options)."""

    out: Path
    steps: int = 2_000
    seed: int = 0
    batch_users: int = 64
    cands_per_user: int = 16
    time_budget_s: float = 1_800.0
    eval_requests: int | None = None
    """Evaluate on every ``len // eval_requests``-th target (None: all ~10k)."""
    slide_requests: int = 300
    """Requests the approximate-increments comparison scores (each needs 61 extends)."""
    compact: bool = True
    json_out: Path | None = None
    plot: Path | None = None
    """Where to draw hit ratio vs TTL on the real timeline (PNG)."""


def run_movielens(run: RealDataRun) -> dict[str, Any]:
    start = time.monotonic()
    data = MovieLensFeatures(movielens.load())
    targets = _every_nth(data.eval_targets(), run.eval_requests)
    console.print(
        f"{movielens.NAME}: {len(data.ml):,} ratings, {len(data.rows)} users;"
        f" {len(data.train_targets()):,} training positions, {len(targets):,} evaluation"
        f" requests of 1 true item + {NEGATIVES} sampled negatives"
    )
    model = _train(data, run, "built-in model")
    fp32 = movielens_scores(model, data, targets)
    report: dict[str, Any] = {
        "dataset": _provenance(data),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(run).items()},
        "machine": {"platform": platform.platform(), "torch": torch.__version__},
        "models": {
            "built-in": _metrics(fp32),
            "popularity": _metrics(popularity_scores(data, targets)),
        },
        "shortcuts": {"int8": int8_entries(model, data, targets, fp32)},
    }
    if run.compact:
        compact = _train(MovieLensFeatures(data.ml, MOVIELENS_COMPACT), run, "compact model")
        compact_scores = movielens_scores(compact, data, targets)
        report["models"]["built-in compact"] = _metrics(compact_scores)
        report["shortcuts"]["compact"] = compare(fp32, compact_scores)
        report["shortcuts"]["compact"]["config"] = _shape(MOVIELENS_COMPACT)
    slid = _every_nth(slid_targets(data, data.eval_targets(), max(INCREMENTS)), run.slide_requests)
    report["shortcuts"]["approximate_increments"] = approximate_increments(
        model, data, slid, INCREMENTS
    )
    report["timeline"] = [ttl_curve(data.ml, c) for c in COMPRESSIONS]
    report["elapsed_s"] = time.monotonic() - start
    save_model(model, run.out, {"data": movielens.NAME, **report["models"]["built-in"]})
    _print(report)
    if run.plot:
        _plot_timeline(report["timeline"], run.plot)
    if run.json_out:
        run.json_out.parent.mkdir(parents=True, exist_ok=True)
        run.json_out.write_text(json.dumps(report, indent=2) + "\n")
    return report


def _every_nth(targets: list[Target], count: int | None) -> list[Target]:
    if count is None or count >= len(targets):
        return targets
    return targets[:: max(1, len(targets) // count)][:count]


def _train(data: MovieLensFeatures, run: RealDataRun, title: str) -> RankerModel:
    settings = TrainSettings(
        steps=run.steps,
        batch_users=run.batch_users,
        cands_per_user=run.cands_per_user,
        seed=run.seed,
        time_budget_s=run.time_budget_s,
    )
    began = time.monotonic()
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"training the {title}", total=run.steps)
        model = train_movielens(
            data,
            settings,
            progress=lambda step, loss: bar.update(
                task, completed=step + 1, description=f"{title} (loss {loss:.3f})"
            ),
        )
    console.print(f"trained the {title} in {time.monotonic() - began:.0f} s")
    return model


def _metrics(scores: list[np.ndarray]) -> dict[str, Any]:
    return asdict(ranking_metrics(scores))


def _shape(cfg: ModelConfig) -> dict[str, Any]:
    return {"pyramid": cfg.pyramid, "candidate_layers": cfg.candidate_layers}


def _provenance(data: MovieLensFeatures) -> dict[str, Any]:
    return {
        "name": movielens.NAME,
        "source": f"GroupLens MovieLens-100k, as text in the PyPI wheel {movielens.WHEEL}",
        "sha256": movielens.FILES,
        "ratings": len(data.ml),
        "users": len(data.rows),
        "items": data.ml.n_items,
        "split": "each user's last 10% of ratings (>= 1) are evaluation targets",
        "protocol": f"1 true item + {NEGATIVES} never-rated items sampled uniformly",
        "config": MOVIELENS.model_dump(mode="json"),
    }


def _print(report: dict[str, Any]) -> None:
    table = Table(title=f"{movielens.NAME}: ranking the true next item among 101")
    for col in ("model", "AUC", "HR@10", "NDCG@10"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for name, m in report["models"].items():
        table.add_row(name, f"{m['auc']:.4f}", f"{m['hr_at_10']:.4f}", f"{m['ndcg_at_10']:.4f}")
    console.print(table)
    shortcuts = Table(title="cache shortcuts on real users (shortcut − exact)")
    for col in ("shortcut", "ΔAUC", "ΔHR@10", "ΔNDCG@10", "max |Δlogit|", "requests"):
        shortcuts.add_column(col, justify="left" if col == "shortcut" else "right")
    rows = [("INT8 K/V", report["shortcuts"]["int8"])]
    if "compact" in report["shortcuts"]:
        rows.append(("compact entry (separately trained)", report["shortcuts"]["compact"]))
    rows += [
        (f"approximate, {r['increments']} slides", r)
        for r in report["shortcuts"]["approximate_increments"]
    ]
    for name, r in rows:
        shortcuts.add_row(
            name,
            f"{r['delta_auc']:+.5f}",
            f"{r['delta_hr_at_10']:+.5f}",
            f"{r['delta_ndcg_at_10']:+.5f}",
            f"{r['max_abs_logit_diff']:.4f}",
            str(r["requests"]),
        )
    console.print(shortcuts)
    timeline = Table(title="the real timeline as requests: hit ratio vs cache TTL")
    for col in ("replay clock", "TTL the formula picks", "its hit ratio", "at 300 s", "oracle"):
        timeline.add_column(col, justify="left" if col == "replay clock" else "right")
    for t in report["timeline"]:
        f = t["formula"]
        at_300 = next(p["hit_ratio"] for p in t["curve"] if p["ttl_s"] == 300.0)
        timeline.add_row(
            f"{t['compression']:g}× ({t['requests_per_s']:.3g} requests/s)",
            f"{f['ttl_s']:.3g} s (mean interval {f['mean_interval_s']:.3g} s)",
            f"{f['hit_ratio']:.4f}",
            f"{at_300:.4f}",
            f"{t['oracle_hit_ratio']:.4f}",
        )
    console.print(timeline)


def _plot_timeline(timeline: list[dict[str, Any]], path: Path) -> None:
    fig, ax = plots.figure()
    for t in timeline:
        line = ax.plot(
            [p["ttl_s"] for p in t["curve"]],
            [p["hit_ratio"] for p in t["curve"]],
            marker="o",
            label=f"clock ×{t['compression']:g}",
        )
        f = t["formula"]
        ax.plot(
            [f["ttl_s"]], [f["hit_ratio"]], marker="*", markersize=16, color=line[0].get_color()
        )
    ax.axhline(timeline[0]["oracle_hit_ratio"], linestyle="--", color="grey", label="oracle")
    ax.set_xscale("log")
    ax.set_xlabel("cache TTL (s of the replay clock, log); ★ = the TTL kvrank picks")
    ax.set_ylabel("share of requests finding an entry")
    ax.set_title(f"{movielens.NAME}: every rating a request at its timestamp")
    plots.save(fig, ax, path)
