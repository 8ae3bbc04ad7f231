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
    source = R.open_table(R.tables(*run)[0])
    assert source.num_rows == 3 and source.column_names == ["id", "score", "extra"]
    assert [r["id"] for r in source.rows([0, 1, 2])] == ["a", "b", "c"]
    assert [r["extra"] for r in source.rows([2, 0, 1])] == ["x", None, None]  # a column only later shards have


def test_broken_and_disagreeing_shards_are_one_line_errors(run, tmp_path):
    root, run_id = run
    d = tmp_path / "runs" / run_id
    (d / "summary.parquet").write_bytes(b"not parquet at all")
    summary = next(r for r in R.tables(root, run_id) if r.name == "summary")
    with pytest.raises(RedlineError, match=r"summary.parquet is not a readable Parquet file \(.+\)$"):
        R.open_table(summary)
    write(d / "mixed" / "part-00000.parquet", pa.table({"v": [1]}))
    write(d / "mixed" / "part-00001.parquet", pa.table({"v": ["one"]}))
    mixed = next(r for r in R.tables(root, run_id) if r.name == "mixed")
    with pytest.raises(RedlineError, match=r"^the shards of mixed disagree on their columns \(.+\)$"):
        R.open_table(mixed)
    with pytest.raises(RedlineError, match="^table empty has no files$"):
        R.open_table(R.TableRef("empty", root, run_id, ()))


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
    source = R.open_table(refs[0])
    assert source.num_rows == 3 and [r["id"] for r in source.rows([2, 0])] == ["c", "a"]
    assert all(f[1] > 0 and f[2] > 0 for f in refs[0].files)
    page = R.query(source, {}, "-score", 1, 2)
    assert [r["id"] for r in page.rows] == ["c", "b"] and page.total == 3


def _shards(tmp_path, rows: list[dict], size: int):
    """A table written as shards of `size` rows (some shards lacking the `note` column) and its ref."""
    root = tmp_path / "runs"
    for i in range(0, len(rows), size):
        part = rows[i:i + size]
        table = pa.Table.from_pylist(part)
        if i // size % 2:
            table = table.drop_columns(["note"])
        write(root / "big" / "attempts" / f"part-{i // size:05d}.parquet", table)
    return R.tables(str(root), "big")[0]


def _reference(rows: list[dict], filters: dict, sort: str | None, search: str | None) -> list[dict]:
    """What a page should hold, worked out the plain way: filter, search, stable sort with nulls last."""
    def keep(r):
        for name, value in filters.items():
            v = r.get(name)
            if isinstance(v, list):
                if value not in v:
                    return False
            elif isinstance(v, bool):
                if v != (value == "true"):
                    return False
            elif v is None or str(v) != value:
                return False
        return not search or any(isinstance(v, str) and search.lower() in v.lower() for v in r.values())
    out = [r for r in rows if keep(r)]
    if sort:
        key, sign = sort.lstrip("-"), -1 if sort.startswith("-") else 1  # numbers: a stable sort either way
        present = sorted([r for r in out if r.get(key) is not None], key=lambda r: sign * r[key])
        out = present + [r for r in out if r.get(key) is None]
    return out


@pytest.mark.parametrize(("filters", "sort", "search"), [
    ({}, None, None), ({}, "-score", None), ({}, "score", None), ({"status": "failed"}, None, None),
    ({"status": "success", "tags": "b"}, "-score", None), ({"flag": "true"}, "queries", None),
    ({}, None, "WORD 7"), ({"status": "success"}, "-queries", "word"), ({"status": "nothing"}, "-score", None)])
def test_pages_read_by_scanning_the_shards_match_the_plain_answer(tmp_path, filters, sort, search):
    """Filters, the search and the sort scan only their columns shard by shard, the sort keeps only the
    best rows up to the page; every page (the last one too, and one past it) is what a whole-table
    filter and stable sort (nulls last) gives."""
    rows = [{"id": f"r{i}", "status": ["success", "failed", "skipped"][i % 3], "tags": [["a"], ["a", "b"], []][i % 3],
             "flag": i % 4 == 0, "score": None if i % 7 == 0 else round((i * 37 % 101) / 100, 2),
             "queries": i % 5, "text": f"word {i}", "note": f"n{i}"} for i in range(230)]
    ref = _shards(tmp_path, rows, 40)
    source = R.open_table(ref)
    expected = _reference([{**r, "note": r["note"] if (int(r["id"][1:]) // 40) % 2 == 0 else None} for r in rows],
                          filters, sort, search)
    per_page = 17
    pages = max(1, -(-len(expected) // per_page))
    for page in (1, 2, pages, pages + 3):
        got = R.query(source, filters, sort, page, per_page, search)
        shown = min(page, pages)
        assert got.total == len(expected) and got.page == shown and got.pages == pages and got.all_rows == 230
        assert [r["id"] for r in got.rows] == [r["id"] for r in expected[(shown - 1) * per_page:shown * per_page]]
        assert all(r["note"] is None or r["note"] == f"n{r['id'][1:]}" for r in got.rows)


def test_a_column_scanned_once_is_served_from_memory_until_the_table_changes(tmp_path, monkeypatch):
    from redline.view import scan

    rows = [{"id": f"r{i}", "status": "ok", "score": i / 100, "queries": i, "tags": ["x"], "flag": True,
             "text": "t", "note": "n"} for i in range(100)]
    ref = _shards(tmp_path, rows, 30)
    cache = R.TableCache()
    first = cache.query(ref, {}, "-score", 1, 5)

    def no_reading(*_):
        raise AssertionError("read a shard again")

    monkeypatch.setattr(scan.FilePiece, "batches", no_reading)
    again = R.query(cache.get(ref), {}, "-score", 2, 5)  # a new page, the same column: from memory
    assert [r["id"] for r in first.rows] == ["r99", "r98", "r97", "r96", "r95"]
    assert [r["id"] for r in again.rows] == ["r94", "r93", "r92", "r91", "r90"]
    with pytest.raises(AssertionError, match="read a shard again"):
        R.query(cache.get(ref), {}, "queries", 1, 5)  # another column is read from the shards
