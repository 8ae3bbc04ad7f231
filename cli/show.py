"""What every command prints with: the consoles and the one table printer."""

from __future__ import annotations

import os
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

# Wide enough for the metrics tables when output goes to a pipe or a file (rich assumes 80 columns).
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def verbose() -> bool:
    return os.environ.get("REDLINE_VERBOSE") == "1"


def print_table(title: str, rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> None:
    """Rows as a table: columns are (key, heading, format); text columns left, numbers right."""
    from redline.pipelines.reporting.report import format_value  # numpy and pyarrow: only when a table prints

    table = Table(title=title)
    for _, heading, fmt in columns:
        table.add_column(heading, justify="left" if fmt == "s" else "right", overflow="fold")
    for row in rows:
        table.add_row(*(format_value(row.get(k), f) for k, _, f in columns))
    console.print(table)


def show_result(pipeline: Any, result: Any) -> None:
    """A pipeline run's summary table, its notes, and where its report is."""
    if result.reused:
        err_console.print(f"[dim]config already run in {result.run_uri}; reusing it (pass --force to redo)[/dim]")
    print_table(pipeline.title, result.summary, pipeline.columns(result.manifest))
    for note in pipeline.notes(result.manifest):
        console.print(note)
    console.print(f"report: [bold]{result.report_html}[/bold]")
