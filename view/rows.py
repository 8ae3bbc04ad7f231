"""A run's row tables (attempts, predictions, stages, verdicts, triggers), read straight from its
Parquet with pyarrow: filtered, sorted and paged by scanning only the columns a request needs
(`view/scan.py`), never loaded whole nor copied into another store.

A directory of `part-*.parquet` shards is one table; any other Parquet file is a table of its own.
Columns with a few distinct short values (recipe, goal, status, victim, category, model, list, hit
types) become filters; a seed beside its perturbed text is shown as a word diff (`view/diff.py`).
"""

from __future__ import annotations

import io
import json
import math
import os
import stat
import threading
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from redline.cluster import storage
from redline.errors import RedlineError, first_line
from redline.pipelines.plane.table_index import (
    INDEX_DIR,
    TableIndex,
    chosen_facets,
    facet_candidates,
    is_text,
    is_text_list,
    read_index,
    too_varied,
)
from redline.pipelines.registry import entries
from redline.view import per_text, plan
from redline.view.scan import Source

PAIRS = (("seed_text", "perturbed_text"), ("seed_text", "text"))  # (before, after) shown as a diff
# each pipeline's main row tables, as its registry entry declares them (`scored/<model>`: a DiaSafety
# run's, one table per model), and the per-text view of a score run's predictions
FIRST = frozenset({per_text.NAME, *(name for e in entries() for name in e.rows)})
MAX_INDEX_BYTES = 64 * 2**20  # a table's index past this is not read (5,000 parts: ~0.3 MB)
HIDDEN_LAST = ("input", "work")  # planned work and stages' parts, not results: listed after the results


@dataclass(frozen=True)
class TableRef:
    name: str  # e.g. "attempts", "stages/4-label", "taebench"
    root: str  # the runs location
    run_id: str
    files: tuple[tuple[str, int, float], ...]  # (path below the run, size, mtime): the cache key, so new shards show up
    index: tuple[str, int, float] | None = None  # the parts' index (pipelines/plane/table_index.py), when written

    def __hash__(self) -> int:
        """Worked out once: a 10M-row run's table holds 10,000 files, and each of its shards is kept by it."""
        if "_hash" not in self.__dict__:
            object.__setattr__(self, "_hash", hash((self.name, self.root, self.run_id, self.files, self.index)))
        return self.__dict__["_hash"]


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
    indexes: dict[str, tuple[str, int, float]] = {}
    for rel, size, mtime in _listing(storage.join(root, *run_id.split("/"))):
        folder, _, base = rel.rpartition("/")
        if rel.startswith(f"{INDEX_DIR}/") and rel.endswith(".parquet"):
            indexes[rel[len(INDEX_DIR) + 1:-len(".parquet")]] = (rel, size, mtime)
        if not rel.endswith(".parquet") or "/." in f"/{rel}":
            continue
        name = folder if folder and base.startswith("part-") else rel.removesuffix(".parquet")
        groups.setdefault(name, []).append((rel, size, mtime))
    refs = [TableRef(n, root, run_id, tuple(sorted(g)), indexes.get(n)) for n, g in groups.items()]
    predictions = groups.get("predictions", [])
    if predictions and per_text.parts_by_shard([rel for rel, _, _ in predictions]):  # a score run's, by shard
        refs.append(TableRef(per_text.NAME, root, run_id, tuple(sorted(predictions)), indexes.get(per_text.NAME)))
    return sorted(refs, key=lambda r: (r.name.split("/")[0] in HIDDEN_LAST, r.name.split("/")[0] not in FIRST, r.name))


