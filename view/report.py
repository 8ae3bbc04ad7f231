"""A run's report.md as HTML inside the viewer: raw HTML in it stays text, plots load from the run
directory through the viewer, and links to other runs' reports open those runs in the viewer."""

from __future__ import annotations

import posixpath
from urllib.parse import urlencode, urlparse

from markdown_it import MarkdownIt

from redline.view.catalog import MAX_DEPTH, SEGMENT


def render(markdown: str, run_id: str) -> str:
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = md.parse(markdown)
    for token in tokens:
        for child in token.children or []:
            if child.type == "image":
                child.attrSet("src", file_url(run_id, str(child.attrGet("src") or "")) or "")
            elif child.type == "link_open":
                child.attrSet("href", link_url(run_id, str(child.attrGet("href") or "")))
    html = md.renderer.render(tokens, md.options, {})
    # table alignment as classes: the viewer's content policy allows no inline styles
    return html.replace(' style="text-align:right"', ' class="num"').replace(' style="text-align:left"', "")


def file_url(run_id: str, name: str) -> str | None:
    """The viewer URL of a file inside the run directory, None for anything outside it."""
    if urlparse(name).scheme or name.startswith("/"):
        return None
    path = posixpath.normpath(name)
    if path.startswith(".."):
        return None
    return "/file?" + urlencode({"id": run_id, "name": path})


def link_url(run_id: str, href: str) -> str:
    """Links of a report: external ones as they are, `../<run>/report.html` to that run's page."""
    if urlparse(href).scheme in ("http", "https"):
        return href
    inside = file_url(run_id, href)
    if inside is not None:
        return inside
    target = posixpath.normpath(posixpath.join(run_id, href))
    parts = target.split("/")
    if parts and parts[-1] in ("report.html", "report.md"):
        parts = parts[:-1]
    if parts and len(parts) <= MAX_DEPTH and all(SEGMENT.match(p) for p in parts):
        return "/run?" + urlencode({"id": "/".join(parts)})
    return "#"
