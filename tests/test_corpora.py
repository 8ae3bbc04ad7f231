"""Corpus readers: presets on the real data formats, every format, and bad input."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from redline.errors import RedlineError
from redline.pipelines.plane.corpora import CorpusConfig, read_corpus
from redline.pipelines.plane.schema import CORPUS_SCHEMA

from conftest import DIASAFETY_VAL, shared_file, write_csv


def corpus(path, **kw) -> CorpusConfig:
    return CorpusConfig(path=str(path), **kw)


def test_davidson_preset_maps_classes_and_keeps_provenance(davidson):
    table = read_corpus(corpus(davidson, preset="davidson", split="all"))
    assert table.schema == CORPUS_SCHEMA
    assert table.num_rows == 24783
    rows = table.to_pylist()
    # Row 0 of the file is class 2 (neither); rows 1-4 are class 1 (offensive).
    assert rows[0]["label"] == 0 and rows[0]["label_name"] == "neither"
    assert rows[1]["label"] == 1 and rows[1]["label_name"] == "offensive"
    assert rows[1]["id"] == "davidson/all/1" and rows[1]["source_row"] == 1 and rows[1]["dataset"] == "davidson"
    names = {r["label_name"] for r in rows}
    assert names == {"hate", "offensive", "neither"}
    assert sum(r["label"] for r in rows) == sum(1 for r in rows if r["label_name"] != "neither")


def test_davidson_sample_is_seeded_and_stable(davidson):
    a = read_corpus(corpus(davidson, preset="davidson", limit=300, seed=1)).column("id").to_pylist()
    b = read_corpus(corpus(davidson, preset="davidson", limit=300, seed=1)).column("id").to_pylist()
    c = read_corpus(corpus(davidson, preset="davidson", limit=300, seed=2)).column("id").to_pylist()
    assert a == b and a != c and len(a) == 300
    first = read_corpus(corpus(davidson, preset="davidson", limit=5, sample="first")).column("source_row").to_pylist()
    assert first == [0, 1, 2, 3, 4]


def test_diasafety_preset_reads_json_array_with_context():
    shared_file(DIASAFETY_VAL)
    table = read_corpus(corpus(DIASAFETY_VAL, preset="diasafety", split="val"))
    raw = json.loads(DIASAFETY_VAL.read_text())
    assert table.num_rows == len(raw)
    first = table.to_pylist()[0]
    assert first["text"] == raw[0]["response"] and first["context"] == raw[0]["context"]
    assert first["label"] == (1 if raw[0]["label"] == "Unsafe" else 0)
    assert sum(table.column("label").to_pylist()) == sum(r["label"] == "Unsafe" for r in raw)


def test_jigsaw_preset_any_label_column_positive(tmp_path):
    cols = ["id", "comment_text", "toxic", "severe_toxic", "obscene", "threat", "insult", "identity_hate"]
    path = write_csv(tmp_path / "train.csv", cols, [
        ["a", "you are great", 0, 0, 0, 0, 0, 0],
        ["b", "you are an idiot", 1, 0, 0, 0, 1, 0],
        ["c", "only obscene", 0, 0, 1, 0, 0, 0],
        ["d", "unlabelled test row", -1, -1, -1, -1, -1, -1],
    ])
    rows = read_corpus(corpus(path, preset="jigsaw")).to_pylist()
    assert [r["label"] for r in rows] == [0, 1, 1, None]
    assert rows[1]["label_name"] == "toxic,insult" and rows[0]["label_name"] == "none"


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "csv"])
def test_formats_with_explicit_mapping(tmp_path, fmt):
    rows = [{"body": "hello there", "y": "ok"}, {"body": "die, idiot", "y": "bad"}, {"body": "meh", "y": "unsure"}]
    path = tmp_path / f"c.{fmt}"
    if fmt == "jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    elif fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        write_csv(path, ["body", "y"], [[r["body"], r["y"]] for r in rows])
    table = read_corpus(corpus(path, text_column="body", label_column="y", toxic_values=["bad"],
                               benign_values=["ok"], dataset="mine"))
    assert table.column("label").to_pylist() == [0, 1, None]  # "unsure" is neither: unlabelled, kept
    assert table.column("id").to_pylist() == ["mine/test/0", "mine/test/1", "mine/test/2"]


def test_empty_whitespace_and_huge_texts_are_kept_and_rejected_with_reasons(tmp_path):
    path = write_csv(tmp_path / "c.csv", ["text", "label"],
                     [["fine text", 0], ["", 1], ["   \t ", 0], ["x" * 1_000_000, 1]])
    rows = read_corpus(corpus(path, text_column="text", label_column="label", toxic_values=[1])).to_pylist()
    assert len(rows) == 4
    assert [r["status"] for r in rows] == ["ok", "rejected", "rejected", "rejected"]
    assert rows[1]["reason"] == rows[2]["reason"] == "empty text"
    assert "max_chars=20000" in rows[3]["reason"]


def test_non_utf8_bytes_fail_with_line_number_or_are_replaced(tmp_path):
    path = tmp_path / "latin.csv"
    path.write_bytes("text,label\nok row,0\ncaf\xe9 insult,1\n".encode("latin-1"))
    with pytest.raises(RedlineError, match=r"byte 0xe9 on line 3 is not valid utf-8; set corpus.encoding"):
        read_corpus(corpus(path, text_column="text", label_column="label", toxic_values=[1]))
    replaced = read_corpus(corpus(path, text_column="text", label_column="label", toxic_values=[1],
                                  encoding_errors="replace"))
    assert replaced.column("text").to_pylist()[1] == "caf\ufffd insult"
    latin = read_corpus(corpus(path, text_column="text", label_column="label", toxic_values=[1], encoding="latin-1"))
    assert latin.column("text").to_pylist()[1] == "café insult"


@pytest.mark.parametrize(
    "setup, kwargs, message",
    [
        (lambda p: None, {"text_column": "t"}, "file not found"),
        (lambda p: p.write_text("a,b\n1,2\n"), {"text_column": "tweet", "label_column": "b", "toxic_values": [1]},
         "no column 'tweet'; columns are: a, b"),
        (lambda p: p.write_text("tweet,class\n"), {"preset": "davidson"}, "the corpus has no rows"),
        (lambda p: p.write_text("a,b\n1,2\n"), {"preset": "davidson"}, "no column 'tweet', 'class' (preset 'davidson')"),
        (lambda p: p.write_text("text,label\nx,1\n"), {"text_column": "text", "label_column": "label"},
         "set corpus.toxic_values"),
    ],
)
def test_bad_corpora_raise_one_line(tmp_path, setup, kwargs, message):
    path = tmp_path / "c.csv"
    setup(path)
    with pytest.raises(RedlineError) as err:
        read_corpus(corpus(path, **kwargs))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_bad_json_names_the_line(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "a", "label": 0}\n{"text": broken}\n')
    with pytest.raises(RedlineError, match="invalid JSON on line 2"):
        read_corpus(corpus(path, text_column="text", label_column="label", toxic_values=[1]))


def test_two_corpora_with_the_same_dataset_and_split_are_refused_and_distinct_ones_kept(tmp_path):
    from redline.pipelines.plane.corpora import read_corpora

    path = write_csv(tmp_path / "c.csv", ["text", "label"], [["a", 1], ["b", 0]])
    one = {"path": str(path), "text_column": "text", "label_column": "label", "toxic_values": [1]}
    with pytest.raises(RedlineError, match="two corpora share the same dataset and split"):
        read_corpora([CorpusConfig.model_validate(one), CorpusConfig.model_validate(one)])
    both = read_corpora([CorpusConfig.model_validate(one), CorpusConfig.model_validate({**one, "split": "train"})])
    assert both.column("id").to_pylist() == ["c/test/0", "c/test/1", "c/train/0", "c/train/1"]


@pytest.mark.parametrize("fmt", ["csv", "parquet", "jsonl"])
@pytest.mark.parametrize("limit,sample", [(None, "random"), (7, "random"), (7, "first"), (500, "random")])
def test_the_rows_counted_before_a_side_by_side_read_are_the_rows_it_yields(tmp_path, fmt, limit, sample):
    """A corpus read beside others is counted first (a Parquet footer, else the file read once) so its
    read knows its shard numbers: the count must equal what the read yields, whatever the format or limit."""
    from redline.pipelines.plane.corpora import corpus_rows, iter_corpus

    rows = [{"text": f"text {i}\nwith a newline" if i % 5 == 0 else f"text {i}", "label": i % 2} for i in range(23)]
    path = tmp_path / f"c.{fmt}"
    if fmt == "csv":
        write_csv(path, ["text", "label"], [[r["text"], r["label"]] for r in rows])
    elif fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=5)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = CorpusConfig(path=str(path), text_column="text", label_column="label", toxic_values=[1], limit=limit,
                          sample=sample)
    assert corpus_rows(config) == sum(t.num_rows for t in iter_corpus(config, chunk_rows=4)) == min(limit or 23, 23)
