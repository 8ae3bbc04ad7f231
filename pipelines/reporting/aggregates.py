"""How a figure is computed, declared with it: from partial sums (counts and sums of a column, under a
row condition) that are computed per shard of output rows and merged by adding, so a run's figures
never need its whole output in one process.

A figure's `compute` is an expression over those partial sums: `Count(...)`, `Sum(...)`, their
`Ratio`, a `Mean` (a ratio of a sum and a count). A `Tally` is a partial sum too, one count per value
of a column of bounded variety (a status, a target), merged by adding count to count: `Distinct`
counts its keys. A `Sketch` is a probability column's histogram of bounded size: `RocAuc` ranks two
classes' sketches.
`partials(rows, by, needs)` gives each group's partial sums, `merge` adds two such results, and
`Value.value(sums)` finishes a figure.

Pure pyarrow (no Ray, no torch): light enough for the registry and the viewer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

Group = tuple[Any, ...]
Sums = dict[str, Any]  # a partial sum's name -> a number, or a tally's {key: count}
Partials = dict[Group, Sums]


@dataclass(frozen=True)
class Where:
    """A row condition with a stable name (the name keys its partial sums in manifests)."""

    name: str
    test: Callable[[pa.Table], Any]  # a boolean array, one per row


def eq(column: str, value: Any) -> Where:
    return Where(f"{column}={value}", lambda t: pc.equal(t.column(column), value))


def ne(column: str, value: Any) -> Where:
    return Where(f"{column}!={value}", lambda t: pc.not_equal(t.column(column), value))


def prefixed(column: str, prefix: str) -> Where:
    return Where(f"{column} {prefix}*", lambda t: pc.starts_with(t.column(column), prefix))


def not_prefixed(column: str, prefix: str) -> Where:
    return Where(f"{column} not {prefix}*", lambda t: pc.invert(pc.starts_with(t.column(column), prefix)))


def isin(column: str, values: Iterable[Any]) -> Where:
    values = tuple(values)
    return Where(f"{column} in {','.join(map(str, values))}",
                 lambda t: pc.is_in(t.column(column), value_set=pa.array(values)))


def valid(column: str) -> Where:
    return Where(f"{column} set", lambda t: pc.is_valid(t.column(column)))


def missing(column: str) -> Where:
    return Where(f"{column} unset", lambda t: pc.is_null(t.column(column)))


def greater(column: str, other: str) -> Where:
    return Where(f"{column}>{other}", lambda t: pc.greater(t.column(column), t.column(other)))


def at_most(column: str, other: str) -> Where:
    return Where(f"{column}<={other}", lambda t: pc.less_equal(t.column(column), t.column(other)))


def same(column: str, other: str) -> Where:
    """Two columns hold the same value (a null on either side, or a column the rows lack: not the same)."""
    def test(t: pa.Table) -> Any:
        if column not in t.column_names or other not in t.column_names:
            return pa.array([False] * t.num_rows)
        return pc.fill_null(pc.equal(t.column(column), t.column(other)), False)

    return Where(f"{column}=={other}", test)


def differs(column: str, other: str) -> Where:
    return Where(f"{column}<>{other}", lambda t: pc.invert(same(column, other).test(t)))


def has(column: str, value: Any) -> Where:
    """A list column holds `value`."""
    def test(t: pa.Table) -> Any:
        lists = t.column(column).combine_chunks()
        if pa.types.is_null(lists.type):
            return pa.array([False] * t.num_rows)
        hit = pc.fill_null(pc.equal(pc.list_flatten(lists), value), False)
        rows = pc.filter(pc.list_parent_indices(lists), hit)
        return pc.is_in(pa.array(range(t.num_rows), pa.int64()), value_set=rows.cast(pa.int64()))
    return Where(f"{value} in {column}", test)


def both(a: Where | None, b: Where | None) -> Where | None:
    if a is None or b is None:
        return a or b
    return Where(f"{a.name} & {b.name}", lambda t: pc.and_kleene(a.test(t), b.test(t)))


class Value:
    """A figure's value from a group's partial sums."""

    def needs(self) -> tuple[Partial, ...]:
        raise NotImplementedError

    def value(self, sums: Sums) -> Any:
        raise NotImplementedError


@dataclass(frozen=True)
class Aggregate(Value):
    """One partial sum: rows counted, or a column summed (`length`: the lengths of a list column),
    over the rows `where` holds."""

    column: str | None = None
    where: Where | None = None
    length: bool = False

    @property
    def name(self) -> str:
        what = "rows" if self.column is None else (f"len({self.column})" if self.length else self.column)
        return f"sum {what}" + (f" where {self.where.name}" if self.where else "")

    def needs(self) -> tuple[Partial, ...]:
        return (self,)

    def value(self, sums: Sums) -> Any:
        total = sums.get(self.name, 0)
        return int(total) if self.column is None or self.length else total

    def per_row(self, rows: pa.Table) -> pa.Array:
        """Each row's share of this sum: 1 or its value where `where` holds, else 0."""
        if self.column is None:
            share = pa.array([1] * rows.num_rows, pa.int64())
        else:
            share = rows.column(self.column).combine_chunks()
            if pa.types.is_null(share.type):  # no row has a value (a shard's column written all-null)
                share = pa.array([0] * rows.num_rows, pa.int64())
            elif self.length:
                share = pc.list_value_length(share)
            elif pa.types.is_boolean(share.type):  # a flag column: the rows it holds for
                share = share.cast(pa.int64())
        if self.where is not None:
            share = pc.if_else(self.where.test(rows), share, pa.scalar(0, share.type))
        return pc.fill_null(share, pa.scalar(0, share.type))


