"""The report builder every pipeline's report is made with: tables (Markdown, CSV, HTML), plots and
the page around them. Each pipeline's own report lives with its pipeline."""

from __future__ import annotations

import base64
import csv
import html
import io
import math
from typing import Any

import numpy as np

from redline.cluster import storage
from redline.cluster.runs import RunDir


def format_value(value: Any, fmt: str) -> str:
    """A table cell: "–" for missing values, the value as text when the format does not fit it."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    try:
        return format(value, fmt)
    except (TypeError, ValueError):
        return str(value)


def markdown_table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    head = "| " + " | ".join(title for _, title, _ in columns) + " |"
    rule = "|" + "|".join("---" if fmt == "s" else "---:" for _, _, fmt in columns) + "|"
    body = ["| " + " | ".join(format_value(r.get(k), f) for k, _, f in columns) + " |" for r in rows]
    return "\n".join([head, rule, *body])


def html_table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    head = "".join(f"<th>{html.escape(t)}</th>" for _, t, _ in columns)
    body = "".join(
        "<tr>" + "".join(f"<td class='{'txt' if f == 's' else 'num'}'>{html.escape(format_value(r.get(k), f))}</td>"
                         for k, _, f in columns) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def csv_text(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    keys = list(dict.fromkeys(k for r in rows for k in r))
    writer = csv.DictWriter(buf, fieldnames=keys)
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def png_bytes(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def grouped_bars(rows: list[dict[str, Any]], name_key: str, series: list[tuple[str, str]], title: str) -> bytes | None:
    """One group of bars per row (named by `name_key`), one bar per (key, legend) in `series`; rates in [0, 1]."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rows:
        return None
    x = np.arange(len(rows))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(5.2, 1.6 * len(rows) + 2), 3.6))
    for j, (key, label) in enumerate(series):
        ax.bar(x + j * width - 0.4 + width / 2, [r.get(key) or 0 for r in rows], width, label=label)
    ax.set_xticks(x, [str(r[name_key]) for r in rows], rotation=15)
    ax.set(ylim=(0, 1), ylabel="rate", title=title)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    data = png_bytes(fig)
    plt.close(fig)
    return data


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1200px;color:#222}
h1{font-size:1.5rem} h2{font-size:1.15rem;margin-top:2rem}
table{border-collapse:collapse;font-size:.85rem;margin:.5rem 0}
th,td{border:1px solid #ddd;padding:.3rem .55rem} th{background:#f4f4f6;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums} tbody tr:nth-child(even){background:#fafafa}
.meta{color:#555;font-size:.85rem} img{max-width:100%;margin:.5rem 1rem .5rem 0;border:1px solid #eee}
"""


def html_page(title: str, sections: list[tuple[str, str]], meta: str) -> str:
    body = "".join(f"<h2>{html.escape(h)}</h2>{content}" for h, content in sections)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>"
            f"<p class='meta'>{meta}</p>{body}</body></html>\n")


def img_tag(png: bytes, alt: str) -> str:
    return f"<img alt='{html.escape(alt)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"


class Report:
    """Builds report.md and report.html of a run from the same sections (tables, plots, notes)."""

    def __init__(self, run: RunDir, title: str, manifest: dict[str, Any], note: str) -> None:
        self.run, self.title, self.manifest = run, title, manifest
        self.md = [f"# {title}", "", f"Run: `{run.uri}` (config {manifest.get('config_hash')})", "", note, ""]
        self.sections: list[tuple[str, str]] = []
        self.note_html = f"<p>{html.escape(note)}</p>"

    def table(self, heading: str, rows: list[dict[str, Any]], cols: list[tuple[str, str, str]]) -> "Report":
        if rows:
            self.md += [f"## {heading}", "", markdown_table(rows, cols), ""]
            lead, self.note_html = self.note_html, ""  # the note sits above the first table
            self.sections.append((heading, lead + html_table(rows, cols)))
        return self

    def plot(self, name: str, png: bytes | None) -> "Report":
        if png:
            storage.write_bytes(self.run.path("plots", f"{name}.png"), png)
            self.md += [f"![{name}.png](plots/{name}.png)", ""]
            if self.sections and self.sections[-1][0] == "Plots":  # consecutive plots share one heading
                self.sections[-1] = ("Plots", self.sections[-1][1] + img_tag(png, name))
            else:
                self.sections.append(("Plots", img_tag(png, name)))
        return self

    def links(self, heading: str, links: list[tuple[str, str]]) -> "Report":
        """A list of (label, href) links, e.g. to the reports of related runs."""
        if links:
            self.md += [f"## {heading}", "", *(f"- [{label}]({href})" for label, href in links), ""]
            items = "".join(f"<li><a href='{html.escape(href)}'>{html.escape(label)}</a></li>" for label, href in links)
            self.sections.append((heading, f"<ul>{items}</ul>"))
        return self

    def text(self, heading: str, text: str) -> "Report":
        self.md += [f"## {heading}", "", "```", text, "```", ""]
        self.sections.append((heading, f"<pre>{html.escape(text)}</pre>"))
        return self

    def paragraph(self, heading: str, text: str) -> "Report":
        """Prose under a heading (text shows as written, in code blocks)."""
        self.md += [f"## {heading}", "", text, ""]
        self.sections.append((heading, f"<p>{html.escape(text)}</p>"))
        return self

    def write(self, csv_name: str, csv_rows: list[dict[str, Any]]) -> None:
        storage.write_text(self.run.path("report.md"), "\n".join(self.md) + "\n")
        storage.write_text(self.run.path(csv_name), csv_text(csv_rows))
        versions = self.manifest.get("versions", {})
        meta = f"run {html.escape(self.run.uri)} · config {self.manifest.get('config_hash')}" + "".join(
            f" · {name} {versions[name]}" for name in ("redline", "ray") if versions.get(name))
        storage.write_text(self.run.path("report.html"), html_page(self.title, self.sections, meta))


COUNT_COLUMNS: list[tuple[str, str, str]] = [("what", "", "s"), ("n", "count", "s")]
