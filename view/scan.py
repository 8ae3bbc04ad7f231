"""One run table as the viewer reads it: its Parquet files opened by footer, scanned batch by batch
with only the columns a request needs, and single rows fetched by position from the row groups that
hold them. Nothing holds the whole table, so a page of a 10M-row run costs a scan of one or two
columns, and the memory stays that of a batch.

A table is a list of pieces (one per file, or an in-memory table) with one schema: the files'
schemas unified, a column a file lacks read as nulls.
"""

from __future__ import annotations

import bisect
import functools
import os
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from redline.cluster import storage
from redline.errors import RedlineError, first_line
from redline.pipelines.plane.table_index import TableIndex

BATCH_ROWS = 65_536


class Piece(Protocol):
    num_rows: int

    def batches(self, columns: list[str]) -> Iterator[pa.Table]: ...

    def take(self, local: np.ndarray) -> pa.Table: ...


@dataclass
class TablePiece:
    """An in-memory table (tests, small derived tables)."""

    table: pa.Table

    @property
    def num_rows(self) -> int:
        return self.table.num_rows

    def batches(self, columns: list[str]) -> Iterator[pa.Table]:
        selected = self.table.select([c for c in columns if c in self.table.column_names])
        for start in range(0, max(self.table.num_rows, 1), BATCH_ROWS):
            yield selected.slice(start, BATCH_ROWS)

    def take(self, local: np.ndarray) -> pa.Table:
        return self.table.take(pa.array(local, pa.int64()))


@dataclass
class FilePiece:
    """A Parquet file below the runs location, opened without following links (storage.open_below)
    each time it is read: its footer says its rows and row groups."""

    root: str
    parts: list[str]
    uri: str
    num_rows: int = 0
    schema: pa.Schema = field(default_factory=lambda: pa.schema([]))
    group_starts: list[int] = field(default_factory=list)  # first row of each row group
    metadata: pq.FileMetaData | None = None  # the footer, read once

    @classmethod
    def open(cls, root: str, parts: list[str]) -> FilePiece:
        piece = cls(root, parts, storage.join(root, *parts))
        with piece._file() as f:
            meta = piece.metadata = f.metadata
        piece.num_rows, piece.schema = meta.num_rows, meta.schema.to_arrow_schema()
        piece.group_starts = _group_starts(meta)
        return piece

    @classmethod
    def described(cls, root: str, parts: list[str], num_rows: int, names: Sequence[str]) -> FilePiece:
        """A part as its table's index describes it (rows, columns): its footer is read only when
        rows are fetched from it, so opening a table of thousands of parts reads none of them."""
        return cls(root, parts, storage.join(root, *parts), num_rows, _names_only(tuple(names)))

    @contextmanager
    def _file(self) -> Iterator[pq.ParquetFile]:
        handle = storage.open_below(self.root, self.parts)
        try:
            try:
                parquet = pq.ParquetFile(handle, metadata=self.metadata)
            except (pa.ArrowInvalid, OSError) as err:
                raise RedlineError(f"{self.uri} is not a readable Parquet file ({first_line(err)})") from None
            yield parquet
        finally:
            handle.close()

    def batches(self, columns: list[str]) -> Iterator[pa.Table]:
        present = [c for c in columns if c in self.schema.names]
        if self.num_rows == 0:
            return
        if not present:  # only a count is needed
            for start in range(0, self.num_rows, BATCH_ROWS):
                yield pa.table({"__n": pa.nulls(min(BATCH_ROWS, self.num_rows - start), pa.int8())})
            return
        if self.num_rows <= BATCH_ROWS:  # a shard: one read
            with self._file() as f:
                yield f.read(columns=present)
            return
        with self._file() as f:
            for batch in f.iter_batches(batch_size=BATCH_ROWS, columns=present):
                yield pa.Table.from_batches([batch])

    def take(self, local: np.ndarray, columns: list[str] | None = None) -> pa.Table:
        """These rows (numbers within the part), every column or only `columns` (those it has)."""
        with self._file() as f:  # a described part's footer is read by this one open, not kept
            group_starts = self.group_starts if self.metadata is not None else _group_starts(f.metadata)
            group_of = [bisect.bisect_right(group_starts, int(i)) - 1 for i in local]
            groups = sorted(set(group_of))
            present = None if columns is None else [c for c in columns if c in f.schema_arrow.names]
            table = f.read_row_groups(groups, columns=present)
        offsets, start = {}, 0
        for g in groups:  # where each group read starts in `table`
            offsets[g] = start
            end = group_starts[g + 1] if g + 1 < len(group_starts) else self.num_rows
            start += end - group_starts[g]
        at = [offsets[g] + int(i) - group_starts[g] for g, i in zip(group_of, local)]
        return table.take(pa.array(at, pa.int64()))


