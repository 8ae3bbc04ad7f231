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


# The columns a person reads first in each row table of a run, by the table's name or its folder
# (`stages/2-grammar`: `stages`): `redline view` shows these at first, in this order, and the rest
# one click away in its column picker.
_BENCH = ("id", "goal", "recipes", "seed_text", "text", "judge_verdict", "classifier_toxic", "natural_score",
          "bench_split")
FIRST_COLUMNS: dict[str, tuple[str, ...]] = {
    "attempts": ("id", "recipe", "goal", "victim", "status", "seed_text", "perturbed_text", "score_before",
                 "score_after", "queries", "words_changed", "reason"),
    "predictions": ("id", "detector", "text", "label", "toxic_score", "pred_toxic", "det_status", "status", "reason"),
    "taebench": _BENCH,
    "taebench_plus": _BENCH,
    "stages": ("id", "goal", "recipes", "seed_text", "text", "kept", "reject_kind", "reject_reason"),
    "responses": ("id", "category", "context", "responses", "gen_error"),
    "scored": ("model", "category", "context", "response", "verdict", "unsafe_category", "utterance_score"),
    "triggers": ("id", "model", "list", "target", "search", "trigger", "hits", "reached", "objective", "status",
                 "reason"),
}


def first_columns(table: str, columns: list[str]) -> list[str]:
    """`columns` a table of that name shows at first (declared order); [] when none is declared."""
    declared = FIRST_COLUMNS.get(table) or FIRST_COLUMNS.get(table.split("/")[0]) or ()
    return [c for c in declared if c in columns]

