"""Analytical FLOP counts of each scoring mode (multiply-add = 2 FLOPs).

Counts the projections, FFN and attention matmuls that dominate; embeddings, norms and
softmax are left out. Used to report how much compute the cache removes, independently of
how fast a given machine happens to run it.
"""

from __future__ import annotations

from kvrank.model.config import ModelConfig


def _token_linear(cfg: ModelConfig) -> int:
    d, f = cfg.d_model, cfg.ffn_mult * cfg.d_model
    return 2 * (4 * d * d + 2 * d * f)


def _attention(cfg: ModelConfig, queries: int, keys: int) -> int:
    return 4 * queries * keys * cfg.d_model  # QK^T and PV


def encode_flops(cfg: ModelConfig) -> int:
    """One user's encode: every entering token's K/V, kept tokens' outputs."""
    d, total = cfg.d_model, 0
    for layer in range(cfg.n_layers):
        rows = cfg.entering(layer) + cfg.ns_tokens
        total += rows * 2 * 3 * d * d  # QKV of every entering token
        if layer < cfg.n_layers - 1:
            q = cfg.kept(layer) + cfg.ns_tokens
            total += q * (_token_linear(cfg) - 2 * 3 * d * d) + _attention(cfg, q, rows)
    return total


def score_flops(cfg: ModelConfig, candidates: int) -> int:
    """Scoring C candidates against cached user K/V."""
    t, total = cfg.cand_tokens, 0
    for layer in range(cfg.first_candidate_layer, cfg.n_layers):
        keys = cfg.entering(layer) + cfg.ns_tokens + t
        total += candidates * (t * _token_linear(cfg) + _attention(cfg, t, keys))
    return total


def full_flops(cfg: ModelConfig, candidates: int) -> int:
    """No cache: every candidate pays the whole user side again."""
    per = encode_flops(cfg) + score_flops(cfg, 1)
    # the full path also computes user outputs at the top layer
    top = cfg.n_layers - 1
    q = cfg.kept(top) + cfg.ns_tokens
    per += q * (_token_linear(cfg) - 6 * cfg.d_model**2) + _attention(
        cfg, q, cfg.entering(top) + cfg.ns_tokens
    )
    return candidates * per


def extend_flops(cfg: ModelConfig, new_events: int) -> int:
    """Appending ``new_events``: the new tokens and the NS tokens, at every layer."""
    total = 0
    for layer in range(cfg.n_layers):
        rows = cfg.entering(layer) + cfg.ns_tokens
        q = min(new_events, cfg.entering(layer)) + cfg.ns_tokens
        total += q * _token_linear(cfg) + _attention(cfg, q, rows)
    return total
