"""Runs of one pipeline side by side: a grid of every figure by run (with its n and 95% interval
where the figure is a share of a counted figure, and its difference from the first run), a chart
of one chosen figure across the runs, and the settings their configs differ in."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from redline.pipelines import aggregates as A
from redline.pipelines.figures import Figure, Table
from redline.pipelines.uncertainty import wilson
from redline.view import charts
from redline.view.catalog import RunInfo, row_label, summary_rows

MAX_CONFIG_KEYS = 400  # settings compared per run (a config is bounded, but a list of detectors can be long)


@dataclass
class Cell:
    value: float | None
    n: int | None = None
    low: float | None = None
    high: float | None = None
    delta: float | None = None  # the value minus the first run's


def numeric_figures(table: Table) -> list[Figure]:
    return [f for f in table.values if f.shown and f.format not in ("s", "d") and f.compute is not None]


def _counted(value: A.Value | None) -> str | None:
    """What a count counts, by its stable name (the row conditions' functions differ between two
    declarations of the same count)."""
    return value.name if isinstance(value, A.Aggregate) else None


def count_of(table: Table, figure: Figure) -> Figure | None:
    """The counted figure a rate is a share of (its Ratio's denominator, declared as a count), if any."""
    if not isinstance(figure.compute, A.Ratio) or _counted(figure.compute.denominator) is None:
        return None
    wanted = _counted(figure.compute.denominator)
    return next((f for f in table.values if f.format == "d" and _counted(f.compute) == wanted), None)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def grid(table: Table, runs: list[RunInfo]) -> tuple[list[tuple[str, Figure]], list[list[Cell]]]:
    """(the grid's rows: a summary row's label and a figure; one cell per run in each)."""
    keys = tuple(k.key for k in table.keys)
    by_run = [{row_label(r, keys): r for r in summary_rows(run.manifest) if isinstance(r, dict)} for run in runs]
    labels = list(dict.fromkeys(label for rows in by_run for label in rows))
    lines, cells = [], []
    for label in labels:
        for figure in numeric_figures(table):
            counted = count_of(table, figure)
            line = []
            for rows in by_run:
                row = rows.get(label, {})
                value = _number(row.get(figure.key))
                n = _number(row.get(counted.key)) if counted else None
                interval = wilson(round(value * n), int(n)) if value is not None and n and 0 <= value <= 1 else None
                line.append(Cell(value, int(n) if n is not None else None, *(interval or (None, None))))
            if all(c.value is None for c in line):
                continue
            first = line[0].value
            for c in line:
                c.delta = None if c.value is None or first is None else c.value - first
            lines.append((label, figure))
            cells.append(line)
    return lines, cells


def chart(table: Table, runs: list[RunInfo], key: str) -> str | None:
    """One figure across the runs: a group per summary row, a bar per run."""
    figure = table.figure(key)
    keys = tuple(k.key for k in table.keys)
    series, groups = [], []
    for run in runs:
        values = {row_label(r, keys): _number(r.get(key)) for r in summary_rows(run.manifest) if isinstance(r, dict)}
        groups += [g for g, v in values.items() if v is not None and g not in groups]
        series.append((run.name, values))
    if not groups:
        return None
    return charts.grouped_bars(groups, [(name, [v.get(g) for g in groups]) for name, v in series],
                               f"{figure.label} by run", figure.label)


def flatten(value: Any, prefix: str = "", out: dict[str, str] | None = None) -> dict[str, str]:
    """A config as dotted settings (`detectors.0.name`) and their values as JSON text."""
    out = {} if out is None else out
    if len(out) >= MAX_CONFIG_KEYS:
        return out
    if isinstance(value, dict):
        for k, v in value.items():
            flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        for i, v in enumerate(value):
            flatten(v, f"{prefix}.{i}", out)
    else:
        out[prefix] = json.dumps(value, sort_keys=True)[:200]
    return out


def config_diff(runs: list[RunInfo]) -> list[tuple[str, list[str | None]]]:
    """The settings whose values differ between the runs (run_name and output left out), each run's value."""
    flat = [flatten((run.manifest or {}).get("config") or {}) for run in runs]
    keys = list(dict.fromkeys(k for f in flat for k in f if k not in ("run_name", "output")))
    return [(k, [f.get(k) for f in flat]) for k in keys if len({f.get(k) for f in flat}) > 1]
