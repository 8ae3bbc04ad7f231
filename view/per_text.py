"""A score run's predictions seen one row per text: the label ("toxic" or "benign"), and each
detector's score and verdict side by side, with `disagree` (the detectors' verdicts differ),
`misclassified` (the detectors whose verdict is not the label) and `fooled` (every, some or none of
the detectors that judged the text got it wrong) to filter on. In a transfer run an adversarial
example made against one of the detectors is that detector's `own`: it fools it by construction,
so, as in the run's figures (`figures.OWN`, the same declaration), it is never counted as that
detector's mistake, nor as one that judged it.

Each input shard's parts (one per detector, `part-SSSSS-K.parquet`) hold the same ids, so the pivot
is done shard by shard, when a request scans it: the table is never held whole.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from redline.cluster.tables import STATUS_OK
from redline.errors import RedlineError
from redline.pipelines.figures import OWN
from redline.view.scan import FilePiece, Source

NAME = "per-text"
PART = re.compile(r"part-(\d{5})-(\d+)\.parquet$")
KEPT = ["id", "text", "label"]
MARKS = ["split", "source"]
LABELS = ("benign", "toxic")  # what decides whether a row is a detector's own example


def parts_by_shard(files: list[str]) -> dict[int, dict[int, str]]:
    """shard -> pool -> file (below the run) of a predictions table written one part per shard and pool."""
    out: dict[int, dict[int, str]] = {}
    for rel in files:
        m = PART.search(rel)
        if m:
            out.setdefault(int(m.group(1)), {})[int(m.group(2))] = rel
    return out


class ShardPivot:
    """One input shard: its detectors' parts joined by id into one row per text."""

    def __init__(self, parts: dict[int, FilePiece], detectors: dict[int, str]) -> None:
        self.parts, self.detectors = parts, detectors
        self.num_rows = parts[min(parts)].num_rows

    def _pivot(self) -> pa.Table:
        base = marks = None
        scores, preds, own = {}, {}, {}
        for pool, piece in sorted(self.parts.items()):
            read = list(piece.batches(["id", "text", "label", *MARKS, "status", "toxic_score", "pred_toxic"]))
            if not read:
                continue
            table = pa.concat_tables(read)
            if base is None:
                base = table.select([c for c in KEPT if c in table.column_names])
                marks = table.select([c for c in MARKS if c in table.column_names])
            at = pc.index_in(base.column("id"), value_set=table.column("id"))
            name = self.detectors.get(pool, f"detector-{pool}")
            scores[name] = table.column("toxic_score").take(at)
            preds[name] = table.column("pred_toxic").take(at)
            status = table.column("status").take(at) if "status" in table.column_names else None
            own[name] = _own(marks, status, name)
        if base is None:
            raise RedlineError("a shard of the predictions has no rows")
        n = base.num_rows
        verdicts = np.array([pc.fill_null(preds[d], False).to_numpy(zero_copy_only=False) for d in preds]).reshape(-1, n)
        known = np.array([pc.is_valid(preds[d]).to_numpy(zero_copy_only=False) for d in preds]).reshape(-1, n)
        mine = np.array([own[d] for d in preds]).reshape(-1, n)
        toxic, benign = (verdicts & known).any(axis=0), (~verdicts & known).any(axis=0)
        label = base.column("label").to_numpy(zero_copy_only=False) if "label" in base.column_names else None
        wrong = [[d for d, v, k, o in zip(preds, verdicts[:, i], known[:, i], mine[:, i]) if k and not o
                  and label is not None and not np.isnan(label[i]) and bool(v) != bool(label[i])] for i in range(n)]
        owner = [next((d for d, o in zip(preds, mine[:, i]) if o), None) for i in range(n)]
        judged = (known & ~mine).sum(axis=0)  # the detectors whose verdict on the text counts
        fooled = [None if label is None or np.isnan(label[i]) or not judged[i] else
                  "every" if len(wrong[i]) == judged[i] else "some" if wrong[i] else "none" for i in range(n)]
        columns = {**{c: base.column(c) for c in base.column_names}, "disagree": pa.array(toxic & benign),
                   "misclassified": pa.array(wrong, pa.list_(pa.string())), "fooled": pa.array(fooled, pa.string()),
                   "own": pa.array(owner, pa.string())}
        if label is not None:
            columns["label"] = pa.array([None if np.isnan(v) else LABELS[int(v)] for v in label], pa.string())
        for d in preds:
            columns[f"score_{d}"], columns[f"pred_{d}"] = scores[d], preds[d]
        return pa.table(columns)

    def batches(self, columns: list[str]) -> Iterator[pa.Table]:
        table = self._pivot()
        yield table.select([c for c in columns if c in table.column_names])

    def take(self, local: np.ndarray) -> pa.Table:
        return self._pivot().take(pa.array(local, pa.int64()))


def _own(marks: pa.Table, status: pa.ChunkedArray | None, detector: str) -> np.ndarray:
    """Which rows are `detector`'s own adversarial examples, by the transfer figures' declaration."""
    n = marks.num_rows
    columns = {c: marks.column(c) if c in marks.column_names else pa.nulls(n, pa.string()) for c in MARKS}
    rows = pa.table({**columns, "status": status if status is not None else pa.array([STATUS_OK] * n),
                     "victim": pa.array([detector] * n, pa.string())})
    return pc.fill_null(OWN.test(rows), False).to_numpy(zero_copy_only=False)


def open_per_text(root: str, run_id: str, files: list[str], key: object) -> Source:
    """The per-text view of a score run's predictions (`files`: the table's parts below the run); the
    detectors' names are read from the first shard's parts."""
    shards = parts_by_shard(files)
    if not shards:
        raise RedlineError("this run's predictions are not written one part per shard and detector")
    opened = [{pool: FilePiece.open(root, [*run_id.split("/"), *rel.split("/")]) for pool, rel in pools.items()}
              for _, pools in sorted(shards.items())]
    names: dict[int, str] = {}
    for pool, piece in opened[0].items():
        first = next(piece.batches(["detector"]), None)
        names[pool] = str(first.column("detector")[0]) if first is not None and first.num_rows else f"detector-{pool}"
    detectors = [names[p] for p in sorted(names)]
    pieces = [ShardPivot(parts, names) for parts in opened]
    fields = [pa.field("id", pa.string()), pa.field("text", pa.string()), pa.field("label", pa.string()),
              pa.field("disagree", pa.bool_()), pa.field("misclassified", pa.list_(pa.string())),
              pa.field("fooled", pa.string()), pa.field("own", pa.string())]
    for d in detectors:
        fields += [pa.field(f"score_{d}", pa.float64()), pa.field(f"pred_{d}", pa.bool_())]
    return Source(NAME, pieces, pa.schema(fields), key)
