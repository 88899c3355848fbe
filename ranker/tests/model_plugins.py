"""Model plugins for the tests: deliberately broken rankers the load-time checks must refuse,
registered in-process (as an installed package's entry points would be), and artifacts of
them and of the example SASRec plugin.

Each broken one is the built-in ranker with one flaw a real model could have. Their cached
and no-cache paths agree with each other wherever the flaw allows, so the check that catches
each is the one named for it, not a side effect.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from kvrank.model import registry
from kvrank.model.artifact import save_ranker
from kvrank.model.config import KVDType, ModelConfig
from kvrank.model.contract import CandidateInput, UserInput
from kvrank.model.kv import UserKV
from kvrank.model.onetrans import OneTransRanker

DISTRIBUTION, VERSION = "kvrank-test-plugins", "1.0"


class CandidatesSeeEachOther(OneTransRanker):
    """Each logit takes in the mean of the whole set's (cross-candidate attention in effect),
    in both the cached and the no-cache path."""

    def score(self, user_kv: UserKV, candidates: CandidateInput) -> Tensor:
        s = super().score(user_kv, candidates)
        return s + 0.5 * s.mean()

    def forward_full(self, user: UserInput, candidates: CandidateInput) -> Tensor:
        s = super().forward_full(user, candidates)
        return s + 0.5 * s.mean()

    def score_many(self, requests: list[tuple[UserKV, CandidateInput]]) -> list[Tensor]:
        return [self.score(kv, c) for kv, c in requests]


class BatchNormalized(OneTransRanker):
    """Logits standardised over the request's candidates (batch-dependent normalisation)."""

    @staticmethod
    def _norm(s: Tensor) -> Tensor:
        return (s - s.mean()) / (s.std(unbiased=False) + 1e-3)

    def score(self, user_kv: UserKV, candidates: CandidateInput) -> Tensor:
        return self._norm(super().score(user_kv, candidates))

    def forward_full(self, user: UserInput, candidates: CandidateInput) -> Tensor:
        return self._norm(super().forward_full(user, candidates))

    def score_many(self, requests: list[tuple[UserKV, CandidateInput]]) -> list[Tensor]:
        return [self.score(kv, c) for kv, c in requests]


class UserSideSeesCandidates(OneTransRanker):
    """Without the cache the user's tokens see the candidate (its item joins the history):
    what a bidirectional or candidate-first model does. Cached scores cannot match."""

    def forward_full(self, user: UserInput, candidates: CandidateInput) -> Tensor:
        out = []
        for i in range(len(candidates)):
            one = candidates.select(slice(i, i + 1))
            seen = {
                name: torch.cat([t, _event_of(name, one, t)]) for name, t in user.events.items()
            }
            out.append(super().forward_full(UserInput(seen, user.user), one))
        return torch.cat(out)


def _event_of(column: str, cand: CandidateInput, like: Tensor) -> Tensor:
    if column in ("item_ids", "categories"):
        return cand.columns[column]
    return torch.zeros((1, *like.shape[1:]), dtype=like.dtype)


class HiddenState(OneTransRanker):
    """Keeps a running count across users and lets it into the state: the same user gets
    another state the second time (a wrong hit waiting to happen)."""

    def __init__(self, net: Any) -> None:
        super().__init__(net)
        self.encodes = 0

    def encode_user(self, user: UserInput, kv_dtype: KVDType | None = None) -> UserKV:
        self.encodes += 1
        kv = super().encode_user(user, kv_dtype)
        extras = {name: t + 1e-3 * self.encodes for name, t in kv.extras.items()}
        return UserKV(**{**kv.__dict__, "extras": extras})


class ReadsPastWindow(OneTransRanker):
    """Counts every event it is handed, the ones before its window too, into its state and
    its no-cache path alike: an adapter that forgot to cut the history to ``window``."""

    def encode_user(self, user: UserInput, kv_dtype: KVDType | None = None) -> UserKV:
        kv = super().encode_user(user, kv_dtype)
        return UserKV(**{**kv.__dict__, "meta": {**kv.meta, "events": str(len(user))}})

    def score(self, user_kv: UserKV, candidates: CandidateInput) -> Tensor:
        return super().score(user_kv, candidates) + 0.01 * int(user_kv.meta.get("events", 0))

    def forward_full(self, user: UserInput, candidates: CandidateInput) -> Tensor:
        return super().forward_full(user, candidates) + 0.01 * len(user)


BROKEN = {
    "test-candidates-see-each-other": (CandidatesSeeEachOther, "candidates_independent"),
    "test-batch-normalized": (BatchNormalized, "candidates_independent"),
    "test-user-side-sees-candidates": (UserSideSeesCandidates, "cached_equals_full"),
    "test-hidden-state": (HiddenState, "encode_deterministic"),
    "test-reads-past-window": (ReadsPastWindow, "window_respected"),
}
"""architecture → (its class, the check that must refuse it)."""


def register_broken() -> None:
    for name, (cls, _) in BROKEN.items():
        registry.register(name, _builder(cls), DISTRIBUTION, VERSION)


def _builder(cls: type[OneTransRanker]) -> registry.Builder:
    from kvrank.model.ranker import RankerModel

    def build(config: Mapping[str, Any], version: str) -> OneTransRanker:
        return cls(RankerModel(ModelConfig.model_validate(dict(config)), version))

    return build


def save_broken(name: str, net: Any, directory: Path) -> Path:
    """An artifact of the broken architecture ``name`` holding ``net``'s weights."""
    cls, _ = BROKEN[name]
    return save_ranker(cls(net), directory, name, net.cfg.model_dump(mode="json"))


SASREC_SMALL = {"n_items": 300, "n_genres": 7, "d_model": 24, "n_heads": 2, "window": 12}
"""A small example-plugin config: quick to check and to serve in tests."""


def save_sasrec(directory: Path, version: str = "s1", **config: Any) -> Path:
    """An artifact of the example SASRec plugin (installed: ``examples/sasrec``) with weights
    scaled so its logits spread (default init gives nearly equal ones)."""
    from kvrank_sasrec.model import build

    cfg = {**SASREC_SMALL, **config}
    torch.manual_seed(7)
    model = build(cfg, version)
    with torch.no_grad():
        for name, p in model.net.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5)
            elif "head" in name or "bias" in name:
                p.normal_(0.0, 0.3)
    return save_ranker(model, directory, "sasrec", model.cfg.model_dump(mode="json"))
