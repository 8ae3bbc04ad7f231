"""Progress on long work: a rich bar on a terminal; where stderr is not one (Ray job logs, CI,
`| tee`) a plain line at most every `REDLINE_PROGRESS_INTERVAL` seconds (10 by default) with the
stage, done/total, rate and ETA, and one when the work ends. `REDLINE_PROGRESS=0` silences both;
`lines` asks for the plain lines even on a terminal (a pod's log), `1` for the bar anywhere."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

stderr_console = Console(stderr=True)

Advance = Callable[..., None]  # advance(n, note=None, more=0): n more done; `note` (e.g. "hits 12") joins the
# line; `more`: the total grows (work found as it runs, e.g. shards as the corpus is read)


def progress_mode() -> str:
    """`bar` on a terminal, `lines` elsewhere, `off` when asked."""
    setting = os.environ.get("REDLINE_PROGRESS", "").lower()
    if setting in ("0", "false", "off"):
        return "off"
    if setting == "lines":
        return "lines"
    if sys.stderr.isatty() or setting in ("1", "true", "on", "bar"):
        return "bar"
    return "lines"


def _eta(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


class PlainProgress:
    """Periodic one-line reports for logs."""

    def __init__(self, description: str, total: int, unit: str, interval: float,
                 write: Callable[[str], None]) -> None:
        self.description, self.total, self.unit, self.interval, self.write = description, total, unit, interval, write
        self.done, self.note, self.notice = 0, "", ""
        self.started = self.last = time.monotonic()
        self.first: tuple[float, int] | None = None  # when the first results came, and how many

    def rate(self) -> float | None:
        """The rate since the first results: start-up (actors loading models) is not work to come,
        so it never makes an ETA; None until a second batch of results arrives."""
        if self.first is None:
            return None
        at, done = self.first
        seconds = time.monotonic() - at
        return (self.done - done) / seconds if seconds > 0 and self.done > done else None

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        steady = self.rate()
        rate = steady if steady is not None else self.done / elapsed
        pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        eta = f", ETA {_eta((self.total - self.done) / steady)}" if steady and self.total > self.done else ""
        note = f", {self.note}" if self.note else ""
        notice = f" [{self.notice}]" if self.notice else ""
        return (f"{self.description}: {self.done:,}/{self.total:,}{pct} {self.unit}, {rate:,.1f} {self.unit}/s{eta}{note}"
                f"{notice}")

    def advance(self, n: int = 1, note: str | None = None, more: int = 0) -> None:
        self.done, self.total = self.done + n, self.total + more
        if self.first is None and n:
            self.first = (time.monotonic(), self.done)
        if note is not None:
            self.note = note
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            self.write(self.line())

    def tick(self, notice: str) -> None:
        """From the ticker: the workers' notices, and a line even when nothing arrived for a while."""
        self.notice = notice
        if time.monotonic() - self.last >= self.interval:
            self.last = time.monotonic()
            self.write(self.line())

    def finish(self) -> None:
        elapsed = time.monotonic() - self.started
        self.write(f"{self.line().split(', ETA')[0]} — done in {_eta(elapsed)}")


@contextmanager
def ticking(every: float, tick: Callable[[str], None]) -> Iterator[None]:
    """Calls `tick(notices)` every `every` seconds from a thread while the block runs, with what the
    workers posted (`cluster.notices`): a run that waits on a remote service says so."""
    from redline.cluster import notices

    notices.open_board()
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every):
            tick(notices.current())

    thread = threading.Thread(target=loop, name="redline-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=2)


@contextmanager
def progress_bar(description: str, total: int, unit: str = "rows") -> Iterator[Advance]:
    """Yields `advance(n, note=None)`; a no-op when progress is off (tests set REDLINE_PROGRESS=0)."""
    mode = progress_mode()
    if mode == "off":
        yield lambda n=1, note=None, more=0: None
        return
    if mode == "lines":
        interval = float(os.environ.get("REDLINE_PROGRESS_INTERVAL", "10"))
        plain = PlainProgress(description, total, unit, interval, lambda s: print(s, file=sys.stderr, flush=True))
        with ticking(min(interval, 5.0), plain.tick):
            yield plain.advance
        plain.finish()
        return
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[note]}", markup=False)]
    with Progress(*columns, console=stderr_console, transient=False) as progress:
        task = progress.add_task(description, total=total, rate="", note="")
        notes = {"note": "", "notice": ""}

        def show() -> None:
            text = " ".join(t for t in (notes["note"], f"[{notes['notice']}]" if notes["notice"] else "") if t)
            progress.update(task, note=text)

        def tick(notice: str) -> None:
            notes["notice"] = notice
            show()

        def advance(n: int = 1, note: str | None = None, more: int = 0) -> None:
            if more:
                progress.update(task, total=(progress.tasks[task].total or 0) + more)
            progress.advance(task, n)
            elapsed = progress.tasks[task].elapsed or 0
            if elapsed > 0:
                progress.update(task, rate=f"{progress.tasks[task].completed / elapsed:,.0f} {unit}/s")
            if note is not None:
                notes["note"] = note
                show()

        with ticking(1.0, tick):
            yield advance
