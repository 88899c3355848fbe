"""Feature → token embedders: events to sequence tokens, the NS auto-split, candidates.

Raw ids are hashed into fixed-size tables (a multiplicative mix, then modulo), so id
spaces of any size map onto bounded memory. Each embedder is a small MLP; it sees one
token's features at a time, so tokens of a user never depend on other users or on the
candidates. Validation of ids and shapes happens earlier, in :mod:`kvrank.model.inputs`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kvrank.model.config import ModelConfig

_MIX = 0x9E3779B97F4A7C15 - (1 << 64)  # golden-ratio constant as a signed int64


def hash_ids(ids: Tensor, buckets: int) -> Tensor:
    """Spread raw non-negative ids over ``[0, buckets)``; int64 overflow wraps by design."""
    mixed = (ids ^ (ids >> 29)) * _MIX
    return torch.remainder(mixed ^ (mixed >> 32), buckets)


class TokenMLP(nn.Module):
    """``in → d → tokens × d``, reshaped into ``tokens`` tokens."""

    def __init__(self, d_in: int, d: int, tokens: int) -> None:
        super().__init__()
        self.tokens = tokens
        self.fc1 = nn.Linear(d_in, d)
        self.fc2 = nn.Linear(d, tokens * d)

    def forward(self, x: Tensor) -> Tensor:
        y: Tensor = self.fc2(F.gelu(self.fc1(x)))
        return y.reshape(*x.shape[:-1], self.tokens, -1)


class FeatureEmbedder(nn.Module):
    """All embedding tables and token MLPs of the ranker."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        e, d = cfg.emb_dim, cfg.d_model
        self.cfg = cfg
        self.items = nn.Embedding(cfg.item_buckets, e)
        self.actions = nn.Embedding(cfg.n_actions, e)
        self.gaps = nn.Embedding(cfg.n_gap_buckets, e)
        self.categories = nn.Embedding(cfg.n_categories, e)
        self.profile = nn.Embedding(cfg.profile_buckets, e)
        self.event_mlp = TokenMLP(4 * e + cfg.event_dense, d, 1)
        ns_in = (cfg.profile_fields + cfg.context_fields) * e + cfg.user_dense + 1
        self.ns_mlp = TokenMLP(ns_in, d, cfg.ns_tokens)
        self.cand_mlp = TokenMLP(2 * e + cfg.cand_dense, d, cfg.cand_tokens)

    def events(
        self, item_ids: Tensor, categories: Tensor, actions: Tensor, gaps: Tensor, dense: Tensor
    ) -> Tensor:
        """Sequence tokens ``[..., n, d]`` from per-event features ``[..., n]``."""
        x = torch.cat(
            [
                self.items(hash_ids(item_ids, self.cfg.item_buckets)),
                self.categories(categories),
                self.actions(actions),
                self.gaps(gaps),
                dense.to(self.items.weight.dtype),
            ],
            dim=-1,
        )
        tokens: Tensor = self.event_mlp(x)
        return tokens.squeeze(-2)

    def ns(self, profile_ids: Tensor, context_ids: Tensor, dense: Tensor) -> Tensor:
        """The auto-split NS tokens ``[..., ns_tokens, d]``."""
        ids = torch.cat([profile_ids, context_ids], dim=-1)
        emb = self.profile(hash_ids(ids, self.cfg.profile_buckets)).flatten(-2)
        one = torch.ones(*dense.shape[:-1], 1, dtype=emb.dtype, device=emb.device)
        tokens: Tensor = self.ns_mlp(torch.cat([emb, dense.to(emb.dtype), one], dim=-1))
        return tokens

    def candidates(self, item_ids: Tensor, categories: Tensor, dense: Tensor) -> Tensor:
        """Candidate tokens ``[..., C, cand_tokens, d]``."""
        x = torch.cat(
            [
                self.items(hash_ids(item_ids, self.cfg.item_buckets)),
                self.categories(categories),
                dense.to(self.items.weight.dtype),
            ],
            dim=-1,
        )
        tokens: Tensor = self.cand_mlp(x)
        return tokens
