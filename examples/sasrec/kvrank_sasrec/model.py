"""A SASRec-style causal transformer served by kvrank through its model contract.

Token order: ``[user token | the user's events, oldest first | one candidate token]``. The
user token embeds the user's profile (age bucket, occupation); each event token its item,
rating and position; a candidate token its item and genre. Every token shares the layers'
weights (as in SASRec); attention is causal, so the user side never sees a candidate and a
candidate sees the user side and itself only. Attention heads have a query/key width
(``qk_dim``) of their own, narrower than the value width (``v_dim``): the cached K and V of
this model differ in shape.

Positions are learned, counted either from the oldest event in the window (``from_oldest``:
appending events leaves earlier tokens unchanged until the window slides, so the model can
extend a cached user exactly) or back from the newest (``from_newest``: every new event moves
every earlier token, so the model cannot extend at all and declares so by not implementing
``extend_user``). No caching, no I/O here: kvrank does those.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any, Literal, cast

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor, nn

from kvrank.errors import IncompatibleKVError
from kvrank.model.contract import CandidateInput, Column, FeatureSpec, UserInput
from kvrank.model.kv import UserKV

ARCHITECTURE = "sasrec"
KVDType = Literal["fp32", "bf16", "fp16", "int8"]


class SASRecConfig(BaseModel):
    """Shapes and vocabularies (what ``config.json`` of an artifact holds)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_items: int = Field(1700, ge=2, le=10_000_000, description="Item vocabulary.")
    n_genres: int = Field(19, ge=1, le=1024, description="Item genres.")
    n_ratings: int = Field(6, ge=1, le=64, description="Rating values per event (0..5).")
    n_ages: int = Field(8, ge=1, le=128, description="Age buckets.")
    n_occupations: int = Field(21, ge=1, le=1024, description="Occupations.")
    d_model: int = Field(48, ge=8, le=2048)
    n_heads: int = Field(3, ge=1, le=32)
    qk_dim: int = Field(12, ge=2, le=256, description="Query/key width per head.")
    v_dim: int = Field(16, ge=2, le=256, description="Value width per head.")
    n_layers: int = Field(2, ge=1, le=24)
    ffn_mult: int = Field(2, ge=1, le=8)
    window: int = Field(50, ge=1, le=4096, description="Events the model sees.")
    positions: Literal["from_oldest", "from_newest"] = "from_oldest"
    slate_context: bool = Field(
        False,
        description="Listwise: every candidate also sees the mean of the slate's candidate"
        " tokens at each layer. A score then depends on the rest of the slate, so it cannot"
        " be served from a per-user cache: kvrank check-model refuses it"
        " (candidates_independent).",
    )

    def fingerprint(self) -> str:
        blob = json.dumps([ARCHITECTURE, self.model_dump(mode="json")], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def feature_spec(cfg: SASRecConfig) -> FeatureSpec:
    return FeatureSpec(
        sequence=(
            Column("item_id", "id", cfg.n_items, description="Item the user rated."),
            Column("genre", "id", cfg.n_genres, description="That item's main genre."),
            Column("rating", "id", cfg.n_ratings, description="The rating given (0..5)."),
        ),
        user=(
            Column("age", "id", cfg.n_ages, width=1, description="Age bucket."),
            Column("occupation", "id", cfg.n_occupations, width=1, description="Occupation."),
        ),
        candidate=(
            Column("item_id", "id", cfg.n_items, description="Item to score."),
            Column("genre", "id", cfg.n_genres, description="The item's main genre."),
        ),
        window=cfg.window,
    )


class Layer(nn.Module):
    """Pre-norm causal self-attention + FFN, shared by every token."""

    def __init__(self, cfg: SASRecConfig) -> None:
        super().__init__()
        d, h = cfg.d_model, cfg.n_heads
        self.h, self.dk, self.dv = h, cfg.qk_dim, cfg.v_dim
        self.norm1 = nn.LayerNorm(d)
        self.q = nn.Linear(d, h * cfg.qk_dim)
        self.k = nn.Linear(d, h * cfg.qk_dim)
        self.v = nn.Linear(d, h * cfg.v_dim)
        self.out = nn.Linear(h * cfg.v_dim, d)
        self.norm2 = nn.LayerNorm(d)
        self.ffn = nn.Sequential(
            nn.Linear(d, cfg.ffn_mult * d), nn.GELU(), nn.Linear(cfg.ffn_mult * d, d)
        )

    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``x [..., T, d]`` → q, k ``[..., T, H, dk]``, v ``[..., T, H, dv]``."""
        y = self.norm1(x)
        shape = x.shape[:-1]
        return (
            self.q(y).view(*shape, self.h, self.dk),
            self.k(y).view(*shape, self.h, self.dk),
            self.v(y).view(*shape, self.h, self.dv),
        )

    def finish(self, x: Tensor, attended: Tensor) -> Tensor:
        """Residual + FFN after attention output ``attended [..., T, H, dv]``."""
        x = x + self.out(attended.flatten(-2))
        out: Tensor = x + self.ffn(self.norm2(x))
        return out


class SASRecNet(nn.Module):
    """The weights, and the batched math every public path shares."""

    def __init__(self, cfg: SASRecConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.items = nn.Embedding(cfg.n_items, d)
        self.ratings = nn.Embedding(cfg.n_ratings, d)
        self.genres = nn.Embedding(cfg.n_genres, d)
        self.ages = nn.Embedding(cfg.n_ages, d)
        self.occupations = nn.Embedding(cfg.n_occupations, d)
        self.positions = nn.Embedding(cfg.window, d)
        self.candidate_slot = nn.Parameter(torch.zeros(d))
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.n_layers))
        self.final = nn.LayerNorm(d)
        self.head = nn.Linear(d, 1)

    def blocks(self) -> list[Layer]:
        return [cast(Layer, layer) for layer in self.layers]

    def user_tokens(self, user: UserInput) -> Tensor:
        """``[1 + n, d]``: the user token, then the last ``window`` events."""
        cfg = self.cfg
        items = user.events["item_id"][-cfg.window :].to(self.head.weight.device)
        genres = user.events["genre"][-cfg.window :].to(items.device)
        ratings = user.events["rating"][-cfg.window :].to(items.device)
        n = items.shape[0]
        order = torch.arange(n, device=items.device)
        pos = order if cfg.positions == "from_oldest" else n - 1 - order
        events = self.event_tokens(items, genres, ratings, pos)
        u = user.user
        profile = self.ages(u["age"].to(items.device)) + self.occupations(
            u["occupation"].to(items.device)
        )
        return torch.cat([profile, events])

    def event_tokens(self, items: Tensor, genres: Tensor, ratings: Tensor, pos: Tensor) -> Tensor:
        out: Tensor = (
            self.items(items) + self.genres(genres) + self.ratings(ratings) + self.positions(pos)
        )
        return out

    def candidate_tokens(self, cands: CandidateInput) -> Tensor:
        dev = self.head.weight.device
        c = cands.columns
        out: Tensor = (
            self.items(c["item_id"].to(dev)) + self.genres(c["genre"].to(dev)) + self.candidate_slot
        )
        return out

    def encode(
        self, x: Tensor, past: list[tuple[Tensor, Tensor]] | None = None
    ) -> list[tuple[Tensor, Tensor]]:
        """Per-layer K/V ``[R, H, d*]`` of user tokens ``x [T, d]``, appended after ``past``
        (the K/V of earlier tokens, which ``x`` attends to) when given."""
        out = []
        for i, layer in enumerate(self.blocks()):
            q, k, v = layer.qkv(x)
            if past is not None:
                k = torch.cat([past[i][0], k])
                v = torch.cat([past[i][1], v])
            out.append((k, v))
            if i == len(self.layers) - 1:
                break  # the user side's top-layer outputs are never used
            x = layer.finish(x, _causal_attend(q, k, v))
        return out

    def score(self, kvs: list[tuple[Tensor, Tensor, Tensor]], x_c: Tensor) -> Tensor:
        """Logits ``[B, C]``: candidates ``x_c [B, C, d]`` against per-layer user K/V
        ``[B, R, H, d*]`` with key validity ``[B, R]``; each candidate sees itself and the
        user rows only."""
        for layer, (k_u, v_u, valid) in zip(self.blocks(), kvs, strict=True):
            q, k_c, v_c = layer.qkv(x_c)
            scale = 1.0 / math.sqrt(q.shape[-1])
            s_user = torch.einsum("bchd,brhd->bhcr", q, k_u) * scale
            s_user = s_user.masked_fill(~valid[:, None, None, :], float("-inf"))
            s_self = torch.einsum("bchd,bchd->bhc", q, k_c)[..., None] * scale
            w = torch.softmax(torch.cat([s_user, s_self], dim=-1), dim=-1)
            a = torch.einsum("bhcr,brhd->bchd", w[..., :-1], v_u)
            a = a + w[..., -1].permute(0, 2, 1)[..., None] * v_c
            x_c = self._slate(layer.finish(x_c, a), dim=1)
        logits: Tensor = self.head(self.final(x_c)).squeeze(-1)
        return logits

    def full(self, x_user: Tensor, x_c: Tensor) -> Tensor:
        """The no-cache reference: each candidate appended to the user's whole sequence and
        run through every layer under one causal mask; logits ``[C]``."""
        c = x_c.shape[0]
        x = torch.cat([x_user.expand(c, -1, -1), x_c[:, None]], dim=1)  # [C, R + 1, d]
        for layer in self.blocks():
            q, k, v = layer.qkv(x)
            x = layer.finish(x, _causal_attend(q, k, v))
            x = torch.cat([x[:, :-1], self._slate(x[:, -1:], dim=0)], dim=1)
        logits: Tensor = self.head(self.final(x[:, -1])).squeeze(-1)
        return logits

    def _slate(self, x_c: Tensor, dim: int) -> Tensor:
        """Candidate tokens plus the slate's mean over ``dim`` (listwise models only)."""
        return x_c + x_c.mean(dim=dim, keepdim=True) if self.cfg.slate_context else x_c


def _causal_attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal attention where the ``T`` queries are the last ``T`` of the ``R`` keys;
    ``[..., T, H, d]`` in and out."""
    t, r = q.shape[-3], k.shape[-3]
    allowed = torch.ones(t, r, dtype=torch.bool, device=q.device).tril(r - t)
    out = nn.functional.scaled_dot_product_attention(
        q.transpose(-3, -2), k.transpose(-3, -2), v.transpose(-3, -2), attn_mask=allowed
    )
    return out.transpose(-3, -2)


class SASRecRanker:
    """The contract's required part (used as is by ``from_newest`` models)."""

    kv_dtypes: Mapping[KVDType, float] = {"fp32": 1e-5, "bf16": 0.1, "fp16": 0.02, "int8": 0.1}

    def __init__(self, cfg: SASRecConfig, version: str) -> None:
        self.cfg = cfg
        self.version = version
        self.net = SASRecNet(cfg)
        self.features = feature_spec(cfg)

    @property
    def module(self) -> nn.Module:
        return self.net

    @property
    def device(self) -> torch.device:
        return self.net.head.weight.device

    def fingerprint(self) -> str:
        return self.cfg.fingerprint()

    @torch.no_grad()
    def encode_user(self, user: UserInput, kv_dtype: KVDType | None = None) -> UserKV:
        layers = self.net.encode(self.net.user_tokens(user))
        return self._pack(layers, min(len(user), self.cfg.window), 0, kv_dtype or "fp32")

    @torch.no_grad()
    def score(self, user_kv: UserKV, candidates: CandidateInput) -> Tensor:
        self._check(user_kv)
        return self._score_batch([user_kv], [candidates])[0]

    @torch.no_grad()
    def score_many(self, requests: list[tuple[UserKV, CandidateInput]]) -> list[Tensor]:
        for kv, _ in requests:
            self._check(kv)
        return self._score_batch([kv for kv, _ in requests], [c for _, c in requests])

    @torch.no_grad()
    def forward_full(self, user: UserInput, candidates: CandidateInput) -> Tensor:
        x_c = self.net.candidate_tokens(candidates)
        return self.net.full(self.net.user_tokens(user)[None], x_c).float()

    def _score_batch(self, kvs: list[UserKV], cands: list[CandidateInput]) -> list[Tensor]:
        """Users' K/V padded to the longest (padding masked), candidate lists to the
        longest (padding dropped): one pass, the same numbers as one request at a time."""
        dev = self.device
        rows = max(kv.length + 1 for kv in kvs)
        layers = []
        for i in range(self.cfg.n_layers):
            ks, vs, valid = [], [], []
            for kv in kvs:
                k, v = kv.layers[i].dequantize(torch.float32)
                pad = rows - k.shape[0]
                ks.append(nn.functional.pad(k.to(dev), (0, 0, 0, 0, 0, pad)))
                vs.append(nn.functional.pad(v.to(dev), (0, 0, 0, 0, 0, pad)))
                valid.append(torch.arange(rows, device=dev) < k.shape[0])
            layers.append((torch.stack(ks), torch.stack(vs), torch.stack(valid)))
        x = [self.net.candidate_tokens(c) for c in cands]
        c_max = max(t.shape[0] for t in x)
        x_c = torch.stack([torch.cat([t, t[-1:].expand(c_max - t.shape[0], -1)]) for t in x])
        logits = self.net.score(layers, x_c).float()
        return [logits[i, : len(c)] for i, c in enumerate(cands)]

    def _check(self, kv: UserKV) -> None:
        if kv.fingerprint != self.fingerprint() or kv.model_version != self.version:
            raise IncompatibleKVError(
                f"UserKV is from {kv.model_version!r} ({kv.fingerprint}); this model is"
                f" {self.version!r} ({self.fingerprint()})"
            )
        if sorted(kv.layers) != list(range(self.cfg.n_layers)):
            raise IncompatibleKVError(f"UserKV holds layers {sorted(kv.layers)}")

    def _pack(
        self, layers: list[tuple[Tensor, Tensor]], length: int, increments: int, dtype: KVDType
    ) -> UserKV:
        return UserKV.build(
            model_version=self.version,
            fingerprint=self.fingerprint(),
            kv=dict(enumerate(layers)),
            length=length,
            kv_dtype=dtype,
            increments=increments,
        )


class ExtendableSASRec(SASRecRanker):
    """Positions from the oldest event: appended events leave earlier tokens as they were,
    so a cached user can be extended by computing only the new tokens."""

    def extend_is_exact(self, user_kv: UserKV, n_new: int) -> bool:
        # exact until the window slides: then every kept event's position moves down
        return user_kv.length + n_new <= self.cfg.window

    @torch.no_grad()
    def extend_user(self, user_kv: UserKV, new_events: UserInput) -> UserKV:
        self._check(user_kv)
        cfg, dev = self.cfg, self.device
        n_old, n_new = user_kv.length, len(new_events)
        ev = {name: t.to(dev) for name, t in new_events.events.items()}
        pos = torch.arange(n_old, n_old + n_new, device=dev).clamp_max(cfg.window - 1)
        x = self.net.event_tokens(ev["item_id"], ev["genre"], ev["rating"], pos)
        past = [user_kv.layers[i].dequantize(torch.float32) for i in range(cfg.n_layers)]
        layers = self.net.encode(x, [(k.to(dev), v.to(dev)) for k, v in past])
        length = min(n_old + n_new, cfg.window)
        # past the window (approximate mode only): keep the user row and the newest events
        layers = [
            (torch.cat([k[:1], k[-length:]]), torch.cat([v[:1], v[-length:]])) for k, v in layers
        ]
        return self._pack(layers, length, user_kv.increments + 1, user_kv.kv_dtype)


def build(config: Mapping[str, Any], version: str) -> SASRecRanker:
    """The ``kvrank.models`` entry point: a fresh model of ``config``."""
    cfg = SASRecConfig.model_validate(dict(config))
    if cfg.positions == "from_oldest":
        return ExtendableSASRec(cfg, version)
    return SASRecRanker(cfg, version)