class TableCache:
    """The last few tables opened (their footers and schema, never their rows), keyed by their files
    (size and mtime) so new shards show up, with each one's filters and its recent pages."""

    def __init__(self, size: int = 8, pages: int = 64) -> None:
        self.size, self._items, self._lock = size, OrderedDict[TableRef, Source](), threading.Lock()
        self._facets: dict[TableRef, dict[str, list[str]]] = {}
        self._known: dict[TableRef, dict[str, list[str]]] = {}
        self._pages: OrderedDict[tuple[Any, ...], Page] = OrderedDict()
        self._max_pages = pages

    def facets(self, ref: TableRef) -> dict[str, list[str]]:
        """The table's filters, worked out once per version of its files (not on every page)."""
        if ref not in self._facets:
            source = self.get(ref)
            found = source.index.facets() if source.index is not None else facets(source)
            with self._lock:
                self._facets = {k: v for k, v in self._facets.items() if k in self._items}
                self._facets[ref] = found
        return self._facets[ref]

    def known(self, ref: TableRef) -> dict[str, list[str]]:
        """Every value of the columns whose values are all known: the index's counted columns, else the
        filters; worked out once per version of the table's files, as its filters are."""
        if ref not in self._known:
            source = self.get(ref)
            found = source.index.values() if source.index is not None else self.facets(ref)
            with self._lock:
                self._known = {k: v for k, v in self._known.items() if k in self._items}
                self._known[ref] = found
        return self._known[ref]

    def get(self, ref: TableRef) -> Source:
        with self._lock:
            if ref in self._items:
                self._items.move_to_end(ref)
                return self._items[ref]
        source = open_table(ref)
        with self._lock:
            self._items[ref] = source
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return source

    def query(self, ref: TableRef, filters: dict[str, str], sort: str | None, page: int, per_page: int,
              search: str | None = None, ranges: Ranges | None = None) -> Page:
        """`query` on the table, a page asked again (back, reload) served from memory."""
        key = (ref, tuple(sorted(filters.items())), sort, page, per_page, search, tuple(sorted((ranges or {}).items())))
        with self._lock:
            if key in self._pages:
                self._pages.move_to_end(key)
                return self._pages[key]
        result = query(self.get(ref), filters, sort, page, per_page, search, ranges, self.known(ref) if search else None)
        with self._lock:
            self._pages[key] = result
            while len(self._pages) > self._max_pages:
                self._pages.popitem(last=False)
        return result


def open_table(ref: TableRef) -> Source:
    """The table's files opened by their footers (rows are read only when a page needs them)."""
    if ref.name == per_text.NAME:
        shards = per_text.shard_sizes([(rel, size) for rel, size, _ in ref.files])
        return per_text.open_per_text(ref.root, ref.run_id, [rel for rel, _, _ in ref.files], key=ref,
                                      index=_read_index(ref, shards))
    index = _read_index(ref)
    if index is not None:
        return Source.of_index(ref.name, ref.root, [*ref.run_id.split("/"), *ref.name.split("/")], index, key=ref)
    return Source.of_files(ref.name, ref.root, [[*ref.run_id.split("/"), *rel.split("/")] for rel, _, _ in ref.files],
                           key=ref)


def _read_index(ref: TableRef, parts: dict[str, int] | None = None) -> TableIndex | None:
    """The table's index when it covers exactly its parts now (a resumed or edited run's is stale);
    `parts`: each part's name in the index and its bytes, when they are not its files' (a view of them)."""
    if ref.index is None or ref.index[1] > MAX_INDEX_BYTES:
        return None
    if parts is None:
        if any(not rel.startswith(f"{ref.name}/part-") for rel, _, _ in ref.files):
            return None
        parts = {rel.rsplit("/", 1)[-1]: size for rel, size, _ in ref.files}
    try:
        handle = storage.open_below(ref.root, [*ref.run_id.split("/"), *ref.index[0].split("/")])
    except RedlineError:  # gone since the listing: the parts are still there
        return None
    try:
        index = read_index(pq.ParquetFile(handle).read())  # (pq.read_table would import pandas: ~0.4 s once)
        pa.default_memory_pool().release_unused()  # the file's buffers: a 10M-row run's index is ~40 MB of them
    except (pa.ArrowInvalid, OSError):
        return None
    finally:
        handle.close()
    return index if index is not None and index.matches(parts) else None


