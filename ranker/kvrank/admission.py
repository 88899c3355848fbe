"""Admission control: a pod takes only the scoring work it can finish before its caller's
deadline, and never computes for a caller that has gone.

Under a spike an unbounded queue is congestion collapse: every request waits behind the
ones before it, all of them miss their deadlines, and the model thread keeps computing
answers nobody reads. Here each scoring request carries a :class:`Deadline` (the caller's,
or the server's default) and is *admitted* before any model work:

- it is **shed** at once (an :class:`~kvrank.errors.Overloaded`, answered 503 with
  ``Retry-After``) when the pod already holds ``max_inflight`` admitted requests, or when
  the wait it would face plus the model time a request takes (a weighted mean, measured on
  the model thread) leaves no time to serve it before its deadline. The wait is the model
  work every admitted request has still to do: a request's worth less what it has had so
  far — on its way to the queue, queued, or between its encode and its score (scores run
  first, so a request admitted now waits for the scores of those admitted before it too,
  not only for the work already queued) — and at least the work queued on the model
  thread (the runner's estimate, which also holds work of no request: prefetches). An idle
  pod (nothing admitted, nothing queued) admits any request whose own model time fits
  before its deadline: ``budget_share`` is the margin for a queue's wait, and there is none.
- a caller that sends no deadline is given the server's default (``default_timeout_ms``,
  the longest anyone waits), all of it budgeted: refusing such a request while its wait
  fits would refuse work its caller would have taken. Unless callers like it are seen to
  leave sooner: the pod learns how long they wait (:class:`Patience`, from the ones that
  disconnected) and gives the next ones that long, budgeted by ``budget_share`` as a stated
  deadline is — callers that give up after a second without saying so are then shed like
  callers that say so, instead of queueing for a deadline they never had. What is learned
  also ends the deadlines of such requests admitted before it was: the queue a spike's
  first second admitted under the default is dropped as it comes up, not worked through
  for callers that left (each one the model reached would be about to leave).
- once admitted, every piece of model work checks, as the model thread picks it up, that
  it can end before the deadline (by what that kind of work takes, and for a request's
  encode or extension the score that must follow it too) and that the caller is still
  connected; if not, the work is dropped, never computed (an
  :class:`~kvrank.errors.Abandoned`).

A request that finds more ahead of it than estimated (the model thread slowed by the spike
itself) is dropped uncomputed by its deadline (504) — late, but no work wasted. The admitted
requests in the pod and the wait are what an autoscaler reads (``kvrank_inflight_requests``,
``kvrank_estimated_wait_seconds``). This module does no I/O and knows nothing of HTTP: the
server turns a header into a :class:`Deadline` and maps the errors to status codes.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from kvrank.errors import Abandoned, Overloaded
from kvrank_common import MAX_TIMEOUT_MS, AdmissionMode

TIMEOUT_HEADER = "x-kvrank-timeout-ms"
"""How long the caller will wait for its answer, in milliseconds (``timeout_header``'s
value: a whole number from 1 to :data:`MAX_TIMEOUT_MS`)."""
SHED_REASONS = ("inflight", "deadline")
"""Why a request was shed: the pod held ``max_inflight`` requests already; or the estimated
wait left no time before the request's deadline."""
ABANDON_REASONS = ("deadline", "disconnected")
ABANDON_STAGES = ("admitted", "encode", "extend", "score", "full")
"""Where an admitted request was dropped: before its first model work (``admitted``), or as
the model thread picked up its encode, extend, score or no-cache forward."""


