"""The long commands show their progress to a person at a terminal, and only there: a log or
a pipe gets the report alone."""

from __future__ import annotations

import io
import threading

from rich.console import Console

from kvrank.progress import bars


def _run(console: Console) -> None:
    with bars(console) as shown:
        shown.add("cache", "cached pods", 40)
        shown.add("alone", "no-cache pod alone", 2)
        # a load test's answers come in from its event loop, not the drawing thread
        workers = [threading.Thread(target=shown.advance, args=("cache",)) for _ in range(40)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        shown.advance("alone", description="no-cache pod alone (warm)")


def test_a_terminal_sees_each_phase_with_its_count() -> None:
    out = io.StringIO()
    _run(Console(file=out, force_terminal=True, width=100))
    drawn = out.getvalue()
    assert "cached pods" in drawn and "40/40" in drawn
    assert "no-cache pod alone (warm)" in drawn and "1/2" in drawn


def test_a_log_or_a_pipe_gets_nothing() -> None:
    out = io.StringIO()
    _run(Console(file=out, force_terminal=False))
    assert out.getvalue() == ""