@dataclass(frozen=True)
class Tally(Value):
    """Rows counted per value of `column`, over the rows `where` holds that have one: {key: count},
    keys as strings. A column of bounded variety only (the partial holds one count per value).
    `before`: a string column keyed by its text before the first `before` (an error's kind, not its
    message)."""

    column: str
    where: Where | None = None
    before: str | None = None

    @property
    def name(self) -> str:
        what = self.column + (f" before {self.before!r}" if self.before else "")
        return f"tally {what}" + (f" where {self.where.name}" if self.where else "")

    def needs(self) -> tuple[Partial, ...]:
        return (self,)

    def value(self, sums: Sums) -> dict[str, int]:
        return {k: int(n) for k, n in (sums.get(self.name) or {}).items()}

    def keys(self, rows: pa.Table) -> tuple[pa.Array, pa.Array]:
        """Each row's key (a string) and whether the row is counted."""
        values, counted = _counted(rows, self.column, self.where)
        if self.before is not None and not pa.types.is_null(values.type):
            values = pc.list_element(pc.split_pattern(values, self.before, max_splits=1), 0)
        return values.cast(pa.string()), counted


def _counted(rows: pa.Table, column: str, where: Where | None) -> tuple[pa.Array, pa.Array]:
    """A column's values and which rows count: those `where` holds with a value (NaN is none)."""
    values = rows.column(column).combine_chunks()
    if pa.types.is_null(values.type):  # no row has a value (a shard's column written all-null)
        return values, pa.array([False] * len(values))
    counted = pc.is_valid(values)
    if pa.types.is_floating(values.type):
        counted = pc.and_(counted, pc.invert(pc.fill_null(pc.is_nan(values), True)))
    if where is not None:
        counted = pc.and_(counted, pc.fill_null(where.test(rows), False))
    return values, counted


SKETCH_LEVEL = 30  # bins 2**-30 wide in log-odds at first: finer than a float32 probability resolves
SKETCH_BINS = 4096  # at most this many bins a sketch keeps (then it halves its resolution)