class AdmissionSettings(BaseModel):
    """The bounds of the scoring work one pod takes on (the server config's ``admission``)."""

    model_config = ConfigDict(extra="forbid")
    mode: AdmissionMode = Field(
        "shed",
        description="shed: refuse what cannot be served in time and drop work nobody waits"
        " for; drop: queue every request, drop only work nobody waits for; off: queue and"
        " compute everything (a server without admission control).",
    )
    default_timeout_ms: int = Field(
        5_000,
        ge=1,
        le=MAX_TIMEOUT_MS,
        description="The deadline of a request whose caller sends none (x-kvrank-timeout-ms),"
        " answered 504 once it passes (a caller that waits longer should say so). It is"
        " budgeted whole (a request is refused only when its wait would not fit in it), and"
        " while such callers are seen to disconnect sooner, they get the time they wait"
        " instead (patience_quantile). Callers should send their own (a ranking caller's is"
        " well under a second): a pod sheds by the deadlines it is given.",
    )
    max_inflight: int = Field(
        256,
        ge=1,
        le=65_536,
        description="Admitted scoring requests in the pod at once (waiting or computing);"
        " beyond it a request is shed. Bounds memory whatever the estimate says.",
    )
    budget_share: float = Field(
        0.25,
        gt=0,
        le=1,
        description="The share of a request's remaining time the pod budgets for its"
        " estimated wait and model work, for a deadline the caller sent or the pod learned"
        " (the default one is budgeted whole): a request is admitted only when both fit in it, so"
        " admitted requests are answered in about this share of their deadline. The rest is"
        " margin for what the estimate cannot see: under a spike the model thread runs"
        " slower than the times it measured (the event loop shares the process with it),"
        " and a pod admitting up to the very deadline finishes work after its callers left.",
    )
    patience_quantile: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="For callers that send no deadline: the quantile of how long the recent"
        " ones that disconnected had waited, given to the next ones as their deadline (the"
        " median caller's; budget_share is the margin, as for a sent deadline).",
    )
    cost_halflife: int = Field(
        32,
        ge=1,
        le=10_000,
        description="Requests over which the model time per request estimate halves its"
        " weight: short enough to follow a shift from hits to misses, long enough not to"
        " chase one slow request.",
    )


@dataclass
class Deadline:
    """When a request's caller stops waiting, and whether it has already gone."""

    at: float
    """On :func:`time.monotonic`'s clock."""
    clock: Callable[[], float] = time.monotonic
    caller_left: bool = False
    """Set (:meth:`leave`) when the caller's connection closed before the answer."""
    share: float | None = None
    """The share of the time left that admission budgets (``None``: ``budget_share``)."""
    stated: bool = True
    """Whether the caller sent it (else the pod chose it)."""
    started: float = 0.0
    left_after_s: float | None = None
    """How long the caller waited before it left."""
    waits: Callable[[], float | None] | None = None
    """For a deadline the pod chose (the caller sent none): how long such callers are
    seen to wait (:meth:`Patience.estimate_s`). Once that is known the deadline ends no
    later than that after the request came, also for requests admitted before it was: a
    queue admitted under the default when a spike began is not worked through for callers
    that have gone."""

    @classmethod
    def after_ms(
        cls,
        ms: float,
        clock: Callable[[], float] = time.monotonic,
        share: float | None = None,
        stated: bool = True,
    ) -> Deadline:
        now = clock()
        return cls(now + ms / 1e3, clock, share=share, stated=stated, started=now)

    def leave(self) -> bool:
        """The caller's connection closed: its work still queued is dropped uncomputed.
        Whether this is news (``False``: it had left already)."""
        if self.caller_left:
            return False
        self.caller_left = True
        self.left_after_s = self.clock() - self.started
        return True

    def due(self) -> float:
        """When the caller stops waiting (``at``, or sooner as :attr:`waits` says)."""
        waited = self.waits() if self.waits is not None else None
        return self.at if waited is None else min(self.at, self.started + waited)

    def left_s(self) -> float:
        return self.due() - self.clock()

    def reason_to_drop(self) -> str | None:
        """``disconnected`` or ``deadline`` when the work is no longer wanted, else ``None``."""
        if self.caller_left:
            return "disconnected"
        return "deadline" if self.left_s() <= 0 else None


@dataclass(eq=False)  # each one itself: the pod holds a set of them
class Ticket:
    """One admitted request: its deadline and the model time it has taken so far."""

    deadline: Deadline
    drops: bool = True
    """Whether work nobody waits for is dropped (admission ``mode`` not ``off``)."""
    model_s: float = 0.0

    def check(self, stage: str, need_s: float = 0.0) -> None:
        """Raise :class:`~kvrank.errors.Abandoned` if the work at ``stage``, which takes
        ``need_s``, is not wanted: its caller left, or it would end past the deadline."""
        if not self.drops:
            return
        reason = self.deadline.reason_to_drop()
        if reason is None and self.deadline.left_s() < need_s:
            reason = "deadline"  # it would end after the caller stopped waiting
        if reason is not None:
            raise Abandoned(reason, stage, self)


_CURRENT: contextvars.ContextVar[Ticket | None] = contextvars.ContextVar(
    "kvrank_ticket", default=None
)


def current_ticket() -> Ticket | None:
    """The ticket of the request whose task is running (``None`` outside one: warm-up,
    prefetch). The model runner reads it, so the cache between the service and the runner
    need not carry it."""
    return _CURRENT.get()


PATIENCE_STANDS_S = 0.1
"""How long an estimate of the callers' patience is reused before it is made again (a
departure makes it again at once)."""


