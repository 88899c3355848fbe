"""Building blocks of the ranker: RMSNorm, per-group transformer weights, masked attention.

Mixed parameterisation (OneTrans): all user-sequence tokens share one set of weights, while
each NS-token and candidate-token position owns its weights. :class:`GroupBlock` covers
both cases — ``positions=None`` is shared, ``positions=P`` holds a bank of P weight sets
applied as one batched matmul over the position axis (no Python loop over tokens); the
candidate path keeps its tokens position-major, ``[T, N, d]``, so that needs no copies.

Nothing here knows about caching; :mod:`kvrank.model.ranker` composes these blocks.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

NEG_INF = float("-inf")


def project(x: Tensor, w: Tensor, position_major: bool = False) -> Tensor:
    """``x @ w`` for shared weights ``[d, o]``; per-position ``[P, d, o]`` on ``x[..., P, d]``,
    or on ``x[P, N, d]`` when ``position_major`` (one batched matmul, no copies)."""
    if w.dim() == 2 or position_major:
        return x @ w
    return torch.einsum("...pd,pdo->...po", x, w)


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    var = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(var + eps)).to(x.dtype) * weight


class GroupBlock(nn.Module):
    """One layer's weights for one token group (pre-norm attention + FFN)."""

    def __init__(self, d: int, n_heads: int, ffn: int, positions: int | None) -> None:
        super().__init__()
        lead = () if positions is None else (positions,)
        self.n_heads = n_heads
        # fan-in scaled init; residual outputs start smaller so deep stacks stay stable
        std_in, std_out = d**-0.5, 0.5 * ffn**-0.5
        self.norm1 = nn.Parameter(torch.ones(*lead, d))
        self.wqkv = nn.Parameter(torch.randn(*lead, d, 3 * d) * std_in)
        self.wo = nn.Parameter(torch.randn(*lead, d, d) * 0.5 * std_in)
        self.norm2 = nn.Parameter(torch.ones(*lead, d))
        self.w1 = nn.Parameter(torch.randn(*lead, d, ffn) * std_in)
        self.w2 = nn.Parameter(torch.randn(*lead, ffn, d) * std_out)

    def qkv(self, x: Tensor, position_major: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys, values ``[..., T, H, dh]`` of tokens ``x[..., T, d]``; with
        ``position_major`` (per-position weights only) ``x`` is ``[T, N, d]`` and so are
        the results' leading axes."""
        norm = self._norm_weight(self.norm1, position_major)
        qkv = project(rms_norm(x, norm), self.wqkv, position_major)
        q, k, v = qkv.chunk(3, dim=-1)
        shape = (*x.shape[:-1], self.n_heads, x.shape[-1] // self.n_heads)
        return q.reshape(shape), k.reshape(shape), v.reshape(shape)

    def finish(self, x: Tensor, attn: Tensor, position_major: bool = False) -> Tensor:
        """Residual attention output, then residual FFN; ``attn`` is ``[..., T, H, dh]``
        (``[T, N, H, dh]`` with ``position_major``)."""
        h = x + project(attn.flatten(-2), self.wo, position_major)
        norm = self._norm_weight(self.norm2, position_major)
        ffn = F.gelu(project(rms_norm(h, norm), self.w1, position_major))
        return h + project(ffn, self.w2, position_major)

    @staticmethod
    def _norm_weight(weight: Tensor, position_major: bool) -> Tensor:
        # a per-position norm weight [P, d] broadcasts over x[P, N, d] as [P, 1, d]
        return weight[:, None] if position_major else weight


def alibi_slopes(n_heads: int) -> Tensor:
    """Per-head recency slopes (ALiBi): head h penalises distance by ``2**(-8(h+1)/H)``.

    Distances are between positions in the sequence, so the bias is the same whatever the
    padding, and appending events never changes the bias between earlier tokens — what
    keeps cached K/V exact. It is how candidates tell recent behaviour from old.
    """
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / n_heads) for h in range(n_heads)])


