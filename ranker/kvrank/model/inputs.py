"""Feature containers for one user and a set of candidates, and their validation.

These are plain tensors in the model's id space, checked against a :class:`ModelConfig`
before they reach the network: wrong shapes, empty sequences, NaN/inf dense values and
ids outside ``[0, 2**63)`` raise :class:`InputError` naming the field. This module does
no hashing into tables and no device placement beyond what the caller asks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from kvrank.errors import InputError
from kvrank.model.config import ModelConfig
from kvrank.model.features import check_dense as _dense
from kvrank.model.features import check_ids as _ids


@dataclass(frozen=True)
class Events:
    """A chronologically ordered slice of a user's behaviour sequence (oldest first)."""

    item_ids: Tensor  # int64 [n], raw ids, hashed into the item table
    categories: Tensor  # int64 [n], in [0, n_categories)
    actions: Tensor  # int64 [n], in [0, n_actions)
    gaps: Tensor  # int64 [n], time-gap bucket in [0, n_gap_buckets)
    dense: Tensor  # float [n, event_dense]

    def __len__(self) -> int:
        return int(self.item_ids.shape[0])

    def slice(self, start: int, stop: int | None = None) -> Events:
        return Events(
            self.item_ids[start:stop],
            self.categories[start:stop],
            self.actions[start:stop],
            self.gaps[start:stop],
            self.dense[start:stop],
        )

    def cat(self, other: Events) -> Events:
        return Events(
            torch.cat([self.item_ids, other.item_ids]),
            torch.cat([self.categories, other.categories]),
            torch.cat([self.actions, other.actions]),
            torch.cat([self.gaps, other.gaps]),
            torch.cat([self.dense, other.dense]),
        )

    def validate(self, cfg: ModelConfig, field: str = "events") -> None:
        if not isinstance(self.item_ids, Tensor):
            raise InputError(f"{field}.item_ids", "expected a tensor")
        n = len(self)
        if n == 0:
            raise InputError(f"{field}.item_ids", "the sequence is empty; at least 1 event needed")
        _ids(self.item_ids, f"{field}.item_ids", (n,), None)
        _ids(self.categories, f"{field}.categories", (n,), cfg.n_categories)
        _ids(self.actions, f"{field}.actions", (n,), cfg.n_actions)
        _ids(self.gaps, f"{field}.gaps", (n,), cfg.n_gap_buckets)
        _dense(self.dense, f"{field}.dense", (n, cfg.event_dense))


@dataclass(frozen=True)
class UserFeatures:
    """Everything on the user side: sequence, profile and context features."""

    events: Events
    profile_ids: Tensor  # int64 [profile_fields]
    context_ids: Tensor  # int64 [context_fields]
    dense: Tensor  # float [user_dense]

    def validate(self, cfg: ModelConfig) -> None:
        self.events.validate(cfg)
        _ids(self.profile_ids, "profile_ids", (cfg.profile_fields,), None)
        _ids(self.context_ids, "context_ids", (cfg.context_fields,), None)
        _dense(self.dense, "user_dense", (cfg.user_dense,))

    def with_events(self, events: Events) -> UserFeatures:
        return UserFeatures(events, self.profile_ids, self.context_ids, self.dense)


@dataclass(frozen=True)
class Candidates:
    """C items to score for one user."""

    item_ids: Tensor  # int64 [C]
    categories: Tensor  # int64 [C], in [0, n_categories)
    dense: Tensor  # float [C, cand_dense]

    def __len__(self) -> int:
        return int(self.item_ids.shape[0])

    def validate(self, cfg: ModelConfig) -> None:
        if not isinstance(self.item_ids, Tensor):
            raise InputError("candidates.item_ids", "expected a tensor")
        c = len(self)
        if c == 0:
            raise InputError("candidates.item_ids", "no candidates; at least 1 needed")
        _ids(self.item_ids, "candidates.item_ids", (c,), None)
        _ids(self.categories, "candidates.categories", (c,), cfg.n_categories)
        _dense(self.dense, "candidates.dense", (c, cfg.cand_dense))

    def select(self, index: Tensor | slice) -> Candidates:
        return Candidates(self.item_ids[index], self.categories[index], self.dense[index])