class Patience:
    """How long callers that send no deadline wait, learned from the ones that left: the
    ``quantile`` of the waits of the last ``keep`` departures within ``window_s`` (``None``
    until ``at_least`` of them, or when none left lately: callers that wait are patient)."""

    def __init__(
        self,
        quantile: float,
        clock: Callable[[], float] = time.monotonic,
        keep: int = 64,
        at_least: int = 8,
        window_s: float = 60.0,
    ):
        self.quantile, self.clock = quantile, clock
        self.keep, self.at_least, self.window_s = keep, at_least, window_s
        self._left: deque[tuple[float, float]] = deque(maxlen=keep)
        self._known: tuple[float, float | None] | None = None
        """The last estimate and until when it stands (every admitted default deadline
        asks for it, many times a request)."""

    def observe(self, waited_s: float) -> None:
        self._left.append((self.clock(), waited_s))
        self._known = None

    def estimate_s(self) -> float | None:
        now = self.clock()
        if self._known is not None and now < self._known[0]:
            return self._known[1]
        waits = sorted(w for at, w in self._left if at >= now - self.window_s)
        estimate = (
            waits[round(self.quantile * (len(waits) - 1))] if len(waits) >= self.at_least else None
        )
        self._known = (now + PATIENCE_STANDS_S, estimate)
        return estimate


@dataclass
class AdmissionStats:
    admitted: int = 0
    shed: Counter[str] = field(default_factory=Counter)
    abandoned: Counter[tuple[str, str]] = field(default_factory=Counter)
    """``(reason, stage)`` → requests dropped there."""
    left: int = 0
    """Callers that disconnected before their answer."""


