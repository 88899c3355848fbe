"""The built-in model's scoring passes in fixed shapes, replayed from CUDA graphs.

On a GPU a production-size scoring pass is bound by launching its ~350 kernels, not by their
arithmetic: replayed from a CUDA graph the same pass took 2–3 ms instead of ~7
(docs/benchmarks.md, "On a GPU"). A graph replays fixed shapes into fixed buffers, so each
pass is padded to a bucket — users to the next of :data:`USER_BUCKETS` (rows whose scores
are dropped), candidates to the next of :data:`CANDIDATE_BUCKETS` (repeating each request's last,
as ``score_many`` pads) — and every user's whole window of K/V is copied in (rows before a
short history are masked keys, as they are in the entry). A bucket's graph is captured the
first time a pass needs it (the server's warm-up captures the smallest), all of them in one
memory pool: the model thread replays one at a time, and each pass's scores are read before
the next replays. A pass larger than every bucket, and every pass on a CPU, runs the same
buffers eagerly — which is how the padding is tested without a GPU: a bucketed pass scores
as ``score_many`` does, within the model contract's bound.

Off unless the server's ``cuda_graphs`` asks for it (built-in model, CUDA device only):
measured on a GPU before it is made the default.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass

import torch
from torch import Tensor

from kvrank.model.inputs import Candidates
from kvrank.model.kv import UserKV
from kvrank.model.ranker import PassBuffers, RankerModel

log = logging.getLogger("kvrank.model.graphs")

USER_BUCKETS = (1, 2, 4, 8, 16, 32)
"""Users one pass is padded to (the runner's ``microbatch_max`` is 32 by default)."""
CANDIDATE_BUCKETS = (64, 128, 256)
"""Candidates one pass is padded to: a ranking request's 50–200, in at most twice its own
rows; more candidates score eagerly."""
WARMUP_RUNS = 3
"""Eager runs on a side stream before a capture (what CUDA's own libraries allocate and
tune on first use must not happen inside it)."""


def bucket(n: int, sizes: tuple[int, ...]) -> int | None:
    """The smallest of ``sizes`` that holds ``n`` (``None``: none does)."""
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


@dataclass
class _Bucket:
    """One bucket's buffers and, once captured, its graph and the tensor replays write."""

    buffers: PassBuffers
    graph: torch.cuda.CUDAGraph | None = None
    out: Tensor | None = None


class BucketedPasses:
    """Scores requests for a :class:`RankerModel` in bucketed passes: replayed from CUDA
    graphs when ``capture`` (default: on a CUDA device), else eagerly from the same
    buffers."""

    def __init__(self, net: RankerModel, capture: bool | None = None) -> None:
        self.net = net
        self.capture = net.device.type == "cuda" if capture is None else capture
        self._buckets: dict[tuple[int, int], _Bucket] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.capture else None
        self.captured = 0
        """Graphs captured so far."""

    def score_many(self, requests: list[tuple[UserKV, Candidates]]) -> list[Tensor]:
        """Per request, the logits ``score`` would give (within the model contract)."""
        users = bucket(len(requests), USER_BUCKETS)
        width = bucket(max(len(c) for _, c in requests), CANDIDATE_BUCKETS)
        if users is None or width is None:
            return self.net.score_many(requests, checked=True)
        one = self._bucket(users, width)
        self.net.fill_pass(requests, one.buffers)
        if one.graph is None:
            with torch.no_grad():
                logits = self.net.pass_logits(one.buffers)
        else:
            one.graph.replay()
            assert one.out is not None
            logits = one.out
        # a copy: the graph's output is written again by the next replay (of any bucket)
        scores = logits[: len(requests)].to(torch.float32, copy=True)
        return [scores[i, : len(c)] for i, (_, c) in enumerate(requests)]

    def _bucket(self, users: int, width: int) -> _Bucket:
        key = (users, width)
        if key not in self._buckets:
            self._buckets[key] = _Bucket(self.net.pass_buffers(users, width))
            if self.capture:
                self._capture(self._buckets[key])
        return self._buckets[key]

    def _capture(self, one: _Bucket) -> None:
        """``one``'s pass as a graph (warmed up first on a side stream)."""
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                self.net.pass_logits(one.buffers)
        torch.cuda.current_stream().wait_stream(side)
        one.graph = torch.cuda.CUDAGraph()
        # thread-local: the event loop's thread may move an entry onto the device meanwhile
        capturing = torch.cuda.graph(one.graph, pool=self._pool, capture_error_mode="thread_local")
        with torch.no_grad(), capturing:
            one.out = self.net.pass_logits(one.buffers)
        self.captured += 1
        log.info(
            "captured a scoring pass of %d users × %d candidates as a CUDA graph",
            one.buffers.users,
            one.buffers.candidates,
        )
