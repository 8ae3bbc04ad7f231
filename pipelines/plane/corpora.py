"""Read labelled corpora (CSV, JSONL/JSON, Parquet; local or s3://) into the corpus schema.

Built-in presets cover the formats our users have: Davidson's offensive tweets, Jigsaw's toxic
comments and DiaSafety. Every row keeps a stable id and its provenance; rows that cannot be scored
(empty, too long) are kept with status `rejected` and a reason, never dropped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, field_validator

from redline.cluster.config import Input, LabelValue, Result, Strict
from redline.cluster.tables import MIXED_KEY, STATUS_OK, STATUS_REJECTED, DataFile
from redline.errors import RedlineError
from redline.pipelines.plane.schema import CORPUS_SCHEMA


class CorpusConfig(Strict):
    """Where a labelled text corpus lives and how its columns map onto redline's corpus schema."""

    path: str = Input(description="Local path or s3:// URI of a CSV, JSONL/JSON or Parquet file.")
    format: Literal["auto", "csv", "jsonl", "json", "parquet"] = Result("auto")
    preset: Literal["davidson", "jigsaw", "diasafety"] | None = Result(
        None, description="Built-in column mapping for a known dataset format."
    )
    text_column: str | None = Result(None)
    label_column: str | Annotated[list[str], Field(min_length=1)] | None = Result(
        None, description="One label column, or several 0/1 columns (toxic if any is positive)."
    )
    context_column: str | None = Result(None)
    toxic_values: list[LabelValue] | None = Result(
        None, min_length=1, description="Values of the label column that mean toxic."
    )
    benign_values: list[LabelValue] | None = Result(
        None, min_length=1, description="Values that mean benign; when unset, every other value is benign."
    )
    label_names: dict[str, str] | None = Result(
        None, description="Readable names of raw label values, e.g. {0: hate, 1: offensive}."
    )
    dataset: str | None = Result(None, description="Dataset name in provenance; default: preset or file stem.")
    split: str = Result("test")
    limit: int | None = Result(None, gt=0, description="Score at most this many rows.")
    sample: Literal["random", "first"] = Result("random")
    seed: int = Result(0)
    encoding: str = Result("utf-8")
    encoding_errors: Literal["strict", "replace"] = Result(
        "strict", description="strict: stop at the first undecodable byte; replace: substitute U+FFFD."
    )
    max_chars: int = Result(20_000, gt=0, description="Longer texts are kept but rejected with a reason.")
    max_field_mb: int = Result(16, gt=0, le=2048, description="CSV: the longest value (in MB) the reader takes.")

    @field_validator("label_names", mode="before")
    @classmethod
    def _stringify_keys(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): str(v) for k, v in value.items()}
        return value


JIGSAW_LABELS = ["toxic", "severe_toxic", "obscene", "threat", "insult", "identity_hate"]

PRESETS: dict[str, dict[str, Any]] = {
    "davidson": {
        "text_column": "tweet",
        "label_column": "class",
        "toxic_values": [0, 1],
        "benign_values": [2],
        "label_names": {"0": "hate", "1": "offensive", "2": "neither"},
    },
    "jigsaw": {"text_column": "comment_text", "label_column": JIGSAW_LABELS},
    "diasafety": {
        "text_column": "response",
        "context_column": "context",
        "label_column": "label",
        "toxic_values": ["Unsafe"],
        "benign_values": ["Safe"],
    },
}


def effective(config: CorpusConfig) -> CorpusConfig:
    """The config with its preset's mapping filled in where the user left fields unset."""
    if not config.preset:
        return config
    given = config.model_dump(exclude_unset=True)
    return CorpusConfig.model_validate({**PRESETS[config.preset], **given})


def data_file(config: CorpusConfig) -> DataFile:
    return DataFile(config.path, config.format, config.encoding, config.encoding_errors, "corpus", config.max_field_mb)


def read_raw(config: CorpusConfig) -> pa.Table:
    """The file as an Arrow table with its own column names."""
    return data_file(config).read()


def _value_key(value: Any) -> str | None:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip().lower()


