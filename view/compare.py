"""Runs of one pipeline side by side: a grid of every figure by run (with its n and 95% interval
where the figure is a share of a counted figure, and its difference from the first run), a chart
of one chosen figure across the runs, the settings their configs differ in, and for two score or
transfer runs of one corpus the texts whose verdict changed between them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from redline.pipelines.reporting.figures import Figure, Table
from redline.pipelines.reporting.uncertainty import wilson
from redline.view import charts
from redline.view.catalog import RunInfo, row_label, summary_rows
from redline.view.scan import FilePiece, Source

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


MAX_CHANGED_ROWS = 100_000  # prediction rows read per run for "what changed" (a request's work budget)
SHOWN_CHANGED = 100


def _predictions(root: str, run: RunInfo) -> Source | None:
    """The run's predictions as far as compare reads them: its first parts, in table order, up to
    MAX_CHANGED_ROWS rows (opened by their footers: a 10M-row run's index is not needed for 0.1M)."""
    from redline.view import rows

    ref = next((r for r in rows.tables(root, run.id) if r.name == "predictions"), None)
    if ref is None:
        return None
    pieces, held = [], 0
    for rel, _, _ in ref.files:
        if held >= MAX_CHANGED_ROWS:
            break
        pieces.append(FilePiece.open(root, [*run.id.split("/"), *rel.split("/")]))
        held += pieces[-1].num_rows
    return Source.of_pieces(f"{run.id}'s predictions", pieces)


def _verdicts(source: Any, row: bool = False) -> pa.Table:
    """(id, detector, pred_toxic) of the table's first MAX_CHANGED_ROWS rows, read a few parts at once;
    with `row`, each one's row number in the table."""
    batches, read = [], 0
    for at, batch in source.scan(["id", "detector", "pred_toxic"]):
        batch = batch.slice(0, MAX_CHANGED_ROWS - read)
        if row:
            batch = batch.append_column("row", pa.array(np.arange(at, at + batch.num_rows)))
        batches.append(batch)
        read += batch.num_rows
        if read >= MAX_CHANGED_ROWS:
            break
    return pa.concat_tables(batches) if batches else pa.table({})


def changed(root: str, a: RunInfo, b: RunInfo) -> dict[str, Any] | None:
    """The texts whose verdict changed between run `a` and run `b` (same ids, same detector), for two
    score or transfer runs of one corpus; None when either has no predictions. The first
    MAX_CHANGED_ROWS rows of each are compared (joined by id and detector), the first SHOWN_CHANGED
    changes in `b`'s order shown."""
    first, second = _predictions(root, a), _predictions(root, b)
    if first is None or second is None:
        return None
    before, after = _verdicts(first), _verdicts(second, row=True)
    if not before.num_rows or not after.num_rows:
        return {"a": a, "b": b, "total": 0, "compared": 0, "rows": [], "complete": True, "bound": MAX_CHANGED_ROWS}
    if before.num_rows == after.num_rows and all(pc.all(pc.equal(after.column(c), before.column(c))).as_py()
                                                 for c in ("id", "detector")):
        both = after.append_column("was", before.column("pred_toxic"))  # one corpus, one layout: row by row
    else:
        both = after.join(before.rename_columns(["id", "detector", "was"]), ["id", "detector"], join_type="inner",
                          use_threads=False)
    flipped = both.filter(pc.fill_null(pc.not_equal(both.column("pred_toxic"), both.column("was")), False))
    first_ones = flipped.sort_by("row").slice(0, SHOWN_CHANGED)
    shown = [{"id": r["id"], "detector": r["detector"], "text": (r.get("text") or "")[:300], "label": r.get("label"),
              "before": was, "after": r["pred_toxic"]}
             for r, was in zip(second.rows(first_ones.column("row").to_pylist()), first_ones.column("was").to_pylist())]
    complete = before.num_rows < MAX_CHANGED_ROWS and after.num_rows < MAX_CHANGED_ROWS
    return {"a": a, "b": b, "total": flipped.num_rows, "compared": both.num_rows, "rows": shown, "complete": complete,
            "bound": MAX_CHANGED_ROWS}
