"""A sharded table's statistics, one row per part, written in its run when the run finishes
(`<run>/.index/<table>.parquet`: a hidden folder, so no reader of the parts' folder takes it for a
part), so a reader of a 10M-row run (`redline view`) plans a page from one small file instead of
opening every part: each part's rows, each number column's least and greatest value and its nulls
(NaN counted with them: both sort last), and, for the columns a viewer filters on (booleans, and
text or lists of text with a few short values), how many of its rows hold each value and each
combination of values.

The index names each part with its size: a reader uses it only while the table's parts are exactly
those, so a resumed run or a part rewritten by hand is never planned from stale figures.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from redline.cluster import storage

INDEX_DIR = ".index"
FACET_MAX_VALUES = 40  # a column with more distinct values is not a filter
FACET_MAX_CHARS = 64  # nor one with a longer value
MAX_COMBINATIONS = 64  # a part's distinct combinations of filter values kept (more: each column alone; a
# reader holds every part's, so this bounds its memory: 5,000 parts x 64)
_SCHEMA_KEY = b"redline.table_schema"
_INDEX_SCHEMA = pa.schema([("part", pa.string()), ("bytes", pa.int64()), ("rows", pa.int64()),
                           ("stats", pa.string())])


def is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def is_text_list(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and is_text(t.value_type)


def is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def facet_candidates(schema: pa.Schema) -> list[str]:
    """Columns that may be filters: booleans, and text or lists of text that are not identifiers."""
    return [f.name for f in schema if pa.types.is_boolean(f.type) or (
        (is_text(f.type) or is_text_list(f.type)) and f.name != "id" and not f.name.endswith("_id"))]


def too_varied(values: Iterable[str]) -> bool:
    values = list(values)
    return len(values) > FACET_MAX_VALUES or any(len(v) > FACET_MAX_CHARS for v in values)


def chosen_facets(schema: pa.Schema, values: dict[str, set[str]], num_rows: int) -> dict[str, list[str]]:
    """The filters a table offers, from each candidate column's distinct values (`values`: the columns
    still within the limits): booleans always; text with more than one value, unless every row has
    its own (a key); lists of text whenever they hold a value."""
    out: dict[str, list[str]] = {}
    for f in schema:
        if pa.types.is_boolean(f.type):
            out[f.name] = ["true", "false"]
            continue
        found = values.get(f.name)
        if not found or len(found) == num_rows > 3:
            continue
        if len(found) > 1 or num_rows <= 1 or is_text_list(f.type):
            out[f.name] = sorted(found)
    return out


@dataclass(frozen=True)
class PartStats:
    """One part's figures. `low`/`high`: each number column's least and greatest value (absent: no
    value but nulls or NaN); `at_end`: its nulls and NaN; `values`: per filter column, the rows
    holding each value (for a list column, the rows whose list holds it); `combos`: the rows holding
    each combination of the single-valued filter columns' values (their names first), so a page
    filtered on several of them is counted without reading a row."""

    part: str
    bytes: int
    rows: int
    names: tuple[str, ...]
    low: dict[str, Any]
    high: dict[str, Any]
    at_end: dict[str, int]
    values: dict[str, dict[str, int]]
    combos: tuple[tuple[str, ...], list[list[Any]]] | None = None


def part_stats(part: str, size: int, table: pa.Table, facets: list[str], names: list[str] | None = None) -> PartStats:
    """`table`'s figures (`facets`: the filter columns still counted; `names`: every column of the
    part, when `table` holds only some)."""
    low: dict[str, Any] = {}
    high: dict[str, Any] = {}
    at_end: dict[str, int] = {}
    values: dict[str, dict[str, int]] = {}
    for name in table.column_names:
        column = table.column(name)
        if is_number(column.type):
            kept = column.drop_null()
            if pa.types.is_floating(column.type):
                kept = kept.filter(pc.invert(pc.is_nan(kept)))
            at_end[name] = table.num_rows - len(kept)
            if len(kept):
                least, greatest = pc.min_max(kept).values()
                low[name], high[name] = least.as_py(), greatest.as_py()
        elif name in facets:
            values[name] = _value_counts(column)
    return PartStats(part, size, table.num_rows, tuple(names or table.column_names), low, high, at_end, values,
                     _combinations(table, [c for c in values if not is_text_list(table.schema.field(c).type)]))


def _combinations(table: pa.Table, columns: list[str]) -> tuple[tuple[str, ...], list[list[Any]]] | None:
    if len(columns) < 2:
        return None
    as_text = pa.table([table.column(c).cast(pa.string()) for c in columns], names=columns)
    counted = as_text.group_by(columns, use_threads=False).aggregate([([], "count_all")])
    if counted.num_rows > MAX_COMBINATIONS:
        return None
    return tuple(columns), [list(r.values()) for r in counted.to_pylist()]


def _value_counts(column: pa.ChunkedArray) -> dict[str, int]:
    if pa.types.is_boolean(column.type):
        kept = column.drop_null()
        trues = int(pc.sum(kept).as_py() or 0)
        return {"true": trues, "false": len(kept) - trues}
    if is_text_list(column.type):
        column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        pairs = pa.table({"row": pc.list_parent_indices(column), "value": pc.list_flatten(column)})
        pairs = pairs.filter(pc.is_valid(pairs.column("value")))
        counted = pairs.group_by("value").aggregate([("row", "count_distinct")])
        return dict(zip(counted.column("value").to_pylist(), counted.column("row_count_distinct").to_pylist()))
    counted = pc.value_counts(column.drop_null())
    return {str(v["values"]): int(v["counts"]) for v in counted.to_pylist()}


def index_uri(run_uri: str, table: str) -> str:
    """Where the index of the run's table `table` (its parts' folder below the run) is written."""
    return storage.join(run_uri, INDEX_DIR, f"{table}.parquet")


# a reader of one part for `write_index`: (part, the columns to leave out or None: every one) ->
# (its name in the index, its size, its columns but those left out, its whole schema)
PartReader = Callable[[str, "set[str] | None"], tuple[str, int, pa.Table, pa.Schema]]


def read_part(uri: str, skipped: set[str] | None) -> tuple[str, int, pa.Table, pa.Schema]:
    """A Parquet part as `write_index` reads it, named by its file name."""
    data = storage.read_bytes(uri)
    part = pq.ParquetFile(io.BytesIO(data))
    whole = part.schema_arrow
    return (uri.rsplit("/", 1)[-1], len(data), part.read(columns=[c for c in whole.names if c not in (skipped or ())]),
            whole)


def write_index(run_uri: str, table: str, threads: int = 4, parts: list[str] | None = None,
                read: PartReader = read_part) -> int:
    """Index the parts (`part-*.parquet`) of the run's table `table`; returns how many parts. Each
    part is read once, without its free-text columns past the first (which shows they are free text).
    `parts` and `read`: a table made from other files (a view of them), each of its parts read so."""
    if parts is None:
        folder_uri = storage.join(run_uri, *table.split("/"))
        parts = [uri for uri in storage.list_files(folder_uri, ".parquet")
                 if uri.rsplit("/", 1)[-1].startswith("part-")]
    if not parts:
        return 0
    first = read(parts[0], None)[2]
    schemas: list[pa.Schema] = []
    facets = [c for c in facet_candidates(first.schema) if not pa.types.is_boolean(first.schema.field(c).type)
              and not too_varied(_value_counts(first.column(c)))]
    skipped = {f.name for f in first.schema if (is_text(f.type) or is_text_list(f.type)) and f.name not in facets}
    seen: dict[str, set[str]] = {c: set() for c in facets}

    stats: list[PartStats] = []
    with ThreadPoolExecutor(max_workers=threads) as pool:
        chunks = (parts[i:i + 4 * threads] for i in range(0, len(parts), 4 * threads))  # a few parts held at once
        for name, size, read_columns, whole in (r for chunk in chunks
                                                for r in pool.map(lambda p: read(p, skipped), chunk)):
            schemas.append(whole)
            facet_now = [c for c in facets if c in seen] + [f.name for f in whole if pa.types.is_boolean(f.type)]
            part = part_stats(name, size, read_columns, facet_now, whole.names)
            for name in [c for c in part.values if c in seen]:
                seen[name].update(part.values[name])
                if too_varied(seen[name]):
                    del seen[name]
            stats.append(part)
    schema = pa.unify_schemas(schemas, promote_options="permissive")
    written = pa.table({"part": [s.part for s in stats], "bytes": [s.bytes for s in stats],
                        "rows": [s.rows for s in stats],
                        "stats": [json.dumps({"names": s.names, "low": s.low, "high": s.high, "at_end": s.at_end,
                                              "values": {k: v for k, v in s.values.items() if k in seen
                                                         or pa.types.is_boolean(schema.field(k).type)},
                                              "combos": _kept(s.combos, seen, schema)})
                                  for s in stats]}, schema=_INDEX_SCHEMA)
    written = written.replace_schema_metadata({_SCHEMA_KEY: base64.b64encode(schema.serialize().to_pybytes()),
                                               b"redline.facets": json.dumps(sorted(seen)).encode()})
    storage.write_parquet(written, index_uri(run_uri, table))
    return len(stats)


def _kept(combos: tuple[tuple[str, ...], list[list[Any]]] | None, seen: dict[str, set[str]], schema: pa.Schema
          ) -> list[Any] | None:
    """A part's combinations, unless one of their columns proved not to be a filter after all."""
    if combos is None or any(c not in seen and not pa.types.is_boolean(schema.field(c).type) for c in combos[0]):
        return None
    return [list(combos[0]), combos[1]]


