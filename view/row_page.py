"""One row in full: every column, its word diff where the table pairs a seed with its perturbed text,
the rows of the run's other tables that share its id (each stage's verdict and reason, each
detector's score, the judge's answer), the config that made the run, and the same text in other runs."""

from __future__ import annotations

from typing import Any

from redline.errors import RedlineError
from redline.view import rows, search
from redline.view.catalog import RunInfo
from redline.view.diff import outcome_view

ELSEWHERE_S = 3.0  # the other runs searched for the same text: a share of the request's budget
MAX_ROWS_PER_TABLE = 5


def text_of(row: dict[str, Any]) -> str:
    """A row in one line: its first text-like value, cut."""
    for key in ("text", "perturbed_text", "response", "seed_text", "context", "target", "trigger"):
        if isinstance(row.get(key), str):
            return row[key][:200]
    return next((v[:200] for v in row.values() if isinstance(v, str)), "")


def row_context(cache: rows.TableCache, root: str, info: RunInfo, table: str, row_id: str,
                runs: list[RunInfo]) -> dict[str, Any]:
    """What the row page shows; a LookupError when the run has no such table or row."""
    refs = rows.tables(root, info.id)
    ref = next((r for r in refs if r.name == table), None)
    if ref is None:
        raise LookupError(f"no table {table[:80]!r} in run {info.id}")
    found = cache.query(ref, {"id": row_id}, None, 1, 1)
    if not found.rows:
        raise LookupError(f"no row with id {row_id[:80]!r} in {info.id} {table}")
    row = found.rows[0]
    diff = outcome_view(row, found.pair) if found.pair else None
    related = []
    for other in refs:
        if other.name == table:
            continue
        try:
            page = cache.query(other, {"id": row_id}, None, 1, MAX_ROWS_PER_TABLE)
        except RedlineError:  # a table without ids (a summary), or one that cannot be filtered by it
            continue
        if page.rows:
            related.append({"table": other.name, "rows": page.rows, "total": page.total})
    text = text_of(row)
    others = (search.search_runs(cache, root, [r for r in runs if r.id != info.id], text, ELSEWHERE_S)
              if text.strip() else None)  # a blank text is nothing to look for
    return {"row": row, "table": table, "row_id": row_id, "pair": found.pair, "diff": diff, "related": related,
            "text": text, "elsewhere": others}
