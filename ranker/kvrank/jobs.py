"""The ``train`` and ``demo`` jobs behind the CLI: orchestration and console output only.

Each job composes library pieces (training, artifacts, the model API) and prints a
readable summary with rich. The maths lives elsewhere; this module must not grow any.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from kvrank.data.synthetic import SyntheticWorld
from kvrank.model.artifact import load_model, save_model
from kvrank.model.config import QUICK, SEED, ModelConfig
from kvrank.model.ranker import RankerModel
from kvrank.train import TrainSettings, evaluate, held_out, train

console = Console()
PROFILE_CONFIGS: dict[str, ModelConfig] = {"quick": QUICK, "seed": SEED}


def train_and_save(out: Path, profile: str, steps: int, version: str, seed: int) -> RankerModel:
    cfg = PROFILE_CONFIGS[profile]
    start = time.monotonic()
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"training {profile} model", total=steps)
        model = train(
            cfg,
            TrainSettings(steps=steps, seed=seed),
            version,
            progress=lambda step, loss: bar.update(
                task, completed=step + 1, description=f"training (loss {loss:.3f})"
            ),
        )
    elapsed = time.monotonic() - start
    data = held_out(SyntheticWorld(cfg, seed), 300, 16)
    result = evaluate(lambda u, c: model.score(model.encode_user(u.features), c), data)
    save_model(model, out, {"auc": result.auc, "logloss": result.logloss, "train_s": elapsed})
    console.print(
        f"trained in {elapsed:.0f} s — held-out AUC {result.auc:.3f}, log-loss"
        f" {result.logloss:.3f} over {result.n} impressions → {out}"
    )
    return model


def run_demo(model_dir: Path) -> None:
    torch.set_num_threads(max(1, torch.get_num_threads()))
    if (model_dir / "config.json").is_file():
        model = load_model(model_dir)
        console.print(f"loaded model {model.version!r} from {model_dir}")
    else:
        console.print(f"no artifact at {model_dir}: training the quick model first")
        model = train_and_save(model_dir, "quick", TrainSettings().steps, "v1", 0)
    world = SyntheticWorld(model.cfg, 0)
    timings: dict[str, list[float]] = {
        "no cache (C forwards)": [],
        "miss (encode+score)": [],
        "hit (score only)": [],
    }
    max_diff = 0.0
    for i in range(20):
        u = world.user(90_000_000 + i)
        cands, _, _ = world.candidates(u, 100, i)
        t0 = time.perf_counter()
        full = model.forward_full(u.features, cands, batched=False)
        t1 = time.perf_counter()
        kv = model.encode_user(u.features)
        model.score(kv, cands)
        t2 = time.perf_counter()
        hit = model.score(kv, cands)
        t3 = time.perf_counter()
        for name, dt in zip(timings, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            timings[name].append(dt * 1e3)
        max_diff = max(max_diff, float((hit - full).abs().max()))
    table = Table(title="100 candidates per request, 20 users (CPU)")
    table.add_column("path")
    table.add_column("p50 ms", justify="right")
    table.add_column("vs no cache", justify="right")
    base = statistics.median(timings["no cache (C forwards)"])
    for name, vals in timings.items():
        p50 = statistics.median(vals)
        table.add_row(name, f"{p50:.2f}", f"{base / p50:.1f}×")
    console.print(table)
    console.print(f"max |Δlogit| cached vs. no-cache: {max_diff:.2e}")
    console.print(
        "[yellow]Not in this build yet:[/] the two-level cache (L1 on device, L2 Redis), the"
        " scoring server and the workload replay; this demo shows the model-level saving."
    )
