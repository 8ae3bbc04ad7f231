"""Arrow schemas of every table redline reads or writes. Defined once; every stage imports them."""

from __future__ import annotations

import pyarrow as pa

# Row status shared by every table: `ok` rows were processed; `rejected` rows are kept with a reason.
STATUS_OK = "ok"
STATUS_REJECTED = "rejected"
STATUS_ERROR = "error"

# A labelled text corpus after normalisation. `label` is 1 toxic / 0 benign / null unknown;
# `label_name` keeps the source's own label ("offensive", "Unsafe", "toxic,insult").
CORPUS_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("text", pa.string()),
        pa.field("context", pa.string()),
        pa.field("label", pa.int8()),
        pa.field("label_name", pa.string()),
        pa.field("dataset", pa.string()),
        pa.field("split", pa.string()),
        pa.field("source", pa.string()),
        pa.field("source_row", pa.int64()),
        pa.field("status", pa.string()),
        pa.field("reason", pa.string()),
    ]
)

# What a detector worker adds to each row it scores.
DETECTION_FIELDS = [
    pa.field("detector", pa.string()),
    pa.field("toxic_score", pa.float64()),
    pa.field("pred_toxic", pa.bool_()),
    pa.field("probs", pa.list_(pa.float32())),
    pa.field("seconds", pa.float64()),  # this row's share of its batch's model time
]

# What a detection worker returns per batch (joined back onto the corpus rows by `id`).
DETECTION_BATCH_SCHEMA = pa.schema(
    [pa.field("id", pa.string()), pa.field("shard", pa.int32())]
    + DETECTION_FIELDS
    + [pa.field("det_status", pa.string()), pa.field("det_reason", pa.string())]
)

# One row per (corpus row, detector): the corpus columns, then the detection columns.
PREDICTION_SCHEMA = pa.schema(list(CORPUS_SCHEMA) + DETECTION_FIELDS)


def empty_table(schema: pa.Schema) -> pa.Table:
    return schema.empty_table()


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Reorder and cast `table` to `schema`, adding absent nullable columns as nulls."""
    columns = []
    for field in schema:
        if field.name in table.column_names:
            columns.append(table.column(field.name).cast(field.type))
        else:
            columns.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=schema)
