"""Where model work runs: one dedicated thread, scoring queued requests together.

The event loop must keep serving I/O (cache reads, other requests) while the model
computes, so every model call goes through :meth:`ModelRunner.run` onto a single worker
thread (one at a time: a GPU gains nothing from two). That thread is the process's one
:func:`model_thread`, and loading the model runs there too: torch's OpenMP pool belongs to
the thread that starts a parallel region, and a second such thread makes libgomp throttle
its spin-waiting once the pools outnumber the cores, which slows every parallel region
(a quick-size score on 2 cores: 10 ms on one thread, 17 ms once another had run torch).

**Continuous batching**: when the thread takes a score and more scores are queued behind
it, they run as one pass (the model's ``score_many``), up to ``batch_max`` requests and
``batch_rows`` padded candidate rows — nobody waits for a batch to fill: what queued while
the previous pass ran is the batch, so an idle server scores each request alone at once and
a busy one in as few passes as its queue allows. A window (``microbatch_s``) can hold each
score back a little longer for others to join. A pass that fails is retried one request at
a time, so one request's bad input fails that request only. Models without ``score_many``
score one request at a time.

Each piece of work names its stage; as the thread picks it up it is dropped if the request
it serves (the current :class:`~kvrank.admission.Ticket`) is no longer waited for, and the
time it took is added to that request's model time (what admission control estimates waits
from; a pass's time is shared by its requests). Scoring goes before user encodes: a request
whose K/V is made is finished first, so under a queue of misses its score does not wait
behind every encode admitted after it (which would double every admitted request's
latency). This module knows nothing of caching.
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
SCORE = "score"
"""The kind of work that finishes a request: run before any other queued work."""
SCORED_AFTER = ("encode", "extend")
"""Stages of a request that its score follows: such work starts only if what follows it
fits before the deadline too — the score, and one more piece of work as long as this one
(the request's task queues its score from the event loop, and the thread may start the
next piece meanwhile). Else its model time would go to an answer past the deadline: under
a queue, the oldest work still wanted is the work whose caller is about to leave."""
BATCH_ROWS = {"cpu": 512, "cuda": 16_384}
"""Padded candidate rows one scoring pass takes at most, by device type (others: the
CPU's). A CPU pass of a few hundred rows already keeps the cores busy, and a larger one
outgrows their caches (one torch thread, users × 100 candidates: the tiny model 2.7 ms a
request at 4–5 users a pass against 3.5 alone; the quick one the same ~9.6 ms from 1 to 8
users, 11–11.4 ms at 16); a GPU pass costs the same ~300 kernel launches at 1 or 100
users, so it takes as many as memory allows (~6 MB of scores per 1,000 rows against a
production window)."""


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
        batch_max: int = 32,
        on_wait: Callable[[float], None] | None = None,
        batch_rows: int | None = None,
        on_pass: Callable[[int], None] | None = None,
    ):
        self.model = model
        self._executor = model_thread()
        self.batch_max = batch_max if isinstance(model, BatchScorer) else 1
        """Requests one scoring pass takes at most (1: each request alone)."""
        self.batch_rows = batch_rows or BATCH_ROWS.get(model.device.type, BATCH_ROWS["cpu"])
        """Padded candidate rows (requests × the most candidates of one) a pass takes at
        most; a request with more scores alone."""
        self.window = MicroBatcher(self, microbatch_s) if microbatch_s > 0 else None
        self.on_wait = on_wait
        """Called on the model thread with each piece of work's wait for it (seconds)."""
        self.on_pass = on_pass
        """Called on the model thread with the requests each scoring pass scored."""
        self.passes = 0
        """Scoring passes run so far (each scores one or more requests; model thread)."""
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
        job = self._job(lambda: fn(*args), getattr(fn, "__name__", "work"), ticket, stage)
        self._push([job])
        return await asyncio.wrap_future(job.done)  # type: ignore[no-any-return]

    async def score(self, kv: UserKV, cands: CandidateInput) -> Tensor:
        """Logits of ``cands`` against a user's K/V, in one pass with the scores queued
        beside it (after the window, when one is set)."""
        if self.window is not None:
            return await self.window.score(kv, cands)
        job = self._score_job(kv, cands, current_ticket())
        self._push([job])
        return await asyncio.wrap_future(job.done)  # type: ignore[no-any-return]

    def _score_job(self, kv: UserKV, cands: CandidateInput, ticket: Ticket | None) -> _Job:
        job = self._job(lambda: self.model.score(kv, cands), SCORE, ticket, SCORE)
        job.scoring = (kv, cands)
        return job

    def _job(
        self, fn: Callable[[], Any], kind: str, ticket: Ticket | None, check: str | None
    ) -> _Job:
        return _Job(
            (kind != SCORE, next(self._order)),
            fn,
            kind,
            self._cost_s.get(kind, 0.0),
            [ticket] if ticket is not None else [],
            check,
        )

    def _push(self, jobs: list[_Job]) -> None:
        """Queue ``jobs`` together (a batch's requests stay next to each other)."""
        with self._lock:
            for job in jobs:
                heapq.heappush(self._pending, job)
        for job in jobs:
            self._queued_in_s += job.expected_s
            # one turn of the thread per job: each turn runs the most urgent work pending
            # then (a turn that finds its job taken into an earlier batch has nothing to do)
            self._executor.submit(self._turn)

    def _take(self) -> list[_Job]:
        """The most urgent pending job; when it is a score, with the scores queued behind it
        that fit in one pass."""
        with self._lock:
            if not self._pending:
                return []
            jobs = [heapq.heappop(self._pending)]
            widest = len(jobs[0].scoring[1]) if jobs[0].scoring else 0
            while jobs[0].scoring and self._pending and len(jobs) < self.batch_max:
                after = self._pending[0].scoring
                if after is None or max(widest, len(after[1])) * (len(jobs) + 1) > self.batch_rows:
                    break
                widest = max(widest, len(after[1]))
                jobs.append(heapq.heappop(self._pending))
        return jobs

    def _turn(self) -> None:
        """On the model thread: run the most urgent pending work."""
        taken = self._take()
        started = time.perf_counter()
        jobs = [job for job in taken if self._start(job, started)]
        if not jobs:
            return
        outcomes = self._outcomes(jobs)
        took = time.perf_counter() - started
        for job in jobs:  # each job of a pass cost its share of the pass
            before = self._cost_s.get(job.kind)
            share = took / len(jobs)
            self._cost_s[job.kind] = (
                share if before is None else COST_DECAY * before + (1 - COST_DECAY) * share
            )
        tickets = [ticket for job in jobs for ticket in job.tickets]
        for ticket in tickets:
            ticket.model_s += took / len(tickets)
        for job, (result, error) in zip(jobs, outcomes, strict=True):
            if error is None:
                job.done.set_result(result)
            else:
                job.done.set_exception(error)

    def _start(self, job: _Job, started: float) -> bool:
        """Start ``job`` unless nobody waits for it any more (its waiter hears why)."""
        self._queued_out_s += job.expected_s
        if self.on_wait is not None:
            self.on_wait(started - job.submitted)
        if not job.done.set_running_or_notify_cancel():
            return False
        try:
            if job.check is not None:
                need = job.expected_s
                if job.check in SCORED_AFTER:
                    need += job.expected_s + self._cost_s.get(SCORE, 0.0)
                for ticket in job.tickets:
                    ticket.check(job.check, need)
        except BaseException as exc:  # the caller's to hear, as run_in_executor does
            job.done.set_exception(exc)
            return False
        return True

    def _outcomes(self, jobs: list[_Job]) -> list[tuple[Any, BaseException | None]]:
        """Each job's result or error: several scores in one pass when they can, else (or
        when that pass fails) one at a time."""
        if len(jobs) > 1:
            assert isinstance(self.model, BatchScorer)
            try:
                results = self.model.score_many([job.scoring for job in jobs])  # type: ignore[misc]
            except Exception:
                pass  # one request's input may fail the pass: each alone, below
            else:
                self._passed(len(jobs))
                return [(result, None) for result in results]
        outcomes: list[tuple[Any, BaseException | None]] = []
        for job in jobs:
            if job.kind == SCORE:
                self._passed(1)
            try:
                outcomes.append((job.fn(), None))
            except BaseException as exc:  # the caller's to hear, as run_in_executor does
                outcomes.append((None, exc))
        return outcomes

    def _passed(self, requests: int) -> None:
        self.passes += 1
        if self.on_pass is not None:
            self.on_pass(requests)

    def close(self) -> None:
        """Wait for the model work submitted so far (the thread itself is the process's)."""
        self._executor.submit(lambda: None).result()


class MicroBatcher:
    """Holds each score back for a window, then queues those that arrived in it together
    (they share passes as any queued scores do)."""

    def __init__(self, runner: ModelRunner, window_s: float) -> None:
        self.runner = runner
        self.window_s = window_s
        self._held: list[_Job] = []
        self._flush: asyncio.Task[None] | None = None

    async def score(self, kv: UserKV, cands: CandidateInput) -> Tensor:
        job = self.runner._score_job(kv, cands, current_ticket())
        self._held.append(job)
        if len(self._held) >= self.runner.batch_max:
            self._queue()
        elif self._flush is None:
            self._flush = asyncio.create_task(self._after_window())
        return await asyncio.wrap_future(job.done)  # type: ignore[no-any-return]

    async def _after_window(self) -> None:
        await asyncio.sleep(self.window_s)
        self._flush = None
        self._queue()

    def _queue(self) -> None:
        held, self._held = self._held, []
        self.runner._push(held)


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
    scoring: tuple[UserKV, CandidateInput] | None = field(default=None, compare=False)
    """A score's user K/V and candidates: what a pass with other scores takes."""
    submitted: float = field(default_factory=time.perf_counter, compare=False)
    done: Future[Any] = field(default_factory=Future, compare=False)
