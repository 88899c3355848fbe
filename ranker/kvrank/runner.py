"""Where model work runs: one dedicated thread, and optional micro-batching of scores.

The event loop must keep serving I/O (cache reads, other requests) while the model
computes, so every model call goes through :meth:`ModelRunner.run` onto a single worker
thread (one at a time: a GPU gains nothing from two). That thread is the process's one
:func:`model_thread`, and loading the model runs there too: torch's OpenMP pool belongs to
the thread that starts a parallel region, and a second such thread makes libgomp throttle
its spin-waiting once the pools outnumber the cores, which slows every parallel region
(a quick-size score on 2 cores: 10 ms on one thread, 17 ms once another had run torch).
With a micro-batching window, the ``score`` calls that arrive within it are scored in one
pass (pays off on GPUs; off by default) when the model can (``score_many``).

Each piece of work names its stage; as the thread picks it up it is dropped if the request
it serves (the current :class:`~kvrank.admission.Ticket`) is no longer waited for, and the
time it took is added to that request's model time (what admission control estimates waits
from). Scoring goes before user encodes: a request whose K/V is made is finished first, so
under a queue of misses its score does not wait behind every encode admitted after it
(which would double every admitted request's latency). This module knows nothing of
caching.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from torch import Tensor

from kvrank.admission import Ticket, current_ticket
from kvrank.model.contract import BatchScorer, CacheableRanker, CandidateInput
from kvrank.model.kv import UserKV

R = TypeVar("R")
COST_DECAY = 0.9
"""Weight of the past in each kind of work's mean duration (about 7 pieces' half-life)."""
_MODEL_THREAD: ThreadPoolExecutor | None = None
FIRST = ("score", "score_many")
"""The kinds of work that finish a request: run before any other queued work."""


def model_thread() -> ThreadPoolExecutor:
    """The process's one thread for torch work (created on first use, lives with the
    process)."""
    global _MODEL_THREAD
    if _MODEL_THREAD is None:
        _MODEL_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvrank-model")
    return _MODEL_THREAD


class ModelRunner:
    def __init__(
        self,
        model: CacheableRanker,
        microbatch_s: float = 0.0,
        max_batch: int = 32,
        on_wait: Callable[[float], None] | None = None,
    ):
        self.model = model
        self._executor = model_thread()
        self.batcher = (
            MicroBatcher(self, model, microbatch_s, max_batch)
            if microbatch_s > 0 and isinstance(model, BatchScorer)
            else None
        )
        self.on_wait = on_wait
        """Called on the model thread with each piece of work's wait for it (seconds)."""
        # each counter written by one thread only: the event loop, or the model thread
        self._queued_in_s = self._queued_out_s = 0.0
        self._cost_s: dict[str, float] = {}
        """Seconds one piece of work of each kind took, weighted mean (model thread)."""
        self._pending: list[_Job] = []  # a heap: scores first, then in order of arrival
        self._lock = threading.Lock()
        self._order = itertools.count()

    @property
    def queue_depth(self) -> int:
        """Work handed to the model thread and not yet started."""
        return len(self._pending)

    def queued_work_s(self) -> float:
        """How long the work handed to the model thread and not yet started will take, by
        what each kind of work took of late (what admission control calls the wait)."""
        return max(0.0, self._queued_in_s - self._queued_out_s)

    async def run(self, fn: Callable[..., R], *args: Any, stage: str | None = None) -> R:
        """Run ``fn(*args)`` on the model thread; with a ``stage``, for the current request
        (dropped there if nobody waits for it any more)."""
        ticket = current_ticket() if stage is not None else None
        return await self.submit(fn, args, [ticket] if ticket else [], stage)

    async def submit(
        self,
        fn: Callable[..., R],
        args: tuple[Any, ...],
        tickets: list[Ticket],
        check: str | None = None,
    ) -> R:
        """``fn(*args)`` on the model thread for the requests of ``tickets``, each charged a
        share of its time; with ``check`` (the stage), dropped as it starts if any of them
        is no longer waited for."""
        kind = getattr(fn, "__name__", "work")
        job = _Job(
            (kind not in FIRST, next(self._order)),
            lambda: fn(*args),
            kind,
            self._cost_s.get(kind, 0.0),
            tickets,
            check,
        )
        with self._lock:
            heapq.heappush(self._pending, job)
        self._queued_in_s += job.expected_s
        # one turn of the thread per job: each turn runs the most urgent job pending then
        self._executor.submit(self._turn)
        return await asyncio.wrap_future(job.done)  # type: ignore[no-any-return]

    def _turn(self) -> None:
        """On the model thread: run the most urgent pending job."""
        with self._lock:
            job = heapq.heappop(self._pending)
        started = time.perf_counter()
        self._queued_out_s += job.expected_s
        if self.on_wait is not None:
            self.on_wait(started - job.submitted)
        if not job.done.set_running_or_notify_cancel():
            return
        try:
            if job.check is not None:
                for ticket in job.tickets:
                    ticket.check(job.check, job.expected_s)
            job.done.set_result(job.fn())
        except BaseException as exc:  # the caller's to hear, as run_in_executor does
            job.done.set_exception(exc)
            return
        took = time.perf_counter() - started
        before = self._cost_s.get(job.kind)
        mean = took if before is None else COST_DECAY * before + (1 - COST_DECAY) * took
        self._cost_s[job.kind] = mean
        for ticket in job.tickets:
            ticket.model_s += took / len(job.tickets)

    async def score(self, kv: UserKV, cands: CandidateInput) -> Tensor:
        """Logits of ``cands`` against a user's K/V (micro-batched when a window is set)."""
        if self.batcher is not None:
            return await self.batcher.score(kv, cands)
        return await self.run(self.model.score, kv, cands, stage="score")

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
        self._pending: list[_Pending] = []
        self._flush: asyncio.Task[None] | None = None
        self.batches = 0
        """Passes run so far (each scores one or more requests)."""

    async def score(self, kv: UserKV, cands: CandidateInput) -> Tensor:
        fut: asyncio.Future[Tensor] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(kv, cands, fut, current_ticket()))
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
        batch = [p for p in self._pending if not p.dropped()]  # the rest: nobody waits
        self._pending = []
        if not batch:
            return
        self.batches += 1
        tickets = [p.ticket for p in batch if p.ticket is not None]
        try:
            requests = [(p.kv, p.cands) for p in batch]
            # each request's drop check ran above: the batch runs for those still wanted,
            # and each of their tickets is charged a share of its time
            results = await self.runner.submit(self.model.score_many, (requests,), tickets)
        except Exception as exc:
            for p in batch:
                if not p.fut.done():
                    p.fut.set_exception(exc)
            return
        for p, logits in zip(batch, results, strict=True):
            if not p.fut.done():
                p.fut.set_result(logits)


@dataclass(order=True)
class _Job:
    """One piece of model work waiting for the thread (ordered by ``rank`` only)."""

    rank: tuple[bool, int]
    """``(not a score, arrival)``: scores first, then first come, first served."""
    fn: Callable[[], Any] = field(compare=False)
    kind: str = field(compare=False)
    expected_s: float = field(compare=False)
    tickets: list[Ticket] = field(compare=False)
    check: str | None = field(compare=False)
    submitted: float = field(default_factory=time.perf_counter, compare=False)
    done: Future[Any] = field(default_factory=Future, compare=False)


@dataclass
class _Pending:
    """A score waiting for its micro-batch."""

    kv: UserKV
    cands: CandidateInput
    fut: asyncio.Future[Tensor]
    ticket: Ticket | None

    def dropped(self) -> bool:
        """Fail the waiter and say so when its request is no longer waited for."""
        if self.ticket is None:
            return False
        try:
            self.ticket.check("score")
        except Exception as exc:
            self.fut.set_exception(exc)
            return True
        return False