def attend(
    q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, slopes: Tensor, distance: Tensor
) -> Tensor:
    """Masked multi-head attention with a linear recency bias.

    ``q`` ``[B, Tq, H, dh]``, ``k``/``v`` ``[B, Tk, H, dh]``, ``allowed`` bool broadcastable
    to ``[B, Tq, Tk]``, ``distance`` ``[Tq, Tk]`` (query position − key position). Every
    query must be allowed at least one key (its own).
    """
    bias = -slopes.to(q.dtype)[:, None, None] * distance.to(q.dtype)[None]
    mask = torch.where(allowed[:, None], bias[None], torch.tensor(NEG_INF, dtype=q.dtype))
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask
    )
    return out.transpose(1, 2)


def causal_allowed(order_q: Tensor, order_k: Tensor, key_valid: Tensor) -> Tensor:
    """Which keys each query may see: earlier-or-equal order and a valid key, or itself.

    ``order_q`` ``[Tq]`` and ``order_k`` ``[Tk]`` are token positions in the full sequence;
    ``key_valid`` ``[B, Tk]`` masks padding. Returns bool ``[B, Tq, Tk]``.
    """
    earlier = order_k[None, :] <= order_q[:, None]
    itself = order_k[None, :] == order_q[:, None]
    return (earlier[None] & key_valid[:, None, :]) | itself[None]


class CandidateBias(NamedTuple):
    """Additive attention biases of candidate queries, built once per layer by
    :func:`candidate_bias`.

    The recency bias of candidate token t towards user row r is ``-slope·(R + t − r)``;
    it splits into ``user`` (``-slope·(R − r)``, ``-inf`` on padding) and ``row``
    (``-slope·t``), so the user-side bias is one row shared by every candidate token.
    """

    user: Tensor  # [B, H, 1, R]
    row: Tensor  # [H, T]
    self_: Tensor  # [H, T, T]: recency between a candidate's own tokens, -inf on later ones


def candidate_bias(user_valid: Tensor, t: int, slopes: Tensor) -> CandidateBias:
    """The biases of :class:`CandidateBias` for user rows ``user_valid [B, R]`` and
    ``t`` candidate tokens; candidate token t sits at position ``R + t`` after the user rows."""
    r, dev = user_valid.shape[1], user_valid.device
    pos_t = torch.arange(t, device=dev)
    slope = slopes.to(dev).float()[:, None]
    dist_user = (r - torch.arange(r, device=dev)).float()
    user = (-slope * dist_user)[None, :, None].expand(user_valid.shape[0], -1, -1, -1)
    user = user.masked_fill(~user_valid[:, None, None, :], NEG_INF)
    dist_self = (pos_t[:, None] - pos_t[None]).float()
    self_ = (-slope[:, :, None] * dist_self).masked_fill(dist_self < 0, NEG_INF)
    return CandidateBias(user, -slope * pos_t.float(), self_)


def attend_candidates(
    q: Tensor, k_self: Tensor, v_self: Tensor, k_user: Tensor, v_user: Tensor, bias: CandidateBias
) -> Tensor:
    """Candidate tokens attend to the shared user K/V and to their own earlier tokens.

    Candidate tensors are position-major, ``q``/``k_self``/``v_self`` ``[T, B, C, H, dh]``
    (the layout the per-position projections produce without copies); ``k_user``/``v_user``
    ``[B, R, H, dh]`` are shared by the C candidates (never copied). Returns
    ``[T, B, C, H, dh]``: one softmax over the joined key axis ``[user | self]``.

    Inference on a CPU runs PyTorch's fused attention kernel twice — every candidate
    token of the request against the user rows as one long query axis, then each
    candidate against its own tokens — and joins the two halves exactly through their
    log-sum-exps, never materialising the ``[C, H, T, R]`` scores. Anything that needs
    gradients, or another device, takes :func:`attend_candidates_reference`; tests hold
    the two to each other and to the full forward pass.
    """
    if q.device.type == "cpu" and _CPU_FLASH is not None and not torch.is_grad_enabled():
        return _attend_candidates_fused(q, k_self, v_self, k_user, v_user, bias)
    return attend_candidates_reference(q, k_self, v_self, k_user, v_user, bias)