def _require_columns(raw: pa.Table, config: CorpusConfig, names: list[str]) -> None:
    missing = [n for n in names if n not in raw.column_names]
    if missing:
        hint = f" (preset '{config.preset}')" if config.preset else ""
        raise RedlineError(
            f"{config.path}: no column {', '.join(repr(m) for m in missing)}{hint}; "
            f"columns are: {', '.join(raw.column_names) or '(none)'}"
        )


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _is_scalar(t: pa.DataType) -> bool:
    return _is_text(t) or pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def check_column_types(raw: pa.Table, config: CorpusConfig) -> None:
    """Every column a role reads holds the type that role needs: texts and contexts are text, a label
    is one scalar per row (several label columns: numbers), and no column mixes types (JSON rows
    whose values differ in type). Otherwise one line naming the column, the type found and a row."""
    roles: list[tuple[str, str, Any, str]] = [(config.text_column, "text_column", _is_text, "text")]  # type: ignore[list-item]
    if config.context_column:
        roles.append((config.context_column, "context_column", _is_text, "text"))
    if isinstance(config.label_column, list):
        roles += [(c, "label_column", _is_number, "0/1 numbers") for c in config.label_column]
    elif config.label_column is not None:
        roles.append((config.label_column, "label_column", _is_scalar, "one text, number or boolean per row"))
    mixed = set((raw.schema.metadata or {}).get(MIXED_KEY, b"").decode().split(",")) - {""}
    for column, setting, ok, expected in roles:
        values = raw.column(column)
        nonnull = values.drop_null()
        if column in mixed:
            found = "values of mixed types"
        elif pa.types.is_null(values.type) or not len(nonnull):
            found = "no values (every row is empty)"
        elif not ok(values.type):
            found = f"{values.type} values"
        else:
            continue
        example = nonnull[0].as_py() if len(nonnull) else None
        row = next((i for i, v in enumerate(values.to_pylist()) if v is not None), None) if len(nonnull) else None
        shown = "" if row is None else f" (row {row}: {str(example)[:60]!r})"
        raise RedlineError(f"{config.path}: column '{column}' ({setting}) holds {found}{shown}, not {expected}; "
                           f"point corpus.{setting} at the right column")


def _labels(raw: pa.Table, config: CorpusConfig) -> tuple[pa.Array, pa.Array]:
    """Each row's label (1 toxic / 0 benign / null) and its source name, worked out once per distinct
    value (or combination of label columns), not once per row."""
    n = raw.num_rows
    if config.label_column is None:
        return pa.nulls(n, pa.int8()), pa.nulls(n, pa.string())
    if isinstance(config.label_column, list):
        # Several 0/1 columns (Jigsaw): toxic if any is positive; -1 marks an unlabelled row.
        columns = config.label_column
        unlabelled = pa.array([False] * n)
        combo = pa.array([0] * n, pa.int64())
        for bit, c in enumerate(columns):
            values = raw.column(c).combine_chunks().cast(pa.float64())
            unlabelled = pc.or_(unlabelled, pc.fill_null(pc.equal(values, -1.0), True))
            positive = pc.fill_null(pc.greater_equal(values, 0.5), False).cast(pa.int64())
            combo = pc.add(combo, pc.multiply(positive, 1 << bit))
        combo = pc.if_else(unlabelled, pa.scalar(None, pa.int64()), combo)
        keys = pc.unique(combo)
        label_of = [None if k is None else int(k > 0) for k in keys.to_pylist()]
        name_of = [None if k is None else (",".join(c for b, c in enumerate(columns) if k >> b & 1) or "none")
                   for k in keys.to_pylist()]
    else:
        toxic = {_value_key(v) for v in (config.toxic_values or [])}
        benign = {_value_key(v) for v in config.benign_values} if config.benign_values is not None else None
        if not toxic:
            raise RedlineError(f"{config.path}: set corpus.toxic_values (which values of '{config.label_column}' "
                               "mean toxic)")
        display = {str(k).strip().lower(): v for k, v in (config.label_names or {}).items()}
        combo = raw.column(config.label_column).combine_chunks()
        keys = pc.unique(combo)
        label_of, name_of = [], []
        for value in keys.to_pylist():
            key = _value_key(value)
            label_of.append(None if key is None else 1 if key in toxic else 0 if benign is None or key in benign
                            else None)
            name_of.append(None if key is None else display.get(key, str(value)))
    at = pc.index_in(combo, value_set=keys, skip_nulls=False)
    return pa.array(label_of, pa.int8()).take(at), pa.array(name_of, pa.string()).take(at)


def sample_indices(n: int, config: CorpusConfig) -> np.ndarray:
    if not config.limit or config.limit >= n:
        return np.arange(n)
    if config.sample == "first":
        return np.arange(config.limit)
    rng = np.random.default_rng(config.seed)
    return np.sort(rng.choice(n, size=config.limit, replace=False))


CHUNK_ROWS = 65_536  # rows a corpus is read and normalised in at a time: memory stays flat whatever its size


def read_corpus(config: CorpusConfig) -> pa.Table:
    """Read one corpus and normalise it to CORPUS_SCHEMA (the chunks of `iter_corpus`, together)."""
    return pa.concat_tables(iter_corpus(config))