@functools.lru_cache(maxsize=256)
def _names_only(names: tuple[str, ...]) -> pa.Schema:
    """One schema object for every part of a table with these columns (thousands of parts: ~2 KB each)."""
    return pa.schema([(n, pa.null()) for n in names])


def _group_starts(meta: pq.FileMetaData) -> list[int]:
    """The first row of each row group."""
    starts, total = [], 0
    for i in range(meta.num_row_groups):
        starts.append(total)
        total += meta.row_group(i).num_rows
    return starts


READ_AHEAD = 8


def _read_ahead(reads: list[Callable[[], Any]]) -> Iterator[Any]:
    """Each read's result in order, up to READ_AHEAD of them running at once on threads."""
    with ThreadPoolExecutor(max_workers=READ_AHEAD) as pool:
        running: deque[Future[Any]] = deque()
        for read in reads:
            running.append(pool.submit(read))
            if len(running) >= READ_AHEAD:
                yield running.popleft().result()
        while running:
            yield running.popleft().result()


class ColumnCache:
    """Whole columns of recently scanned tables, bounded in bytes (least recently used out first), so
    the next sort or filter on a column reads memory, not every shard again."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes, self._items = max_bytes, OrderedDict[tuple[Hashable, str], pa.ChunkedArray]()
        self._lock = threading.Lock()

    def get(self, key: Hashable, names: list[str]) -> dict[str, pa.ChunkedArray] | None:
        with self._lock:
            if not all((key, n) in self._items for n in names):
                return None
            for n in names:
                self._items.move_to_end((key, n))
            return {n: self._items[(key, n)] for n in names}

    def put(self, key: Hashable, columns: dict[str, pa.ChunkedArray]) -> None:
        if sum(c.nbytes for c in columns.values()) > self.max_bytes:
            return
        with self._lock:
            self._items.update({(key, n): c for n, c in columns.items()})
            while sum(c.nbytes for c in self._items.values()) > self.max_bytes:
                self._items.popitem(last=False)


COLUMNS = ColumnCache(int(float(os.environ.get("REDLINE_VIEW_CACHE_MB", "96")) * 2**20))


class Source:
    """A table as pieces with one schema; rows are numbered across the pieces in order. `key`: what
    identifies this version of the table (its files with sizes and mtimes), so its scanned columns
    can be kept in COLUMNS."""

    def __init__(self, name: str, pieces: Sequence[Piece], schema: pa.Schema, key: Hashable | None = None,
                 index: TableIndex | None = None, searchable: list[str] | None = None) -> None:
        self.name, self.pieces, self.schema, self.key, self.index = name, list(pieces), schema, key, index
        self.searchable = searchable  # the columns a text search looks in (None: every text column)
        self.starts = list(np.cumsum([0] + [p.num_rows for p in self.pieces[:-1]])) if self.pieces else []
        self.num_rows = sum(p.num_rows for p in self.pieces)

    @classmethod
    def of_table(cls, table: pa.Table, name: str = "table") -> Source:
        return cls(name, [TablePiece(table)], table.schema)

    @classmethod
    def of_files(cls, name: str, root: str, files: list[list[str]], key: Hashable | None = None) -> Source:
        if not files:
            raise RedlineError(f"table {name} has no files")
        return cls.of_pieces(name, [FilePiece.open(root, parts) for parts in files], key)

    @classmethod
    def of_pieces(cls, name: str, pieces: list[FilePiece], key: Hashable | None = None) -> Source:
        """Opened parts as one table, their schemas unified (a column a part lacks read as nulls)."""
        try:
            schema = pa.unify_schemas([p.schema for p in pieces], promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            raise RedlineError(f"the shards of {name} disagree on their columns ({first_line(err)})") from None
        return cls(name, pieces, schema, key)

    @classmethod
    def of_index(cls, name: str, root: str, folder: list[str], index: TableIndex, key: Hashable | None = None) -> Source:
        """The table its index describes (`folder`: the parts' folder below `root`): no part opened."""
        pieces = [FilePiece.described(root, [*folder, p.part], p.rows, p.names) for p in index.parts]
        return cls(name, pieces, index.schema, key, index)

    def scan_parts(self, numbers: Sequence[int], columns: list[str],
                   then: Callable[[pa.Table], Any] | None = None) -> Iterator[tuple[int, int, Any]]:
        """(piece number, its first row number, its rows) of each of these pieces in the order given,
        only `columns`, a few read at a time on threads; with `then`, what it makes of the rows, worked
        out on the reading thread too (Arrow's compute releases the GIL, as its decoding does)."""
        def read(piece: Piece) -> Any:
            batches = [self._conform(b, columns) for b in piece.batches(columns)]
            table = pa.concat_tables(batches) if batches else self._conform(pa.table({}), columns)
            return table if then is None else then(table)

        for i, table in zip(numbers, _read_ahead([lambda p=self.pieces[i]: read(p) for i in numbers])):
            yield i, int(self.starts[i]), table

    @property
    def column_names(self) -> list[str]:
        return self.schema.names

    def _conform(self, table: pa.Table, columns: list[str]) -> pa.Table:
        """`table` with exactly `columns`, in the unified types (nulls where a piece lacks one)."""
        n = table.num_rows
        out = []
        for name in columns:
            want = self.schema.field(name).type
            column = table.column(name) if name in table.column_names else pa.nulls(n, want)
            if column.type != want:
                try:
                    column = column.cast(want)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
                    raise RedlineError(f"the shards of {self.name} disagree on column '{name}' "
                                       f"({first_line(err)})") from None
            out.append(column)
        return pa.table(out, names=columns) if columns else pa.table({"__n": pa.nulls(n, pa.int8())})

    def scan(self, columns: list[str]) -> Iterator[tuple[int, pa.Table]]:
        """(first row number, batch) over the whole table in order, each batch holding only `columns`
        and about BATCH_ROWS rows (small shards joined). Pieces are read a few at a time on threads
        (Parquet decoding releases the GIL), at most READ_AHEAD pieces ahead of the caller."""
        cached = COLUMNS.get(self.key, columns) if self.key is not None and columns else None
        if cached is not None:
            whole = pa.table(cached)
            for start in range(0, whole.num_rows, BATCH_ROWS):
                yield start, whole.slice(start, BATCH_ROWS)
            return
        pending: list[pa.Table] = []
        scanned: list[pa.Table] = []
        keeping, kept, at = self.key is not None and bool(columns), 0, 0

        def flush() -> Iterator[tuple[int, pa.Table]]:
            nonlocal at, keeping, kept
            if pending:
                joined = pa.concat_tables(pending)
                pending.clear()
                if keeping:
                    scanned.append(joined)
                    kept += joined.nbytes
                    if kept > COLUMNS.max_bytes:  # too big to keep: never held whole
                        keeping, scanned[:] = False, []
                yield at, joined
                at += joined.num_rows

        for batches in _read_ahead([lambda p=p: [self._conform(b, columns) for b in p.batches(columns)]
                                    for p in self.pieces]):
            for batch in batches:
                pending.append(batch)
                if sum(b.num_rows for b in pending) >= BATCH_ROWS:
                    yield from flush()
        yield from flush()
        if keeping and scanned:  # read to the end and small enough: kept for the next request
            whole = pa.concat_tables(scanned)
            COLUMNS.put(self.key, {n: whole.column(n) for n in columns})

    def rows(self, numbers: Sequence[int]) -> list[dict[str, Any]]:
        """The rows at these row numbers, every column, in the order given."""
        if not len(numbers):
            return []
        wanted = np.asarray(numbers, np.int64)
        piece_of = np.searchsorted(np.asarray(self.starts, np.int64), wanted, side="right") - 1
        found: dict[int, dict[str, Any]] = {}
        for p in sorted(set(piece_of.tolist())):
            mine = wanted[piece_of == p]
            table = self._conform(self.pieces[p].take(mine - int(self.starts[p])), self.column_names)
            found.update(zip(mine.tolist(), table.to_pylist()))
        return [found[int(n)] for n in wanted]
