"""A run's row tables (attempts, predictions, stages, verdicts, triggers), read straight from its
Parquet with pyarrow: filtered, sorted and paged in memory, never copied into another store.

A directory of `part-*.parquet` shards is one table; any other Parquet file is a table of its own.
Columns with a few distinct short values (recipe, goal, status, victim, category, model, list, hit
types) become filters; a seed beside its perturbed text is shown as a word diff.
"""

from __future__ import annotations

import difflib
import html
import io
import math
import os
import stat
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from redline.cluster import storage
from redline.errors import RedlineError, first_line

PAIRS = (("seed_text", "perturbed_text"), ("seed_text", "text"))  # (before, after) shown as a diff
FACET_MAX_VALUES = 40
FACET_MAX_CHARS = 64
FIRST = ("attempts", "predictions", "triggers", "scored", "taebench", "taebench_plus")  # each pipeline's main rows
HIDDEN_LAST = ("input", "work")  # planned work and stages' parts, not results: listed after the results


@dataclass(frozen=True)
class TableRef:
    name: str  # e.g. "attempts", "stages/4-label", "taebench"
    root: str  # the runs location
    run_id: str
    files: tuple[tuple[str, int, float], ...]  # (path below the run, size, mtime): the cache key, so new shards show up


def _listing(run_uri: str) -> list[tuple[str, int, float]]:
    """(path below the run, size, mtime) of every regular file in a run directory; locally symbolic
    links are skipped, never followed."""
    if storage.is_s3(run_uri):
        fs, path = storage.resolve(run_uri)
        try:
            infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
        except OSError as err:
            raise RedlineError(f"cannot list {run_uri}: {first_line(err)}") from None
        return [(i.path[len(path):].lstrip("/"), i.size or 0, i.mtime.timestamp() if i.mtime else 0.0)
                for i in infos if i.type == pafs.FileType.File]
    top = storage.resolve(run_uri)[1]
    out = []
    for folder, dirs, names in os.walk(top, followlinks=False):
        for name in names:
            st = os.lstat(os.path.join(folder, name))
            if stat.S_ISREG(st.st_mode):
                out.append((os.path.relpath(os.path.join(folder, name), top).replace(os.sep, "/"), st.st_size,
                            st.st_mtime))
    return out


def tables(root: str, run_id: str) -> list[TableRef]:
    """The row tables of run `run_id` under `root`, results first."""
    groups: dict[str, list[tuple[str, int, float]]] = {}
    for rel, size, mtime in _listing(storage.join(root, *run_id.split("/"))):
        if not rel.endswith(".parquet") or "/." in f"/{rel}":
            continue
        folder, _, base = rel.rpartition("/")
        name = folder if folder and base.startswith("part-") else rel.removesuffix(".parquet")
        groups.setdefault(name, []).append((rel, size, mtime))
    refs = [TableRef(n, root, run_id, tuple(sorted(g))) for n, g in groups.items()]
    return sorted(refs, key=lambda r: (r.name.split("/")[0] in HIDDEN_LAST, r.name not in FIRST, r.name))


class TableCache:
    """The last few tables read, keyed by their files (size and mtime), so paging does not re-read."""

    def __init__(self, size: int = 8) -> None:
        self.size, self._items, self._lock = size, OrderedDict[TableRef, pa.Table](), threading.Lock()
        self._facets: dict[TableRef, dict[str, list[str]]] = {}

    def facets(self, ref: TableRef) -> dict[str, list[str]]:
        """The table's filters, worked out once per version of its files (not on every page)."""
        if ref not in self._facets:
            table = self.get(ref)
            with self._lock:
                self._facets = {k: v for k, v in self._facets.items() if k in self._items}
                self._facets[ref] = facets(table)
        return self._facets[ref]

    def get(self, ref: TableRef) -> pa.Table:
        with self._lock:
            if ref in self._items:
                self._items.move_to_end(ref)
                return self._items[ref]
        table = read_table(ref)
        with self._lock:
            self._items[ref] = table
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return table


