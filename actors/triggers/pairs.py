"""Dialogue pairs from any corpus: a table with an input and a response column (CSV, JSON/JSONL,
Parquet; local or s3://), or a dialogue file with one utterance per line."""

from __future__ import annotations

import random

from redline.cluster import storage
from redline.cluster.config import CorpusConfig, PairCorpusConfig
from redline.errors import RedlineError
from redline.pipelines.corpora import _decode, read_raw

Pair = tuple[str, str]


def read_pairs(config: PairCorpusConfig, seed: int = 0) -> list[Pair]:
    corpus = CorpusConfig(path=config.path, format="auto" if config.format == "dialogue" else config.format,
                          encoding=config.encoding, encoding_errors=config.encoding_errors)
    if config.format == "dialogue" or (config.format == "auto" and config.path.split("?")[0].endswith(".txt")):
        pairs = dialogue_pairs(_decode(storage.read_bytes(config.path), corpus))
    else:
        table = read_raw(corpus)
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
