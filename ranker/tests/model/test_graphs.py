"""Bucketed scoring passes (what CUDA graphs replay): padded to a bucket of users and
candidates, whole windows of K/V copied in — and scored as ``score_many`` scores, within the
model contract. Run eagerly from the same buffers here (no GPU): everything but the capture."""

from __future__ import annotations

import pytest
import torch

from kvrank.errors import IncompatibleKVError
from kvrank.model.checks import EXACT_TOLERANCE
from kvrank.model.config import TINY
from kvrank.model.graphs import CANDIDATE_BUCKETS, BucketedPasses, bucket

PYRAMID = TINY.model_copy(update={"pyramid": (32, 16, 8), "candidate_layers": 2})
"""Windows that shrink by layer: each scoring layer's buffers have their own rows."""


@pytest.mark.parametrize("cfg", [TINY, PYRAMID], ids=["tiny", "pyramid"])
def test_a_bucketed_pass_scores_each_request_as_score_many_does(factory, cfg) -> None:
    """Three users (padded to four) with histories of 2 to 32 events (rows before a short
    one are masked keys in the whole window) and 1 to 37 candidates (padded to 64)."""
    net = factory.model(cfg, seed=3, version="graphs")
    requests = [
        (net.encode_user(factory.user(cfg, n, i)), factory.candidates(cfg, c, i))
        for i, (n, c) in enumerate([(2, 37), (32, 1), (11, 20)])
    ]
    passes = BucketedPasses(net)
    assert not passes.capture  # on a CPU: the same buffers, run eagerly
    got = passes.score_many(requests)
    want = net.score_many(requests)
    for g, w, (_, cands) in zip(got, want, requests, strict=True):
        assert g.shape == (len(cands),) and g.dtype == torch.float32
        assert torch.allclose(g, w, rtol=0, atol=EXACT_TOLERANCE), (g - w).abs().max()


def test_a_bucket_used_again_holds_nothing_of_its_last_pass(factory) -> None:
    """The same bucket, first for long histories, then for short ones and fewer users:
    the second pass's scores are its own (no row of the first is still read)."""
    net = factory.model(TINY, seed=4, version="graphs")
    passes = BucketedPasses(net)
    long = [
        (net.encode_user(factory.user(TINY, 32, i)), factory.candidates(TINY, 50, i))
        for i in range(4)
    ]
    short = [(net.encode_user(factory.user(TINY, 3, 9)), factory.candidates(TINY, 40, 9))]
    passes.score_many(long)
    (again,) = passes.score_many(short)
    assert torch.allclose(again, net.score(*short[0]), rtol=0, atol=EXACT_TOLERANCE)


def test_a_pass_larger_than_every_bucket_scores_eagerly_and_a_foreign_state_is_refused(
    factory,
) -> None:
    net = factory.model(TINY, seed=5, version="graphs")
    kv = net.encode_user(factory.user(TINY, 8, 1))
    wide = factory.candidates(TINY, CANDIDATE_BUCKETS[-1] + 1, 1)
    assert bucket(len(wide), CANDIDATE_BUCKETS) is None
    (scores,) = BucketedPasses(net).score_many([(kv, wide)])
    assert torch.equal(scores, net.score_many([(kv, wide)])[0])
    other = factory.model(TINY, seed=6, version="another")
    with pytest.raises(IncompatibleKVError):
        BucketedPasses(other).score_many([(kv, factory.candidates(TINY, 5, 1))])
