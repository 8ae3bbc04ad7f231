"""`redline view`: a read-only web app over the runs under one location (local or s3://).

Pages: the run list (state, wall time, counts, headline figures; live while runs are running), a run
page (report, manifest, config, rows filtered/sorted/paged from the run's Parquet, seed vs perturbed
as a word diff), and compare (headline tables of several runs of one pipeline side by side, with a
grouped bar chart). Plain HTML, one small script and one stylesheet served from the package: no build
step, no CDN, works offline. Same key rules as `redline serve`: loopback needs none; any other host
needs the key (or --insecure).
"""

from __future__ import annotations

import itertools
import json
import posixpath
import re
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pyarrow as pa
from anyio import to_thread
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from redline.cluster import access, paths, storage
from redline.errors import RedlineError, first_line
from redline.pipelines.plane.schema import first_columns
from redline.pipelines.registry import entries, entry
from redline.pipelines.registry import pipeline as load_pipeline
from redline.view import catalog, charts, compare, diff, report, row_page, rows, search

HERE = Path(__file__).parent
COOKIE = "redline_view_key"
PUBLIC = ("/healthz", "/static/", "/favicon.ico")
PER_PAGE = 50
RUNS_PER_PAGE = 100
MAX_COMPARED = 12  # runs per compare page: each is a manifest read and a table
MAX_FILE_BYTES = 50 << 20
SESSION_S = 12 * 3600.0  # how long a browser's key cookie holds
FILE_TYPES = {".html": "text/html; charset=utf-8", ".md": "text/plain; charset=utf-8", ".png": "image/png",
              ".svg": "image/svg+xml", ".csv": "text/csv; charset=utf-8", ".json": "application/json",
              ".txt": "text/plain; charset=utf-8"}
# Pages load only the viewer's own script, styles and images; a run's report.html opens sandboxed.
PAGE_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
FILE_POLICY = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; sandbox"


class Gate:
    """Before any route: the Host rule, then the key (every request but /healthz and the static
    assets), as a Bearer token or X-API-Key header, or the session cookie a browser gets by opening
    any page once with ?key= (a signed token that expires, never the key or a hash of it)."""

    def __init__(self, app: ASGIApp, keys: access.KeyCheck, hosts: access.HostRule) -> None:
        self.app, self.keys, self.hosts = app, keys, hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        host = request.headers.get("host")
        if not self.hosts.allows(host):
            await Response(self.hosts.refusal(host), status_code=421, media_type="text/plain")(scope, receive, send)
            return
        if not self.keys.required or scope["path"].startswith(PUBLIC):
            await self.app(scope, receive, send)
            return
        given = request.query_params.get("key")
        if given is not None and self.keys.matches(given):
            params = [(k, v) for k, v in request.query_params.multi_items() if k != "key"]
            response = RedirectResponse(scope["path"] + ("?" + urlencode(params) if params else ""), status_code=303)
            response.set_cookie(COOKIE, self.keys.session_token(SESSION_S), max_age=int(SESSION_S), httponly=True,
                                samesite="strict")
            await response(scope, receive, send)
            return
        header = access.given_key({k.lower(): v for k, v in request.headers.items()})
        cookie = request.cookies.get(COOKIE, "")
        if (header and self.keys.matches(header)) or (cookie and self.keys.session_ok(cookie)):
            await self.app(scope, receive, send)
            return
        wrong = given is not None or bool(header) or bool(cookie)
        page = TEMPLATES.get_template("login.html").render(path=scope["path"], wrong=wrong)
        await HTMLResponse(page, status_code=401, headers={"Content-Security-Policy": PAGE_POLICY})(scope, receive, send)


TEMPLATES = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]))
def _short(value: str) -> str:
    """A long path-like choice by its last two parts (a provenance dropdown of corpus paths); the full
    value is the option's value and title."""
    parts = value.rstrip("/").split("/")
    return value if len(parts) <= 2 or len(value) <= 40 else "…/" + "/".join(parts[-2:])


TEMPLATES.globals.update(fmt=catalog.format_value, cell=rows.cell, urlencode=urlencode, short=_short)
TEMPLATES.filters["pair"] = lambda value, key: (key, value)


