"""The model thread's continuous batching: scores queued while the model is busy share a
pass, within its bounds, with the scores each would get alone; one request's failure or
departure touches that request only."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable

import pytest
import torch

from kvrank.admission import _CURRENT, Deadline, Ticket
from kvrank.errors import Abandoned, IncompatibleKVError
from kvrank.model.checks import EXACT_TOLERANCE
from kvrank.model.config import TINY
from kvrank.runner import SCORE, ModelRunner


@pytest.fixture(scope="module")
def model(factory):
    return factory.model(TINY, seed=5, version="runner")


@pytest.fixture(scope="module")
def requests(model, factory):
    """Six users, each with its own history length and candidate count."""
    f = factory
    return [
        (model.encode_user(f.user(TINY, 4 + 5 * i, i)), f.candidates(TINY, 3 + 2 * i, i))
        for i in range(6)
    ]


async def queued_behind_busy_thread(runner: ModelRunner, calls: list[Awaitable]) -> list:
    """Start ``calls`` while the model thread is busy, so that all of them are queued when it
    comes free; their outcomes (results or errors) in order."""
    async with busy_thread(runner, len(calls)) as start:
        tasks = start(calls)
    return await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def busy_thread(runner: ModelRunner, queued: int):
    """Keeps the model thread busy until ``queued`` pieces of work wait for it; yields what
    starts the calls (as tasks)."""
    started, release = threading.Event(), threading.Event()

    def busy() -> None:
        started.set()
        release.wait(timeout=60)

    blocker = asyncio.ensure_future(runner.run(busy))
    try:
        while not started.is_set():  # queued before it, scores would go first
            await asyncio.sleep(0.001)
        yield lambda calls: [asyncio.ensure_future(c) for c in calls]
        for _ in range(30_000):
            if runner.queue_depth >= queued:
                break
            await asyncio.sleep(0.001)
        assert runner.queue_depth == queued
    finally:
        release.set()
        await blocker


def near(batched: torch.Tensor, alone: torch.Tensor) -> bool:
    """A score from a pass with other users against the same score alone: equal within
    what the model contract allows (the load-time check holds a model to it): the users'
    padding differs, so sums run in another order."""
    return batched.shape == alone.shape and bool(
        torch.allclose(batched, alone, rtol=0, atol=EXACT_TOLERANCE)
    )


def alone(model, requests) -> list[torch.Tensor]:
    return [model.score(kv, cands) for kv, cands in requests]


def test_queued_scores_share_one_pass_with_the_scores_each_gets_alone(model, requests) -> None:
    runner = ModelRunner(model)
    calls = [runner.score(kv, cands) for kv, cands in requests]
    batched = asyncio.run(queued_behind_busy_thread(runner, calls))
    assert runner.passes == 1
    for got, want in zip(batched, alone(model, requests), strict=True):
        assert got.shape == want.shape
        assert near(got, want)


def test_a_pass_takes_at_most_batch_max_requests_and_batch_rows_rows(model, requests) -> None:
    by_users = ModelRunner(model, batch_max=4)
    asyncio.run(queued_behind_busy_thread(by_users, [by_users.score(*r) for r in requests]))
    assert by_users.passes == 2  # 4 + 2

    # every request has 5 candidates: 12 rows take two requests per pass (10 rows), not three
    fives = [(kv, cands.select(slice(0, 5))) for kv, cands in requests[1:]]
    by_rows = ModelRunner(model, batch_rows=12)
    asyncio.run(queued_behind_busy_thread(by_rows, [by_rows.score(*r) for r in fives]))
    assert by_rows.passes == 3  # 2 + 2 + 1


def test_one_bad_request_fails_alone_and_the_rest_of_its_pass_is_scored(
    model, requests, factory
) -> None:
    other = factory.model(TINY, seed=6, version="another")
    foreign = other.encode_user(factory.user(TINY, 9, 1))
    mixed = [*requests[:2], (foreign, requests[2][1]), *requests[3:]]
    runner = ModelRunner(model)
    outcomes = asyncio.run(queued_behind_busy_thread(runner, [runner.score(*r) for r in mixed]))
    assert isinstance(outcomes[2], IncompatibleKVError)
    good = [o for i, o in enumerate(outcomes) if i != 2]
    want = alone(model, [r for i, r in enumerate(mixed) if i != 2])
    assert all(near(got, w) for got, w in zip(good, want, strict=True))


def test_a_request_nobody_waits_for_is_left_out_of_the_pass(model, requests) -> None:
    runner = ModelRunner(model)
    gone = Ticket(Deadline.after_ms(60_000))

    async def scored_for(ticket: Ticket | None, kv, cands):
        token = _CURRENT.set(ticket)
        try:
            return await runner.score(kv, cands)
        finally:
            _CURRENT.reset(token)

    async def main() -> list:
        calls = [scored_for(gone if i == 1 else None, *r) for i, r in enumerate(requests)]
        async with busy_thread(runner, len(calls)) as start:
            tasks = start(calls)
            while runner.queue_depth < len(calls):
                await asyncio.sleep(0.001)
            gone.deadline.caller_left = True  # the caller hangs up while its score is queued
        return await asyncio.gather(*tasks, return_exceptions=True)

    outcomes = asyncio.run(main())
    assert isinstance(outcomes[1], Abandoned)
    assert gone.model_s == 0.0  # no model time spent on it
    assert runner.passes == 1
    rest = [r for i, r in enumerate(requests) if i != 1]
    got = [o for i, o in enumerate(outcomes) if i != 1]
    assert all(near(a, b) for a, b in zip(got, alone(model, rest), strict=True))


def test_batch_max_one_and_models_without_score_many_score_each_request_alone(
    model, requests
) -> None:
    class OneAtATime:
        """The model without its ``score_many``."""

        device = model.device

        def score(self, kv, cands):
            return model.score(kv, cands)

    for runner in (ModelRunner(model, batch_max=1), ModelRunner(OneAtATime())):  # type: ignore[arg-type]
        got = asyncio.run(queued_behind_busy_thread(runner, [runner.score(*r) for r in requests]))
        assert runner.passes == len(requests)
        assert all(near(a, b) for a, b in zip(got, alone(model, requests), strict=True))


def test_a_window_holds_scores_back_until_they_can_share_a_pass(model, requests) -> None:
    runner = ModelRunner(model, microbatch_s=0.05)

    async def main() -> list:
        # nothing keeps the thread busy: only the window brings these together
        return await asyncio.gather(*[runner.score(*r) for r in requests])

    got = asyncio.run(main())
    assert runner.passes == 1  # all of them arrived within the window
    assert all(near(a, b) for a, b in zip(got, alone(model, requests), strict=True))


@pytest.mark.parametrize(
    ("left_ms", "stage", "runs"),
    [(150, "encode", False), (400, "encode", True), (150, "full", True)],
)
def test_a_requests_encode_starts_only_if_its_score_can_follow_before_the_deadline(
    model, left_ms, stage, runs
) -> None:
    """With 150 ms left, an encode of 50 ms is not started: its score (100 ms) could not
    follow in time, nor the next piece of work the thread may take first — that request's
    model time would buy an answer nobody reads. A request's whole work (``full``) needs
    only its own time."""
    runner = ModelRunner(model)
    runner._cost_s.update({"work": 0.05, SCORE: 0.1})  # what each kind took of late
    ran: list[str] = []

    def work() -> None:
        ran.append(stage)

    async def for_ticket() -> None:
        token = _CURRENT.set(Ticket(Deadline.after_ms(left_ms)))
        try:
            await runner.run(work, stage=stage)
        finally:
            _CURRENT.reset(token)

    if runs:
        asyncio.run(for_ticket())
        assert ran == [stage]
    else:
        with pytest.raises(Abandoned) as late:
            asyncio.run(for_ticket())
        assert (late.value.reason, late.value.stage, ran) == ("deadline", stage, [])