@dataclass(frozen=True)
class TableIndex:
    """A table as its index describes it: the unified schema, its parts in order with their figures,
    and the filter columns whose values were counted in every part."""

    schema: pa.Schema
    parts: list[PartStats]
    facet_columns: frozenset[str]

    @property
    def num_rows(self) -> int:
        return sum(p.rows for p in self.parts)

    def values(self) -> dict[str, list[str]]:
        """Every value of each column counted in every part (a filter column, or one with a single value)."""
        values: dict[str, set[str]] = {c: set() for c in self.facet_columns}
        for p in self.parts:
            for name in values:
                values[name].update(v for v, n in p.values.get(name, {}).items() if n)
        return {name: sorted(found) for name, found in values.items()}

    def facets(self) -> dict[str, list[str]]:
        chosen = chosen_facets(self.schema, {k: set(v) for k, v in self.values().items()}, self.num_rows)
        return {name: chosen[name] for name in self.schema.names if name in chosen}

    def matches(self, parts: dict[str, int]) -> bool:
        """Whether the index covers exactly these parts (name -> bytes)."""
        return {p.part: p.bytes for p in self.parts} == parts


def read_index(table: pa.Table) -> TableIndex | None:
    """An index file's table as a TableIndex; None when it is not one (an older or foreign file)."""
    meta = table.schema.metadata or {}
    if _SCHEMA_KEY not in meta or not table.schema.equals(_INDEX_SCHEMA.with_metadata(meta)):
        return None
    # thousands of parts repeat the same column names and values: one object each (a 10M-row run's
    # index held 24 MB as read, ~half of it in copies of the same strings)
    shared: dict[Any, Any] = {}

    def one(value: Any) -> Any:
        return shared.setdefault(value, value) if isinstance(value, (str, tuple)) else value

    def keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        return {one(k): v for k, v in pairs}

    try:
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(meta[_SCHEMA_KEY])))
        facet_columns = frozenset(json.loads(meta.get(b"redline.facets", b"[]")))
        parts = []
        for part, size, rows, raw in zip(*(table.column(c).to_pylist() for c in ("part", "bytes", "rows", "stats"))):
            s = json.loads(raw, object_pairs_hook=keys)
            combos = s.get("combos")
            if combos:
                combos = (one(tuple(one(c) for c in combos[0])), [[one(v) for v in row] for row in combos[1]])
            parts.append(PartStats(part, size, rows, one(tuple(one(n) for n in s["names"])), s["low"], s["high"],
                                   s["at_end"], s["values"], combos or None))
            _check(parts[-1])
    except (ValueError, KeyError, TypeError, pa.ArrowInvalid):
        return None
    return TableIndex(schema, parts, facet_columns)