def facets(source: Source | pa.Table) -> dict[str, list[str]]:
    """Filterable columns and their values: booleans, and text (or lists of text) with a few short
    values. Each column is scanned alone and left as soon as it has too many or too long values."""
    source = Source.of_table(source) if isinstance(source, pa.Table) else source
    lists = {f.name for f in source.schema if is_text_list(f.type)}
    values: dict[str, set[str]] = {name: set() for name in facet_candidates(source.schema)
                                   if not pa.types.is_boolean(source.schema.field(name).type)}

    def seen(batch: pa.Table) -> bool:
        """Add the batch's values; drop the columns past the limits. False: none is left."""
        for name in [n for n in values if n in batch.column_names]:
            column = pc.list_flatten(batch.column(name)) if name in lists else batch.column(name)
            values[name].update(pc.unique(column.drop_null()).to_pylist())
            if too_varied(values[name]):
                del values[name]
        return bool(values)

    # the first batch rules out the free-text columns, then one scan reads only the columns left
    if values and seen(next(source.scan(list(values)), (0, pa.table({})))[1]):
        for _, batch in source.scan(list(values)):
            if not seen(batch):
                break
    out = chosen_facets(source.schema, values, source.num_rows)
    return {name: out[name] for name in source.column_names if name in out}


def pair_of(table: pa.Table | Source) -> tuple[str, str] | None:
    return next((p for p in PAIRS if all(c in table.column_names for c in p)), None)


# provenance columns a table shows only when picked (the column picker lists them)
HIDDEN_AT_FIRST = frozenset({"dataset", "split", "source", "source_row", "seed_label_name", "transformation",
                             "constraints", "search", "probs", "seconds", "shard"})


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
    schema: pa.Schema | None = None
    exact: bool = True  # False: `total` is a lower bound (counting stopped after plan.COUNT_ROWS rows)


Ranges = dict[str, tuple[float | None, float | None]]  # number column -> (least, greatest), either open


def _mask(table: pa.Table, filters: dict[str, str], search: str | None, ranges: Ranges | None = None,
          searched: list[str] | None = None) -> pa.Array | None:
    """Which rows of a batch hold every filter (a value of a list column: the list contains it), every
    number range (ends included; a null is outside) and the text search (one of `searched`, else any
    text column, contains it, case-insensitive); None: every row."""
    mask = None
    for name, (least, greatest) in (ranges or {}).items():
        column = table.column(name)
        for bound, compare in ((least, pc.greater_equal), (greatest, pc.less_equal)):
            if bound is not None:
                cond = pc.fill_null(compare(column, bound), False)
                mask = cond if mask is None else pc.and_(mask, cond)
    for name, value in filters.items():
        column = table.column(name)
        if pa.types.is_boolean(column.type):
            cond = pc.equal(column, value == "true")
        elif is_text_list(column.type):
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
        for name in table.column_names if searched is None else searched:
            if is_text(table.column(name).type):
                found = pc.fill_null(pc.match_substring(table.column(name), search, ignore_case=True), False)
                needle = found if needle is None else pc.or_(needle, found)
        if needle is not None:
            mask = needle if mask is None else pc.and_(mask, needle)
    return mask


def number_columns(source: Source | pa.Table | Page) -> list[str]:
    """The columns a number range applies to."""
    return [f.name for f in source.schema or [] if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)]


def _check(source: Source, filters: dict[str, str], ranges: Ranges | None) -> None:
    for name in filters:
        if name not in source.column_names:
            raise RedlineError(f"no column '{name}' to filter on")
    numbers = number_columns(source)
    for name in ranges or {}:
        if name not in numbers:
            raise RedlineError(f"no number column '{name}' for a range (number columns: {', '.join(numbers) or 'none'})")


def searched_columns(source: Source, search: str, known: dict[str, list[str]] | None = None) -> list[str]:
    """The text columns a search looks in: the table's searchable ones, less those whose every value
    is known (`known`) and none of which holds it."""
    texts = source.searchable or [f.name for f in source.schema if is_text(f.type)]
    return [c for c in texts if c not in (known or {}) or pc.any(
        pc.match_substring(pa.array(known[c], pa.string()), search, ignore_case=True)).as_py()]


