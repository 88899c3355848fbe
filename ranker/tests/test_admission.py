"""Admission control's decisions, on a clock the test moves: what is shed and why, what an
admitted request's stale work does, and what a pod's wait estimate follows."""

from __future__ import annotations

import contextlib

import pytest

from kvrank.admission import Admission, AdmissionSettings, Deadline, current_ticket
from kvrank.errors import Abandoned, Overloaded


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def measured(admission: Admission, clock: Clock, model_s: float, n: int = 1) -> None:
    """``n`` requests served one after another, each taking ``model_s`` of model time."""
    for _ in range(n):
        with admission.admit(Deadline.after_ms(10_000, clock)) as ticket:
            ticket.model_s = model_s


def test_a_request_that_would_wait_past_its_deadline_is_shed_before_any_work(clock) -> None:
    queued = [0.0]
    admission = Admission(AdmissionSettings(), lambda: queued[0])
    measured(admission, clock, 0.05)
    queued[0] = 0.5  # half a second of model work ahead of the next request
    with admission.admit(Deadline.after_ms(2_200, clock)):
        pass  # 500 ms of wait + its own 50 ms fit in a quarter (budget_share) of 2,200 ms
    with pytest.raises(Overloaded) as shed, admission.admit(Deadline.after_ms(2_000, clock)):
        pytest.fail("admitted")
    assert shed.value.reason == "deadline"
    assert "500 ms wait and 50 ms of model work exceed budget_share=0.25" in str(shed.value)
    assert shed.value.retry_after_s == 1
    assert admission.stats.shed == {"deadline": 1}
    assert admission.inflight == 0  # the shed one never counted


def test_an_idle_pod_admits_what_it_can_serve_in_time_so_one_slow_request_is_not_its_last(
    clock,
) -> None:
    """One request that took 2 s (a cold start, a stalled CPU) puts the estimate over a
    quarter of a 5 s deadline: a busy pod sheds on it, an idle one admits, re-measures and
    is back to normal; a request whose own work cannot fit is shed even by an idle pod."""
    admission = Admission(AdmissionSettings(budget_share=0.25))
    measured(admission, clock, 2.0)
    with admission.admit(Deadline.after_ms(5_000, clock)) as ticket:  # idle: admitted
        with pytest.raises(Overloaded), admission.admit(Deadline.after_ms(5_000, clock)):
            pytest.fail("admitted beside a request in flight")
        ticket.model_s = 0.01
    measured(admission, clock, 0.01, n=40)
    assert admission.cost_s < 0.1  # the estimate followed: nothing is shed any more
    with (
        admission.admit(Deadline.after_ms(5_000, clock)),
        admission.admit(Deadline.after_ms(5_000, clock)),
    ):
        pass
    slow = Admission(AdmissionSettings())
    measured(slow, clock, 2.0)
    with pytest.raises(Overloaded), slow.admit(Deadline.after_ms(1_500, clock)):
        pytest.fail("admitted work that ends past its deadline")


def test_a_pod_that_budgets_the_whole_deadline_admits_up_to_it(clock) -> None:
    queued = [0.5]
    admission = Admission(AdmissionSettings(budget_share=1.0), lambda: queued[0])
    measured(admission, clock, 0.05)
    with admission.admit(Deadline.after_ms(560, clock)):
        pass
    with pytest.raises(Overloaded), admission.admit(Deadline.after_ms(540, clock)):
        pytest.fail("admitted")


def test_an_admitted_request_counts_the_model_work_it_has_still_to_do(clock) -> None:
    """Not only the work queued: scores go before encodes, so a request admitted now also
    waits for the scores of the requests whose encodes are queued or done."""
    queued = [0.0]
    admission = Admission(AdmissionSettings(), lambda: queued[0])
    measured(admission, clock, 0.05)  # a request's worth: encode and score
    with contextlib.ExitStack() as held:
        tickets = [
            held.enter_context(admission.admit(Deadline.after_ms(10_000, clock))) for _ in range(10)
        ]
        assert admission.estimated_wait_s() == pytest.approx(0.5)  # parsing, reading Redis
        queued[0] = 0.1  # five encodes reached the model thread: still a request's worth each
        assert admission.estimated_wait_s() == pytest.approx(0.5)
        for ticket in tickets[:5]:
            ticket.model_s = 0.02  # encoded: their scores are still to come
        assert admission.estimated_wait_s() == pytest.approx(5 * 0.05 + 5 * 0.03)
        queued[0] = 0.6  # work of no request (prefetches) queued too: at least that
        assert admission.estimated_wait_s() == pytest.approx(0.6)
    assert admission.inflight == 0
    queued[0] = 0.0
    assert admission.estimated_wait_s() == 0.0


def test_work_that_would_end_past_the_deadline_is_not_started(clock) -> None:
    admission = Admission(AdmissionSettings())
    with pytest.raises(Abandoned) as late, admission.admit(Deadline.after_ms(100, clock)) as t:
        t.check("encode", need_s=0.05)  # 100 ms left: it fits
        clock.now += 0.06
        t.check("score", need_s=0.05)  # 40 ms left
    assert (late.value.reason, late.value.stage) == ("deadline", "score")


