"""Runs of one pipeline side by side: a grid of every figure by run (with its n and 95% interval
where the figure is a share of a counted figure, and its difference from the first run), a chart
of one chosen figure across the runs, the settings their configs differ in, and for two score or
transfer runs of one corpus the texts whose verdict changed between them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

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
            counted = table.count_of(figure)
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


MAX_CHANGED_ROWS = 500_000  # prediction rows read per run for "what changed" (a request's work budget)
SHOWN_CHANGED = 100


def _predictions(cache: Any, root: str, run: RunInfo) -> Any:
    from redline.view import rows

    ref = next((r for r in rows.tables(root, run.id) if r.name == "predictions"), None)
    return None if ref is None else cache.get(ref)


def _verdicts(source: Any, columns: list[str]) -> Iterator[pa.Table]:
    read = 0
    for piece in source.pieces:
        for batch in piece.batches(columns):
            yield batch
            read += batch.num_rows
            if read >= MAX_CHANGED_ROWS:
                return


def changed(cache: Any, root: str, a: RunInfo, b: RunInfo) -> dict[str, Any] | None:
    """The texts whose verdict changed between run `a` and run `b` (same ids, same detector), for two
    score or transfer runs of one corpus; None when either has no predictions."""
    first, second = _predictions(cache, root, a), _predictions(cache, root, b)
    if first is None or second is None:
        return None
    before: dict[tuple[str, str], bool | None] = {}
    for batch in _verdicts(first, ["id", "detector", "pred_toxic"]):
        before.update(zip(zip(batch.column("id").to_pylist(), batch.column("detector").to_pylist()),
                          batch.column("pred_toxic").to_pylist()))
    shown: list[dict[str, Any]] = []
    total = compared = read = 0
    for batch in _verdicts(second, ["id", "detector", "pred_toxic", "text", "label"]):
        read += batch.num_rows
        cols = {c: batch.column(c).to_pylist() if c in batch.column_names else [None] * batch.num_rows
                for c in ("id", "detector", "pred_toxic", "text", "label")}
        for i, key in enumerate(zip(cols["id"], cols["detector"])):
            if key not in before:
                continue
            compared += 1
            was, now = before[key], cols["pred_toxic"][i]
            if was is None or now is None or was == now:
                continue
            total += 1
            if len(shown) < SHOWN_CHANGED:
                shown.append({"id": key[0], "detector": key[1], "text": (cols["text"][i] or "")[:300],
                              "label": cols["label"][i], "before": was, "after": now})
    complete = len(before) < MAX_CHANGED_ROWS and read < MAX_CHANGED_ROWS
    return {"a": a, "b": b, "total": total, "compared": compared, "rows": shown, "complete": complete}