class Admission:
    """Admits or sheds each scoring request (see the module docstring)."""

    def __init__(
        self,
        settings: AdmissionSettings,
        queued_work_s: Callable[[], float] = lambda: 0.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.settings, self.clock = settings, clock
        self.queued_work_s = queued_work_s
        """The model work queued now, in seconds (the runner's estimate)."""
        self.admitted: set[Ticket] = set()
        """Admitted requests not yet answered."""
        self.loop_lag_s = 0.0
        """How far behind the event loop runs (see :func:`watch_loop_lag`)."""
        self.cost_s = 0.0
        """Model time per request, weighted mean (0 until one was measured)."""
        self.stats = AdmissionStats()
        self.patience = Patience(settings.patience_quantile, clock)
        """How long callers that send no deadline wait (learned from those that left)."""
        self._measured = 0
        self._weight = 1 - 0.5 ** (1 / settings.cost_halflife)

    def observe_loop_lag(self, late_s: float) -> None:
        """One tick of the event loop's lag monitor: how late a timer fired. The estimate
        follows a rise at once and decays by a tenth a tick."""
        self.loop_lag_s = max(late_s, 0.9 * self.loop_lag_s)

    def deadline(self, timeout_ms: float | None = None) -> Deadline:
        """A request's deadline ``timeout_ms`` after its caller sent it (a request reaches
        its route only after the event loop's lag, so that much of its time is gone). A
        caller that sends none (``None``) gets the default, all of it budgeted — or, while
        callers like it are seen to leave sooner, the time they wait (see the module)."""
        lag_ms = self.loop_lag_s * 1e3
        if timeout_ms is not None:
            return Deadline.after_ms(timeout_ms - lag_ms, self.clock)
        default_ms = float(self.settings.default_timeout_ms)
        patience_s = self.patience.estimate_s()
        if patience_s is None or patience_s * 1e3 >= default_ms:
            chosen = Deadline.after_ms(default_ms - lag_ms, self.clock, share=1.0, stated=False)
        else:
            chosen = Deadline.after_ms(patience_s * 1e3 - lag_ms, self.clock, stated=False)
        chosen.waits = self.patience.estimate_s
        return chosen

    @property
    def inflight(self) -> int:
        return len(self.admitted)

    def estimated_wait_s(self) -> float:
        """What a request admitted now would wait before its own model work: what every
        admitted request has still to do (a request's worth less its model time so far),
        and at least the work queued on the model thread."""
        # on every request's screen, over up to max_inflight tickets: kept to attribute reads
        # (a deadline that follows callers' patience follows this pod's, asked once here)
        cost, owed = self.cost_s, 0.0
        learned = self.patience.estimate_s()
        for t in self.admitted:
            d = t.deadline
            due = d.at if d.waits is None or learned is None else min(d.at, d.started + learned)
            if d.caller_left or due <= d.clock():
                continue  # dropped as the model thread comes to it
            if t.model_s < cost:
                owed += cost - t.model_s
        return max(owed, self.queued_work_s())

    def retry_after_s(self) -> int:
        """Whole seconds after which the queue now in the pod will have drained (>= 1)."""
        return max(1, math.ceil(self.estimated_wait_s()))

    def prefetch_refusal(self) -> str | None:
        """Why a prefetch must not run now (``None``: it may). A prefetch shifts work — the
        ranking request that follows would make the entry anyway — so it is worth its model
        time only when that time is spare: in ``shed`` mode it is refused while the pod holds
        ``max_inflight`` requests or a scoring request admitted now would wait more than one
        request's worth of model work (work it would otherwise queue behind)."""
        if self.settings.mode != "shed":
            return None
        if self.inflight >= self.settings.max_inflight:
            return "inflight"
        return "busy" if self.estimated_wait_s() > self.cost_s else None

    def screen(self, deadline: Deadline) -> None:
        """The check :meth:`admit` makes, before a request's body is even read (parsing a
        body is work too: under a spike, a shed answer must cost next to nothing)."""
        if self.settings.mode == "shed":
            self._refuse_if_overloaded(deadline)

    @contextlib.contextmanager
    def admit(self, deadline: Deadline) -> Iterator[Ticket]:
        """The request's ticket, current while the block runs; raises
        :class:`~kvrank.errors.Overloaded` (before any work) when it must be shed."""
        ticket = Ticket(deadline, drops=self.settings.mode != "off")
        ticket.check("admitted")  # gone before it got here (a slow body, a late header)
        if self.settings.mode == "shed":
            self._refuse_if_overloaded(deadline)
        self.admitted.add(ticket)
        self.stats.admitted += 1
        token = _CURRENT.set(ticket)
        try:
            yield ticket
        except Abandoned as exc:
            self.stats.abandoned[(exc.reason, exc.stage)] += 1
            raise
        finally:
            _CURRENT.reset(token)
            self.admitted.discard(ticket)
            if ticket.model_s > 0:
                self._observe_cost(ticket.model_s)
            if not deadline.stated and deadline.left_after_s is not None:
                self.patience.observe(deadline.left_after_s + self.loop_lag_s)

    def caller_left(self, deadline: Deadline) -> None:
        """The caller of ``deadline``'s request disconnected before its answer: its work
        still queued is dropped (see :meth:`Deadline.leave`), and it is counted."""
        if deadline.leave():
            self.stats.left += 1

    def _refuse_if_overloaded(self, deadline: Deadline) -> None:
        if self.inflight >= self.settings.max_inflight:
            self._shed("inflight", f"{self.inflight} requests in this pod (max_inflight)")
        wait, left = self.estimated_wait_s(), max(deadline.left_s(), 0.0)
        if self.inflight == 0 and wait == 0 and self.cost_s <= left:
            # idle: shedding here would also keep the estimate as it stands (nothing
            # admitted, nothing measured), so one slow request — a cold start, a stalled
            # CPU — would have the pod refuse everything from then on
            return
        share = self.settings.budget_share if deadline.share is None else deadline.share
        if wait + self.cost_s > share * left:
            whose = "" if deadline.stated else " (none sent: the pod's)"
            self._shed(
                "deadline",
                f"an estimated {wait * 1e3:.0f} ms wait and {self.cost_s * 1e3:.0f} ms of model"
                f" work exceed {'budget_share=' if deadline.share is None else ''}{share:g} of"
                f" the {left * 1e3:.0f} ms left before the deadline{whose}",
            )

    def _shed(self, reason: str, why: str) -> None:
        self.stats.shed[reason] += 1
        raise Overloaded(reason, why, self.retry_after_s())

    def _observe_cost(self, seconds: float) -> None:
        # the plain mean of the first requests, then the weighted one: the first request
        # measured (a miss, typically) does not stand for the mix until others come in
        self._measured += 1
        self.cost_s += max(self._weight, 1 / self._measured) * (seconds - self.cost_s)


LAG_TICK_S = 0.01


async def watch_loop_lag(admission: Admission, tick_s: float = LAG_TICK_S) -> None:
    """Runs for the server's life: how late a timer fires is how long anything new waits
    for the event loop — a request's time spent before its route runs, which no clock in
    the request shows."""
    while True:
        started = time.monotonic()
        await asyncio.sleep(tick_s)
        admission.observe_loop_lag(max(0.0, time.monotonic() - started - tick_s))
