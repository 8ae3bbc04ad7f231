"""The viewer's run tables read in this process: which files make a table, in which order tables are
listed, how shards join, what a broken file says, and the cache of recent tables (view/rows.py)."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from redline.errors import RedlineError
from redline.view import rows as R


def write(path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


@pytest.fixture
def run(tmp_path):
    root = tmp_path / "runs"
    d = root / "score-abc"
    write(d / "predictions" / "part-00000.parquet", pa.table({"id": ["a", "b"], "score": [0.1, 0.2]}))
    write(d / "predictions" / "part-00001.parquet", pa.table({"id": ["c"], "score": [0.3], "extra": ["x"]}))
    write(d / "input" / "part-00000.parquet", pa.table({"id": ["a"]}))
    write(d / "stages" / "4-label.parquet", pa.table({"id": ["a"]}))
    write(d / "summary.parquet", pa.table({"n": [3]}))
    write(d / "zeta.parquet", pa.table({"n": [1]}))
    write(d / ".staging" / "part-00002.parquet", pa.table({"id": ["z"]}))  # a shard not yet committed
    (d / "report.md").write_text("# report")
    (d / "notes.parquet.txt").write_text("not a table")
    (d / "linked.parquet").symlink_to(d / "summary.parquet")  # never followed
    return str(root), "score-abc"


def test_tables_are_grouped_and_listed_results_first(run):
    root, run_id = run
    refs = R.tables(root, run_id)
    assert [r.name for r in refs] == ["predictions", "stages/4-label", "summary", "zeta", "input"]
    predictions = refs[0]
    assert [f[0] for f in predictions.files] == ["predictions/part-00000.parquet", "predictions/part-00001.parquet"]
    assert all(size > 0 and mtime > 0 for _, size, mtime in predictions.files)
    assert refs[1].files[0][0] == "stages/4-label.parquet"


def test_shards_are_joined_with_their_columns_promoted(run):
    table = R.read_table(R.tables(*run)[0])
    assert table.column("id").to_pylist() == ["a", "b", "c"]
    assert table.column("extra").to_pylist() == [None, None, "x"]  # a column only later shards have


def test_broken_and_disagreeing_shards_are_one_line_errors(run, tmp_path):
    root, run_id = run
    d = tmp_path / "runs" / run_id
    (d / "summary.parquet").write_bytes(b"not parquet at all")
    summary = next(r for r in R.tables(root, run_id) if r.name == "summary")
    with pytest.raises(RedlineError, match=r"summary.parquet is not a readable Parquet file \(.+\)$"):
        R.read_table(summary)
    write(d / "mixed" / "part-00000.parquet", pa.table({"v": [1]}))
    write(d / "mixed" / "part-00001.parquet", pa.table({"v": ["one"]}))
    mixed = next(r for r in R.tables(root, run_id) if r.name == "mixed")
    with pytest.raises(RedlineError, match=r"^the shards of mixed disagree on their columns \(.+\)$"):
        R.read_table(mixed)
    with pytest.raises(RedlineError, match="^table empty has no files$"):
        R.read_table(R.TableRef("empty", root, run_id, ()))


def test_the_cache_keeps_the_latest_tables_and_sees_new_shards(run, tmp_path):
    root, run_id = run
    cache = R.TableCache(size=2)
    predictions, stages, summary = R.tables(root, run_id)[:3]
    first = cache.get(predictions)
    assert cache.get(predictions) is first  # paging does not re-read
    cache.get(stages)
    cache.get(predictions)  # used again: now the most recent
    cache.get(summary)  # over the size: the least recently used (stages) goes
    assert cache.get(predictions) is first and list(cache._items) == [summary, predictions]
    facets = cache.facets(predictions)
    assert cache.facets(predictions) is facets
    write(tmp_path / "runs" / run_id / "predictions" / "part-00003.parquet", pa.table({"id": ["d"], "score": [0.4]}))
    newer = R.tables(root, run_id)[0]
    assert newer != predictions and cache.get(newer).num_rows == 4
    assert set(cache._facets) <= set(cache._items)  # filters of tables no longer cached are dropped
    cache.facets(newer)
    assert set(cache._facets) <= set(cache._items) and newer in cache._facets


def test_tables_of_a_run_on_s3(s3_env, run):
    from redline.cluster import artifacts, storage

    root, run_id = run
    artifacts.s3_client().create_bucket(Bucket="viewrows")
    for folder, _, names in os.walk(os.path.join(root, run_id)):
        for name in names:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                rel = os.path.relpath(path, root)
                storage.write_bytes(f"s3://viewrows/runs/{rel}", open(path, "rb").read())
    refs = R.tables("s3://viewrows/runs", run_id)
    assert [r.name for r in refs] == ["predictions", "stages/4-label", "summary", "zeta", "input"]
    assert R.read_table(refs[0]).num_rows == 3 and all(f[1] > 0 and f[2] > 0 for f in refs[0].files)
