"""The cacheable causal ranker: ``encode_user``, ``extend_user``, ``score``, ``forward_full``.

Token order is ``[user sequence | user NS tokens | candidate tokens]`` under one causal
mask, so the user-side K/V never depend on a candidate. The cached path encodes the user
once (:meth:`RankerModel.encode_user`) and scores all C candidates in one batched pass
against those K/V (:meth:`RankerModel.score`). :meth:`RankerModel.forward_full` is the
no-cache reference: every candidate's whole sequence through the whole model, built from
one generic causal mask — tests hold the cached path to it.

The user side is left-padded to ``max_events``; padding keys are masked, and there are no
absolute positions (order comes from the causal mask and time-gap buckets), so a user's
tokens do not depend on how much padding precedes them and appended events leave earlier
tokens unchanged. This module does no caching and no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, cast

import torch
from torch import Tensor, nn

from kvrank.errors import IncompatibleKVError
from kvrank.model.config import KVDType, ModelConfig
from kvrank.model.embed import FeatureEmbedder
from kvrank.model.inputs import Candidates, Events, UserFeatures
from kvrank.model.kv import TORCH_DTYPES, UserKV
from kvrank.model.layers import (
    CandidateBias,
    GroupBlock,
    alibi_slopes,
    attend,
    attend_candidates,
    candidate_bias,
    causal_allowed,
    rms_norm,
)

KVLayers = dict[int, tuple[Tensor, Tensor, Tensor]]  # layer -> (k, v, key_valid), batched

SCORE_CHUNK = 128
"""Candidates per pass in :meth:`RankerModel.score` on a CPU."""

GPU_SCORE_CHUNK = 1024
"""The same on a GPU, where each pass is one more round of ~300 kernel launches and the
scores of C = 1,024 against a full production window take ~400 MB (one pass instead of two
at C = 200 measured 7.4 against 11.6 ms on an H200)."""

FULL_CHUNK = 32
"""Sequences per batch in the batched no-cache reference."""

NS_INPUT = "ns_input"
"""The extra a ``UserKV`` of this model keeps: its NS tokens' inputs (for ``extend_user``)."""

DEFAULT_REFRESH_EVERY = 50
"""Full re-encode after this many ``extend_user`` calls (see docs/benchmarks.md, drift)."""


@dataclass(frozen=True)
class PassBuffers:
    """The inputs of a scoring pass of fixed shape: ``users`` users' whole windows of K/V
    (``layers``: per scoring layer K and V ``[users, rows, H, dh]`` and which rows hold a
    key, ``[users, rows]``) and ``[users, candidates, T, d]`` candidate tokens. What a CUDA
    graph replays reads them (see :mod:`kvrank.model.graphs`)."""

    layers: KVLayers
    x: Tensor

    @property
    def users(self) -> int:
        return int(self.x.shape[0])

    @property
    def candidates(self) -> int:
        return int(self.x.shape[1])


