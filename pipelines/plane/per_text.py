"""A score run's predictions seen one row per text: the label ("toxic" or "benign"), and each
detector's score and verdict side by side, with `disagree` (the detectors' verdicts differ),
`misclassified` (the detectors whose verdict is not the label) and `fooled` (every, some or none of
the detectors that judged the text got it wrong) to filter on. In a transfer run an adversarial
example made against one of the detectors is that detector's `own`: it fools it by construction,
so, as in the run's figures (`figures.OWN`, the same declaration), it is never counted as that
detector's mistake, nor as one that judged it.

Each input shard's parts (one per detector, `part-SSSSS-K.parquet`) hold the same ids, so the view
is made shard by shard (`pivot`), never whole. When the run finishes, its worker writes the view's
index (`write_index`: each shard's figures, as `table_index` writes them for a table of files), so a
reader (`redline view`) plans its pages and counts from one small file.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from redline.cluster import storage
from redline.cluster.tables import STATUS_OK
from redline.errors import RedlineError
from redline.pipelines.plane import table_index
from redline.pipelines.reporting.figures import OWN

NAME = "per-text"
PART = re.compile(r"part-(\d{5})-(\d+)\.parquet$")
KEPT = ["id", "text", "label"]
MARKS = ["split", "source"]
READ = [*KEPT, *MARKS, "status", "toxic_score", "pred_toxic"]  # what the view reads of each part
LABELS = ("benign", "toxic")  # what decides whether a row is a detector's own example


def parts_by_shard(files: list[str]) -> dict[int, dict[int, str]]:
    """shard -> pool -> file (as given) of a predictions table written one part per shard and pool."""
    out: dict[int, dict[int, str]] = {}
    for rel in files:
        m = PART.search(rel)
        if m:
            out.setdefault(int(m.group(1)), {})[int(m.group(2))] = rel
    return out


def shard_key(files: dict[int, str]) -> str:
    """A shard's name in the view's index: its parts' file names (a part added or gone: another shard)."""
    return "+".join(files[pool].rsplit("/", 1)[-1] for pool in sorted(files))


def schema(detectors: list[str]) -> pa.Schema:
    """The view's columns, for these detectors in pool order."""
    fields = [pa.field("id", pa.string()), pa.field("text", pa.string()), pa.field("label", pa.string()),
              pa.field("disagree", pa.bool_()), pa.field("misclassified", pa.list_(pa.string())),
              pa.field("fooled", pa.string()), pa.field("own", pa.string())]
    for d in detectors:
        fields += [pa.field(f"score_{d}", pa.float64()), pa.field(f"pred_{d}", pa.bool_())]
    return pa.schema(fields)


def detector_name(part: pa.Table, pool: int) -> str:
    return str(part.column("detector")[0]) if "detector" in part.column_names and part.num_rows else f"detector-{pool}"