def iter_corpus(config: CorpusConfig, chunk_rows: int = CHUNK_ROWS) -> Iterator[pa.Table]:
    """One corpus normalised to CORPUS_SCHEMA, chunk by chunk as the file is read (CSV and Parquet
    stream in bounded memory; JSON is read whole): the same rows, ids and errors as reading it whole.
    A random `limit` sample reads the file twice (first to count its rows)."""
    config = effective(config)
    source = data_file(config)
    keep = None
    if config.limit and config.sample != "first":
        n = sum(t.num_rows for t in source.stream(chunk_rows)) if source.streamable() else None
        keep = sample_indices(n, config) if n is not None else None
    offset, taken = 0, 0
    for raw in source.stream(chunk_rows):
        if offset == 0:
            _check_columns(raw, config)
        start, offset = offset, offset + raw.num_rows
        if raw.num_rows == 0:
            continue
        check_column_types(raw, config)
        if keep is None and config.limit and config.sample != "first" and not source.streamable():
            keep = sample_indices(raw.num_rows, config)  # read whole: the one chunk is the file
        if keep is not None:
            rows = keep[(keep >= start) & (keep < offset)]
        else:
            rows = np.arange(start, min(offset, start + config.limit - taken) if config.limit else offset)
        taken += len(rows)
        if len(rows):
            yield _normalised(raw.take(pa.array(rows - start)), config, rows)
        if config.limit and config.sample == "first" and taken >= config.limit:
            return
    if offset == 0:
        raise RedlineError(f"{config.path}: the corpus has no rows")


def corpus_rows(config: CorpusConfig) -> int:
    """How many rows `iter_corpus(config)` yields: the file's rows (a Parquet footer, else the file read
    once, in bounded memory where it streams), at most its `limit`."""
    n = data_file(effective(config)).count_rows()
    return min(n, config.limit) if config.limit else n


def _check_columns(raw: pa.Table, config: CorpusConfig) -> None:
    if config.text_column is None:
        raise RedlineError(f"{config.path}: set corpus.text_column (or a preset); columns are: {', '.join(raw.column_names)}")
    needed = [config.text_column]
    if config.label_column is not None:
        needed += config.label_column if isinstance(config.label_column, list) else [config.label_column]
    if config.context_column:
        needed.append(config.context_column)
    _require_columns(raw, config, needed)


def dataset_name(config: CorpusConfig) -> str:
    config = effective(config)
    return config.dataset or config.preset or Path(config.path.rstrip("/")).stem


def _normalised(raw: pa.Table, config: CorpusConfig, keep: np.ndarray) -> pa.Table:
    """The rows of `raw` (the file's rows `keep`) in CORPUS_SCHEMA."""
    n = len(keep)
    labels, label_names = _labels(raw, config)
    texts = raw.column(config.text_column).combine_chunks().cast(pa.string())
    empty = pc.fill_null(pc.equal(pc.utf8_trim_whitespace(texts), ""), True)
    too_long = pc.fill_null(pc.greater(pc.utf8_length(texts), config.max_chars), False)
    status = pc.if_else(pc.or_(empty, too_long), STATUS_REJECTED, STATUS_OK)
    reason = pc.if_else(empty, "empty text", pc.if_else(
        too_long, f"text longer than corpus.max_chars={config.max_chars}", pa.scalar(None, pa.string())))
    contexts = (raw.column(config.context_column).combine_chunks().cast(pa.string()) if config.context_column
                else pa.nulls(n, pa.string()))
    dataset = dataset_name(config)
    rows = pa.array(keep, pa.int64())
    return pa.table(
        {
            "id": pc.binary_join_element_wise(f"{dataset}/{config.split}/", rows.cast(pa.string()), ""),
            "text": texts,
            "context": contexts,
            "label": labels,
            "label_name": label_names,
            "dataset": pa.repeat(pa.scalar(dataset), n),
            "split": pa.repeat(pa.scalar(config.split), n),
            "source": pa.repeat(pa.scalar(config.path), n),
            "source_row": rows,
            "status": status,
            "reason": reason,
        },
        schema=CORPUS_SCHEMA,
    )


def distinct(configs: list[CorpusConfig]) -> None:
    keys = [(dataset_name(c), c.split) for c in configs]
    if len(set(keys)) != len(keys):
        raise RedlineError("two corpora share the same dataset and split; give each a distinct `dataset` or `split`")


def iter_corpora(configs: list[CorpusConfig], chunk_rows: int = CHUNK_ROWS) -> Iterator[pa.Table]:
    """Every corpus's chunks in turn (`iter_corpus`); ids stay distinct across corpora."""
    distinct(configs)
    for config in configs:
        yield from iter_corpus(config, chunk_rows)


def read_corpora(configs: list[CorpusConfig]) -> pa.Table:
    return pa.concat_tables(iter_corpora(configs))


ROW_BYTES_GUESS = 100  # a short text and its label in a CSV or JSONL line (a tweet: 80-160 bytes)


def guess_rows(configs: list[CorpusConfig]) -> int | None:
    """About how many rows the corpora hold, told from their local files' sizes and their limits before
    a row is read, for planning only (how many shards an actor takes at once); None where a file is not
    on this machine's disk (an s3:// corpus, or one only the workers see)."""
    total = 0
    for c in configs:
        path = Path(c.path).expanduser()
        if c.path.startswith("s3://") or not path.is_file():
            return None
        rows = -(-path.stat().st_size // ROW_BYTES_GUESS)
        total += min(rows, c.limit) if c.limit else rows
    return total