def query(source: Source | pa.Table, filters: dict[str, str], sort: str | None, page: int, per_page: int,
          search: str | None = None, ranges: Ranges | None = None, known: dict[str, list[str]] | None = None
          ) -> Page:
    """One page of the rows where every filter holds and the text search matches, sorted by `sort`
    ("col" or "-col"; ties keep the table's order, nulls last). Only the columns the filters, the
    search and the sort read are scanned, batch by batch; the sort keeps the best rows up to this
    page, never the whole order; the page's rows are then read by position, every column. `known`:
    the columns whose every value is known (`TableCache.known`), so a search skips a column none of
    whose values holds it."""
    source = Source.of_table(source) if isinstance(source, pa.Table) else source
    _check(source, filters, ranges)
    key = sort.lstrip("-") if sort else None
    if key is not None and key not in source.column_names:
        raise RedlineError(f"no column '{key}' to sort by")
    if key is not None and not _sortable(source.schema.field(key).type):
        key = None
    texts = searched_columns(source, search, known) if search else []
    needed = list(dict.fromkeys([*filters, *(ranges or {}), *([key] if key else []), *texts]))
    page = max(1, page)
    planned = plan.Planned(0, True, []) if search and not texts else None  # no column can hold it
    if planned is None and source.index is not None and needed and (filters or ranges or key or texts):
        def mask(batch: pa.Table) -> pa.Array | None:
            return _mask(batch, filters, search, ranges, texts)
        if key is None:
            planned = plan.filtered_page(source, needed, mask, filters, search, ranges or {}, page, per_page)
        elif key in number_columns(source):
            planned = plan.sorted_page(source, needed, mask, filters, search, ranges or {}, key,
                                       bool(sort and sort.startswith("-")), page, per_page)
    exact = True
    if planned is not None:
        total, numbers, exact = planned.total, planned.numbers, planned.exact
        page = min(page, max(1, math.ceil(total / per_page)))
    elif not needed or (not filters and not ranges and not key and not texts):
        total = source.num_rows
        page = min(page, max(1, math.ceil(total / per_page)))
        numbers = list(range((page - 1) * per_page, min(page * per_page, total)))
    elif key is None:
        total, numbers = _filtered(source, needed, filters, search, ranges, page, per_page, texts)
        page = min(page, max(1, math.ceil(total / per_page)))
    else:
        total, numbers = _sorted(source, needed, filters, search, ranges, key, sort.startswith("-"), page, per_page,
                                 texts)
        page = min(page, max(1, math.ceil(total / per_page)))
    sortable = frozenset(f.name for f in source.schema if _sortable(f.type))
    return Page(source.column_names, source.rows(numbers), total, source.num_rows, page,
                max(1, math.ceil(total / per_page)), pair_of(source), sortable, source.schema, exact)


def _filtered(source: Source, needed: list[str], filters: dict[str, str], search: str | None, ranges: Ranges | None,
              page: int, per_page: int, searched: list[str]) -> tuple[int, list[int]]:
    """The number of matching rows and the row numbers of the page (the last page when past it)."""
    total, start, kept = 0, (page - 1) * per_page, deque[int](maxlen=per_page)
    for offset, batch in source.scan(needed):
        mask = _mask(batch, filters, search, ranges, searched)
        hits = np.flatnonzero(np.asarray(mask)) + offset if mask is not None else np.arange(batch.num_rows) + offset
        if total < start + per_page:  # still before the page's end: keep the last `per_page` seen
            kept.extend(hits[:start + per_page - total].tolist())
        total += len(hits)
    last_start = max(0, min(start, (math.ceil(total / per_page) - 1) * per_page))
    numbers = list(kept)[-(min(total, last_start + per_page) - last_start):] if total else []
    return total, numbers