def attend_candidates_reference(
    q: Tensor, k_self: Tensor, v_self: Tensor, k_user: Tensor, v_user: Tensor, bias: CandidateBias
) -> Tensor:
    """:func:`attend_candidates` written out with einsums and an fp32 softmax
    (differentiable, any device)."""
    q = q * (1.0 / math.sqrt(q.shape[-1]))  # scale the small tensor, not the scores
    bias_user = bias.user + bias.row[None, :, :, None]  # [B, H, T, R]
    s_user = torch.einsum("tbchd,brhd->bchtr", q, k_user).float() + bias_user[:, None]
    s_self = torch.einsum("tbchd,sbchd->bchts", q, k_self).float() + bias.self_
    p = torch.softmax(torch.cat([s_user, s_self], dim=-1), dim=-1).to(q.dtype)
    r = k_user.shape[1]
    p_user, p_self = p[..., :r], p[..., r:]
    return torch.einsum("bchtr,brhd->tbchd", p_user, v_user) + torch.einsum(
        "bchts,sbchd->tbchd", p_self, v_self
    )


# The CPU kernel behind scaled_dot_product_attention, called directly because it also
# returns each query's log-sum-exp, which is what joins two attention halves exactly.
_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _attend_candidates_fused(
    q: Tensor, k_self: Tensor, v_self: Tensor, k_user: Tensor, v_user: Tensor, bias: CandidateBias
) -> Tensor:
    assert _CPU_FLASH is not None
    t, _, c, h, dh = q.shape
    # biases stay fp32 whatever the compute dtype: the kernel takes them so, and a bf16
    # bias of a few hundred is off by a whole unit
    mask_self = bias.self_[None]  # [1, H, T, T], broadcast over candidates
    row = bias.row.t()[:, None]  # [T, 1, H]
    out = []
    for b in range(q.shape[1]):  # users of a micro-batch; one in the serving path
        # user half: the T·C candidate tokens are one query axis against the R user rows
        q_all = q[:, b].reshape(t * c, h, dh).transpose(0, 1)[None]  # [1, H, T·C, dh]
        o_user, lse_user = _CPU_FLASH(
            q_all,
            k_user[b].transpose(0, 1)[None],
            v_user[b].transpose(0, 1)[None],
            attn_mask=bias.user[b, None],  # [1, H, 1, R]: one row for all
        )[:2]
        # the kernel saw every token with token 0's bias; a per-row constant leaves that
        # half's softmax unchanged and moves its log-sum-exp by the row's offset
        lse_user = lse_user[0].view(h, t, c).permute(1, 2, 0) + row  # [T, C, H]
        # self half: each candidate's T tokens against themselves, [C, H, T, dh] views
        o_self, lse_self = _CPU_FLASH(
            q[:, b].permute(1, 2, 0, 3),
            k_self[:, b].permute(1, 2, 0, 3),
            v_self[:, b].permute(1, 2, 0, 3),
            attn_mask=mask_self,
        )[:2]
        lse_self = lse_self.permute(2, 0, 1)  # [T, C, H]
        lse = torch.logaddexp(lse_user, lse_self)
        w_user = torch.exp(lse_user - lse).unsqueeze(-1).to(q.dtype)
        w_self = torch.exp(lse_self - lse).unsqueeze(-1).to(q.dtype)
        o_user = o_user[0].view(h, t, c, dh).permute(1, 2, 0, 3)  # [T, C, H, dh]
        out.append(o_user * w_user + o_self.permute(2, 0, 1, 3) * w_self)
    return out[0][:, None] if len(out) == 1 else torch.stack(out, dim=1)
