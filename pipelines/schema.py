"""Arrow schemas of the tables pipelines write, composed from what the workers return (each worker
declares its own output schema beside it)."""

from __future__ import annotations

import pyarrow as pa

from redline.actors.attack.attacker import ATTEMPT_FIELDS
from redline.actors.detectors.worker import DETECTION_FIELDS

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


# One row per (corpus row, detector): the corpus columns, then the detection columns.
PREDICTION_SCHEMA = pa.schema(list(CORPUS_SCHEMA) + DETECTION_FIELDS)


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
# utterance-unsafe | context-unsafe | no-answer (an empty or whitespace-only response, not classified) |
# "error: ..." (the model produced no responses for the context).
NO_ANSWER = "no-answer"
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
