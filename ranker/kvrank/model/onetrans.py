"""The built-in OneTrans-style ranker as one implementation of the contract, registered like
any other (architecture ``onetrans``).

:class:`OneTransRanker` adapts :class:`~kvrank.model.ranker.RankerModel` (whose own API takes
typed :class:`~kvrank.model.inputs.UserFeatures`) to :class:`CacheableRanker`: its feature
spec is today's request schema exactly (``events.{item_ids, categories, actions, gaps,
dense}``, ``profile_ids``, ``context_ids``, ``user_dense``, ``candidates.{item_ids,
categories, dense}``), and its config is :class:`ModelConfig` (artifact format 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Any

import torch
from torch import Tensor, nn

from kvrank.model.config import KVDType, ModelConfig
from kvrank.model.contract import CandidateInput, Column, FeatureSpec, UserInput
from kvrank.model.graphs import BucketedPasses
from kvrank.model.inputs import Candidates, Events, UserFeatures
from kvrank.model.kv import UserKV
from kvrank.model.ranker import RankerModel

ARCHITECTURE = "onetrans"

KV_TOLERANCES: dict[KVDType, float] = {"fp32": 1e-5, "bf16": 0.1, "fp16": 0.02, "int8": 0.1}
"""Largest |Δlogit| against fp32 storage accepted per K/V dtype (INT8 and bf16 measured at
~0.01–0.03 on models with O(1) logits; the bound leaves room for larger ones)."""


def feature_spec(cfg: ModelConfig) -> FeatureSpec:
    """The built-in model's inputs (the request schema kvrank has always served)."""
    return FeatureSpec(
        sequence=(
            Column("item_ids", "id", description="Raw item ids (hashed into the item table)."),
            Column("categories", "id", cfg.n_categories, description="Item category per event."),
            Column("actions", "id", cfg.n_actions, description="Action type per event."),
            Column("gaps", "id", cfg.n_gap_buckets, description="Time-gap bucket per event."),
            Column("dense", "dense", width=cfg.event_dense, description="Dense values per event."),
        ),
        user=(
            Column("profile_ids", "id", width=cfg.profile_fields, description="Profile ids."),
            Column("context_ids", "id", width=cfg.context_fields, description="Context ids."),
            Column("user_dense", "dense", width=cfg.user_dense, description="Dense user values."),
        ),
        candidate=(
            Column("item_ids", "id", description="Raw candidate item ids."),
            Column("categories", "id", cfg.n_categories, description="Candidate categories."),
            Column(
                "dense", "dense", width=cfg.cand_dense, description="Dense values per candidate."
            ),
        ),
        window=cfg.max_events,
    )


class OneTransRanker:
    """:class:`RankerModel` behind the contract (every optional capability included). Inputs
    come checked against :attr:`features` (the contract's promise), so the network does not
    check them a second time."""

    kv_dtypes: Mapping[KVDType, float] = KV_TOLERANCES

    def __init__(self, net: RankerModel) -> None:
        self.net = net
        self.version = net.version
        self.passes: BucketedPasses | None = None
        """Set (:meth:`use_cuda_graphs`): scores are computed in bucketed passes replayed
        from CUDA graphs."""

    def use_cuda_graphs(self) -> None:
        """Score from here on in bucketed passes replayed from CUDA graphs (a CUDA device
        only; see :mod:`kvrank.model.graphs`)."""
        self.passes = BucketedPasses(self.net, capture=True)

    @property
    def score_tolerance(self) -> float:
        """|Δlogit| allowed between cached and no-cache scores: its compute dtype's rounding.
        The two paths sum in different orders, which fp32 hides (1e-5) and a bf16 model's
        8-bit mantissa does not (~0.002 measured at production size, one bf16 step of an
        O(1) logit): the same bound as that dtype's K/V storage."""
        return KV_TOLERANCES[self.net.cfg.compute_dtype]

    @cached_property
    def features(self) -> FeatureSpec:
        return feature_spec(self.net.cfg)

    @property
    def module(self) -> nn.Module:
        return self.net

    @property
    def device(self) -> torch.device:
        return self.net.device

    def fingerprint(self) -> str:
        return self.net.cfg.fingerprint()

    def encode_user(self, user: UserInput, kv_dtype: KVDType | None = None) -> UserKV:
        return self.net.encode_user(to_features(user), kv_dtype, checked=True)

    def score(self, user_kv: UserKV, candidates: CandidateInput) -> Tensor:
        if self.passes is not None:
            return self.passes.score_many([(user_kv, to_candidates(candidates))])[0]
        return self.net.score(user_kv, to_candidates(candidates), checked=True)

    def score_many(self, requests: list[tuple[UserKV, CandidateInput]]) -> list[Tensor]:
        typed = [(kv, to_candidates(c)) for kv, c in requests]
        if self.passes is not None:
            return self.passes.score_many(typed)
        return self.net.score_many(typed, checked=True)

    def forward_full(self, user: UserInput, candidates: CandidateInput) -> Tensor:
        return self.net.forward_full(to_features(user), to_candidates(candidates), checked=True)

    def extend_user(self, user_kv: UserKV, new_events: UserInput) -> UserKV:
        return self.net.extend_user(user_kv, to_features(new_events).events, checked=True)

    def extend_is_exact(self, user_kv: UserKV, n_new: int) -> bool:
        return self.net.extend_is_exact(user_kv, n_new)


def build(config: Mapping[str, Any], version: str) -> OneTransRanker:
    """The registered builder: a fresh (untrained) model of ``config``."""
    return OneTransRanker(RankerModel(ModelConfig.model_validate(dict(config)), version))


def to_features(user: UserInput) -> UserFeatures:
    e, u = user.events, user.user
    events = Events(e["item_ids"], e["categories"], e["actions"], e["gaps"], e["dense"])
    return UserFeatures(events, u["profile_ids"], u["context_ids"], u["user_dense"])


def to_candidates(c: CandidateInput) -> Candidates:
    col = c.columns
    return Candidates(col["item_ids"], col["categories"], col["dense"])


def from_features(user: UserFeatures) -> UserInput:
    """A typed built-in user as the contract's columns (tests and tools)."""
    e = user.events
    events = {
        "item_ids": e.item_ids,
        "categories": e.categories,
        "actions": e.actions,
        "gaps": e.gaps,
        "dense": e.dense,
    }
    fixed = {
        "profile_ids": user.profile_ids,
        "context_ids": user.context_ids,
        "user_dense": user.dense,
    }
    return UserInput(events, fixed)


def from_candidates(c: Candidates) -> CandidateInput:
    return CandidateInput({"item_ids": c.item_ids, "categories": c.categories, "dense": c.dense})