def _check(p: PartStats) -> None:
    """A part's figures hold the types the planner compares (an index is read from a bucket)."""
    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    ok = (isinstance(p.part, str) and isinstance(p.rows, int) and all(isinstance(n, str) for n in p.names)
          and all(isinstance(d, dict) for d in (p.low, p.high, p.at_end, p.values))
          and set(p.low) == set(p.high) <= set(p.at_end)
          and all(number(v) for v in [*p.low.values(), *p.high.values()])
          and all(isinstance(v, int) for v in p.at_end.values())
          and all(isinstance(c, dict) and all(isinstance(k, str) and isinstance(n, int) for k, n in c.items())
                  for c in p.values.values()))
    if ok and p.combos is not None:
        columns, rows = p.combos
        ok = (all(isinstance(c, str) for c in columns) and isinstance(rows, list)
              and all(isinstance(r, list) and len(r) == len(columns) + 1 and isinstance(r[-1], int) for r in rows))
    if not ok:
        raise ValueError("an index row of the wrong shape")


def known_rows(part: PartStats, filters: dict[str, str], ranges: dict[str, tuple[Any, Any]]) -> int | None:
    """How many of the part's rows hold every filter and range, when its figures say (None: the part
    must be read). A part that cannot match is 0; a part every row of which matches is its rows."""
    counts: list[int | None] = []
    if len(filters) > 1 and part.combos is not None and set(filters) <= set(part.combos[0]):
        at = [part.combos[0].index(name) for name in filters]
        wanted = list(filters.values())
        counts.append(sum(row[-1] for row in part.combos[1] if [row[j] for j in at] == wanted))
        filters = {}
    for name, value in filters.items():
        found = part.values.get(name)
        if found is not None and set(found) == {"true", "false"} and value not in found:
            found = None  # a boolean compared with another word: left to the rows
        counts.append(None if found is None else int(found.get(value, 0)))
    for name, (least, greatest) in ranges.items():
        if name not in part.at_end:  # not a number column of this part
            counts.append(None)
        elif name not in part.low:  # nulls and NaN only: outside every range
            counts.append(0)
        elif (least is not None and part.high[name] < least) or (greatest is not None and part.low[name] > greatest):
            counts.append(0)
        elif ((least is None or part.low[name] >= least) and (greatest is None or part.high[name] <= greatest)
              and not part.at_end[name]):
            counts.append(part.rows)
        else:
            counts.append(None)
    if 0 in counts:
        return 0
    partial = [c for c in counts if c != part.rows]
    if not partial:
        return part.rows
    return partial[0] if len(partial) == 1 and partial[0] is not None else None


def sort_bound(part: PartStats, key: str, descending: bool) -> float | None:
    """The best value of `key` the part can hold in this order (None: none but nulls and NaN)."""
    if key not in part.low:
        return None
    return part.high[key] if descending else part.low[key]

