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
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

stderr_console = Console(stderr=True)

RECENT_S = 60.0  # the rate is the work done in the last minute (or since the first results, if later)


class Pace:
    """How far a piece of long work is and how fast it goes now: the one definition of its rate and
    time left, which the terminal bar, the log lines and the run's manifest (`redline view`'s "time
    left") all show. The rate is over the last `RECENT_S` seconds of results, never reaching back past
    the first results: start-up (actors loading models, the corpus being read) is not work to come,
    so it never makes an ETA; None until a second batch of results arrives."""

    def __init__(self, total: int) -> None:
        self.done, self.total = 0, total
        self.seen: list[tuple[float, int]] = []  # (when, done) at each result in the recent window

    def add(self, n: int, more: int = 0) -> None:
        self.done, self.total = self.done + n, self.total + more
        if n:
            now = time.monotonic()
            self.seen.append((now, self.done))
            while len(self.seen) > 2 and self.seen[1][0] <= now - RECENT_S:
                self.seen.pop(0)

    def rate(self) -> float | None:
        if not self.seen:
            return None
        at, done = self.seen[0]
        seconds = time.monotonic() - at
        return (self.done - done) / seconds if seconds > 0 and self.done > done else None

    def eta_s(self) -> float | None:
        rate = self.rate()
        return (self.total - self.done) / rate if rate and self.total > self.done else None

    def figures(self) -> dict[str, float | int | None]:
        """What a run's manifest records of it (`redline view` shows these, not a rate of its own)."""
        rate, eta = self.rate(), self.eta_s()
        return {"done": self.done, "total": self.total, "rate": None if rate is None else round(rate, 3),
                "eta_s": None if eta is None else round(eta, 1)}


class Advance:
    """What `progress_bar` yields: `advance(n, note=None, more=0)`: n more done; `note` (e.g. "hits 12")
    joins the line; `more`: the total grows (work found as it runs, e.g. shards as the corpus is read).
    `pace` is the work's figures whether or not anything is shown."""

    def __init__(self, pace: Pace, show: Callable[[int, str | None, int], None] | None = None) -> None:
        self.pace, self.show = pace, show

    def __call__(self, n: int = 1, note: str | None = None, more: int = 0) -> None:
        self.pace.add(n, more)
        if self.show is not None:
            self.show(n, note, more)


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
                 write: Callable[[str], None], pace: Pace | None = None) -> None:
        self.description, self.unit, self.interval, self.write = description, unit, interval, write
        self.pace = pace or Pace(total)
        self.note, self.notice = "", ""
        self.started = self.last = time.monotonic()

    def line(self) -> str:
        p = self.pace
        steady, eta = p.rate(), p.eta_s()
        rate = steady if steady is not None else p.done / max(time.monotonic() - self.started, 1e-9)
        pct = f" ({100 * p.done / p.total:.0f}%)" if p.total else ""
        eta_text = f", ETA {_eta(eta)}" if eta is not None else ""
        note = f", {self.note}" if self.note else ""
        notice = f" [{self.notice}]" if self.notice else ""
        return (f"{self.description}: {p.done:,}/{p.total:,}{pct} {self.unit}, {rate:,.1f} {self.unit}/s{eta_text}"
                f"{note}{notice}")

    def advance(self, n: int = 1, note: str | None = None, more: int = 0) -> None:
        self.pace.add(n, more)
        self.report(note)

    def report(self, note: str | None = None) -> None:
        """A line if the interval has passed (the pace advanced by its caller)."""
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
    """Yields an `Advance` (`advance(n, note=None, more=0)`, its figures in `advance.pace`); nothing
    is shown when progress is off (tests set REDLINE_PROGRESS=0), and the pace is kept all the same."""
    mode, pace = progress_mode(), Pace(total)
    if mode == "off":
        yield Advance(pace)
        return
    if mode == "lines":
        interval = float(os.environ.get("REDLINE_PROGRESS_INTERVAL", "10"))
        plain = PlainProgress(description, total, unit, interval, lambda s: print(s, file=sys.stderr, flush=True), pace)
        with ticking(min(interval, 5.0), plain.tick):
            yield Advance(pace, lambda n, note, more: plain.report(note))
        plain.finish()
        return
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("{task.fields[left]}"),
               TextColumn("{task.fields[note]}", markup=False)]
    with Progress(*columns, console=stderr_console, transient=False) as progress:
        task = progress.add_task(description, total=total, rate="", left="", note="")
        notes = {"note": "", "notice": ""}

        def show() -> None:
            text = " ".join(t for t in (notes["note"], f"[{notes['notice']}]" if notes["notice"] else "") if t)
            progress.update(task, note=text)

        def tick(notice: str) -> None:
            notes["notice"] = notice
            show()

        def advance(n: int, note: str | None, more: int) -> None:
            if more:
                progress.update(task, total=pace.total)
            progress.advance(task, n)
            rate, eta = pace.rate(), pace.eta_s()
            progress.update(task, rate="" if rate is None else f"{rate:,.0f} {unit}/s",
                            left="" if eta is None else f"{_eta(eta)} left")
            if note is not None:
                notes["note"] = note
                show()

        with ticking(1.0, tick):
            yield Advance(pace, advance)
