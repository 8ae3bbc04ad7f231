"""Rich progress bars for long work, drawn on stderr and only when it is a terminal or forced."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

stderr_console = Console(stderr=True)


def progress_enabled() -> bool:
    if os.environ.get("REDLINE_PROGRESS") in ("0", "false", "off"):
        return False
    return sys.stderr.isatty() or os.environ.get("REDLINE_PROGRESS") in ("1", "true", "on")


@contextmanager
def progress_bar(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """Yields `advance(n)`; a no-op when progress is disabled (pipes, CI, tests)."""
    if not progress_enabled():
        yield lambda n: None
        return
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=stderr_console, transient=False) as progress:
        task = progress.add_task(description, total=total, rate="")

        def advance(n: int) -> None:
            progress.advance(task, n)
            elapsed = progress.tasks[task].elapsed or 0
            if elapsed > 0:
                progress.update(task, rate=f"{progress.tasks[task].completed / elapsed:,.0f} rows/s")

        yield advance