def _sorted(source: Source, needed: list[str], filters: dict[str, str], search: str | None, ranges: Ranges | None,
            key: str, descending: bool, page: int, per_page: int, searched: list[str]) -> tuple[int, list[int]]:
    """The number of matching rows and the row numbers of the page in the sort's order: each batch's
    best `page * per_page` rows are merged with the best so far (ties broken by row number)."""
    k = page * per_page
    order = [(key, "descending" if descending else "ascending", "at_end"), ("__row", "ascending", "at_end")]
    best: pa.Table | None = None
    total = 0
    for offset, batch in source.scan(needed):
        rows = pa.table({key: batch.column(key), "__row": pa.array(np.arange(batch.num_rows) + offset, pa.int64())})
        mask = _mask(batch, filters, search, ranges, searched)
        if mask is not None:
            rows = rows.filter(mask)
        total += rows.num_rows
        merged = rows if best is None else pa.concat_tables([best, rows])
        best = merged.take(pc.select_k_unstable(merged, k, sort_keys=order)) if merged.num_rows > k else merged
    if best is None or total == 0:
        return 0, []
    best = best.take(pc.sort_indices(best, sort_keys=order))
    start = max(0, min((page - 1) * per_page, (math.ceil(total / per_page) - 1) * per_page))
    return total, best.column("__row").to_pylist()[start:start + per_page]


EXPORT_FORMATS = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson"}
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")  # a spreadsheet would run such a cell as a formula


def export(source: Source, filters: dict[str, str], search: str | None, fmt: str,
           ranges: Ranges | None = None) -> Iterator[bytes]:
    """Every row where the filters and the search hold, in table order, as CSV or JSON lines, one
    batch at a time (any size, never held whole). In CSV, lists and records become JSON text and a
    text cell that a spreadsheet would take for a formula gets a leading apostrophe."""
    if fmt not in EXPORT_FORMATS:
        raise RedlineError(f"export format must be one of {', '.join(EXPORT_FORMATS)}, not {fmt!r}")
    _check(source, filters, ranges)
    return _export(source, filters, search, fmt, ranges)


def _export(source: Source, filters: dict[str, str], search: str | None, fmt: str,
            ranges: Ranges | None) -> Iterator[bytes]:
    first = True
    for _, batch in source.scan(source.column_names):
        mask = _mask(batch, filters, search, ranges)
        rows = batch.filter(mask) if mask is not None else batch
        if fmt == "jsonl":
            yield "".join(json.dumps(r, default=str, ensure_ascii=False) + "\n" for r in rows.to_pylist()).encode()
            continue
        out = io.BytesIO()
        pacsv.write_csv(_flat(rows), out, pacsv.WriteOptions(include_header=first))
        first = False
        yield out.getvalue()
    if fmt == "csv" and first:  # nothing matched: the header alone
        out = io.BytesIO()
        pacsv.write_csv(_flat(source.schema.empty_table()), out)
        yield out.getvalue()


def _flat(table: pa.Table) -> pa.Table:
    """The table with every column a CSV cell can hold: nested values as JSON text, formulas defused."""
    columns = []
    for name in table.column_names:
        column = table.column(name)
        if pa.types.is_nested(column.type):
            column = pa.array([None if v is None else json.dumps(v, default=str, ensure_ascii=False)
                               for v in column.to_pylist()], pa.string())
        if is_text(column.type):
            risky = pc.fill_null(pc.starts_with(column, FORMULA_START[0]), False)
            for start in FORMULA_START[1:]:
                risky = pc.or_(risky, pc.fill_null(pc.starts_with(column, start), False))
            column = pc.if_else(risky, pc.binary_join_element_wise("'", column, ""), column)
        columns.append(column)
    return pa.table(columns, names=table.column_names)


def _sortable(t: pa.DataType) -> bool:
    return not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_struct(t) or pa.types.is_map(t))


def cell(value: Any) -> str:
    """A value as display text (escaped by the template)."""
    if value is None:
        return ""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"  # a tiny model's scores differ past the 4th digit
    if isinstance(value, list):
        return ", ".join(cell(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}: {cell(v)}" for k, v in value.items())
    return str(value)
