"""Where model work runs: one dedicated thread, and optional micro-batching of scores.

The event loop must keep serving I/O (cache reads, other requests) while the model
computes, so every model call goes through :meth:`ModelRunner.run` onto a single worker
thread (one at a time: a GPU gains nothing from two). That thread is the process's one
:func:`model_thread`, and loading the model runs there too: torch's OpenMP pool belongs to
the thread that starts a parallel region, and a second such thread makes libgomp throttle
its spin-waiting once the pools outnumber the cores, which slows every parallel region
(a quick-size score on 2 cores: 10 ms on one thread, 17 ms once another had run torch).
With a micro-batching window, the ``score`` calls that arrive within it are scored in one
pass (pays off on GPUs; off by default) when the model can (``score_many``). This module
knows nothing of caching.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from torch import Tensor

from kvrank.model.contract import BatchScorer, CacheableRanker, CandidateInput
from kvrank.model.kv import UserKV

R = TypeVar("R")
_MODEL_THREAD: ThreadPoolExecutor | None = None


def model_thread() -> ThreadPoolExecutor:
    """The process's one thread for torch work (created on first use, lives with the
    process)."""
    global _MODEL_THREAD
    if _MODEL_THREAD is None:
        _MODEL_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvrank-model")
    return _MODEL_THREAD


class ModelRunner:
    def __init__(self, model: CacheableRanker, microbatch_s: float = 0.0, max_batch: int = 32):
        self.model = model
        self._executor = model_thread()
        self.batcher = (
            MicroBatcher(self, model, microbatch_s, max_batch)
            if microbatch_s > 0 and isinstance(model, BatchScorer)
            else None
        )

    async def run(self, fn: Callable[..., R], *args: Any) -> R:
        """Run ``fn(*args)`` on the model thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def score(self, kv: UserKV, cands: CandidateInput) -> Tensor:
        """Logits of ``cands`` against a user's K/V (micro-batched when a window is set)."""
        if self.batcher is not None:
            return await self.batcher.score(kv, cands)
        return await self.run(self.model.score, kv, cands)

    def close(self) -> None:
        """Wait for the model work submitted so far (the thread itself is the process's)."""
        self._executor.submit(lambda: None).result()


class MicroBatcher:
    """Collects concurrent ``score`` calls for a short window and runs them as one batch."""

    def __init__(
        self, runner: ModelRunner, model: BatchScorer, window_s: float, max_batch: int
    ) -> None:
        self.runner = runner
        self.model = model
        self.window_s = window_s
        self.max_batch = max_batch
        self._pending: list[tuple[UserKV, CandidateInput, asyncio.Future[Tensor]]] = []
        self._flush: asyncio.Task[None] | None = None
        self.batches = 0
        """Passes run so far (each scores one or more requests)."""

    async def score(self, kv: UserKV, cands: CandidateInput) -> Tensor:
        fut: asyncio.Future[Tensor] = asyncio.get_running_loop().create_future()
        self._pending.append((kv, cands, fut))
        if len(self._pending) >= self.max_batch:
            await self._run()
        elif self._flush is None:
            self._flush = asyncio.create_task(self._after_window())
        return await fut

    async def _after_window(self) -> None:
        await asyncio.sleep(self.window_s)
        self._flush = None
        await self._run()

    async def _run(self) -> None:
        batch, self._pending = self._pending, []
        if not batch:
            return
        self.batches += 1
        try:
            requests = [(kv, c) for kv, c, _ in batch]
            results = await self.runner.run(self.model.score_many, requests)
        except Exception as exc:
            for *_, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        for (_, _, fut), logits in zip(batch, results, strict=True):
            if not fut.done():
                fut.set_result(logits)
