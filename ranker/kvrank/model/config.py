"""Typed configuration of the cacheable ranker (what ``config.json`` in an artifact holds).

The config fixes every tensor shape, so it also defines which cached K/V a model can use:
:meth:`ModelConfig.fingerprint` is the salt of cache keys and the compatibility check of
``UserKV``. This module only describes shapes; it builds no tensors.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ComputeDType = Literal["fp32", "bf16", "fp16"]
KVDType = Literal["fp32", "bf16", "fp16", "int8"]


class ModelConfig(BaseModel):
    """Shapes and vocabulary sizes of the OneTrans-style ranker."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    d_model: int = Field(64, ge=8, le=4096, description="Hidden width of every token.")
    n_heads: int = Field(4, ge=1, le=64, description="Attention heads; must divide d_model.")
    n_layers: int = Field(2, ge=1, le=48, description="Transformer blocks.")
    ffn_mult: int = Field(2, ge=1, le=8, description="FFN hidden width = ffn_mult × d_model.")
    max_events: int = Field(
        128, ge=1, le=65536, description="User sequence tokens after padding (window size)."
    )
    ns_tokens: int = Field(
        4, ge=1, le=64, description="Non-sequential user tokens made by the auto-split MLP."
    )
    cand_tokens: int = Field(16, ge=1, le=64, description="Tokens per candidate (T_c).")
    item_buckets: int = Field(
        50_000, ge=16, le=50_000_000, description="Rows of the hashed item-id table."
    )
    n_actions: int = Field(4, ge=1, le=1024, description="Distinct event action types.")
    n_gap_buckets: int = Field(16, ge=1, le=1024, description="Time-gap buckets of events.")
    n_categories: int = Field(64, ge=1, le=1_000_000, description="Candidate categories.")
    profile_fields: int = Field(4, ge=0, le=64, description="Hashed user-profile id fields.")
    context_fields: int = Field(2, ge=0, le=64, description="Hashed context id fields.")
    profile_buckets: int = Field(10_000, ge=16, le=50_000_000, description="Profile table rows.")
    event_dense: int = Field(2, ge=0, le=256, description="Dense values per event.")
    user_dense: int = Field(4, ge=0, le=256, description="Dense user/context values.")
    cand_dense: int = Field(4, ge=0, le=256, description="Dense values per candidate.")
    emb_dim: int = Field(32, ge=4, le=1024, description="Width of each embedding table.")
    pyramid: tuple[int, ...] | None = Field(
        None,
        description=(
            "Per layer, how many of the last user-sequence tokens issue queries and are"
            " kept (non-increasing, each <= max_events). None keeps every token."
        ),
    )
    candidate_layers: int | None = Field(
        None, ge=1, description="Candidates join only the top k layers (None: all layers)."
    )
    compute_dtype: ComputeDType = Field("fp32", description="Parameter and compute dtype.")

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelConfig:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.candidate_layers is not None and self.candidate_layers > self.n_layers:
            raise ValueError(
                f"candidate_layers={self.candidate_layers} exceeds n_layers={self.n_layers}"
            )
        if self.pyramid is not None:
            if len(self.pyramid) != self.n_layers:
                raise ValueError(
                    f"pyramid has {len(self.pyramid)} entries; n_layers={self.n_layers}"
                )
            prev = self.max_events
            for i, q in enumerate(self.pyramid):
                if not 1 <= q <= prev:
                    raise ValueError(f"pyramid[{i}]={q} must be in [1, {prev}]")
                prev = q
        return self

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def first_candidate_layer(self) -> int:
        """Index of the lowest layer that candidate tokens take part in."""
        return self.n_layers - (self.candidate_layers or self.n_layers)

    def kept(self, layer: int) -> int:
        """User-sequence tokens that issue queries at ``layer`` and leave it."""
        return self.pyramid[layer] if self.pyramid is not None else self.max_events

    def entering(self, layer: int) -> int:
        """User-sequence tokens that enter ``layer`` (its K/V rows before the NS tokens)."""
        return self.max_events if layer == 0 else self.kept(layer - 1)

    def fingerprint(self) -> str:
        """Stable hash of every field: equal iff the tensor shapes and semantics match."""
        return _fingerprint(self)


@functools.lru_cache(maxsize=256)
def _fingerprint(cfg: ModelConfig) -> str:
    """:meth:`ModelConfig.fingerprint`, computed once per config (every score checks it;
    a frozen config hashes and compares by its fields, so a copy with a change is another
    key — never a value cached on the object, which ``model_copy`` would carry over)."""
    blob = json.dumps(cfg.model_dump(mode="json"), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


QUICK = ModelConfig()
"""Small config for CPU tests, the quick benchmark and ``kvrank train``."""

TINY = ModelConfig(
    d_model=32,
    n_heads=4,
    n_layers=3,
    max_events=32,
    ns_tokens=2,
    cand_tokens=4,
    item_buckets=1000,
    profile_buckets=500,
    n_categories=16,
    emb_dim=8,
)
"""The smallest model every code path still runs on (several layers, heads, NS and
candidate tokens): the one preset the tests serve, train on and compare against."""

PRODUCTION = ModelConfig(
    d_model=256,
    n_heads=4,
    n_layers=6,
    ffn_mult=4,
    max_events=1500,
    ns_tokens=8,
    cand_tokens=16,
    item_buckets=200_000,
    emb_dim=64,
)
"""The size of a production ranking model (OneTrans-S class): 6 layers of width 256, 4 heads,
histories of up to 1,500 events — what the benchmarks' ``production`` profile measures."""

PRODUCTION_COMPACT = PRODUCTION.model_copy(
    update={"pyramid": (1024, 512, 256, 128, 64, 16), "candidate_layers": 2}
)
"""Production size with the memory-saving choices: a pyramid schedule and candidates in the top
2 layers only (the cache then holds 2 layers' K/V, of at most 64 user rows)."""
