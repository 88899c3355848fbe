"""Building blocks of the ranker: RMSNorm, per-group transformer weights, masked attention.

Mixed parameterisation (OneTrans): all user-sequence tokens share one set of weights, while
each NS-token and candidate-token position owns its weights. :class:`GroupBlock` covers
both cases — ``positions=None`` is shared, ``positions=P`` holds a bank of P weight sets
applied with one einsum over the position axis (no Python loop over tokens).

Nothing here knows about caching; :mod:`kvrank.model.ranker` composes these blocks.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

NEG_INF = float("-inf")


def project(x: Tensor, w: Tensor) -> Tensor:
    """``x @ w`` for shared weights ``[d, o]``; per-position ``[P, d, o]`` on ``x[..., P, d]``."""
    if w.dim() == 2:
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

    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys, values ``[..., T, H, dh]`` of tokens ``x[..., T, d]``."""
        qkv = project(rms_norm(x, self.norm1), self.wqkv)
        q, k, v = qkv.chunk(3, dim=-1)
        shape = (*x.shape[:-1], self.n_heads, x.shape[-1] // self.n_heads)
        return q.reshape(shape), k.reshape(shape), v.reshape(shape)

    def finish(self, x: Tensor, attn: Tensor) -> Tensor:
        """Residual attention output, then residual FFN; ``attn`` is ``[..., T, H, dh]``."""
        h = x + project(attn.flatten(-2), self.wo)
        return h + project(F.gelu(project(rms_norm(h, self.norm2), self.w1)), self.w2)


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


def candidate_bias(user_valid: Tensor, t: int, slopes: Tensor) -> tuple[Tensor, Tensor]:
    """Additive attention biases for candidate queries (computed once per layer).

    Returns ``[B, H, T, R]`` towards the R user rows (recency slope, ``-inf`` on padding)
    and ``[H, T, T]`` towards the candidate's own tokens (recency, ``-inf`` on later ones).
    Candidate token t sits at position ``R + t`` after the user rows.
    """
    r, dev = user_valid.shape[1], user_valid.device
    pos_t = torch.arange(t, device=dev)
    slope = slopes.to(dev).float()[:, None, None]
    dist_user = ((r + pos_t)[:, None] - torch.arange(r, device=dev)[None]).float()
    bias_user = (-slope * dist_user)[None].expand(user_valid.shape[0], -1, -1, -1)
    bias_user = bias_user.masked_fill(~user_valid[:, None, None, :], NEG_INF)
    dist_self = (pos_t[:, None] - pos_t[None]).float()
    bias_self = (-slope * dist_self).masked_fill(dist_self < 0, NEG_INF)
    return bias_user, bias_self


def attend_candidates(
    q: Tensor,
    k_self: Tensor,
    v_self: Tensor,
    k_user: Tensor,
    v_user: Tensor,
    bias_user: Tensor,
    bias_self: Tensor,
) -> Tensor:
    """Candidate tokens attend to the shared user K/V and to their own earlier tokens.

    ``q``/``k_self``/``v_self`` ``[B, C, T, H, dh]``; ``k_user``/``v_user`` ``[B, R, H, dh]``
    are broadcast over the C candidates (never copied); biases from :func:`candidate_bias`.
    Returns ``[B, C, T, H, dh]``. Softmax runs in fp32 over the joined key axis; every
    elementwise pass over the ``[B, C, H, T, R]`` scores is kept to one add.
    """
    q = q * (1.0 / math.sqrt(q.shape[-1]))  # scale the small tensor, not the scores
    s_user = torch.einsum("bcthd,brhd->bchtr", q, k_user).float() + bias_user[:, None]
    s_self = torch.einsum("bcthd,bcshd->bchts", q, k_self).float() + bias_self
    p = torch.softmax(torch.cat([s_user, s_self], dim=-1), dim=-1).to(q.dtype)
    r = k_user.shape[1]
    p_user, p_self = p[..., :r], p[..., r:]
    return torch.einsum("bchtr,brhd->bcthd", p_user, v_user) + torch.einsum(
        "bchts,bcshd->bcthd", p_self, v_self
    )