REFRESH_S = 3.0  # an open page asks about a running run this often


class Viewer:
    """The viewer's pages over the runs under `root`: one method per route."""

    def __init__(self, root: str, refresh_s: float = REFRESH_S) -> None:
        self.root, self.cache, self.run_rows = root, rows.TableCache(), catalog.RunCache()
        self.refresh_ms = max(100, round(refresh_s * 1000))

    def find_runs(self) -> list[catalog.RunInfo]:
        return catalog.find_runs(self.root, cache=self.run_rows)

    def page(self, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        html = TEMPLATES.get_template(name).render(root=self.root, refresh_ms=self.refresh_ms, **context)
        return HTMLResponse(html, status_code=status, headers={"Content-Security-Policy": PAGE_POLICY})

    def error_page(self, message: str, status: int) -> HTMLResponse:
        return self.page("error.html", status, title="error", message=message)

    async def run_list(self, request: Request) -> Response:
        try:
            runs = await to_thread.run_sync(self.find_runs)
        except RedlineError as err:
            return self.error_page(str(err), 502)
        pipeline = request.query_params.get("pipeline") or ""
        selected = [r for r in runs if not pipeline or r.pipeline == pipeline]
        pages = max(1, -(-len(selected) // RUNS_PER_PAGE))
        try:
            page_no = min(pages, max(1, int(request.query_params.get("page", "1"))))
        except ValueError:
            return self.error_page("page must be a whole number", 400)
        names = catalog.figure_names(selected)
        by = request.query_params.get("by") or ""
        order = request.query_params.get("order") or "desc"
        if by and by not in names or order not in ("asc", "desc"):
            return self.error_page("sort by one of the figures these runs show, in order asc or desc", 400)
        chart = ""
        if by:  # every run of the list in the figure's order, and a bar per run that has it
            ranked = catalog.by_figure(selected, by, order == "desc")
            selected = [r for r, _ in ranked]
            valued = [(r.id, v) for r, v in ranked if v is not None][:RUNS_PER_PAGE]
            chart = charts.grouped_bars([i for i, _ in valued], [(by, [v for _, v in valued])], by, by)
        shown = selected[(page_no - 1) * RUNS_PER_PAGE: page_no * RUNS_PER_PAGE]
        keep = {k: v for k, v in (("pipeline", pipeline), ("by", by), ("order", order if by else "")) if v}
        return self.page("runs.html", title="runs", runs=shown, selected=len(selected), page_no=page_no, pages=pages,
                         first=(page_no - 1) * RUNS_PER_PAGE + 1, figure_names=names, by=by, order=order, chart=chart,
                         keep=keep, pipelines=sorted({r.pipeline for r in runs if r.pipeline}), pipeline=pipeline,
                         total=len(runs))

    async def api_runs(self, request: Request) -> Response:
        """Every run, or only those named by `id` (the run list's page follows its own rows), and how
        many runs there are (of `pipeline`): a run list that shows fewer has new ones to show."""
        try:
            runs = await to_thread.run_sync(self.find_runs)
        except RedlineError as err:
            return JSONResponse({"error": str(err)}, status_code=502)
        wanted = set(request.query_params.getlist("id")[:RUNS_PER_PAGE])
        pipeline = request.query_params.get("pipeline") or ""
        selected = sum(1 for r in runs if not pipeline or r.pipeline == pipeline)  # a new one: the list reloads
        return JSONResponse({"root": self.root, "selected": selected,
                             "runs": [r.as_json() for r in runs if not wanted or r.id in wanted]})

    def load_run(self, run_id: str) -> catalog.RunInfo:
        info = catalog.read_run(self.root, run_id)
        if info is None:
            raise LookupError(f"no run '{run_id}' under {self.root}")
        return info

    async def run_page(self, request: Request) -> Response:
        params = request.query_params
        run_id = params.get("id", "")
        try:
            info = await to_thread.run_sync(self.load_run, run_id)
        except RedlineError as err:
            return self.error_page(str(err), 400)
        except LookupError as err:
            return self.error_page(str(err), 404)
        context: dict[str, Any] = {"title": info.name, "run": info, "manifest_json": _pretty(info.manifest),
                                   "config_json": _pretty((info.manifest or {}).get("config")),
                                   "report_html": None, "report_error": None, "tables": [], "rows_error": None}
        context["report_link"] = await to_thread.run_sync(_has_file, self.root, [*info.id.split("/"), "report.html"])
        try:
            data = await to_thread.run_sync(storage.read_below, self.root, [*info.id.split("/"), "report.md"],
                                            MAX_FILE_BYTES)
            context["report_html"] = report.render(data.decode(), info.id)
        except paths.NotFound:
            context["report_error"] = "no report yet"
        except RedlineError as err:
            context["report_error"] = str(err)
        except UnicodeDecodeError:
            context["report_error"] = "report.md is not UTF-8 text"
        try:
            refs = await to_thread.run_sync(rows.tables, self.root, info.id)
            context["tables"] = [r.name for r in refs]
            if any(r.name == "predictions" for r in refs):
                context["confusion"] = _confusion(info)
            asked = params.get("table")
            chosen = next((r for r in refs if r.name == asked), None) if asked else (refs[0] if refs else None)
            if asked and chosen is None:  # never another table in its place: the rows would be mistaken for it
                shown = asked if len(asked) <= 80 else asked[:77] + "..."
                raise RedlineError(f"no table {shown!r} in this run (its tables: "
                                   f"{', '.join(r.name for r in refs) or 'none yet'})")
            if chosen is not None:
                context.update(await to_thread.run_sync(lambda: _rows_context(self.cache, chosen, params)))
        except RedlineError as err:
            context["rows_error"] = str(err)
        except pa.ArrowException as err:  # a column type the filters or sort cannot handle
            context["rows_error"] = f"cannot show these rows: {first_line(err)}"
        return self.page("run.html", **context)

    async def compare(self, request: Request) -> Response:
        ids = list(dict.fromkeys(request.query_params.getlist("id")))
        if len(ids) < 2:
            return self.error_page("select two or more runs of the same pipeline to compare", 400)
        if len(ids) > MAX_COMPARED:
            return self.error_page(f"compare at most {MAX_COMPARED} runs at once ({len(ids)} selected)", 400)
        try:
            infos = [await to_thread.run_sync(self.load_run, i) for i in ids]
        except RedlineError as err:
            return self.error_page(str(err), 400)
        except LookupError as err:
            return self.error_page(str(err), 404)
        broken = [i for i in infos if i.manifest is None]
        if broken:
            return self.error_page(f"run {broken[0].id} cannot be read: {broken[0].error}", 400)
        kinds = sorted({i.pipeline for i in infos})
        if len(kinds) > 1:
            return self.error_page(f"compare runs of one pipeline (these are {', '.join(kinds)})", 400)
        try:
            context = await to_thread.run_sync(_compare_context, self.cache, self.root, infos,
                                               request.query_params.get("figure") or None)
        except RedlineError as err:
            return self.error_page(str(err), 400)
        return self.page("compare.html", title=f"compare {len(infos)} {kinds[0]} runs", **context)

    async def run_file(self, request: Request) -> Response:
        """A report file of a run: only regular files of a directory that is a run, never through a link."""
        run_id, name = request.query_params.get("id", ""), request.query_params.get("name", "")
        try:
            parts = _file_parts(name)
            info = await to_thread.run_sync(self.load_run, run_id)
            data = await to_thread.run_sync(storage.read_below, self.root, [*info.id.split("/"), *parts],
                                            MAX_FILE_BYTES)
        except (LookupError, paths.NotFound) as err:
            return Response(str(err), status_code=404, media_type="text/plain")
        except RedlineError as err:
            return Response(str(err), status_code=400, media_type="text/plain")
        headers = {"Content-Security-Policy": FILE_POLICY, "X-Content-Type-Options": "nosniff"}
        return Response(data, media_type=FILE_TYPES[posixpath.splitext(name)[1]], headers=headers)

    async def export(self, request: Request) -> Response:
        """The rows a run page's filters and search select, as CSV or JSON lines, streamed."""
        params = request.query_params
        fmt = params.get("format", "csv")

        def open_export() -> tuple[rows.TableRef, Any]:
            info = self.load_run(params.get("id", ""))
            ref = next((r for r in rows.tables(self.root, info.id) if r.name == params.get("table")), None)
            if ref is None:
                raise LookupError(f"no table {params.get('table', '')!r} in run {info.id}")
            filters, ranges = _selection(params)
            return ref, rows.export(self.cache.get(ref), filters, params.get("q") or None, fmt, ranges)

        try:
            ref, stream = await to_thread.run_sync(open_export)
        except LookupError as err:
            return Response(str(err), status_code=404, media_type="text/plain")
        except RedlineError as err:
            return Response(str(err), status_code=400, media_type="text/plain")
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{ref.run_id}-{ref.name}")[:120]
        headers = {"Content-Disposition": f'attachment; filename="{name}.{fmt}"', "X-Content-Type-Options": "nosniff"}
        return StreamingResponse(stream, media_type=rows.EXPORT_FORMATS[fmt], headers=headers)

    async def search_page(self, request: Request) -> Response:
        """One text across every run's tables, newest run first."""
        text = request.query_params.get("q") or ""
        if not text.strip():
            return self.page("search.html", title="search", q="", found=None)
        try:
            runs = await to_thread.run_sync(self.find_runs)
            found = await to_thread.run_sync(search.search_runs, self.cache, self.root, runs, text)
        except RedlineError as err:
            return self.error_page(str(err), 400)
        return self.page("search.html", title=f"search: {text[:40]}", q=text, found=found, text_of=row_page.text_of)

    async def row_view(self, request: Request) -> Response:
        """One row in full, with what the run and other runs know about it."""
        params = request.query_params
        try:
            info = await to_thread.run_sync(self.load_run, params.get("id", ""))
            runs = await to_thread.run_sync(self.find_runs)
            context = await to_thread.run_sync(row_page.row_context, self.cache, self.root, info,
                                               params.get("table", ""), params.get("row", ""), runs)
        except RedlineError as err:
            return self.error_page(str(err), 400)
        except LookupError as err:
            return self.error_page(str(err), 404)
        return self.page("row.html", title=f"{info.name} · {context['row_id'][:40]}", run=info,
                         text_of=row_page.text_of, config_json=_pretty((info.manifest or {}).get("config")), **context)

    async def healthz(self, _: Request) -> Response:
        return JSONResponse({"ok": True})

    async def favicon(self, _: Request) -> Response:
        return RedirectResponse("/static/favicon.svg", status_code=301)

    def routes(self) -> list[Route | Mount]:
        return [Route("/", self.run_list), Route("/api/runs", self.api_runs), Route("/run", self.run_page),
                Route("/compare", self.compare), Route("/search", self.search_page), Route("/row", self.row_view),
                Route("/file", self.run_file), Route("/export", self.export), Route("/healthz", self.healthz),
                Route("/favicon.ico", self.favicon),
                Mount("/static", StaticFiles(directory=HERE / "static"), name="static")]


def _warm_up() -> None:
    """At start, not on a page: pyarrow loads pandas the first time it computes anything (~0.4 s), the
    pipelines' modules give a compare page each run's report columns (~0.2 s), and the pages' templates
    compile (~0.1 s)."""
    import pyarrow.compute as pc

    pc.take(pa.table({"x": [0]}), pa.array([0]))
    for e in entries():
        load_pipeline(e.name)
    for name in TEMPLATES.list_templates():
        TEMPLATES.get_template(name)


def build_app(root: str, key: str | None = None, host: str = "127.0.0.1",
              allowed_hosts: tuple[str, ...] = (), refresh_s: float = REFRESH_S) -> Starlette:
    """The viewer of the runs under `root`; `key`: the secret every request must carry (None: none);
    `host`: the address it is bound to, and `allowed_hosts` other names it answers to (the Host rule);
    `refresh_s`: how often an open page asks about a running run (a list with none running: 10/3 as often)."""
    threading.Thread(target=_warm_up, name="redline-view-warm-up", daemon=True).start()
    app = Starlette(routes=Viewer(root, refresh_s).routes())
    app.add_middleware(Gate, keys=access.KeyCheck(key), hosts=access.HostRule(host, allowed_hosts))
    return app


MAX_JSON_ITEMS = 200  # entries of one object or list shown on a page
MAX_JSON_CHARS = 256 << 10


def _has_file(root: str, parts: list[str]) -> bool:
    """Whether the run holds that file (a link is shown only to a file that exists)."""
    try:
        storage.open_below(root, parts).close()
    except (paths.NotFound, RedlineError):
        return False
    return True


def _bounded(value: Any, depth: int = 0) -> Any:
    """`value` with at most MAX_JSON_ITEMS entries per object or list and 16 levels, what is left out
    said in place (the whole file is one link away)."""
    if depth >= 16 and isinstance(value, (dict, list)):
        return "… nested deeper (see manifest.json)"
    if isinstance(value, dict):
        out = {str(k): _bounded(v, depth + 1) for k, v in itertools.islice(value.items(), MAX_JSON_ITEMS)}
        if len(value) > MAX_JSON_ITEMS:
            out["…"] = f"{len(value) - MAX_JSON_ITEMS:,} more entries (see manifest.json)"
        return out
    if isinstance(value, list):
        out_list = [_bounded(v, depth + 1) for v in value[:MAX_JSON_ITEMS]]
        if len(value) > MAX_JSON_ITEMS:
            out_list.append(f"… {len(value) - MAX_JSON_ITEMS:,} more items (see manifest.json)")
        return out_list
    if isinstance(value, str) and len(value) > 4096:
        return value[:4096] + f"… ({len(value):,} characters)"
    return value


def _pretty(value: Any) -> str:
    if value is None:
        return ""
    text = json.dumps(_bounded(value), indent=2, default=str)
    return text if len(text) <= MAX_JSON_CHARS else text[:MAX_JSON_CHARS] + "\n… (cut here; see manifest.json)"


def _file_parts(name: str) -> list[str]:
    parts = name.split("/")
    if (not name or len(parts) > 2 or not all(catalog.SEGMENT.match(p) for p in parts)
            or posixpath.splitext(name)[1] not in FILE_TYPES):
        raise RedlineError(f"not a report file: {name!r}")
    return parts


FILTER = re.compile(r"^f_(.+)$")
RANGE = re.compile(r"^(min|max)_(.+)$")


def _selection(params: Any) -> tuple[dict[str, str], rows.Ranges]:
    """The value filters (`f_COL=VALUE`) and number ranges (`min_COL`, `max_COL`) a URL asks for."""
    filters = {m.group(1): v for k, v in params.items() if (m := FILTER.match(k)) and v != ""}
    ranges: rows.Ranges = {}
    for k, v in params.items():
        if (m := RANGE.match(k)) and v.strip() != "":
            try:
                bound = float(v)
            except ValueError:
                raise RedlineError(f"{k} must be a number, not {v[:40]!r}") from None
            least, greatest = ranges.get(m.group(2), (None, None))
            ranges[m.group(2)] = (bound, greatest) if m.group(1) == "min" else (least, bound)
    return filters, ranges


def _rows_context(cache: rows.TableCache, ref: rows.TableRef, params: Any) -> dict[str, Any]:
    facets = cache.facets(ref)
    filters, ranges = _selection(params)
    try:
        page_no = int(params.get("page", "1"))
        per_page = min(500, max(1, int(params.get("n", str(PER_PAGE)))))
    except ValueError:
        raise RedlineError("page and n must be whole numbers") from None
    result = cache.query(ref, filters, params.get("sort") or None, page_no, per_page, params.get("q") or None, ranges)
    columns = [c for c in result.columns if not (result.pair and c in result.pair)]
    picked = [c for c in params.getlist("col") if c in columns] if params.get("cols") else []
    shown = (picked or first_columns(ref.name, columns) or [c for c in columns if c not in rows.HIDDEN_AT_FIRST]
             or columns)
    diffs = [diff.outcome_view(r, result.pair) for r in result.rows] if result.pair else []
    base = list(params.multi_items())

    def link(changes: dict[str, Any], drop: tuple[str, ...] = ()) -> str:
        """This page's URL with `changes` made and `drop` left out."""
        kept = [(k, v) for k, v in base if k not in changes and k not in drop]
        return "/run?" + urlencode(kept + sorted((k, str(v)) for k, v in changes.items()))

    export_query = [("id", ref.run_id), ("table", ref.name), *sorted((f"f_{k}", v) for k, v in filters.items()),
                    *[(k, v) for k, v in sorted(params.items()) if RANGE.match(k) and v.strip()],
                    *([("q", params["q"])] if params.get("q") else [])]

    def full(row: dict[str, Any]) -> str | None:
        """The row's own page (None: the table has no id column)."""
        if row.get("id") is None:
            return None
        return "/row?" + urlencode([("id", ref.run_id), ("table", ref.name), ("row", str(row["id"]))])

    def permalink(row: dict[str, Any]) -> str | None:
        """The one row, by its id, in this table, with the columns chosen (None: the table has no id column)."""
        if row.get("id") is None:
            return None
        chosen = [("cols", "1"), *(("col", c) for c in picked)] if picked else []
        return "/run?" + urlencode([("id", ref.run_id), ("table", ref.name), ("f_id", str(row["id"])), *chosen])

    numbers = {c: (params.get(f"min_{c}", ""), params.get(f"max_{c}", "")) for c in rows.number_columns(result)}
    return {"link": link, "export_query": export_query, "permalink": permalink, "full": full, "picked": picked,
            "columns": columns, "numbers": numbers, "ranges": ranges, "table": ref.name, "facets": facets,
            "filters": filters, "result": result, "shown": shown, "diffs": diffs, "sort": params.get("sort") or "",
            "q": params.get("q") or ""}


def _confusion(info: catalog.RunInfo) -> list[dict[str, Any]]:
    """Each detector's confusion matrix (per dataset) from the run's summary, every cell linking to
    its rows of the predictions table."""
    out = []
    for row in catalog.summary_rows(info.manifest):
        if not isinstance(row, dict) or not all(isinstance(row.get(k), int) for k in ("tp", "fn", "fp", "tn")):
            continue
        where = [("id", info.id), ("table", "predictions"), ("f_detector", str(row.get("detector", "")))]
        if row.get("dataset") and row["dataset"] != "all":  # "all": the summary's roll-up over datasets
            where.append(("f_dataset", str(row["dataset"])))

        def cell(label: int, predicted: bool, where: list[tuple[str, str]] = where) -> str:
            return "/run?" + urlencode([*where, ("f_label", str(label)), ("f_pred_toxic", str(predicted).lower())])

        out.append({"detector": row.get("detector"), "dataset": row.get("dataset"),
                    "cells": [[("toxic", row["tp"], cell(1, True)), ("benign", row["fn"], cell(1, False))],
                              [("toxic", row["fp"], cell(0, True)), ("benign", row["tn"], cell(0, False))]]})
    return out


def _compare_context(cache: rows.TableCache, root: str, infos: list[catalog.RunInfo],
                     chosen: str | None) -> dict[str, Any]:
    """The grid of every figure by run, one figure charted across them (`chosen`, else the first
    headline figure), the settings their configs differ in, and each run's own summary table."""
    pipeline = infos[0].pipeline
    table = entry(pipeline).table
    spec = load_pipeline(pipeline)
    tables = [(i, catalog.summary_rows(i.manifest), spec.columns(i.manifest or {})) for i in infos]
    lines, cells = compare.grid(table, infos)
    numeric = [f.key for f in compare.numeric_figures(table)]
    if chosen is not None and chosen not in numeric:
        raise RedlineError(f"chart one of this pipeline's figures ({', '.join(numeric)}), not {chosen[:40]!r}")
    key = chosen or next((k for k in table.headline if k in numeric), numeric[0] if numeric else None)
    return {"runs": infos, "tables": tables, "chart": compare.chart(table, infos, key) if key else None,
            "pipeline": pipeline, "grid": list(zip(lines, cells)), "figures": [table.figure(k) for k in numeric],
            "figure": key, "config_diff": compare.config_diff(infos),
            "changed": compare.changed(root, infos[0], infos[1]) if pipeline in ("score", "transfer") else None}
