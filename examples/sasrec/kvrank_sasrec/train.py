"""Train the example SASRec plugin briefly on synthetic users and write a kvrank artifact.

    python -m kvrank_sasrec.train --out artifacts/sasrec [--positions from_newest]

The world: each item has a genre, each user a favourite genre that most of their history
and their positives come from, so a model that reads the history learns to rank. Prints the
held-out AUC; the artifact names the architecture and this package's version, and carries a
few held-out requests with the logits training gave them (``golden.safetensors``), which
kvrank matches when it loads the model.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import Tensor

from kvrank.model.artifact import save_ranker
from kvrank.model.contract import CandidateInput, UserInput
from kvrank.model.golden import GoldenCase, save_golden
from kvrank_sasrec.model import ARCHITECTURE, SASRecConfig, SASRecRanker, build


class World:
    """Users with a favourite genre, items with a genre; deterministic per seed."""

    def __init__(self, cfg: SASRecConfig, seed: int) -> None:
        self.cfg = cfg
        self.g = torch.Generator().manual_seed(seed)
        self.item_genre = torch.randint(0, cfg.n_genres, (cfg.n_items,), generator=self.g)

    def _items(self, genre: Tensor, n: int, loyal: float) -> Tensor:
        pool = (self.item_genre == genre).nonzero().flatten()
        own = pool[torch.randint(0, len(pool), (n,), generator=self.g)]
        other = torch.randint(0, self.cfg.n_items, (n,), generator=self.g)
        return torch.where(torch.rand(n, generator=self.g) < loyal, own, other)

    def user(self, n: int) -> tuple[UserInput, Tensor]:
        cfg = self.cfg
        fav = torch.randint(0, cfg.n_genres, (), generator=self.g)
        items = self._items(fav, n, 0.7)
        liked = self.item_genre[items] == fav
        ratings = torch.where(liked, 4, torch.randint(0, 4, (n,), generator=self.g))
        profile = {
            "age": torch.randint(0, cfg.n_ages, (1,), generator=self.g),
            "occupation": torch.randint(0, cfg.n_occupations, (1,), generator=self.g),
        }
        events = {
            "item_id": items,
            "genre": self.item_genre[items],
            "rating": ratings.clamp_max(cfg.n_ratings - 1),
        }
        return UserInput(events, profile), fav

    def candidates(self, fav: Tensor, c: int) -> tuple[CandidateInput, Tensor]:
        labels = (torch.rand(c, generator=self.g) < 0.3).float()
        items = torch.where(
            labels.bool(),
            self._items(fav, c, 0.9),
            torch.randint(0, self.cfg.n_items, (c,), generator=self.g),
        )
        return CandidateInput({"item_id": items, "genre": self.item_genre[items]}), labels


def auc(scores: Tensor, labels: Tensor) -> float:
    order = scores.argsort()
    ranks = torch.empty_like(order, dtype=torch.float64)
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=torch.float64)
    pos = labels.bool()
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def train(cfg: SASRecConfig, steps: int, seed: int, budget_s: float) -> tuple[SASRecRanker, float]:
    torch.manual_seed(seed)
    model = build(cfg.model_dump(), "v1")
    net, world = model.net, World(cfg, seed)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    start = time.monotonic()
    for _ in range(steps):
        if time.monotonic() - start > budget_s:
            break
        n = int(torch.randint(3, cfg.window + 1, (), generator=world.g))
        batch = [world.user(n) for _ in range(32)]
        cands = [world.candidates(fav, 16) for _, fav in batch]
        x = torch.stack([net.user_tokens(u) for u, _ in batch])
        layers = [(k, v, torch.ones(k.shape[:2], dtype=torch.bool)) for k, v in net.encode(x)]
        x_c = torch.stack([net.candidate_tokens(c) for c, _ in cands])
        logits = net.score(layers, x_c)
        labels = torch.stack([y for _, y in cands])
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
    net.eval()
    held_out = World(cfg, seed + 1)
    scores: list[Tensor] = []
    truth: list[Tensor] = []
    for _ in range(100):
        user, fav = held_out.user(int(torch.randint(1, cfg.window + 1, (), generator=held_out.g)))
        c, y = held_out.candidates(fav, 20)
        scores.append(model.score(model.encode_user(user), c))
        truth.append(y)
    return model, auc(torch.cat(scores), torch.cat(truth))


@torch.no_grad()
def golden_cases(model: SASRecRanker, world: World, count: int = 4) -> list[GoldenCase]:
    """Held-out requests and the logits training's own (batched, differentiable) path gives
    them: kvrank matches them when it loads the model (train/serve parity)."""
    net, cases = model.net, []
    for i in range(count):
        user, fav = world.user(1 + i * (model.cfg.window // count))
        cands, _ = world.candidates(fav, 8)
        x = net.user_tokens(user)[None]
        layers = [(k, v, torch.ones(k.shape[:2], dtype=torch.bool)) for k, v in net.encode(x)]
        logits = net.score(layers, net.candidate_tokens(cands)[None])[0]
        cases.append(GoldenCase(user, cands, logits))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--positions", choices=["from_oldest", "from_newest"], default="from_oldest"
    )
    parser.add_argument("--version", default="v1")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-budget", type=float, default=60.0)
    args = parser.parse_args()
    cfg = SASRecConfig(positions=args.positions)
    start = time.monotonic()
    model, score = train(cfg, args.steps, args.seed, args.time_budget)
    model.version = args.version
    save_ranker(model, args.out, ARCHITECTURE, cfg.model_dump(mode="json"))
    save_golden(args.out, golden_cases(model, World(cfg, args.seed + 2)))
    print(f"trained in {time.monotonic() - start:.0f} s — held-out AUC {score:.4f} → {args.out}")


if __name__ == "__main__":
    main()
