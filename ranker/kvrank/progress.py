"""Progress of the long commands (``bench``, ``loadtest``, ``shadowtest``) on standard error.

A person at a terminal sees a bar per phase (the requests a load test has answered so far,
the step a benchmark is at); where standard error is a log or a pipe, nothing is drawn, so
the report on standard output and a CI log stay the same. rich draws the bars from its own
thread; :meth:`Bars.advance` may be called from any.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)


class Bars:
    """Named bars on one display: :meth:`add` one per phase, :meth:`advance` it."""

    def __init__(self, progress: Progress | None) -> None:
        self._progress = progress
        self._tasks: dict[str, TaskID] = {}

    def add(self, name: str, description: str, total: float | None) -> None:
        if self._progress is not None:
            self._tasks[name] = self._progress.add_task(description, total=total)

    def advance(self, name: str, steps: float = 1.0, description: str | None = None) -> None:
        if self._progress is None or name not in self._tasks:
            return
        task = self._tasks[name]
        if description is None:
            self._progress.advance(task, steps)
        else:
            self._progress.update(task, advance=steps, description=description)


@contextlib.contextmanager
def bars(console: Console | None = None) -> Iterator[Bars]:
    """Bars drawn on ``console`` (standard error by default) while it is a terminal; a
    :class:`Bars` that draws nothing otherwise. The bars are gone once the block ends."""
    console = console if console is not None else Console(stderr=True)
    if not console.is_terminal:
        yield Bars(None)
        return
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    with progress:
        yield Bars(progress)