def test_the_pod_holds_at_most_max_inflight_requests_whatever_the_estimate(clock) -> None:
    admission = Admission(AdmissionSettings(max_inflight=3))
    with contextlib.ExitStack() as held:
        for _ in range(3):  # nothing measured yet: the estimate is 0
            held.enter_context(admission.admit(Deadline.after_ms(1_000, clock)))
        with pytest.raises(Overloaded) as shed, admission.admit(Deadline.after_ms(1_000, clock)):
            pytest.fail("admitted")
    assert shed.value.reason == "inflight"
    with admission.admit(Deadline.after_ms(1_000, clock)):
        assert admission.inflight == 1


def test_work_past_its_deadline_or_for_a_caller_that_left_is_dropped_and_counted(
    clock,
) -> None:
    admission = Admission(AdmissionSettings())
    with pytest.raises(Abandoned) as late, admission.admit(Deadline.after_ms(100, clock)) as t:
        t.check("encode")  # in time
        clock.now += 0.2
        t.check("score")
    assert (late.value.reason, late.value.stage, late.value.ticket) == ("deadline", "score", t)
    left = Deadline.after_ms(1_000, clock)
    with pytest.raises(Abandoned) as gone, admission.admit(left) as ticket:
        left.caller_left = True
        ticket.check("encode")
    assert gone.value.reason == "disconnected"
    assert admission.stats.abandoned == {("deadline", "score"): 1, ("disconnected", "encode"): 1}
    assert admission.inflight == 0


def test_a_deadline_already_past_on_arrival_is_dropped_before_admission(clock) -> None:
    admission = Admission(AdmissionSettings())
    deadline = Deadline.after_ms(10, clock)
    clock.now += 1
    with pytest.raises(Abandoned) as late, admission.admit(deadline):
        pytest.fail("admitted")
    assert late.value.stage == "admitted"


@pytest.mark.parametrize(
    ("mode", "sheds", "drops"), [("shed", True, True), ("drop", False, True), ("off", False, False)]
)
def test_each_mode_sheds_and_drops_what_it_says(clock, mode, sheds, drops) -> None:
    admission = Admission(AdmissionSettings(mode=mode, max_inflight=1))
    with admission.admit(Deadline.after_ms(100, clock)):
        try:
            with admission.admit(Deadline.after_ms(100, clock)) as ticket:
                clock.now += 1
                ticket.check("encode")
        except Overloaded:
            assert sheds
        except Abandoned:
            assert not sheds and drops
        else:
            assert not sheds and not drops


def test_the_wait_estimate_follows_a_shift_in_model_time_within_a_few_halflives(clock) -> None:
    admission = Admission(AdmissionSettings(cost_halflife=8))
    measured(admission, clock, 0.100, n=1)  # the first request, a miss
    measured(admission, clock, 0.002, n=3)  # then hits: the first is no longer all there is
    assert admission.cost_s == pytest.approx((0.100 + 3 * 0.002) / 4)
    measured(admission, clock, 0.002, n=100)
    assert admission.cost_s == pytest.approx(0.002, rel=0.01)
    measured(admission, clock, 0.020, n=24)  # then misses: three halflives
    assert 0.017 < admission.cost_s < 0.020
    measured(admission, clock, 1.0, n=1)  # one slow request moves it by a twelfth
    assert admission.cost_s < 0.020 + 1.0 / 11


def test_the_admitted_requests_ticket_is_current_inside_its_block_only(clock) -> None:
    admission = Admission(AdmissionSettings())
    assert current_ticket() is None
    with admission.admit(Deadline.after_ms(100, clock)) as ticket:
        assert current_ticket() is ticket
    assert current_ticket() is None


@pytest.mark.parametrize("mode", ["shed", "drop", "off"])
def test_a_prefetch_runs_only_on_spare_model_time_and_only_shed_mode_refuses_it(
    clock, mode
) -> None:
    queued = [0.0]
    admission = Admission(AdmissionSettings(mode=mode, max_inflight=2), lambda: queued[0])
    admission.cost_s = 0.05
    assert admission.prefetch_refusal() is None  # idle
    queued[0] = 0.04  # less than a request's worth ahead: still spare
    assert admission.prefetch_refusal() is None
    queued[0] = 0.2
    assert admission.prefetch_refusal() == ("busy" if mode == "shed" else None)
    queued[0] = 0.0
    with (
        admission.admit(Deadline.after_ms(1000, clock)),
        admission.admit(Deadline.after_ms(1000, clock)),
    ):
        assert admission.prefetch_refusal() == ("inflight" if mode == "shed" else None)


