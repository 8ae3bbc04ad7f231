"""Pages of an indexed table (`pipelines/plane/table_index.py`) planned from its parts' figures: a part
that cannot match is never read, a part whose matches the figures count is read only when the page's
rows lie in it, and a sort reads parts best bound first, stopping once no unread part can beat the
page. Rows read only to count what matches are bounded (COUNT_ROWS); past that the total is a lower
bound, shown as such.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from redline.pipelines.plane.table_index import known_rows, sort_bound
from redline.view.scan import Source

MERGE_ROWS = 16_384  # rows of a sort's parts masked and merged at once
COUNT_ROWS = 250_000  # rows a request may read past its page only to count the matches

Mask = Callable[[pa.Table], "pa.Array | None"]


@dataclass(frozen=True)
class Planned:
    total: int  # matching rows (a lower bound when not `exact`)
    exact: bool
    numbers: list[int]  # the page's row numbers, in order


def _known(source: Source, filters: dict[str, str], ranges: dict[str, tuple[Any, Any]], search: str | None
           ) -> list[int | None]:
    assert source.index is not None
    known = [known_rows(p, filters, ranges) for p in source.index.parts]
    return [k if not search or k == 0 else None for k in known]  # a search is known only to miss


def _hits(mask: Mask, batch: pa.Table, at: int) -> np.ndarray:
    m = mask(batch)
    return np.arange(batch.num_rows) + at if m is None else np.flatnonzero(np.asarray(m)) + at


def _count_rest(source: Source, needed: list[str], mask: Mask, known: list[int | None], rest: list[int]
                ) -> tuple[int, bool]:
    """The matches in parts `rest`: counted from the figures where they say, else read up to COUNT_ROWS
    rows (each part masked on the thread that read it); (count, whether exact)."""
    total = sum(known[i] or 0 for i in rest)
    unknown = [i for i in rest if known[i] is None]
    read = 0
    counts = source.scan_parts(unknown, needed, then=lambda batch: (batch.num_rows, len(_hits(mask, batch, 0))))
    for done, (_, _, (rows, hits)) in enumerate(counts, start=1):
        read, total = read + rows, total + hits
        if read >= COUNT_ROWS and done < len(unknown):
            counts.close()
            return total, False
    return total, True


def filtered_page(source: Source, needed: list[str], mask: Mask, filters: dict[str, str], search: str | None,
                  ranges: dict[str, tuple[Any, Any]], page: int, per_page: int) -> Planned:
    """The page of matching rows in table order."""
    assert source.index is not None
    parts, known = source.index.parts, _known(source, filters, ranges, search)
    start, want = (page - 1) * per_page, page * per_page
    candidates = [i for i, k in enumerate(known) if k != 0]
    reads = source.scan_parts([i for i in candidates if known[i] != parts[i].rows], needed,
                              then=lambda batch: _hits(mask, batch, 0))
    total, kept, upto = 0, deque[int](maxlen=per_page), 0
    for upto, i in enumerate(candidates, start=1):
        if known[i] == parts[i].rows:  # every row matches: its numbers are known
            first = int(source.starts[i])
            hits = np.arange(first, first + min(parts[i].rows, max(0, want - total)))
            count = parts[i].rows
        else:
            _, at, hits = next(reads)
            hits = hits + at
            count = len(hits)
        kept.extend(hits[:max(0, want - total)].tolist())
        total += count
        if total >= want:
            break
    reads.close()
    rest, exact = _count_rest(source, needed, mask, known, candidates[upto:])
    total += rest
    last_start = max(0, min(start, (math.ceil(total / per_page) - 1) * per_page))
    numbers = list(kept)[-(min(total, last_start + per_page) - last_start):] if total else []
    return Planned(total, exact, numbers)


def sorted_page(source: Source, needed: list[str], mask: Mask, filters: dict[str, str], search: str | None,
                ranges: dict[str, tuple[Any, Any]], key: str, descending: bool, page: int, per_page: int
                ) -> Planned | None:
    """The page of matching rows sorted by number column `key` (ties in table order, nulls and NaN
    last); None when the page reaches the rows without a value (the caller scans the whole table)."""
    assert source.index is not None
    parts, known = source.index.parts, _known(source, filters, ranges, search)
    k = page * per_page
    order = [(key, "descending" if descending else "ascending", "at_end"), ("__row", "ascending", "at_end")]
    bounds = {i: sort_bound(p, key, descending) for i, p in enumerate(parts) if known[i] != 0}
    ranked = sorted((i for i, b in bounds.items() if b is not None),
                    key=lambda i: (-bounds[i] if descending else bounds[i], i))  # type: ignore[operator]
    best: pa.Table | None = None
    read: set[int] = set()
    group: list[tuple[int, pa.Table]] = []
    hits = 0

    def merge() -> None:  # the group's matches into the best so far (parts masked together: fewer calls)
        nonlocal best, hits
        batch = pa.concat_tables([b for _, b in group])
        rows = pa.table({key: batch.column(key),
                         "__row": pa.array(np.concatenate([np.arange(b.num_rows) + at for at, b in group]), pa.int64())})
        m = mask(batch)
        rows = rows.filter(m) if m is not None else rows
        hits += rows.num_rows
        merged = rows if best is None else pa.concat_tables([best, rows])
        best = merged.take(pc.select_k_unstable(merged, k, sort_keys=order)) if merged.num_rows > k else merged
        best = best.take(pc.sort_indices(best, sort_keys=order))
        group.clear()

    for i, at, batch in source.scan_parts(ranked, needed):
        if best is not None and best.num_rows >= k:
            worst = _value(best.column(key)[k - 1])
            bound = bounds[i]
            if worst is not None and (bound < worst if descending else bound > worst):  # type: ignore[operator]
                break
        read.add(i)
        group.append((at, batch))
        if best is None or best.num_rows < k or sum(b.num_rows for _, b in group) >= MERGE_ROWS:
            merge()  # until the page is full, after each part: its bound can stop the next
    if group:
        merge()
    if best is None or best.num_rows < k or _value(best.column(key)[k - 1]) is None:
        return None
    counted_rest, exact = _count_rest(source, needed, mask, known, [i for i in bounds if i not in read])
    total = hits + counted_rest
    start = (page - 1) * per_page
    return Planned(total, exact, best.column("__row").to_pylist()[start:start + per_page])


def _value(scalar: pa.Scalar) -> Any:
    """A sort value, None for a null or NaN (both sort last)."""
    value = scalar.as_py()
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value