@dataclass(frozen=True)
class Sketch(Value):
    """A probability column's histogram in log-odds (scores near 0 and 1 stay apart), over the rows
    `where` holds: {"level": L, "counts": {bin: rows}}, bin `floor(logit(p) * 2**L)`. It starts at
    `SKETCH_LEVEL` (exact for any practical ranking) and halves its resolution whenever it would hold
    more than `SKETCH_BINS` bins, so its size is bounded whatever the rows; two sketches add at the
    coarser level of the two."""

    column: str
    where: Where | None = None

    @property
    def name(self) -> str:
        return f"sketch logit({self.column})" + (f" where {self.where.name}" if self.where else "")

    def needs(self) -> tuple[Partial, ...]:
        return (self,)

    def value(self, sums: Sums) -> dict[str, Any]:
        return sums.get(self.name) or {"level": SKETCH_LEVEL, "counts": {}}

    def keys(self, rows: pa.Table) -> tuple[pa.Array, pa.Array]:
        """Each row's bin at `SKETCH_LEVEL` (an integer) and whether the row is counted."""
        values, counted = _counted(rows, self.column, self.where)
        p = pc.if_else(counted, values.cast(pa.float64()), 0.5)  # rows not counted: a key dropped with them
        p = pc.max_element_wise(pc.min_element_wise(p, 1 - 1e-15), 1e-15)
        logit = pc.ln(pc.divide(p, pc.subtract(1.0, p)))
        return pc.floor(pc.multiply(logit, float(2 ** SKETCH_LEVEL))).cast(pa.int64()), counted


def coarsen(sketch: dict[str, Any], level: int) -> dict[str, Any]:
    """A sketch at a coarser `level` (each bin's rows into the bin that holds it; bins in the order
    they first appear). Vectorised: the bins' keys are shifted right (floor division by a power of 2)
    and grouped by pyarrow, as a shard's partial sums are."""
    if level >= sketch["level"]:
        return sketch
    counts = sketch["counts"]
    if not counts:
        return {"level": level, "counts": {}}
    # int64 keys: a shift of 63 or more leaves only the sign (Arrow would return the keys unshifted)
    keys = pc.shift_right(_bin_keys(counts), min(sketch["level"] - level, 62))
    if sketch["level"] - level > 62:
        keys = pc.shift_right(keys, 1)
    summed = pa.table({"key": keys, "n": pa.array(list(counts.values()), pa.int64()),
                       "at": pa.array(range(len(keys)), pa.int64())}).group_by(
        "key", use_threads=False).aggregate([("n", "sum"), ("at", "min")]).sort_by("at_min")
    return {"level": level, "counts": dict(zip(summed.column("key").cast(pa.string()).to_pylist(),
                                               summed.column("n_sum").to_pylist()))}


def _bin_keys(counts: dict[str, int]) -> pa.Array:
    return pa.array(list(counts), pa.string()).cast(pa.int64())


def _sketch_of(keys: pa.Array, counts: pa.Array) -> dict[str, Any]:
    """A shard's sketch from its bins at `SKETCH_LEVEL` and their rows: at the finest level at which
    it holds at most `SKETCH_BINS` bins, made in pyarrow before any bin becomes a Python object."""
    distinct, shift = keys, 0
    while len(distinct) > SKETCH_BINS:
        distinct, shift = pc.unique(pc.shift_right(distinct, 1)), shift + 1
    if shift:
        summed = pa.table({"key": pc.shift_right(keys, shift), "n": counts}).group_by(
            "key", use_threads=False).aggregate([("n", "sum")])
        keys, counts = summed.column("key"), summed.column("n_sum")
    return {"level": SKETCH_LEVEL - shift, "counts": dict(zip(keys.cast(pa.string()).to_pylist(), counts.to_pylist()))}


def bounded(sketch: dict[str, Any]) -> dict[str, Any]:
    """The sketch at the finest level at which it holds at most `SKETCH_BINS` bins (what halving its
    resolution one level at a time until it fits gives, found on its distinct keys at once)."""
    if len(sketch["counts"]) <= SKETCH_BINS:
        return sketch
    distinct, shift = _bin_keys(sketch["counts"]), 0
    while len(distinct) > SKETCH_BINS:
        distinct, shift = pc.unique(pc.shift_right(distinct, 1)), shift + 1
    return coarsen(sketch, sketch["level"] - shift)