def test_a_caller_without_a_deadline_is_refused_only_when_its_wait_would_not_fit_the_default(
    clock,
) -> None:
    """Three rankers whose Redis restarted empty: misses queue 1.1 s of model work. A caller
    that sent no deadline would be answered in ~1.3 s of the server's default 5 s — it is
    admitted; one that sent 5 s is budgeted a quarter of them, as it asked to be."""
    queued = [0.0]
    admission = Admission(AdmissionSettings(budget_share=0.25), lambda: queued[0], clock)
    measured(admission, clock, 0.157)
    queued[0] = 1.1
    with admission.admit(admission.deadline()):
        pass
    with pytest.raises(Overloaded), admission.admit(admission.deadline(5_000)):
        pytest.fail("admitted past its budget_share")
    queued[0] = 5.0  # a wait past the default itself: refused, saying whose deadline it was
    with pytest.raises(Overloaded) as shed, admission.admit(admission.deadline()):
        pytest.fail("admitted past the default deadline")
    assert "of the 5000 ms left before the deadline (none sent: the pod's)" in str(shed.value)


def leave_after(admission: Admission, clock: Clock, waited_s: float, n: int) -> None:
    """``n`` callers without a deadline, each hanging up after ``waited_s``."""
    for _ in range(n):
        deadline = admission.deadline()
        with pytest.raises(Abandoned), admission.admit(deadline) as ticket:
            clock.now += waited_s
            deadline.leave()
            ticket.check("encode")


def test_callers_without_a_deadline_that_leave_early_are_given_the_time_they_wait(clock) -> None:
    """A spike from callers that give up after a second without saying so: once the pod
    has seen them leave, the next ones get a second, budgeted as a sent one — shed while
    the wait would not fit in a quarter of it, instead of queued for the default 5 s."""
    queued = [0.0]
    admission = Admission(AdmissionSettings(), lambda: queued[0], clock)
    measured(admission, clock, 0.05)
    leave_after(admission, clock, 1.0, n=7)
    assert admission.patience.estimate_s() is None  # seven: not yet enough to go by
    assert admission.deadline().left_s() == pytest.approx(5.0)
    leave_after(admission, clock, 1.0, n=1)
    assert admission.patience.estimate_s() == pytest.approx(1.0)
    quiet = admission.deadline()
    assert quiet.left_s() == pytest.approx(1.0) and not quiet.stated
    queued[0] = 0.5
    with pytest.raises(Overloaded) as shed, admission.admit(admission.deadline()):
        pytest.fail("admitted with half a second of work ahead of a one-second caller")
    assert "exceed budget_share=0.25 of the 1000 ms left" in str(shed.value)
    queued[0] = 0.1
    with admission.admit(admission.deadline()):
        pass  # 100 ms ahead + 50 ms of its own: within a quarter of its second
    # a caller that says how long it waits is taken at its word
    assert admission.deadline(3_000).left_s() == pytest.approx(3.0)
    # callers that wait longer than the default teach nothing: the default holds
    slow = Admission(AdmissionSettings(), clock=clock)
    leave_after(slow, clock, 8.0, n=10)
    assert slow.deadline().left_s() == pytest.approx(5.0)


def test_requests_admitted_under_the_default_end_once_the_callers_wait_is_learned(clock) -> None:
    """A spike's first second is admitted under the 5 s default (nobody has left yet). Once
    the pod sees such callers leave after a second, the requests it admitted before end a
    second after they came too: dropped as the model thread reaches them, and no longer in
    the wait a new request is told — not worked through for callers that have gone."""
    admission = Admission(AdmissionSettings(), clock=clock)
    measured(admission, clock, 0.05)
    with contextlib.ExitStack() as held:
        early = [held.enter_context(admission.admit(admission.deadline())) for _ in range(4)]
        assert admission.estimated_wait_s() == pytest.approx(4 * 0.05)
        clock.now += 0.6
        stated = held.enter_context(admission.admit(Deadline.after_ms(3_000, clock)))
        clock.now += 0.6  # the early ones came 1.2 s ago
        early[0].check("encode")  # nothing learned yet: the default's 5 s still hold
        for _ in range(8):
            admission.patience.observe(1.0)  # eight such callers left after a second
        with pytest.raises(Abandoned) as late:
            early[1].check("encode")
        assert late.value.reason == "deadline"
        assert admission.estimated_wait_s() == pytest.approx(0.05)  # the stated one's only
        stated.check("encode")  # a caller that said how long it waits is taken at its word
        assert stated.deadline.left_s() == pytest.approx(2.4)


def test_the_learned_wait_is_forgotten_once_callers_stop_leaving(clock) -> None:
    admission = Admission(AdmissionSettings(patience_quantile=0.1), clock=clock)
    for waited in (0.2, 0.9, 1.0, 1.0, 1.0, 1.1, 1.2, 1.5, 2.0, 3.0):
        leave_after(admission, clock, waited, n=1)
    # the tenth percentile: nine in ten of the callers that left waited at least this long
    assert admission.patience.estimate_s() == pytest.approx(0.9)
    clock.now += 61  # a minute without anyone leaving: callers wait now
    assert admission.patience.estimate_s() is None
    assert admission.deadline().left_s() == pytest.approx(5.0)