class RankerModel(nn.Module):
    """OneTrans-style ranker whose user side can be cached and extended."""

    def __init__(self, cfg: ModelConfig, version: str = "dev") -> None:
        super().__init__()
        self.cfg = cfg
        self.version = version
        d, h, f = cfg.d_model, cfg.n_heads, cfg.ffn_mult * cfg.d_model
        self.embed = FeatureEmbedder(cfg)
        self.seq_blocks = nn.ModuleList(GroupBlock(d, h, f, None) for _ in range(cfg.n_layers))
        self.ns_blocks = nn.ModuleList(
            GroupBlock(d, h, f, cfg.ns_tokens) for _ in range(cfg.n_layers)
        )
        n_cand = cfg.n_layers - cfg.first_candidate_layer
        self.cand_blocks = nn.ModuleList(
            GroupBlock(d, h, f, cfg.cand_tokens) for _ in range(n_cand)
        )
        self.final_norm = nn.Parameter(torch.ones(d))
        self.heads = nn.ModuleDict({"ctr": nn.Linear(d, 1)})
        self.slopes: Tensor
        self.register_buffer("slopes", alibi_slopes(h), persistent=False)
        self.to(TORCH_DTYPES[cfg.compute_dtype])

    @property
    def device(self) -> torch.device:
        return self.final_norm.device

    @property
    def dtype(self) -> torch.dtype:
        return self.final_norm.dtype

    # ----------------------------------------------------------------- public API
    @torch.no_grad()
    def encode_user(
        self,
        user: UserFeatures,
        kv_dtype: KVDType | None = None,
        layers: Literal["all", "scoring"] = "all",
        *,
        checked: bool = False,
    ) -> UserKV:
        """Compute the user's K/V. ``layers="scoring"`` keeps only the layers candidates
        attend to (smallest entry; such a ``UserKV`` cannot be extended). ``checked``: the
        input was checked already (the serving path checks each request once, against the
        feature spec), so it is not checked again here; every public method takes it."""
        if not checked:
            user.validate(self.cfg)
        x_seq, valid, x_ns = self._user_tokens(user)
        keep = range(self.cfg.n_layers) if layers == "all" else self._candidate_layer_ids()
        kv = self._encode(x_seq, valid, x_ns, set(keep))
        return self._pack(kv, kv_dtype, min(len(user.events), self.cfg.max_events), 0, x_ns[0])

    @torch.no_grad()
    def extend_user(self, user_kv: UserKV, new_events: Events, *, checked: bool = False) -> UserKV:
        """Append ``new_events`` to a cached user, computing only the new tokens.

        Exact when :meth:`extend_is_exact` says so; otherwise earlier tokens keep K/V that
        still reflect events a window has dropped since (a bounded drift: the serving default
        encodes in full instead).
        """
        self.check_kv(user_kv)
        if len(user_kv.layers) != self.cfg.n_layers:
            raise IncompatibleKVError(
                "this UserKV holds only the scoring layers; extend_user needs all layers"
            )
        if not checked:
            new_events.validate(self.cfg, "new_events")
        cfg = self.cfg
        x_new = self.embed.events(*self._event_tensors(new_events))[None, -cfg.max_events :]
        x_ns = user_kv.extras[NS_INPUT].to(self.device, self.dtype)[None]
        length = min(user_kv.length + len(new_events), cfg.max_events)
        out: KVLayers = {}
        for layer in range(cfg.n_layers):
            r, q_l, k_l = cfg.entering(layer), cfg.kept(layer), x_new.shape[1]
            old_k, old_v = user_kv.layers[layer].dequantize(self.dtype)
            seq_blk, ns_blk = self._seq(layer), self._ns(layer)
            qs, ks, vs = seq_blk.qkv(x_new)
            qn, kn, vn = ns_blk.qkv(x_ns)
            k = torch.cat([old_k[None, k_l:r].to(self.device), ks, kn], dim=1)
            v = torch.cat([old_v[None, k_l:r].to(self.device), vs, vn], dim=1)
            valid = self._key_valid(layer, length)
            out[layer] = (k, v, valid)
            if layer == cfg.n_layers - 1:
                break
            m = min(k_l, q_l)  # new tokens that stay for the next layer
            q = torch.cat([qs[:, k_l - m :], qn], dim=1)
            a = self._attend(q, k, v, r - m, valid)
            x_new = seq_blk.finish(x_new[:, k_l - m :], a[:, :m])
            x_ns = ns_blk.finish(x_ns, a[:, m:])
        ns_input = user_kv.extras[NS_INPUT]
        return self._pack(out, user_kv.kv_dtype, length, user_kv.increments + 1, ns_input)

    @torch.no_grad()
    def score(self, user_kv: UserKV, candidates: Candidates, *, checked: bool = False) -> Tensor:
        """CTR logits ``[C]`` for all candidates in one batched pass over the cached K/V."""
        self.check_kv(user_kv)
        if not checked:
            candidates.validate(self.cfg)
        layers = self._scoring_layers([user_kv])
        x_c = self.embed.candidates(*self._cand_tensors(candidates))[None]
        # chunks keep the [chunk, H, T, R] attention scores cache-sized: same numbers, faster
        # on CPUs once C × R grows (candidates never see each other, so this is exact)
        biases = self._candidate_biases(layers)  # the user's, shared by every chunk
        chunk = SCORE_CHUNK if x_c.device.type == "cpu" else GPU_SCORE_CHUNK
        parts = [
            self._score(layers, x_c[:, i : i + chunk], biases)[0]
            for i in range(0, x_c.shape[1], chunk)
        ]
        return torch.cat(parts).float()

    @torch.no_grad()
    def score_many(
        self, requests: list[tuple[UserKV, Candidates]], *, checked: bool = False
    ) -> list[Tensor]:
        """Score several users' requests in one batched pass (micro-batching on GPUs).

        User K/V have one shape per model, so they stack; candidate lists are padded to the
        longest by repeating their last candidate, and the padding's scores are dropped.
        Every candidate only attends to its own user and itself, so results equal
        :meth:`score` per request.
        """
        for kv, cands in requests:
            self.check_kv(kv)
            if not checked:
                cands.validate(self.cfg)
        layers = self._scoring_layers([kv for kv, _ in requests])
        c_max = max(len(c) for _, c in requests)
        x_c = torch.stack([self._padded_candidates(c, c_max) for _, c in requests])
        logits = self._score(layers, x_c).float()
        return [logits[i, : len(c)] for i, (_, c) in enumerate(requests)]

    def pass_buffers(self, users: int, candidates: int) -> PassBuffers:
        """Empty :class:`PassBuffers` for ``users`` × ``candidates``, on this model's device."""
        cfg, dt, dev = self.cfg, self.dtype, self.device
        layers: KVLayers = {}
        for layer in self._candidate_layer_ids():
            shape = (users, cfg.entering(layer) + cfg.ns_tokens, cfg.n_heads, cfg.head_dim)
            layers[layer] = (
                torch.zeros(shape, dtype=dt, device=dev),
                torch.zeros(shape, dtype=dt, device=dev),
                torch.ones(shape[:2], dtype=torch.bool, device=dev),
            )
        x = torch.zeros(users, candidates, cfg.cand_tokens, cfg.d_model, dtype=dt, device=dev)
        return PassBuffers(layers, x)

    @torch.no_grad()
    def fill_pass(self, requests: list[tuple[UserKV, Candidates]], into: PassBuffers) -> None:
        """Copy ``requests`` into ``into`` (at most its users, none with more candidates):
        each user's whole window of K/V and its candidate tokens, the candidates padded by
        repeating the last (as :meth:`score_many` pads). Rows past the requests keep what
        they held (zeros, or an earlier pass's users): a candidate attends to its own user
        only, so they change no request's scores, and theirs are dropped."""
        b, width = len(requests), into.candidates
        for kv, _ in requests:
            self.check_kv(kv)
        lengths = torch.tensor([kv.length for kv, _ in requests], device=self.device)
        for layer, (k_in, v_in, valid_in) in into.layers.items():
            kvs = [kv.layers[layer].dequantize(self.dtype) for kv, _ in requests]
            torch.stack([k.to(self.device) for k, _ in kvs], out=k_in[:b])
            torch.stack([v.to(self.device) for _, v in kvs], out=v_in[:b])
            r = self.cfg.entering(layer)
            rows = torch.arange(valid_in.shape[1], device=self.device)
            torch.ge(rows[None], (r - lengths.clamp(max=r))[:, None], out=valid_in[:b])
        torch.stack([self._padded_candidates(c, width) for _, c in requests], out=into.x[:b])

    def pass_logits(self, buffers: PassBuffers) -> Tensor:
        """Logits ``[users, candidates]`` of the pass in ``buffers`` (no copies, no host
        work: what a CUDA graph captures)."""
        return self._score(buffers.layers, buffers.x)

    def _scoring_layers(self, kvs: list[UserKV]) -> KVLayers:
        """The scoring layers' user K/V of ``kvs``, stacked, from the first row any of them
        fills: rows before it are padding for every user, masked keys that would add
        nothing, so candidates skip them (exact, and a short history scores faster)."""
        layers: KVLayers = {}
        for layer in self._candidate_layer_ids():
            r = self.cfg.entering(layer)
            start = r - max(min(kv.length, r) for kv in kvs)
            ks, vs, valids = [], [], []
            for kv in kvs:
                k, v = kv.layers[layer].dequantize(self.dtype)
                ks.append(k[start:].to(self.device))
                vs.append(v[start:].to(self.device))
                valids.append(self._key_valid(layer, kv.length)[:, start:])
            layers[layer] = (torch.stack(ks), torch.stack(vs), torch.cat(valids))
        return layers

    def _padded_candidates(self, cands: Candidates, length: int) -> Tensor:
        x = self.embed.candidates(*self._cand_tensors(cands))
        if x.shape[0] == length:
            return x
        return torch.cat([x, x[-1:].expand(length - x.shape[0], -1, -1)])

    @torch.no_grad()
    def forward_full(
        self,
        user: UserFeatures,
        candidates: Candidates,
        batched: bool = True,
        *,
        checked: bool = False,
    ) -> Tensor:
        """No-cache reference logits ``[C]``: each candidate's full sequence
        ``[user | candidate]`` through the whole model, batched (what serving without a
        cache does: the strongest no-cache baseline). ``batched=False`` runs the C sequences
        one after another (a benchmark mode only)."""
        if not checked:
            user.validate(self.cfg)
            candidates.validate(self.cfg)
        # no padding: every sequence of the request has this user's length, so nothing
        # pads it to the window (what a tuned no-cache server does; the scores are the same)
        x_seq, valid, x_ns = self._user_tokens(user, pad=False)
        x_c = self.embed.candidates(*self._cand_tensors(candidates))
        if not batched:
            return torch.cat(
                [self._full(x_seq, valid, x_ns, x_c[i : i + 1]) for i in range(len(candidates))]
            ).float()
        # at most FULL_CHUNK sequences at a time: the baseline's attention scores grow as
        # C × N², which would not fit in memory at the brief's sizes
        out = []
        for i in range(0, len(candidates), FULL_CHUNK):
            part = x_c[i : i + FULL_CHUNK]
            c = part.shape[0]
            out.append(
                self._full(
                    x_seq.expand(c, -1, -1), valid.expand(c, -1), x_ns.expand(c, -1, -1), part
                )
            )
        return torch.cat(out).float()

    def check_kv(self, user_kv: UserKV) -> None:
        """Raise ``IncompatibleKVError`` unless ``user_kv`` came from this model."""
        cfg = self.cfg
        if user_kv.fingerprint != cfg.fingerprint() or user_kv.model_version != self.version:
            raise IncompatibleKVError(
                f"UserKV is from model {user_kv.model_version!r} (config"
                f" {user_kv.fingerprint}); this model is {self.version!r} ({cfg.fingerprint()})"
            )
        for layer in self._candidate_layer_ids():
            if layer not in user_kv.layers:
                raise IncompatibleKVError(f"UserKV lacks layer {layer} that scoring needs")
        for layer, lk in user_kv.layers.items():
            expected = (cfg.entering(layer) + cfg.ns_tokens, cfg.n_heads, cfg.head_dim)
            # V too: the fused attention reads V by K's shape, so a V of another head count
            # would be read past its end (wrong scores, NaN), not refused
            if tuple(lk.k.shape) != expected or tuple(lk.v.shape) != expected:
                raise IncompatibleKVError(
                    f"UserKV layer {layer} has K {tuple(lk.k.shape)}, V {tuple(lk.v.shape)};"
                    f" expected {expected}"
                )
        if not 1 <= user_kv.length <= cfg.max_events:
            raise IncompatibleKVError(
                f"UserKV length {user_kv.length} outside [1, {cfg.max_events}]"
            )

    def extend_is_exact(self, user_kv: UserKV, n_new: int) -> bool:
        """Whether :meth:`extend_user` with ``n_new`` events gives the K/V a full encode of
        the longer history gives (fp32: within rounding).

        Rows reused at a layer are projections of that layer's inputs, which were computed
        when the old tokens attended over every layer below; those inputs are still right
        unless some lower layer's window slid since, dropping events the old tokens had
        attended to. So: exact unless a layer whose window now holds more events than it
        admits (``length + n_new > entering(layer)``) lies below a layer that reuses rows
        (one admitting more than the ``n_new`` new tokens). Windows at the top layer may
        slide freely; a one-layer model is always exact; a pyramid is exact while each
        window below the deepest reusing layer still holds the whole history.
        """
        total = user_kv.length + n_new
        slid_below = False
        for layer in range(self.cfg.n_layers):
            window = self.cfg.entering(layer)
            if slid_below and window > n_new:
                return False
            slid_below = slid_below or total > window
        return True

    @staticmethod
    def refresh_due(user_kv: UserKV, refresh_every: int = DEFAULT_REFRESH_EVERY) -> bool:
        """True when the next update should be a full re-encode to bound drift."""
        return user_kv.increments >= refresh_every

    # ------------------------------------------------------ batched internals
    def user_tokens_batch(self, users: list[UserFeatures]) -> tuple[Tensor, Tensor, Tensor]:
        """Left-padded sequence tokens ``[B, N, d]``, validity ``[B, N]``, NS ``[B, ns, d]``."""
        n_max, dev = self.cfg.max_events, self.device
        lengths = [min(len(u.events), n_max) for u in users]

        def padded(get: Callable[[Events], Tensor]) -> Tensor:
            rows = []
            for u, n in zip(users, lengths, strict=True):
                t = get(u.events)[-n_max:]
                pad = torch.zeros((n_max - n, *t.shape[1:]), dtype=t.dtype)
                rows.append(torch.cat([pad, t]))
            return torch.stack(rows).to(dev)

        x_seq = self.embed.events(
            padded(lambda e: e.item_ids),
            padded(lambda e: e.categories),
            padded(lambda e: e.actions),
            padded(lambda e: e.gaps),
            padded(lambda e: e.dense),
        )
        valid = (
            torch.arange(n_max, device=dev)[None]
            >= n_max - torch.tensor(lengths, device=dev)[:, None]
        )
        x_ns = self.embed.ns(
            torch.stack([u.profile_ids for u in users]).to(dev),
            torch.stack([u.context_ids for u in users]).to(dev),
            torch.stack([u.dense for u in users]).to(dev),
        )
        return x_seq, valid, x_ns

    def encode_batch(self, x_seq: Tensor, valid: Tensor, x_ns: Tensor) -> KVLayers:
        """Scoring-layer K/V of B users (differentiable; used by training)."""
        return self._encode(x_seq, valid, x_ns, set(self._candidate_layer_ids()))

    def score_batch(self, layers: KVLayers, x_c: Tensor) -> Tensor:
        """Logits ``[B, C]`` of candidate tokens ``x_c [B, C, T, d]`` (differentiable)."""
        return self._score(layers, x_c)

    def _seq(self, layer: int) -> GroupBlock:
        return cast(GroupBlock, self.seq_blocks[layer])

    def _ns(self, layer: int) -> GroupBlock:
        return cast(GroupBlock, self.ns_blocks[layer])

    def _cand(self, index: int) -> GroupBlock:
        return cast(GroupBlock, self.cand_blocks[index])

    def _candidate_layer_ids(self) -> range:
        return range(self.cfg.first_candidate_layer, self.cfg.n_layers)

    def _event_tensors(self, ev: Events) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        dev = self.device
        return (
            ev.item_ids.to(dev),
            ev.categories.to(dev),
            ev.actions.to(dev),
            ev.gaps.to(dev),
            ev.dense.to(dev),
        )

    def _cand_tensors(self, c: Candidates) -> tuple[Tensor, Tensor, Tensor]:
        return c.item_ids.to(self.device), c.categories.to(self.device), c.dense.to(self.device)

    def _user_tokens(self, user: UserFeatures, pad: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        """Sequence tokens ``[1, N, d]`` of the last ``max_events`` events, left-padded to
        the window unless ``pad`` is off; their validity ``[1, N]``; NS tokens ``[1, ns, d]``."""
        n_max, dev = self.cfg.max_events, self.device
        events = user.events.slice(-n_max)
        tokens = self.embed.events(*self._event_tensors(events))
        n = tokens.shape[0]
        width = n_max if pad else n
        x_seq = torch.cat([tokens.new_zeros(width - n, tokens.shape[1]), tokens])[None]
        valid = (torch.arange(width, device=dev) >= width - n)[None]
        x_ns = self.embed.ns(
            user.profile_ids.to(dev), user.context_ids.to(dev), user.dense.to(dev)
        )[None]
        return x_seq, valid, x_ns

    def _key_valid(self, layer: int, length: int) -> Tensor:
        r = self.cfg.entering(layer)
        rows = torch.arange(r + self.cfg.ns_tokens, device=self.device)
        return (rows >= r - min(length, r))[None]

    def _encode(self, x_seq: Tensor, valid: Tensor, x_ns: Tensor, keep: set[int]) -> KVLayers:
        cfg, out = self.cfg, {}
        b, dev = x_seq.shape[0], x_seq.device
        for layer in range(cfg.n_layers):
            r, q_l = x_seq.shape[1], cfg.kept(layer)
            qs, ks, vs = self._seq(layer).qkv(x_seq)
            qn, kn, vn = self._ns(layer).qkv(x_ns)
            k, v = torch.cat([ks, kn], dim=1), torch.cat([vs, vn], dim=1)
            key_valid = torch.cat(
                [valid, torch.ones(b, cfg.ns_tokens, dtype=torch.bool, device=dev)], 1
            )
            if layer in keep:
                out[layer] = (k, v, key_valid)
            if layer == cfg.n_layers - 1:
                break  # the user side's top-layer outputs are never used
            a = self._attend(torch.cat([qs[:, r - q_l :], qn], dim=1), k, v, r - q_l, key_valid)
            x_seq = self._seq(layer).finish(x_seq[:, r - q_l :], a[:, :q_l])
            x_ns = self._ns(layer).finish(x_ns, a[:, q_l:])
            valid = valid[:, r - q_l :]
        return out

    def _candidate_biases(self, layers: KVLayers) -> dict[int, CandidateBias]:
        """Per scoring layer, the attention biases of candidate tokens towards its user rows."""
        t = self.cfg.cand_tokens
        return {i: candidate_bias(valid, t, self.slopes) for i, (_, _, valid) in layers.items()}

    def _score(
        self, layers: KVLayers, x_c: Tensor, biases: dict[int, CandidateBias] | None = None
    ) -> Tensor:
        """Logits ``[B, C]`` of candidate tokens ``x_c [B, C, T, d]``.

        The candidate tokens go through the layers position-major, ``[T, B·C, d]``: every
        candidate token position has its own weights, and in that layout each projection is
        one batched matmul over the positions with no copies in between.
        """
        first = self.cfg.first_candidate_layer
        b, c, t, d = x_c.shape
        biases = biases or self._candidate_biases(layers)
        x = x_c.permute(2, 0, 1, 3).reshape(t, b * c, d)
        for i in range(len(self.cand_blocks)):
            blk = self._cand(i)
            k_user, v_user, _ = layers[first + i]
            q, k_c, v_c = (y.view(t, b, c, *y.shape[2:]) for y in blk.qkv(x, True))
            a = attend_candidates(q, k_c, v_c, k_user, v_user, biases[first + i])
            x = blk.finish(x, a.reshape(t, b * c, *a.shape[3:]), True)
        return self._head(x, token_dim=0).view(b, c)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, first_q: int, key_valid: Tensor) -> Tensor:
        """Causal attention where the queries are the key positions from ``first_q`` on.

        Keys sit at positions ``0..Tk-1`` (padding masked by ``key_valid [B, Tk]``); the
        queries are the last ``Tq`` of them, i.e. positions ``first_q..Tk-1``.
        """
        dev, n_k = q.device, k.shape[1]
        order_q = torch.arange(first_q, n_k, device=dev)
        order_k = torch.arange(n_k, device=dev)
        assert order_q.numel() == q.shape[1]
        allowed = causal_allowed(order_q, order_k, key_valid)
        return attend(q, k, v, allowed, self.slopes, order_q[:, None] - order_k[None])

    def _head(self, x_c: Tensor, token_dim: int = -2) -> Tensor:
        """Logits from candidate tokens pooled over ``token_dim``."""
        pooled = rms_norm(x_c, self.final_norm).mean(dim=token_dim)
        logits: Tensor = self.heads["ctr"](pooled)
        return logits.squeeze(-1)

    def _full(self, x_seq: Tensor, valid: Tensor, x_ns: Tensor, x_c: Tensor) -> Tensor:
        """One whole sequence per batch row: ``[seq | ns | candidate]`` (the reference)."""
        cfg, b, dev = self.cfg, x_seq.shape[0], x_seq.device
        t, ns, first = cfg.cand_tokens, cfg.ns_tokens, cfg.first_candidate_layer
        for layer in range(cfg.n_layers):
            # an unpadded sequence may be shorter than the layer's window
            r = x_seq.shape[1]
            q_l = min(cfg.kept(layer), r)
            with_cand = layer >= first
            groups = [(self._seq(layer), x_seq), (self._ns(layer), x_ns)]
            if with_cand:
                groups.append((self._cand(layer - first), x_c))
            qkv = [blk.qkv(x) for blk, x in groups]
            k = torch.cat([p[1] for p in qkv], dim=1)
            v = torch.cat([p[2] for p in qkv], dim=1)
            n_tail = ns + (t if with_cand else 0)
            key_valid = torch.cat([valid, torch.ones(b, n_tail, dtype=torch.bool, device=dev)], 1)
            q = torch.cat([qkv[0][0][:, r - q_l :], *[p[0] for p in qkv[1:]]], dim=1)
            a = self._attend(q, k, v, r - q_l, key_valid)
            x_seq = self._seq(layer).finish(x_seq[:, r - q_l :], a[:, :q_l])
            x_ns = self._ns(layer).finish(x_ns, a[:, q_l : q_l + ns])
            if with_cand:
                x_c = self._cand(layer - first).finish(x_c, a[:, q_l + ns :])
            valid = valid[:, r - q_l :]
        return self._head(x_c)

    def _pack(
        self,
        layers: KVLayers,
        kv_dtype: KVDType | None,
        length: int,
        increments: int,
        ns_input: Tensor,
    ) -> UserKV:
        return UserKV.build(
            model_version=self.version,
            fingerprint=self.cfg.fingerprint(),
            kv={i: (k[0], v[0]) for i, (k, v, _) in layers.items()},
            length=length,
            kv_dtype=kv_dtype or self.cfg.compute_dtype,
            increments=increments,
            extras={NS_INPUT: ns_input},
        )