def add_sketches(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    level = min(a["level"], b["level"])
    a, b = coarsen(a, level), coarsen(b, level)
    counts = dict(a["counts"])
    for key, n in b["counts"].items():
        counts[key] = counts.get(key, 0) + n
    return bounded({"level": level, "counts": counts})


@dataclass(frozen=True)
class Distinct(Value):
    """How many distinct values `column` takes over the rows `where` holds (a `Tally`'s keys)."""

    column: str
    where: Where | None = None

    def needs(self) -> tuple[Partial, ...]:
        return (Tally(self.column, self.where),)

    def value(self, sums: Sums) -> int:
        return len(Tally(self.column, self.where).value(sums))


@dataclass(frozen=True)
class RocAuc(Value):
    """Area under the ROC curve of a probability `score` for `label` = 1 against 0, over the rows
    `where` holds: from the two classes' score sketches (ties, and scores within one bin, count half);
    None without rows of both classes."""

    score: str
    label: str
    where: Where | None = None

    def sketches(self) -> tuple[Sketch, Sketch]:
        return (Sketch(self.score, both(self.where, eq(self.label, 1))),
                Sketch(self.score, both(self.where, eq(self.label, 0))))

    def needs(self) -> tuple[Partial, ...]:
        return self.sketches()

    def curve(self, sums: Sums) -> tuple[list[float], list[float]] | None:
        """(false positive rates, true positive rates) at every bin, highest score first."""
        pos, neg = (s.value(sums) for s in self.sketches())
        level = min(pos["level"], neg["level"])
        pos, neg = coarsen(pos, level)["counts"], coarsen(neg, level)["counts"]
        n_pos, n_neg = sum(pos.values()), sum(neg.values())
        if not n_pos or not n_neg:
            return None
        fpr, tpr, fp, tp = [0.0], [0.0], 0, 0
        for key in sorted({*pos, *neg}, key=int, reverse=True):
            tp, fp = tp + pos.get(key, 0), fp + neg.get(key, 0)
            fpr.append(fp / n_neg)
            tpr.append(tp / n_pos)
        return fpr, tpr

    def value(self, sums: Sums) -> float | None:
        curve = self.curve(sums)
        if curve is None:
            return None
        fpr, tpr = curve  # the trapezoids count a step's ties half
        return float(sum((fpr[i] - fpr[i - 1]) * (tpr[i] + tpr[i - 1]) / 2 for i in range(1, len(fpr))))


@dataclass(frozen=True)
class AveragePrecision(RocAuc):
    """Area under the precision-recall curve of `score` for `label` = 1 (average precision: the
    precision at each bin, weighted by the recall it adds), from the same sketches as `RocAuc`."""

    def value(self, sums: Sums) -> float | None:
        pos, neg = (s.value(sums) for s in self.sketches())
        level = min(pos["level"], neg["level"])
        pos, neg = coarsen(pos, level)["counts"], coarsen(neg, level)["counts"]
        n_pos = sum(pos.values())
        if not n_pos or not neg:
            return None
        ap, tp, fp = 0.0, 0, 0
        for key in sorted({*pos, *neg}, key=int, reverse=True):
            hit = pos.get(key, 0)
            tp, fp = tp + hit, fp + neg.get(key, 0)
            ap += hit / n_pos * tp / (tp + fp)
        return ap


Partial = Aggregate | Tally | Sketch


def Count(where: Where | None = None) -> Aggregate:  # noqa: N802 - reads as a declaration
    return Aggregate(None, where)


def Sum(column: str, where: Where | None = None, *, length: bool = False) -> Aggregate:  # noqa: N802
    return Aggregate(column, where, length)


@dataclass(frozen=True)
class Ratio(Value):
    """numerator / denominator; None when the denominator is 0 (no rows to speak of)."""

    numerator: Value
    denominator: Value

    def needs(self) -> tuple[Partial, ...]:
        return self.numerator.needs() + self.denominator.needs()

    def value(self, sums: Sums) -> Any:
        num, den = self.numerator.value(sums), self.denominator.value(sums)
        return None if not den or num is None else float(num / den)


@dataclass(frozen=True)
class Combined(Value):
    """A value made of other figures' values."""

    parts: tuple[Value, ...]

    def needs(self) -> tuple[Partial, ...]:
        return tuple(a for p in self.parts for a in p.needs())


class Plus(Combined):
    """Their sum."""

    def value(self, sums: Sums) -> Any:
        return sum(p.value(sums) for p in self.parts)


class MeanOf(Combined):
    """Their mean, those without a value (None) left out; None when none has one."""

    def value(self, sums: Sums) -> Any:
        values = [v for v in (p.value(sums) for p in self.parts) if v is not None]
        return sum(values) / len(values) if values else None


def Mean(column: str, where: Where | None = None) -> Ratio:  # noqa: N802
    """The mean of a column over the rows `where` holds that have a value."""
    rows = both(where, valid(column))
    return Ratio(Sum(column, rows), Count(rows))


def partials(rows: pa.Table, by: tuple[str, ...], needs: Iterable[Partial]) -> Partials:
    """Each group's partial sums (groups in order of first appearance), in vectorised group-bys: one
    for the sums, one per tally."""
    needs = list(dict.fromkeys(needs))
    if rows.num_rows == 0:
        return {}
    sums = [a for a in needs if isinstance(a, Aggregate)]
    keys = {f"k{i}": rows.column(c) for i, c in enumerate(by)}
    names = list(keys) or ["one"]
    shares = pa.table({**keys, **{f"a{j}": a.per_row(rows) for j, a in enumerate(sums)},
                       "one": pa.array([0] * rows.num_rows, pa.int8())})  # a key when `by` is empty
    summed = shares.group_by(names, use_threads=False).aggregate([(f"a{j}", "sum") for j in range(len(sums))])
    groups = [tuple(g) for g in zip(*(summed.column(k).to_pylist() for k in names))] if by else [()] * summed.num_rows
    totals = [summed.column(f"a{j}_sum").to_pylist() for j in range(len(sums))]
    out: Partials = {group: {a.name: totals[j][i] or 0 for j, a in enumerate(sums)} for i, group in enumerate(groups)}
    for tally in (a for a in needs if isinstance(a, (Tally, Sketch))):
        counted_by: dict[Group, dict[str, int]] = {group: {} for group in out}
        key, counted = tally.keys(rows)
        kept = pa.table({**keys, "one": shares.column("one"), "key": key}).filter(counted)
        counts = kept.group_by([*names, "key"], use_threads=False).aggregate([([], "count_all")])
        if isinstance(tally, Sketch):  # bounded per group while its bins are still arrays
            for group in out:
                mine = counts.filter(_in_group(counts, names, group)) if by else counts
                out[group][tally.name] = _sketch_of(mine.column("key"), mine.column("count_all"))
            continue
        found = zip(*(counts.column(k).to_pylist() for k in names)) if by else [()] * counts.num_rows
        for group, k, n in zip(found, counts.column("key").to_pylist(), counts.column("count_all").to_pylist()):
            counted_by[tuple(group)][k] = n
        for group, found_ in counted_by.items():
            out[group][tally.name] = found_
    return out


def _in_group(table: pa.Table, names: list[str], group: Group) -> pa.Array:
    """Which rows of a grouped table belong to `group` (a null in the group matches nulls)."""
    mask = None
    for name, value in zip(names, group):
        column = table.column(name)
        here = pc.is_null(column) if value is None else pc.fill_null(pc.equal(column, value), False)
        mask = here if mask is None else pc.and_(mask, here)
    return mask


def merge(*results: Partials) -> Partials:
    """Partial sums of several shards added group by group (groups in order of first appearance)."""
    out: Partials = {}
    for result in results:
        for group, sums in result.items():
            add(out.setdefault(group, {}), sums)
    return out


def add(total: Sums, sums: Sums) -> Sums:
    """`sums` added into `total` (a tally key by key)."""
    for name, value in sums.items():
        if isinstance(value, dict) and "level" in value:  # a sketch
            total[name] = add_sketches(total[name], value) if name in total else value
        elif isinstance(value, dict):
            mine = total.setdefault(name, {})
            for key, n in value.items():
                mine[key] = mine.get(key, 0) + n
        else:
            total[name] = total.get(name, 0) + value
    return total


def to_json(result: Partials) -> list[list[Any]]:
    """A manifest's form: [[group values...], {name: sum}] per group (JSON has no tuple keys)."""
    return [[list(group), sums] for group, sums in result.items()]


def from_json(data: list[list[Any]]) -> Partials:
    return {tuple(group): dict(sums) for group, sums in data}
