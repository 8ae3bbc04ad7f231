"""How a figure is computed, declared with it: from partial sums (counts and sums of a column, under a
row condition) that are computed per shard of output rows and merged by adding, so a run's figures
never need its whole output in one process.

A figure's `compute` is an expression over those partial sums: `Count(...)`, `Sum(...)`, their
`Ratio`, a `Mean` (a ratio of a sum and a count). `partials(rows, by, needs)` gives each group's
partial sums, `merge` adds two such results, and `Value.value(sums)` finishes a figure.

Pure pyarrow (no Ray, no torch): light enough for the registry and the viewer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

Group = tuple[Any, ...]
Partials = dict[Group, dict[str, float]]


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


def both(a: Where | None, b: Where | None) -> Where | None:
    if a is None or b is None:
        return a or b
    return Where(f"{a.name} & {b.name}", lambda t: pc.and_kleene(a.test(t), b.test(t)))


class Value:
    """A figure's value from a group's partial sums."""

    def needs(self) -> tuple[Aggregate, ...]:
        raise NotImplementedError

    def value(self, sums: dict[str, float]) -> Any:
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

    def needs(self) -> tuple[Aggregate, ...]:
        return (self,)

    def value(self, sums: dict[str, float]) -> Any:
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


def Count(where: Where | None = None) -> Aggregate:  # noqa: N802 - reads as a declaration
    return Aggregate(None, where)


def Sum(column: str, where: Where | None = None, *, length: bool = False) -> Aggregate:  # noqa: N802
    return Aggregate(column, where, length)


@dataclass(frozen=True)
class Ratio(Value):
    """numerator / denominator; None when the denominator is 0 (no rows to speak of)."""

    numerator: Value
    denominator: Value

    def needs(self) -> tuple[Aggregate, ...]:
        return self.numerator.needs() + self.denominator.needs()

    def value(self, sums: dict[str, float]) -> Any:
        num, den = self.numerator.value(sums), self.denominator.value(sums)
        return None if not den or num is None else float(num / den)


@dataclass(frozen=True)
class Combined(Value):
    """A value made of other figures' values."""

    parts: tuple[Value, ...]

    def needs(self) -> tuple[Aggregate, ...]:
        return tuple(a for p in self.parts for a in p.needs())


class Plus(Combined):
    """Their sum."""

    def value(self, sums: dict[str, float]) -> Any:
        return sum(p.value(sums) for p in self.parts)


class MeanOf(Combined):
    """Their mean, those without a value (None) left out; None when none has one."""

    def value(self, sums: dict[str, float]) -> Any:
        values = [v for v in (p.value(sums) for p in self.parts) if v is not None]
        return sum(values) / len(values) if values else None


def Mean(column: str, where: Where | None = None) -> Ratio:  # noqa: N802
    """The mean of a column over the rows `where` holds that have a value."""
    rows = both(where, valid(column))
    return Ratio(Sum(column, rows), Count(rows))


def partials(rows: pa.Table, by: tuple[str, ...], needs: Iterable[Aggregate]) -> Partials:
    """Each group's partial sums (groups in order of first appearance), in one vectorised group-by."""
    needs = list(dict.fromkeys(needs))
    if rows.num_rows == 0:
        return {}
    shares = pa.table({**{f"k{i}": rows.column(c) for i, c in enumerate(by)},
                       **{f"a{j}": a.per_row(rows) for j, a in enumerate(needs)},
                       "one": pa.array([0] * rows.num_rows, pa.int8())})  # a key when `by` is empty
    keys = [f"k{i}" for i in range(len(by))] or ["one"]
    summed = shares.group_by(keys, use_threads=False).aggregate([(f"a{j}", "sum") for j in range(len(needs))])
    groups = zip(*(summed.column(k).to_pylist() for k in keys)) if by else [()] * summed.num_rows
    totals = [summed.column(f"a{j}_sum").to_pylist() for j in range(len(needs))]
    return {tuple(group): {a.name: totals[j][i] or 0 for j, a in enumerate(needs)}
            for i, group in enumerate(groups)}


def merge(*results: Partials) -> Partials:
    """Partial sums of several shards added group by group (groups in order of first appearance)."""
    out: Partials = {}
    for result in results:
        for group, sums in result.items():
            mine = out.setdefault(group, {})
            for name, value in sums.items():
                mine[name] = mine.get(name, 0) + value
    return out


def to_json(result: Partials) -> list[list[Any]]:
    """A manifest's form: [[group values...], {name: sum}] per group (JSON has no tuple keys)."""
    return [[list(group), sums] for group, sums in result.items()]


def from_json(data: list[list[Any]]) -> Partials:
    return {tuple(group): dict(sums) for group, sums in data}
