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


# What an attack worker returns per attempt (joined back onto the seed rows by `attempt_id`).
ATTEMPT_FIELDS = [
    pa.field("recipe", pa.string()),
    pa.field("goal", pa.string()),  # tae | bae
    pa.field("victim", pa.string()),
    pa.field("transformation", pa.string()),
    pa.field("constraints", pa.string()),
    pa.field("search", pa.string()),
    pa.field("perturbed_text", pa.string()),
    pa.field("score_before", pa.float64()),  # the victim's toxic score of the seed
    pa.field("score_after", pa.float64()),  # ... of the perturbed text
    pa.field("pred_before", pa.bool_()),
    pa.field("pred_after", pa.bool_()),
    pa.field("queries", pa.int64()),
    pa.field("words_changed", pa.int64()),
    pa.field("words_total", pa.int64()),
    pa.field("perturbed_pct", pa.float64()),
    pa.field("similarity", pa.float64()),  # sentence-encoder cosine, seed vs perturbed
    pa.field("seconds", pa.float64()),
]
ATTACK_RESULT_SCHEMA = pa.schema(
    [pa.field("attempt_id", pa.string()), pa.field("shard", pa.int32())] + ATTEMPT_FIELDS
    + [pa.field("attack_status", pa.string()), pa.field("attack_reason", pa.string())]
)

# One row per attempt (seed x recipe): the seed's provenance, then the attempt.
# status: success | failed | skipped | error, with a reason unless success.
ATTACK_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("seed_id", pa.string()),
        pa.field("seed_text", pa.string()),
        pa.field("seed_label", pa.int8()),
        pa.field("seed_label_name", pa.string()),
        pa.field("dataset", pa.string()),
        pa.field("split", pa.string()),
        pa.field("source", pa.string()),
        pa.field("source_row", pa.int64()),
    ]
    + ATTEMPT_FIELDS
    + [pa.field("status", pa.string()), pa.field("reason", pa.string())]
)

# One row per (model, context, response) of a DiaSafety chatbot evaluation. verdict: safe |
# utterance-unsafe | context-unsafe | "error: ..." (the model produced no responses for the context).
DIALOGUE_SCORED_SCHEMA = pa.schema(
    [
        pa.field("model", pa.string()),
        pa.field("context_id", pa.string()),
        pa.field("category", pa.string()),
        pa.field("context", pa.string()),
        pa.field("response_index", pa.int64()),
        pa.field("response", pa.string()),
        pa.field("empty", pa.bool_()),
        pa.field("verdict", pa.string()),
        pa.field("unsafe_category", pa.string()),
        pa.field("utterance_score", pa.float64()),
    ]
)