def pivot(parts: dict[int, pa.Table], detectors: dict[int, str]) -> pa.Table:
    """One shard's parts (pool -> its rows, READ's columns) as one row per text, in the first part's order."""
    base = marks = None
    scores, preds, own = {}, {}, {}
    for pool, table in sorted(parts.items()):
        if not table.num_rows:
            continue
        if base is None:
            base = table.select([c for c in KEPT if c in table.column_names])
            marks = table.select([c for c in MARKS if c in table.column_names])
        at = pc.index_in(base.column("id"), value_set=table.column("id"))
        name = detectors.get(pool, f"detector-{pool}")
        scores[name] = table.column("toxic_score").take(at)
        preds[name] = table.column("pred_toxic").take(at)
        status = table.column("status").take(at) if "status" in table.column_names else None
        own[name] = _own(marks, status, name)
    if base is None:
        raise RedlineError("a shard of the predictions has no rows")
    n, names = base.num_rows, np.array(list(preds), dtype=object)
    verdicts = np.array([pc.fill_null(preds[d], False).to_numpy(zero_copy_only=False) for d in preds]).reshape(-1, n)
    known = np.array([pc.is_valid(preds[d]).to_numpy(zero_copy_only=False) for d in preds]).reshape(-1, n)
    mine = np.array([own[d] for d in preds]).reshape(-1, n).astype(bool)
    toxic, benign = (verdicts & known).any(axis=0), (~verdicts & known).any(axis=0)
    label = base.column("label").to_numpy(zero_copy_only=False).astype(float) if "label" in base.column_names else None
    labelled = ~np.isnan(label) if label is not None else np.zeros(n, bool)
    judged = known & ~mine  # the detectors whose verdict on the text counts
    toxic_label = np.nan_to_num(label) != 0 if label is not None else np.zeros(n, bool)
    wrong = judged & labelled & (verdicts != toxic_label)  # unlabelled: no detector is wrong about it
    rows, dets = np.nonzero(wrong.T)  # row by row, each row's detectors in pool order
    misclassified = pa.ListArray.from_arrays(np.concatenate([[0], np.cumsum(wrong.sum(axis=0))]).astype(np.int32),
                                             pa.array(names[dets].tolist(), pa.string()))
    owner = pa.array(names[mine.argmax(axis=0)].tolist() if n else [], pa.string(), mask=~mine.any(axis=0))
    counted, fooled_n = judged.sum(axis=0), wrong.sum(axis=0)
    fooled = pa.array(np.where(fooled_n == counted, "every", np.where(fooled_n > 0, "some", "none")).tolist(),
                      pa.string(), mask=~labelled | (counted == 0))
    columns = {**{c: base.column(c) for c in base.column_names}, "disagree": pa.array(toxic & benign),
               "misclassified": misclassified, "fooled": fooled, "own": owner}
    if label is not None:
        columns["label"] = pa.array(np.array(LABELS, dtype=object)[(np.nan_to_num(label) != 0).astype(int)].tolist(),
                                    pa.string(), mask=~labelled)
    for d in preds:
        columns[f"score_{d}"], columns[f"pred_{d}"] = scores[d], preds[d]
    return pa.table(columns)


def _own(marks: pa.Table, status: pa.ChunkedArray | None, detector: str) -> np.ndarray:
    """Which rows are `detector`'s own adversarial examples, by the transfer figures' declaration."""
    n = marks.num_rows
    columns = {c: marks.column(c) if c in marks.column_names else pa.nulls(n, pa.string()) for c in MARKS}
    rows = pa.table({**columns, "status": status if status is not None else pa.array([STATUS_OK] * n),
                     "victim": pa.array([detector] * n, pa.string())})
    return pc.fill_null(OWN.test(rows), False).to_numpy(zero_copy_only=False)


def write_index(run_uri: str, table: str) -> int:
    """The per-text view's index of the run's predictions table `table` (written one part per shard and
    detector), beside the tables' own (`.index/per-text.parquet`): each shard's pivot read once; returns
    how many shards (0: the table is not written by shard)."""
    uris = storage.list_files(storage.join(run_uri, *table.split("/")), ".parquet")
    shards = [files for _, files in sorted(parts_by_shard(uris).items())]
    if not shards:
        return 0
    names = {pool: detector_name(table_index.read_part(uri, None)[2], pool) for pool, uri in shards[0].items()}
    by_key = {shard_key(files): files for files in shards}

    def read(key: str, skipped: set[str] | None) -> tuple[str, int, pa.Table, pa.Schema]:
        sizes, parts = 0, {}
        for pool, uri in by_key[key].items():
            _, size, part, _ = table_index.read_part(uri, None)
            sizes, parts[pool] = sizes + size, part.select([c for c in READ if c in part.column_names])
        rows = pivot(parts, names)
        return key, sizes, rows.select([c for c in rows.column_names if c not in (skipped or ())]), rows.schema

    return table_index.write_index(run_uri, NAME, parts=list(by_key), read=read)
