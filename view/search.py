"""One text searched across every run's row tables, newest run first, within a time budget: which
runs and tables hold it, how many rows match, and a few of them."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from redline.errors import RedlineError, first_line
from redline.view import per_text, rows
from redline.view.catalog import RunInfo

MAX_QUERY_CHARS = 200
BUDGET_S = 10.0  # a request's total work: a search that would take longer says where it stopped
SHOWN = 3  # matching rows shown per table


@dataclass
class Hit:
    run: str
    table: str
    total: int
    exact: bool
    rows: list[dict[str, Any]]


@dataclass
class Found:
    hits: list[Hit] = field(default_factory=list)
    runs_searched: int = 0
    tables_searched: int = 0
    stopped: bool = False  # the budget ran out before every run was searched
    errors: list[str] = field(default_factory=list)


def search_runs(cache: rows.TableCache, root: str, runs: list[RunInfo], text: str,
                budget_s: float = BUDGET_S) -> Found:
    """Every table of every readable run in `runs` searched for `text` (the tables' text columns,
    case-insensitive, as a run page's search); a table whose query fails is named, never skipped."""
    text = text.strip()
    if not text or len(text) > MAX_QUERY_CHARS:
        raise RedlineError(f"search for a text of 1 to {MAX_QUERY_CHARS} characters")
    found, deadline = Found(), time.monotonic() + budget_s
    for run in runs:
        if run.manifest is None:
            continue
        if time.monotonic() > deadline:
            found.stopped = True
            break
        found.runs_searched += 1
        try:
            refs = rows.tables(root, run.id)
        except RedlineError as err:
            found.errors.append(f"{run.id}: {err}")
            continue
        for ref in refs:
            if ref.name == per_text.NAME:  # the predictions' texts again, pivoted: searched there
                continue
            if time.monotonic() > deadline:  # a run of many tables stops at the budget too
                found.stopped = True
                return found
            try:
                page = cache.query(ref, {}, None, 1, SHOWN, text)
            except RedlineError as err:
                found.errors.append(f"{run.id} {ref.name}: {err}")
                continue
            except pa.ArrowException as err:  # a column type the search cannot read
                found.errors.append(f"{run.id} {ref.name}: cannot search it ({first_line(err)})")
                continue
            found.tables_searched += 1
            if page.total:
                found.hits.append(Hit(run.id, ref.name, page.total, page.exact, page.rows))
    return found
