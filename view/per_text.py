"""The per-text view of a score run's predictions (`pipelines/plane/per_text.py`: one row per text, every
detector's score and verdict side by side) as a table the viewer pages: one piece per input shard,
pivoted when a request reads it. With the view's index (written when the run finished, and still
matching the shards' parts) nothing is opened to show the table: its rows, filters and counts come
from the index, and only the shards a page needs are read."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from redline.errors import RedlineError
from redline.pipelines.plane.per_text import NAME, READ, detector_name, parts_by_shard, pivot, schema, shard_key
from redline.pipelines.plane.table_index import TableIndex
from redline.view.scan import FilePiece, Source

PIVOTS_BYTES = 32 * 2**20  # the shards pivoted last, kept: a page's rows are taken from the shards its plan just read
_PIVOTS: OrderedDict[tuple[object, ...], pa.Table] = OrderedDict()
_LOCK = threading.Lock()


VERDICTS = ["id", "status", "toxic_score", "pred_toxic"]  # what a detector's part adds to the first one's
SEARCHED = ["id", "text"]  # a text search looks here (label, fooled and own are filters of a few words)


class ShardPivot:
    """One input shard: its detectors' parts joined by id into one row per text. Described by an
    index (`num_rows` given), its parts are opened only when it is read. Columns the parts hold as they
    are (the id, the text, a detector's score and verdict) are read without pivoting the shard."""

    def __init__(self, root: str, files: dict[int, list[str]], detectors: dict[int, str],
                 num_rows: int | None = None, version: object = None) -> None:
        self.root, self.files, self.detectors = root, files, detectors
        self._parts: dict[int, FilePiece] = {}
        self.num_rows = num_rows if num_rows is not None else self.part(min(files)).num_rows
        first = min(files)  # the view's columns read as they are: (pool, its column)
        self.plain = {"id": (first, "id"), "text": (first, "text")}
        for pool in files:
            name = detectors.get(pool, f"detector-{pool}")
            self.plain.update({f"score_{name}": (pool, "toxic_score"), f"pred_{name}": (pool, "pred_toxic")})
        # its pivot is kept under its table's version (the files' sizes and times): a part rewritten is read again
        self.key = (version, root, *("/".join(files[pool]) for pool in sorted(files)))

    def part(self, pool: int) -> FilePiece:
        """A detector's part, its footer read the first time it is needed (a sort on the first detector's
        score never opens the others')."""
        if pool not in self._parts:
            self._parts[pool] = FilePiece.open(self.root, self.files[pool])
        return self._parts[pool]

    def parts(self) -> dict[int, FilePiece]:
        return {pool: self.part(pool) for pool in self.files}

    def _pivot(self) -> pa.Table:
        with _LOCK:
            if self.key in _PIVOTS:
                _PIVOTS.move_to_end(self.key)
                return _PIVOTS[self.key]
        read = {pool: list(piece.batches(READ)) for pool, piece in self.parts().items()}
        table = pivot({pool: pa.concat_tables(batches) for pool, batches in read.items() if batches}, self.detectors)
        with _LOCK:
            _PIVOTS[self.key] = table
            while sum(t.nbytes for t in _PIVOTS.values()) > PIVOTS_BYTES and len(_PIVOTS) > 1:
                _PIVOTS.popitem(last=False)
        return table

    def batches(self, columns: list[str]) -> Iterator[pa.Table]:
        with _LOCK:
            kept = _PIVOTS.get(self.key)
        light = self._light(columns) if kept is None and columns and set(columns) <= set(self.plain) else None
        table = light if light is not None else kept if kept is not None else self._pivot()
        yield table.select([c for c in columns if c in table.column_names])

    def _light(self, columns: list[str]) -> pa.Table | None:
        """`columns` (the id, the text, detectors' scores and verdicts) without the pivot: read from
        the first part, each other detector's aligned to it by id; None when the first part is empty."""
        first = min(self.files)
        wanted: dict[int, list[str]] = {}
        for c in columns:
            pool, source = self.plain[c]
            wanted.setdefault(pool, []).append(source)
        aligned = ["id"] if set(wanted) - {first} else []  # the other detectors' rows are aligned by id
        base = pa.concat_tables(list(self.part(first).batches([*aligned, *wanted.get(first, [])])) or [pa.table({})])
        if not base.num_rows:
            return None
        out = {}
        for pool, sources in wanted.items():
            rows = base if pool == first else pa.concat_tables(
                list(self.part(pool).batches(["id", *sources])) or [pa.table({"id": pa.array([], pa.string())})])
            at = None if pool == first else pc.index_in(base.column("id"), value_set=rows.column("id"))
            for c in columns:
                if self.plain[c][0] == pool:
                    column = rows.column(self.plain[c][1]) if self.plain[c][1] in rows.column_names else pa.nulls(
                        rows.num_rows)
                    out[c] = column if at is None else column.take(at)
        return pa.table(out)

    def take(self, local: np.ndarray) -> pa.Table:
        """These rows: from the shard's pivot when it is kept, else pivoted alone (the first part's rows
        taken, the other parts' verdicts read without their texts)."""
        with _LOCK:
            kept = _PIVOTS.get(self.key)
        if kept is not None:
            return kept.take(pa.array(local, pa.int64()))
        parts = self.parts()
        first = min(parts)
        read = {first: parts[first].take(local, READ)}
        ids = read[first].column("id")
        for pool, piece in parts.items():
            if pool != first:  # a shard's parts hold its ids in one order: the same rows, else joined by id
                rows = piece.take(local, VERDICTS) if local.size and np.max(local) < piece.num_rows else None
                if rows is None or not rows.column("id").equals(ids):
                    rows = pa.concat_tables(list(piece.batches(VERDICTS)) or [pa.table({})])
                read[pool] = rows
        return pivot({pool: rows.select([c for c in READ if c in rows.column_names]) for pool, rows in read.items()},
                     self.detectors)


def shard_sizes(files: list[tuple[str, int]]) -> dict[str, int]:
    """Each shard's name in the view's index -> its parts' bytes (`files`: (path, size) of the parts)."""
    size = dict(files)
    return {shard_key(pools): sum(size[rel] for rel in pools.values())
            for pools in parts_by_shard([rel for rel, _ in files]).values()}


def open_per_text(root: str, run_id: str, files: list[str], key: object, index: TableIndex | None = None) -> Source:
    """The per-text view of a score run's predictions (`files`: the table's parts below the run);
    `index`: the view's index, when it matches the parts (else every shard's parts are opened by
    their footers). The detectors' names are read from the first shard's parts."""
    shards = [pools for _, pools in sorted(parts_by_shard(files).items())]
    if not shards:
        raise RedlineError("this run's predictions are not written one part per shard and detector")
    paths = [{pool: [*run_id.split("/"), *rel.split("/")] for pool, rel in pools.items()} for pools in shards]
    first = ShardPivot(root, paths[0], {})
    names = {pool: detector_name(pa.concat_tables(list(piece.batches(["detector"])) or [pa.table({})]), pool)
             for pool, piece in first.parts().items()}
    detectors = [names[p] for p in sorted(names)]
    if index is not None:  # it matches the parts: the same shards, in the same order
        rows = {stats.part: stats.rows for stats in index.parts}
        pieces = [ShardPivot(root, parts, names, rows[shard_key(pools)], key) for parts, pools in zip(paths, shards)]
        return Source(NAME, pieces, index.schema, key, index, searchable=SEARCHED)
    return Source(NAME, [ShardPivot(root, parts, names, version=key) for parts in paths], schema(detectors), key,
                  searchable=SEARCHED)
