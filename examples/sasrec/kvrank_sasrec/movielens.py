"""Train and evaluate the example SASRec plugin on MovieLens-100k: kvrank's data, split and
ranking protocol, so its figures sit beside the built-in model's on the same requests.

    python -m kvrank_sasrec.movielens --out artifacts/sasrec-movielens [--json report.json]

Each rating is an event (item, genre, rating); the user token embeds the age bucket and the
occupation. A training step draws one history length for its whole batch (the plugin's
trainer stacks equal-length users) and, for each example, the true next item plus items the
user never rated. Evaluation scores kvrank's requests (1 true item + 100 sampled negatives)
through the model contract, from fp32 and from INT8 K/V.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvrank.bench.real_users import compare
from kvrank.data.movielens import load
from kvrank.data.movielens_features import MovieLensFeatures, Target
from kvrank.model.artifact import save_ranker
from kvrank.model.config import KVDType
from kvrank.model.contract import CandidateInput, UserInput
from kvrank.train import ranking_metrics
from kvrank_sasrec.model import ARCHITECTURE, SASRecConfig, SASRecRanker, build


def user_input(
    data: MovieLensFeatures, cfg: SASRecConfig, user: int, stop: int, n: int
) -> UserInput:
    """``user``'s ``n`` events before position ``stop``, in the plugin's columns."""
    ml = data.ml
    rows = data.rows[user][stop - n : stop]
    items = ml.item[rows]
    events = {
        "item_id": torch.from_numpy(items),
        "genre": torch.from_numpy(ml.items.genre[items]),
        "rating": torch.from_numpy(ml.rating[rows]),
    }
    profile = {
        "age": torch.tensor([min(int(ml.users.age[user]) // 10, cfg.n_ages - 1)]),
        "occupation": torch.tensor([int(ml.users.occupation[user])]),
    }
    return UserInput(events, profile)


def candidates(data: MovieLensFeatures, items: np.ndarray) -> CandidateInput:
    return CandidateInput(
        {
            "item_id": torch.from_numpy(items.astype(np.int64)),
            "genre": torch.from_numpy(data.ml.items.genre[items]),
        }
    )


def train(
    cfg: SASRecConfig,
    data: MovieLensFeatures,
    steps: int,
    seed: int,
    budget_s: float,
    batch: int = 64,
) -> SASRecRanker:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = build(cfg.model_dump(), "v1")
    net, targets = model.net, data.train_targets()
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    negatives, start = 15, time.monotonic()
    for _ in range(steps):
        if time.monotonic() - start > budget_s:
            break
        n = int(rng.integers(1, cfg.window + 1))
        picks = [
            t
            for t in (targets[int(j)] for j in rng.integers(0, len(targets), 4 * batch))
            if t.pos >= n
        ]
        users, cands = [], []
        for t in picks[:batch]:
            items = np.concatenate([[data.item_at(t)], data.negatives(t.user, negatives, rng)])
            users.append(net.user_tokens(user_input(data, cfg, t.user, t.pos, n)))
            cands.append(net.candidate_tokens(candidates(data, items)))
        x = torch.stack(users)
        layers = [(k, v, torch.ones(k.shape[:2], dtype=torch.bool)) for k, v in net.encode(x)]
        logits = net.score(layers, torch.stack(cands))
        labels = torch.zeros_like(logits)
        labels[:, 0] = 1.0
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    net.eval()
    return model


def scores(
    model: SASRecRanker,
    data: MovieLensFeatures,
    targets: list[Target],
    kv_dtype: KVDType | None = None,
) -> list[np.ndarray]:
    """kvrank's evaluation requests scored through the contract (history: the latest window)."""
    cfg = model.cfg
    out = []
    for t in targets:
        user = user_input(data, cfg, t.user, t.pos, min(t.pos, cfg.window))
        kv = model.encode_user(user, kv_dtype)
        out.append(model.score(kv, candidates(data, data.eval_items(t))).float().numpy())
    return out


def run(out: Path, steps: int, seed: int, budget_s: float, eval_every: int = 1) -> dict[str, Any]:
    data = MovieLensFeatures(load())
    cfg = SASRecConfig()
    began = time.monotonic()
    model = train(cfg, data, steps, seed, budget_s)
    targets = data.eval_targets()[::eval_every]
    fp32 = scores(model, data, targets)
    r = ranking_metrics(fp32)
    int8 = compare(fp32, scores(model, data, targets, "int8"))
    save_ranker(model, out, ARCHITECTURE, cfg.model_dump(mode="json"))
    return {
        "model": "sasrec (example plugin)",
        "auc": r.auc,
        "hr_at_10": r.hr_at_10,
        "ndcg_at_10": r.ndcg_at_10,
        "requests": r.requests,
        "int8": int8,
        "steps": steps,
        "elapsed_s": time.monotonic() - began,
        "config": cfg.model_dump(mode="json"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-budget", type=float, default=1200.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    report = run(args.out, args.steps, args.seed, args.time_budget)
    int8 = report["int8"]
    print(
        f"sasrec on movielens-100k: AUC {report['auc']:.4f}, HR@10 {report['hr_at_10']:.4f},"
        f" NDCG@10 {report['ndcg_at_10']:.4f} over {report['requests']} requests; INT8 K/V"
        f" ΔAUC {int8['delta_auc']:+.5f} (max |Δlogit| {int8['max_abs_logit_diff']:.4f})"
        f" — trained in {report['elapsed_s']:.0f} s → {args.out}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
