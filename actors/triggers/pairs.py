"""Dialogue pairs from any corpus: a table with an input and a response column (CSV, JSON/JSONL,
Parquet; local or s3://), or a dialogue file with one utterance per line."""

from __future__ import annotations

import random
from typing import Literal

from redline.cluster.config import Input, Result, Strict
from redline.cluster.tables import DataFile
from redline.errors import RedlineError

Pair = tuple[str, str]


class PairCorpusConfig(Strict):
    """Dialogue pairs (input -> response) for the egregious-output models."""

    path: str = Input(description="CSV, JSONL/JSON or Parquet with an input and a response column, or a text file "
                                  "with one utterance per line (consecutive lines form pairs; blank lines end a dialogue).")
    format: Literal["auto", "csv", "jsonl", "json", "parquet", "dialogue"] = Result("auto")
    input_column: str = Result("context")
    output_column: str = Result("response")
    encoding: str = Result("utf-8")
    encoding_errors: Literal["strict", "replace"] = Result("strict")
    limit: int | None = Result(None, gt=0, description="Use at most this many pairs (seeded sample).")


def read_pairs(config: PairCorpusConfig, seed: int = 0) -> list[Pair]:
    source = DataFile(config.path, "auto" if config.format == "dialogue" else config.format, config.encoding,
                      config.encoding_errors, "pairs")
    if config.format == "dialogue" or (config.format == "auto" and config.path.split("?")[0].endswith(".txt")):
        pairs = dialogue_pairs(source.read_text())
    else:
        table = source.read()
        missing = [c for c in (config.input_column, config.output_column) if c not in table.column_names]
        if missing:
            raise RedlineError(f"{config.path}: no column {', '.join(map(repr, missing))} "
                               f"(columns: {', '.join(table.column_names)}); set input_column / output_column")
        pairs = [(str(a), str(b)) for a, b in zip(table.column(config.input_column).to_pylist(),
                                                  table.column(config.output_column).to_pylist())
                 if a is not None and b is not None and str(a).strip() and str(b).strip()]
    if not pairs:
        raise RedlineError(f"{config.path}: no dialogue pairs (empty file, or every row lacks an input or a response)")
    if config.limit is not None and len(pairs) > config.limit:
        pairs = random.Random(seed).sample(pairs, config.limit)
    return pairs


def dialogue_pairs(text: str) -> list[Pair]:
    """Consecutive non-blank lines form pairs (line i -> line i+1); a blank line ends a dialogue."""
    pairs: list[Pair] = []
    previous: str | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line:
            previous = None
            continue
        if previous is not None:
            pairs.append((previous, line))
        previous = line
    return pairs


def split(pairs: list[Pair], test_fraction: float, seed: int) -> tuple[list[Pair], list[Pair]]:
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    n_test = max(1, int(len(pairs) * test_fraction)) if len(pairs) > 1 else 0
    test = {i for i in order[:n_test]}
    return [p for i, p in enumerate(pairs) if i not in test], [p for i, p in enumerate(pairs) if i in test]
