"""The one run skeleton every pipeline shares: preflight, open (or reuse) the run directory, do the
work, record the summary, write the report, mark the run complete; a failure marks it failed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from redline.cluster.config import RunConfig
from redline.cluster.runs import (
    Run,
    RunDir,
    RunResult,
    Stopwatch,
    complete,
    lifecycle,
    open_run,
)

C = TypeVar("C", bound=RunConfig)
Columns = list[tuple[str, str, str]]  # (key, heading, format)


@dataclass(frozen=True)
class Gate:
    """The figures `--fail-if` rules may name, and how to read them from a finished run's manifest
    (each a dict with value, n, low, high)."""

    keys: tuple[str, ...]
    figures: Callable[[dict[str, Any]], dict[str, dict[str, Any]]]


@dataclass(frozen=True)
class Pipeline(Generic[C]):
    """A pipeline: its name (run directories and manifests use it), config model and the steps the
    skeleton calls. `execute` does the work inside the run and returns the summary rows (stored as
    `manifest["summary"]`); `write_report` renders report.md / report.html from the run directory
    alone, so `redline report RUN` can redo it."""

    name: str
    config: type[C]
    execute: Callable[[C, Run, Stopwatch, bool], list[dict[str, Any]]]
    write_report: Callable[[RunDir, dict[str, Any]], None]
    title: str
    columns: Callable[[dict[str, Any]], Columns]
    preflight: Callable[[C], None] = lambda config: None
    notes: Callable[[dict[str, Any]], list[str]] = lambda manifest: []
    gate: Gate | None = None  # figures a release gate can check (`--fail-if`)

    def run(self, config: C, *, force: bool = False, verbose: bool = False) -> RunResult:
        self.preflight(config)
        run = open_run(self.name, config, config.output, config.run_name, force)
        if run.reused:
            return RunResult(run.uri, run.manifest, run.manifest.get("summary", []), reused=True)
        watch = Stopwatch()
        with lifecycle(run):
            summary = self.execute(config, run, watch, verbose)
            run.manifest["summary"] = summary
            self.write_report(run.dir, run.manifest)
            watch.lap("report_s")
            run.manifest["timings"] = {**run.manifest.get("timings", {}), **watch.timings}
            complete(run)
        return RunResult(run.uri, run.manifest, summary)