def read_table(ref: TableRef) -> pa.Table:
    parts = []
    for rel, _, _ in ref.files:
        uri = storage.join(ref.root, ref.run_id, rel)
        try:
            data = storage.read_below(ref.root, [*ref.run_id.split("/"), *rel.split("/")])
            parts.append(pq.read_table(io.BytesIO(data)))
        except pa.ArrowInvalid as err:
            raise RedlineError(f"{uri} is not a readable Parquet file ({first_line(err)})") from None
    if not parts:
        raise RedlineError(f"table {ref.name} has no files")
    try:
        return pa.concat_tables(parts, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise RedlineError(f"the shards of {ref.name} disagree on their columns ({first_line(err)})") from None


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_text_list(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and _is_text(t.value_type)


def facets(table: pa.Table) -> dict[str, list[str]]:
    """Filterable columns and their values: booleans, and text (or lists of text) with a few short values."""
    out: dict[str, list[str]] = {}
    for name in table.column_names:
        column = table.column(name)
        if pa.types.is_boolean(column.type):
            out[name] = ["true", "false"]
            continue
        if _is_text_list(column.type):
            column = pc.list_flatten(column)
        elif not _is_text(column.type):
            continue
        values = pc.unique(column.drop_null() if hasattr(column, "drop_null") else column)
        if name == "id" or name.endswith("_id") or (len(values) == table.num_rows > 3):
            continue  # a key, unique per row: nothing to group by
        if 1 <= len(values) <= FACET_MAX_VALUES:
            texts = [v for v in values.to_pylist() if v is not None]
            if texts and max(len(v) for v in texts) <= FACET_MAX_CHARS and (len(texts) > 1 or table.num_rows <= 1
                                                                           or _is_text_list(table.column(name).type)):
                out[name] = sorted(texts)
    return out


def pair_of(table: pa.Table) -> tuple[str, str] | None:
    return next((p for p in PAIRS if all(c in table.column_names for c in p)), None)


@dataclass
class Page:
    columns: list[str]
    rows: list[dict[str, Any]]
    total: int  # rows after filtering
    all_rows: int
    page: int
    pages: int
    pair: tuple[str, str] | None
    sortable: frozenset[str] = frozenset()  # columns a sort applies to (not lists, structs or maps)


def query(table: pa.Table, filters: dict[str, str], sort: str | None, page: int, per_page: int,
          search: str | None = None) -> Page:
    """Rows of `table` where every filter holds (a value of a list column: the list contains it), the
    text search (any text column contains it, case-insensitive), sorted by `sort` ("col" or "-col")."""
    mask = None
    for name, value in filters.items():
        if name not in table.column_names:
            raise RedlineError(f"no column '{name}' to filter on")
        column = table.column(name)
        if pa.types.is_boolean(column.type):
            cond = pc.equal(column, value == "true")
        elif _is_text_list(column.type):
            flat = pc.list_flatten(column)
            parents = pc.list_parent_indices(column)
            hit_rows = pc.unique(pc.filter(parents, pc.equal(flat, value)))
            cond = pc.is_in(pa.array(range(table.num_rows), pa.int64()), value_set=hit_rows.cast(pa.int64()))
        else:
            cond = pc.equal(column.cast(pa.string()), value)
        cond = pc.fill_null(cond, False)
        mask = cond if mask is None else pc.and_(mask, cond)
    if search:
        needle = None
        for name in table.column_names:
            if _is_text(table.column(name).type):
                found = pc.fill_null(pc.match_substring(table.column(name), search, ignore_case=True), False)
                needle = found if needle is None else pc.or_(needle, found)
        if needle is not None:
            mask = needle if mask is None else pc.and_(mask, needle)
    view = table.filter(mask) if mask is not None else table
    if sort:
        key = sort.lstrip("-")
        if key not in table.column_names:
            raise RedlineError(f"no column '{key}' to sort by")
        if _sortable(table.column(key).type):
            view = view.sort_by([(key, "descending" if sort.startswith("-") else "ascending")])
    pages = max(1, math.ceil(view.num_rows / per_page))
    page = min(max(1, page), pages)
    rows = view.slice((page - 1) * per_page, per_page).to_pylist()
    sortable = frozenset(f.name for f in table.schema if _sortable(f.type))
    return Page(table.column_names, rows, view.num_rows, table.num_rows, page, pages, pair_of(table), sortable)


def _sortable(t: pa.DataType) -> bool:
    return not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_struct(t) or pa.types.is_map(t))


def cell(value: Any) -> str:
    """A value as display text (escaped by the template)."""
    if value is None:
        return ""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    if isinstance(value, list):
        return ", ".join(cell(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}: {cell(v)}" for k, v in value.items())
    return str(value)


def outcome_view(row: dict[str, Any], pair: tuple[str, str]) -> tuple[str, str, str]:
    """An attempt's (before HTML, after HTML, note) by its outcome: a success as a word diff; a failed
    attempt as the diff to the best candidate, labelled as such (it fooled nothing); a skipped or
    errored attempt as its seed alone, with why (there is no candidate to diff)."""
    before, after = row.get(pair[0]), row.get(pair[1])
    status, reason = row.get("status"), row.get("reason")
    if status in ("skipped", "error") or after is None:
        note = f"{status or 'no result'}: {reason}" if reason else (status or "no result")
        return html.escape(before or ""), "", note
    left, right = word_diff(before, after)
    if status == "failed":
        return left, right, "failed: the best candidate found, which did not change the victim's decision" + (
            f" ({reason})" if reason else "")
    return left, right, ""


MAX_DIFF_CELLS = 250_000  # words before x words after (past the common ends) that difflib may compare


def word_diff(before: str | None, after: str | None) -> tuple[str, str]:
    """HTML of both texts with the words that differ marked: removed in `before`, added in `after`.
    The common first and last words are matched in linear time; difflib compares only what lies
    between them, and when that is larger than MAX_DIFF_CELLS the whole middle is marked as changed
    (an attack changes a few words; a quadratic diff of two long unrelated texts would hold a worker)."""
    a, b = (before or "").split(), (after or "").split()
    head = 0
    while head < min(len(a), len(b)) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < min(len(a), len(b)) - head and a[len(a) - 1 - tail] == b[len(b) - 1 - tail]:
        tail += 1
    mid_a, mid_b = a[head:len(a) - tail], b[head:len(b) - tail]
    if len(mid_a) * len(mid_b) <= MAX_DIFF_CELLS:
        ops = difflib.SequenceMatcher(None, mid_a, mid_b, autojunk=False).get_opcodes()
    else:
        ops = [("replace", 0, len(mid_a), 0, len(mid_b))]
    opcodes = ([("equal", 0, head, 0, head)] if head else [])
    opcodes += [(op, i1 + head, i2 + head, j1 + head, j2 + head) for op, i1, i2, j1, j2 in ops]
    if tail:
        opcodes.append(("equal", len(a) - tail, len(a), len(b) - tail, len(b)))
    left, right = [], []
    for op, i1, i2, j1, j2 in opcodes:
        old, new = html.escape(" ".join(a[i1:i2])), html.escape(" ".join(b[j1:j2]))
        if op == "equal":
            left.append(old)
            right.append(new)
            continue
        if old:
            left.append(f"<del>{old}</del>")
        if new:
            right.append(f"<mark>{new}</mark>")
    return " ".join(p for p in left if p), " ".join(p for p in right if p)
