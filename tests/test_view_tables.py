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
    from redline.pipelines.plane.table_index import write_index

    assert write_index(f"s3://viewrows/runs/{run_id}", "predictions") == 2  # as the pipeline's worker does
    indexed = R.tables("s3://viewrows/runs", run_id)[0]
    assert indexed.index is not None and indexed.index[0] == ".index/predictions.parquet"
    source = R.open_table(indexed)
    assert source.index is not None and source.num_rows == 3
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


def _reference(rows: list[dict], filters: dict, sort: str | None, search: str | None, ranges: dict | None = None
               ) -> list[dict]:
    """What a page should hold, worked out the plain way: filter, range, search, stable sort with NaN
    and then nulls last."""
    def missing(v):
        return v is None or v != v

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
        for name, (least, greatest) in (ranges or {}).items():
            v = r.get(name)
            if missing(v) or (least is not None and v < least) or (greatest is not None and v > greatest):
                return False
        return not search or any(isinstance(v, str) and search.lower() in v.lower() for v in r.values())
    out = [r for r in rows if keep(r)]
    if sort:
        key, sign = sort.lstrip("-"), -1 if sort.startswith("-") else 1  # numbers: a stable sort either way
        present = sorted([r for r in out if not missing(r.get(key))], key=lambda r: sign * r[key])
        nan = [r for r in out if missing(r.get(key)) and r.get(key) is not None]
        out = present + nan + [r for r in out if r.get(key) is None]  # NaN, then nulls (as pyarrow sorts)
    return out


CASES = [({}, None, None, None), ({}, "-score", None, None), ({}, "score", None, None),
         ({"status": "failed"}, None, None, None), ({"status": "success", "tags": "b"}, "-score", None, None),
         ({"flag": "true"}, "queries", None, None), ({}, None, "WORD 7", None),
         ({"status": "success"}, "-queries", "word", None), ({"status": "nothing"}, "-score", None, None),
         ({"status": "failed", "flag": "false"}, None, None, None), ({"status": "skipped", "flag": "true"}, "-ratio", None, None),
         ({}, "ratio", None, {"score": (0.2, 0.6)}), ({"status": "success"}, None, None, {"queries": (3, None)}),
         ({}, "-score", None, {"ratio": (None, 0.5)}), ({}, "-queries", None, {"score": (2.0, None)}),
         # a search a filter column's values hold, one none of them holds (the texts are searched still)
         ({}, None, "FAIL", None), ({"flag": "true"}, "-score", "kipp", None), ({}, "score", "ucc", None)]


def _rows(n: int) -> list[dict]:
    return [{"id": f"r{i}", "status": ["success", "failed", "skipped"][i % 3], "tags": [["a"], ["a", "b"], []][i % 3],
             "flag": i % 4 == 0, "score": None if i % 7 == 0 else round((i * 37 % 101) / 100, 2),
             "ratio": float("nan") if i % 11 == 0 else (i * 13 % 17) / 17 if i < 120 else None,
             "queries": i % 5, "text": f"word {i}", "note": f"n{i}"} for i in range(n)]


@pytest.mark.parametrize("indexed", [False, True], ids=["scanned", "indexed"])
@pytest.mark.parametrize(("filters", "sort", "search", "ranges"), CASES)
def test_pages_read_by_scanning_the_shards_match_the_plain_answer(tmp_path, filters, sort, search, ranges, indexed):
    """Filters, ranges, the search and the sort scan only their columns shard by shard (or, with the
    table's index, only the shards its figures cannot rule out), the sort keeps only the best rows up
    to the page; every page (the last one too, and one past it) is what a whole-table filter and
    stable sort (NaN, then nulls, last) gives."""
    from redline.pipelines.plane.table_index import write_index

    rows = _rows(230)
    ref = _shards(tmp_path, rows, 40)
    if indexed:
        assert write_index(str(tmp_path / "runs" / "big"), "attempts") == 6
        ref = R.tables(str(tmp_path / "runs"), "big")[0]
    source = R.open_table(ref)
    assert (source.index is not None) == indexed
    expected = _reference([{**r, "note": r["note"] if (int(r["id"][1:]) // 40) % 2 == 0 else None} for r in rows],
                          filters, sort, search, ranges)
    per_page = 17
    pages = max(1, -(-len(expected) // per_page))
    cache = R.TableCache()  # as the viewer asks: a search skips a filter column none of whose values holds it
    for page in (1, 2, pages, pages + 3):
        for got in (R.query(source, filters, sort, page, per_page, search, ranges),
                    cache.query(ref, filters, sort, page, per_page, search, ranges)):
            shown = min(page, pages)
            assert got.total == len(expected) and got.exact and got.page == shown and got.pages == pages
            assert got.all_rows == 230
            assert [r["id"] for r in got.rows] == [r["id"] for r in expected[(shown - 1) * per_page:shown * per_page]]
            assert all(r["note"] is None or r["note"] == f"n{r['id'][1:]}" for r in got.rows)
    if search:
        known = cache.known(ref)
        assert ("status" in R.searched_columns(source, search, known)) == any(
            search.lower() in v for v in ("success", "failed", "skipped"))


def test_an_indexed_table_opens_without_reading_a_shard_and_rules_shards_out(tmp_path, monkeypatch):
    """With its index, a table opens, offers its filters and pages from the index alone; a filter reads
    only the shards holding its value, a sort only those that can beat the page; a count past
    plan.COUNT_ROWS rows is a lower bound, said as such, with the page still right."""
    from redline.pipelines.plane.table_index import write_index
    from redline.view import plan, scan

    rows = [{"id": f"r{i}", "batch": f"b{i // 100}", "status": "rejected" if i % 50 == 0 else "ok",
             "score": i / 3000, "text": f"text {i}"} for i in range(3000)]
    ref = _shards(tmp_path, [{**r, "note": "n"} for r in rows], 100)
    write_index(str(tmp_path / "runs" / "big"), "attempts")
    ref = R.tables(str(tmp_path / "runs"), "big")[0]
    read: list[str] = []
    real_batches = scan.FilePiece.batches

    def counted(piece, columns):
        read.append(piece.parts[-1])
        return real_batches(piece, columns)

    def no_footer(*_):
        raise AssertionError("a shard's footer was read to open the table")

    monkeypatch.setattr(scan.FilePiece, "batches", counted)
    monkeypatch.setattr(scan.FilePiece, "open", no_footer)
    cache = R.TableCache()
    assert cache.facets(ref)["batch"] == sorted(f"b{i}" for i in range(30)) and cache.facets(ref)["status"] == ["ok", "rejected"]
    first = cache.query(ref, {}, None, 1, 10)
    assert [r["id"] for r in first.rows] == [f"r{i}" for i in range(10)] and read == []
    one = cache.query(ref, {"batch": "b7"}, None, 1, 10)
    assert one.total == 100 and [r["id"] for r in one.rows] == [f"r{i}" for i in range(700, 710)]
    assert read == []  # the other shards cannot hold b7, and every row of this one does
    both = cache.query(ref, {"batch": "b3", "status": "rejected"}, None, 1, 10)
    assert both.total == 2 and [r["id"] for r in both.rows] == ["r300", "r350"] and read == ["part-00003.parquet"]
    read.clear()
    top = cache.query(ref, {}, "-score", 1, 10)
    assert [r["id"] for r in top.rows] == [f"r{i}" for i in range(2999, 2989, -1)] and top.total == 3000
    assert "part-00029.parquet" in read and len(read) <= scan.READ_AHEAD + 1  # best bound first, then stopped
    monkeypatch.setattr(plan, "COUNT_ROWS", 150)
    found = cache.query(ref, {}, None, 1, 10, "TEXT 5")  # r5, r50..r59 in the first shard; 111 rows in all
    assert not found.exact and found.total == 11 and [r["id"] for r in found.rows] == [
        "r5", *[f"r{i}" for i in range(50, 59)]]
    from starlette.testclient import TestClient

    from redline.view.app import build_app

    (tmp_path / "runs" / "big" / "manifest.json").write_text('{"pipeline": "attack", "state": "complete"}')
    with TestClient(build_app(str(tmp_path / "runs")), base_url="http://127.0.0.1") as client:
        html = client.get("/run", params={"id": "big", "table": "attempts", "q": "text 5"}).text
    assert "at least" in html.split('id="row-count"')[1].split("</p>")[0]


def test_a_stale_index_is_never_used(tmp_path):
    """A shard added (a resumed run) or rewritten after the index was written: the table is read from
    its shards, every row counted."""
    from redline.pipelines.plane.table_index import write_index

    ref = _shards(tmp_path, [{"id": f"r{i}", "status": "ok", "note": "n"} for i in range(60)], 20)
    folder = tmp_path / "runs" / "big" / "attempts"
    write_index(str(tmp_path / "runs" / "big"), "attempts")
    write(folder / "part-00003.parquet", pa.table({"id": ["late"], "status": ["new"], "note": ["n"]}))
    ref = R.tables(str(tmp_path / "runs"), "big")[0]
    assert ref.index is not None
    source = R.open_table(ref)
    assert source.index is None and source.num_rows == 61
    assert R.query(source, {"status": "new"}, None, 1, 5).total == 1
    write_index(str(tmp_path / "runs" / "big"), "attempts")
    write(folder / "part-00000.parquet", pa.table({"id": ["only"], "status": ["ok"], "note": ["n"]}))
    ref = R.tables(str(tmp_path / "runs"), "big")[0]
    assert R.open_table(ref).index is None and R.open_table(ref).num_rows == 42


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


def test_export_streams_the_selected_rows_as_csv_and_json_lines(tmp_path, monkeypatch):
    import csv
    import io as _io
    import json

    from redline.view import scan

    monkeypatch.setattr(scan, "BATCH_ROWS", 25)

    rows = [{"id": f"r{i}", "status": ["success", "failed"][i % 2], "tags": [["a"], ["a", "b"], []][i % 3],
             "flag": i % 4 == 0, "score": i / 10, "queries": i, "text": "=HYPERLINK(1)" if i == 3 else f"word {i}",
             "note": f"n{i}"} for i in range(100)]
    source = R.open_table(_shards(tmp_path, rows, 30))
    want = [r for r in rows if r["status"] == "failed" and "b" in r["tags"]]
    chunks = list(R.export(source, {"status": "failed", "tags": "b"}, None, "csv"))
    assert len(chunks) == 4  # one per batch of 25 rows scanned, never the whole table at once
    got = list(csv.DictReader(_io.StringIO(b"".join(chunks).decode())))
    assert [g["id"] for g in got] == [r["id"] for r in want]
    assert got[0]["tags"] == '["a", "b"]' and got[0]["score"] == str(want[0]["score"])
    lines = [json.loads(line) for line in b"".join(R.export(source, {"flag": "true"}, "word", "jsonl")).splitlines()]
    assert [x["id"] for x in lines] == [r["id"] for r in rows if r["flag"] and r["text"].startswith("word")]
    assert lines[0]["tags"] == ["a"] and lines[0]["flag"] is True
    defused = list(csv.DictReader(_io.StringIO(b"".join(R.export(source, {}, "HYPERLINK", "csv")).decode())))
    assert [d["text"] for d in defused] == ["'=HYPERLINK(1)"]  # a spreadsheet would have run it
    nothing = b"".join(R.export(source, {"status": "nope"}, None, "csv")).decode()
    assert nothing.splitlines() == ['"id","status","tags","flag","score","queries","text","note"']
    with pytest.raises(RedlineError, match="export format must be one of csv, jsonl, not 'xlsx'"):
        R.export(source, {}, None, "xlsx")
    with pytest.raises(RedlineError, match="no column 'nope' to filter on"):
        R.export(source, {"nope": "x"}, None, "csv")


def test_number_ranges_column_picker_and_row_permalinks_in_the_app(tmp_path):
    """Over HTTP, on a run's shards: a number range selects its rows (ends included), the export takes
    the same rows, provenance columns start hidden and the picker chooses the columns (kept in the
    URL), and each row links to itself alone."""
    import json
    import re

    from starlette.testclient import TestClient

    from redline.view.app import build_app

    rows = [{"id": f"r{i}", "status": ["success", "failed"][i % 2], "tags": ["a"], "flag": True, "score": i / 10,
             "queries": i % 7, "text": f"word {i}", "note": f"n{i}", "source": "davidson.csv"} for i in range(100)]
    ref = _shards(tmp_path, rows, 30)
    (tmp_path / "runs" / "big" / "manifest.json").write_text(json.dumps({"pipeline": "attack", "state": "complete"}))
    with TestClient(build_app(ref.root), base_url="http://127.0.0.1:8765") as client:
        base = {"id": "big", "table": "attempts"}
        page = client.get("/run", params={**base, "min_queries": "2", "max_queries": "3", "f_status": "success"}).text
        want = [r["id"] for r in rows if 2 <= r["queries"] <= 3 and r["status"] == "success"]
        assert f"{len(want)} of 100 rows" in page
        header = re.search(r"<thead>(.*?)</thead>", page, re.S).group(1)
        # an attempts table shows the attack's own first columns (pipelines/plane/schema.py FIRST_COLUMNS), in order
        assert re.findall(r">([a-z_]+)</a>", header) == ["id", "status", "queries"] and ">source<" not in header
        assert 'name="col" value="source" >' in page and 'name="min_queries" value="2"' in page
        export = client.get("/export", params={**base, "min_queries": "2", "max_queries": "3", "f_status": "success",
                                               "format": "jsonl"})
        assert [json.loads(line)["id"] for line in export.text.splitlines()] == want
        picked = client.get("/run", params=[*base.items(), ("cols", "1"), ("col", "id"), ("col", "source")]).text
        header = re.search(r"<thead>(.*?)</thead>", picked, re.S).group(1)
        assert re.findall(r">([a-z_]+)</a>", header) == ["id", "source"]
        assert "col=source" in re.search(r'href="([^"]*sort=id[^"]*)"', picked).group(1)  # sorting keeps the pick
        first = re.search(r'class="permalink" href="([^"]+)#rows"', page).group(1).replace("&amp;", "&")
        alone = client.get(first).text
        assert "1 of 100 rows" in alone and f"f_id={want[0]}" in first
        # a row's permalink keeps the columns chosen (issue 53 item 8: the choice was lost in row links)
        kept = re.search(r'class="permalink" href="([^"]+)#rows"', picked).group(1).replace("&amp;", "&")
        header = re.search(r"<thead>(.*?)</thead>", client.get(kept).text, re.S).group(1)
        assert "col=source" in kept and re.findall(r">([a-z_]+)</a>", header) == ["id", "source"]
        bad = client.get("/run", params={**base, "min_queries": "two"}).text
        assert "min_queries must be a number, not &#39;two&#39;" in bad
        text_range = client.get("/run", params={**base, "min_text": "1"}).text
        assert "no number column &#39;text&#39; for a range" in text_range


def test_a_score_run_shows_each_detectors_confusion_matrix_linking_to_its_cells_rows(tmp_path):
    import json
    import re

    from starlette.testclient import TestClient

    from redline.view.app import build_app

    preds = [{"id": f"d/test/{i}", "detector": det, "dataset": "d", "label": i % 2,
              "pred_toxic": (i % 3 == 0) if det == "a" else (i % 2 == 1), "toxic_score": i / 100}
             for i in range(60) for det in ("a", "b")]
    root = tmp_path / "runs"
    for k, det in enumerate(("a", "b")):
        write(root / "s" / "predictions" / f"part-00000-{k}.parquet",
              pa.Table.from_pylist([p for p in preds if p["detector"] == det]))
    summary = []
    for det in ("a", "b"):
        mine = [p for p in preds if p["detector"] == det]
        count = {name: sum(1 for p in mine if (p["label"], p["pred_toxic"]) == cell)
                 for name, cell in (("tp", (1, True)), ("fn", (1, False)), ("fp", (0, True)), ("tn", (0, False)))}
        summary += [{"detector": det, "dataset": "all", **count}, {"detector": det, "dataset": "d", **count}]
    (root / "s" / "manifest.json").write_text(json.dumps({"pipeline": "score", "state": "complete", "summary": summary}))
    with TestClient(build_app(str(root)), base_url="http://127.0.0.1:8765") as client:
        page = client.get("/run", params={"id": "s"}).text
        matrices = re.findall(r'<table class="confusion" data-detector="([^"]+)">(.*?)</table>', page, re.S)
        assert [d for d, _ in matrices] == ["a", "a", "b", "b"]  # the roll-up over datasets, then each dataset
        for row, (_, matrix) in zip(summary, matrices):
            links = re.findall(r'<a href="([^"]+)#rows"[^>]*>([\d,]+)</a>', matrix)
            assert [int(n) for _, n in links] == [row["tp"], row["fn"], row["fp"], row["tn"]]
            for href, n in links:  # each cell's link shows exactly that cell's rows
                shown = client.get(href.replace("&amp;", "&")).text
                assert f'<p class="meta" id="row-count">{int(n)} of 120 rows' in shown
    assert summary[2]["fn"] == summary[2]["fp"] == 0 and summary[0]["fn"] > 0


def test_a_running_runs_progress_shows_rows_done_and_the_drivers_rate_and_time_left(tmp_path):
    """Rows done from the parts counted; the rate and time left are the driver's (what its progress
    line printed, saved with the counts: the recent rate of the running step), never the rows over
    the time since the run started, start-up and the corpus' reading included (issue 53 item 1:
    "61/s · about 6,421 s left" where the command line said 7,327 rows/s and 44 s left)."""
    import json

    from starlette.testclient import TestClient

    from redline.view.app import build_app

    root = tmp_path / "runs"
    (root / "live").mkdir(parents=True)
    manifest = {"pipeline": "score", "state": "running", "started_at": "2026-11-25T10:00:00+00:00",
                "updated_at": "2026-11-25T10:10:00+00:00", "input_rows": [1000, 1000, 1000, 500],
                "config": {"detectors": [{"name": "a"}, {"name": "b"}]},
                "partials": {"summary": {"shards": [[0, 0], [1, 0], [0, 1], [3, 1]], "groups": []}}}
    (root / "live" / "manifest.json").write_text(json.dumps(manifest))
    with TestClient(build_app(str(root)), base_url="http://127.0.0.1:8765") as client:
        [run] = client.get("/api/runs").json()["runs"]
        # 3,500 rows per detector, 2 detectors; counted 3,500 rows in 600 s: no rate made up from that
        assert run["progress"] == {"done": 3500, "total": 7000, "rate": None, "eta_s": None,
                                   "updated": "2026-11-25T10:10:00+00:00", "text": "3,500 of 7,000 rows (50%)"}
        manifest["progress"] = {"step": "scoring with 2 detector(s)", "unit": "rows", "done": 3500, "total": 7000,
                                "rate": 7327.0, "eta_s": 44.0}
        (root / "live" / "manifest.json").write_text(json.dumps(manifest))
        [run] = client.get("/api/runs").json()["runs"]
        assert run["progress"]["text"] == "3,500 of 7,000 rows (50%) · 7,327 rows/s · about 44 s left"
        assert "3,500 of 7,000 rows (50%) · 7,327 rows/s · about 44 s left" in client.get("/").text
        page = client.get("/run", params={"id": "live"}).text
        assert 'id="progress" data-run="live">3,500 of 7,000 rows (50%)' in page and "saved 2026-11-25 10:10:00" in page
        for bad in ({"rate": "fast", "eta_s": -5}, {"rate": float("1e400"), "unit": "<b>"}):  # read, never trusted
            (root / "live" / "manifest.json").write_text(json.dumps({**manifest, "progress": bad}))
            assert client.get("/api/runs").json()["runs"][0]["progress"]["text"] == "3,500 of 7,000 rows (50%)"
        manifest.update(state="complete", partials={"summary": {"shards": [[i, p] for i in range(4) for p in (0, 1)]}})
        (root / "live" / "manifest.json").write_text(json.dumps(manifest))
        [run] = client.get("/api/runs").json()["runs"]
        assert run["progress"]["done"] == 7000 and run["progress"]["eta_s"] is None
        assert 'data-field="progress"></div>' in client.get("/").text  # a finished run shows no progress line


@pytest.mark.parametrize("indexed", [False, True])
def test_a_score_run_per_text_with_every_detector_side_by_side_and_its_filters(tmp_path, indexed):
    from redline.pipelines.plane.per_text import write_index
    from redline.view import per_text

    preds = [{"id": f"d/test/{i}", "text": f"text {i}", "detector": det, "label": None if i == 59 else i % 2,
              "pred_toxic": None if (det == "b" and i == 7) else ((i % 3 == 0) if det == "a" else (i % 2 == 1)),
              "toxic_score": (i if det == "a" else 100 - i) / 100} for i in range(60) for det in ("a", "b")]
    root = tmp_path / "runs"
    for shard in range(2):  # two input shards of 30 texts, a part per shard and detector
        for k, det in enumerate(("a", "b")):
            write(root / "s" / "predictions" / f"part-{shard:05d}-{k}.parquet",
                  pa.Table.from_pylist([p for p in preds if p["detector"] == det and int(p["id"].split("/")[-1]) // 30 == shard]))
    if indexed:  # as the run's worker writes it when the run finishes
        assert write_index(str(root / "s"), "predictions") == 2
    refs = R.tables(str(root), "s")
    assert [r.name for r in refs][:2] == ["per-text", "predictions"]
    source = R.open_table(refs[0])
    assert (source.index is not None) == indexed
    assert source.num_rows == 60 and source.column_names == [
        "id", "text", "label", "disagree", "misclassified", "fooled", "own", "score_a", "pred_a", "score_b", "pred_b"]
    if indexed:
        assert source.index.facets() == R.facets(source)
    by = {p["id"]: {} for p in preds}
    for p in preds:
        by[p["id"]][p["detector"]] = p
    disagree = [i for i, d in by.items() if d["b"]["pred_toxic"] is not None and d["a"]["pred_toxic"] != d["b"]["pred_toxic"]]
    wrong_a = [i for i, d in by.items() if d["a"]["label"] is not None and d["a"]["pred_toxic"] != bool(d["a"]["label"])]
    assert R.facets(source)["disagree"] == ["true", "false"] and R.facets(source)["misclassified"] == ["a"]
    # which texts fool every detector that judged them, one filter; and the label as a filter of its own
    judged = {i: [d for d in "ab" if v[d]["pred_toxic"] is not None] for i, v in by.items()}
    every = [i for i, v in by.items() if v["a"]["label"] is not None
             and all(v[d]["pred_toxic"] != bool(v[d]["label"]) for d in judged[i])]
    assert [r["id"] for r in R.query(source, {"fooled": "every"}, None, 1, 100).rows] == every
    assert sorted(R.facets(source)["label"]) == ["benign", "toxic"] and sorted(R.facets(source)["fooled"]) == [
        "every", "none", "some"]
    toxic_fooled = R.query(source, {"fooled": "every", "label": "toxic"}, None, 1, 100).rows
    assert [r["id"] for r in toxic_fooled] == [i for i in every if by[i]["a"]["label"] == 1] and toxic_fooled
    assert R.query(source, {"id": "d/test/59"}, None, 1, 1).rows[0]["fooled"] is None  # no label, no verdict on it
    page = R.query(source, {"disagree": "true"}, None, 1, 100)
    assert [r["id"] for r in page.rows] == disagree
    assert [r["id"] for r in R.query(source, {"misclassified": "a"}, None, 1, 100).rows] == wrong_a
    top = R.query(source, {}, "-score_b", 1, 3).rows
    assert [(r["id"], r["score_a"], r["pred_b"]) for r in top] == [("d/test/0", 0.0, False), ("d/test/1", 0.01, True),
                                                                   ("d/test/2", 0.02, False)]
    assert by["d/test/7"]["b"]["pred_toxic"] is None and R.query(source, {"id": "d/test/7"}, None, 1, 1).rows[0]["disagree"] is False
    # the first detector's columns and the text are read from its part alone: the same answers
    assert [r["id"] for r in R.query(source, {}, "-score_a", 1, 3).rows] == ["d/test/59", "d/test/58", "d/test/57"]
    found = R.query(source, {}, None, 1, 100, search="TEXT 5")
    assert [r["id"] for r in found.rows] == ["d/test/5", *(f"d/test/{i}" for i in range(50, 60))]
    assert R.query(source, {}, None, 1, 100, search="toxic").total == 0  # label, fooled, own: filters, not searched
    assert per_text.parts_by_shard(["predictions/part-00003-1.parquet", "x.parquet"]) == {3: {1: "predictions/part-00003-1.parquet"}}


def test_a_shards_rows_taken_alone_are_its_pivots_rows_whatever_order_its_parts_hold(tmp_path):
    """A page's rows of the per-text view are taken from their shard alone: the other detectors' rows
    at the same positions when the parts hold the ids in one order, else joined by id (a part written
    in another order, or missing a row): always the rows of the whole shard's pivot."""
    import numpy as np

    from redline.pipelines.plane.per_text import READ, pivot
    from redline.view import per_text

    first = pa.table({"id": [f"t{i}" for i in range(12)], "text": [f"text {i}" for i in range(12)],
                      "label": [i % 2 for i in range(12)], "status": ["ok"] * 12,
                      "toxic_score": [i / 12 for i in range(12)], "pred_toxic": [i % 3 == 0 for i in range(12)]})
    other = first.set_column(4, "toxic_score", pa.array([1 - i / 12 for i in range(12)])).set_column(
        5, "pred_toxic", pa.array([i % 2 == 1 for i in range(12)]))
    orders = {"aligned": other, "reversed": other.take(pa.array(range(11, -1, -1))),
              "short": other.filter(pa.array([i != 4 for i in range(12)]))}
    for name, second in orders.items():
        for k, table in enumerate((first, second)):
            write(tmp_path / name / f"part-00000-{k}.parquet", table)
        piece = per_text.ShardPivot(str(tmp_path), {k: [name, f"part-00000-{k}.parquet"] for k in (0, 1)},
                                    {0: "a", 1: "b"}, version=name)
        whole = pivot({0: first.select([c for c in READ if c in first.column_names]),
                       1: second.select([c for c in READ if c in second.column_names])}, {0: "a", 1: "b"})
        for local in ([3, 0, 9], [11], [4, 5]):
            assert piece.take(np.array(local)).to_pylist() == whole.take(pa.array(local)).to_pylist(), (name, local)
    assert piece.take(np.array([4]))["pred_b"].to_pylist() == [None]  # the row the short part lacks


def test_an_unlabelled_corpus_per_text_has_verdicts_but_no_mistakes():
    """Predictions without a label column (a corpus scored without labels): every detector's verdict
    side by side, nobody misclassified, no `fooled`, no label."""
    from redline.pipelines.plane.per_text import pivot

    parts = {k: pa.table({"id": ["x", "y"], "text": ["a", "b"], "status": ["ok", "ok"], "toxic_score": [0.9, 0.1],
                          "pred_toxic": [True, k == 1]}) for k in (0, 1)}
    rows = pivot(parts, {0: "a", 1: "b"}).to_pylist()
    assert [(r["disagree"], r["misclassified"], r["fooled"], r.get("label")) for r in rows] == [
        (False, [], None, None), (True, [], None, None)]
    assert [(r["pred_a"], r["pred_b"]) for r in rows] == [(True, True), (False, True)]


def test_the_per_text_index_counts_without_reading_a_shard_and_a_stale_one_is_never_used(tmp_path, monkeypatch):
    """A large run's per-text view opens, filters and counts from its index: only the shards a page
    shows are pivoted. An index that no longer matches the parts (one rewritten) is not used."""
    from redline.pipelines.plane.per_text import write_index
    from redline.view import per_text

    root = tmp_path / "runs"
    for shard in range(6):  # 6 shards of 20 texts; detector a calls every text of shard 3 toxic, b none
        for k, det in enumerate(("a", "b")):
            write(root / "s" / "predictions" / f"part-{shard:05d}-{k}.parquet", pa.Table.from_pylist([
                {"id": f"d/{shard}/{i}", "text": f"t{i}", "detector": det, "label": i % 2, "status": "ok",
                 "pred_toxic": det == "a" and shard == 3, "toxic_score": 0.9 if det == "a" and shard == 3 else 0.1}
                for i in range(20)]))
    assert write_index(str(root / "s"), "predictions") == 6
    read = set()  # the shards whose parts were read
    parts = per_text.ShardPivot.parts
    monkeypatch.setattr(per_text.ShardPivot, "parts", lambda self: read.add(self.files[0][-1]) or parts(self))
    source = R.open_table(R.tables(str(root), "s")[0])
    assert source.index is not None and source.num_rows == 120 and read == {"part-00000-0.parquet"}  # its names
    read.clear()
    page = R.query(source, {"disagree": "true"}, None, 1, 5)
    assert page.total == 20 and [r["id"] for r in page.rows] == [f"d/3/{i}" for i in range(5)]
    assert read == {"part-00003-0.parquet"}  # the one shard that holds them; the count came from the index
    assert R.query(source, {"misclassified": "a", "label": "benign"}, None, 1, 50).total == 10
    top = R.query(source, {}, "-score_a", 1, 3).rows
    assert {r["score_a"] for r in top} == {0.9}
    assert R.query(source, {"fooled": "every"}, None, 1, 50).total == 50  # the toxic texts outside shard 3
    # one part rewritten (a resumed run): the index is stale, the view pivots every shard again
    write(root / "s" / "predictions" / "part-00005-1.parquet", pa.Table.from_pylist([
        {"id": f"d/5/{i}", "text": f"t{i} again", "detector": "b", "label": i % 2, "status": "ok", "pred_toxic": True,
         "toxic_score": 0.95} for i in range(20)]))
    fresh = R.open_table(R.tables(str(root), "s")[0])
    assert fresh.index is None
    assert R.query(fresh, {"disagree": "true"}, None, 1, 5).total == 40


def test_a_transfer_runs_per_text_never_counts_a_detectors_own_examples_as_its_mistakes(tmp_path):
    """Examples made against a detector fool it by construction: the transfer figures leave them out
    of its rates (`own_n`), and the per-text view marks them `own` and leaves them out of its
    `misclassified`, so a filter counts what the report counts."""
    from redline.pipelines.reporting.figures import TRANSFER

    rows = []  # TAE made against a or b, BAE made against a, their seeds; each detector calls all benign
    for i in range(12):
        split, source = ("tae", "a") if i < 5 else ("tae", "b") if i < 9 else ("bae", "a") if i < 11 else ("seed", "s1")
        label = 0 if split == "bae" else 1
        for det in ("a", "b"):
            pred = det == "b" and i == 0 or split == "bae" and det == "b"
            rows.append({"id": f"x{i}", "text": f"t{i}", "label": label, "split": split, "source": source, "status": "ok",
                         "dataset": "d", "detector": det, "pred_toxic": pred, "toxic_score": float(pred)})
    root = tmp_path / "runs"
    for k, det in enumerate(("a", "b")):
        write(root / "t" / "predictions" / f"part-00000-{k}.parquet", pa.Table.from_pylist([r for r in rows if r["detector"] == det]))
    source = R.open_table(R.tables(str(root), "t")[0])
    by_id = {r["id"]: r for r in R.query(source, {}, None, 1, 100).rows}
    assert [by_id[f"x{i}"]["own"] for i in range(12)] == ["a"] * 5 + ["b"] * 4 + ["a"] * 2 + [None]
    for det in ("a", "b"):
        wrong = {r["id"] for r in R.query(source, {"misclassified": det}, None, 1, 100).rows}
        figures = {r["victim"]: r for r in TRANSFER.rows(TRANSFER.partials(pa.Table.from_pylist(
            [r for r in rows if r["detector"] == det])))}[det]
        # the report's mistakes: TAE called benign, BAE called toxic, seeds called benign -- own examples apart
        assert len(wrong) == round(figures["tae_rate"] * figures["tae_n"]) + round(
            (figures["bae_rate"] or 0) * figures["bae_n"]) + round(figures["seed_rate"] * figures["seed_n"])
        assert not any(by_id[i]["own"] == det for i in wrong)
    # a TAE is judged only by the detector it was not made against: x0 b gets right, x1 b and x5 a get wrong;
    # a BAE made against a (x9) is judged by b alone, which calls it toxic; a seed (x11) by both, both fooled
    assert [by_id[f"x{i}"]["fooled"] for i in (0, 1, 5, 9, 11)] == ["none", "every", "every", "every", "every"]
    assert {r["id"] for r in R.query(source, {"own": "b"}, None, 1, 100).rows} == {f"x{i}" for i in range(5, 9)}


def test_each_pipelines_tables_open_on_their_own_first_columns():
    from redline.pipelines.plane.schema import first_columns

    stage = ["id", "text", "label", "goal", "recipe", "seed_text", "dataset", "recipes", "grammar_errors", "kept",
             "reject_reason", "reject_kind"]
    assert first_columns("stages/2-grammar", stage) == ["id", "goal", "recipes", "seed_text", "text", "kept",
                                                        "reject_kind", "reject_reason"]
    assert first_columns("scored/tiny-gpt2", ["model", "context_id", "response", "verdict", "context"]) == [
        "model", "context", "response", "verdict"]
    assert first_columns("zeta", ["a", "b"]) == [] and first_columns("taebench", ["x"]) == []



def test_the_run_list_is_paged_follows_its_own_rows_and_rereads_only_changed_manifests(tmp_path, monkeypatch):
    """250 runs: a page of 100, newest first; the live refresh asks for its page's runs only; a
    finished run's row is kept until its manifest changes, a running run's is read every time."""
    import json
    import re

    from starlette.testclient import TestClient

    from redline.view import catalog
    from redline.view.app import build_app

    root = tmp_path / "runs"
    for i in range(250):
        d = root / f"run-{i:03d}"
        d.mkdir(parents=True)
        state = "running" if i == 249 else "complete"
        (d / "manifest.json").write_text(json.dumps({"pipeline": "score", "state": state, "run_name": d.name,
                                                     "started_at": f"2026-11-26T00:{i // 60:02d}:{i % 60:02d}+00:00"}))
    reads = []
    real = catalog.read_run
    monkeypatch.setattr(catalog, "read_run", lambda r, rel: reads.append(rel) or real(r, rel))
    with TestClient(build_app(str(root)), base_url="http://127.0.0.1:8765") as client:
        first = client.get("/").text
        ids = re.findall(r'data-id="([^"]+)"', first)
        assert len(ids) == 100 and ids[0] == "run-249" and ids[-1] == "run-150" and "page 1 of 3" in first
        last = client.get("/", params={"page": "3"}).text
        assert re.findall(r'data-id="([^"]+)"', last) == [f"run-{i:03d}" for i in range(49, -1, -1)]
        assert "runs 201–250 of 250" in last and 'rel="prev"' in last and 'rel="next"' not in last
        assert "page must be a whole number" in client.get("/", params={"page": "x"}).text
        some = client.get("/api/runs", params=[("id", "run-007"), ("id", "run-249")]).json()["runs"]
        assert sorted(r["id"] for r in some) == ["run-007", "run-249"]
        assert len(client.get("/api/runs").json()["runs"]) == 250
        reads.clear()
        again = client.get("/").text
        assert reads == ["run-249"]  # only the running run's manifest is read again
        assert 'aria-label="select run-150"' in again  # a kept row is still a readable run (comparable)
        changed = root / "run-010" / "manifest.json"
        changed.write_text(json.dumps({"pipeline": "score", "state": "failed", "run_name": "run-010",
                                       "started_at": "2026-11-26T00:00:10+00:00", "error": "boom"}))
        reads.clear()
        row = [r for r in client.get("/api/runs", params={"id": "run-010"}).json()["runs"]]
        assert sorted(reads) == ["run-010", "run-249"] and row[0]["state"] == "failed"


def test_an_index_of_the_wrong_shape_is_ignored(tmp_path):
    """An index is read from wherever the run lives (a bucket): one whose figures are not of the types
    the planner compares is ignored, and the table is read from its shards."""
    from redline.pipelines.plane.table_index import write_index

    _shards(tmp_path, [{"id": f"r{i}", "score": float(i), "note": "n"} for i in range(40)], 20)
    write_index(str(tmp_path / "runs" / "big"), "attempts")
    good = pq.read_table(tmp_path / "runs" / "big" / ".index" / "attempts.parquet")
    stats = [s.replace('"low": {"score": 0.0}', '"low": {"score": "0"}') for s in good.column("stats").to_pylist()]
    assert stats != good.column("stats").to_pylist()
    bad = good.set_column(3, "stats", pa.array(stats)).replace_schema_metadata(good.schema.metadata)
    pq.write_table(bad, tmp_path / "runs" / "big" / ".index" / "attempts.parquet")
    source = R.open_table(R.tables(str(tmp_path / "runs"), "big")[0])
    assert source.index is None and [r["id"] for r in R.query(source, {}, "score", 1, 2).rows] == ["r0", "r1"]


def test_a_parquet_piece_reads_its_rows_exactly_across_row_groups(tmp_path, monkeypatch):
    """Rows fetched by position from a part of several row groups, opened or described by the index,
    in the order asked; scans in batches or whole, and a count without columns."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from redline.view import scan

    table = pa.table({"id": [f"r{i}" for i in range(50)], "x": list(range(50))})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=7)
    opened = scan.FilePiece.open(str(tmp_path), ["t.parquet"])
    assert opened.num_rows == 50 and opened.group_starts == [0, 7, 14, 21, 28, 35, 42, 49]
    described = scan.FilePiece.described(str(tmp_path), ["t.parquet"], 50, ["id", "x"])
    asked = np.array([49, 0, 8, 14, 13, 21, 6, 7, 48])
    for piece in (opened, described):
        got = piece.take(asked)
        assert got.column("id").to_pylist() == [f"r{i}" for i in asked] and got.column("x").to_pylist() == asked.tolist()
    assert pa.concat_tables(opened.batches(["x", "absent"])).column("x").to_pylist() == list(range(50))
    monkeypatch.setattr(scan, "BATCH_ROWS", 16)  # a part larger than a batch: read in batches, in order
    batches = list(opened.batches(["x"]))
    assert [b.num_rows for b in batches] == [16, 16, 16, 2] and pa.concat_tables(batches).column("x").to_pylist() == list(range(50))
    counts = list(opened.batches(["absent"]))  # no column asked for that it has: only how many rows
    assert [b.num_rows for b in counts] == [16, 16, 16, 2] and counts[0].column_names == ["__n"]
    pq.write_table(table.slice(0, 0), tmp_path / "empty.parquet")
    assert list(scan.FilePiece.open(str(tmp_path), ["empty.parquet"]).batches(["x"])) == []


def test_the_column_cache_is_bounded_and_drops_the_least_recently_used():
    import pyarrow as pa

    from redline.view.scan import ColumnCache

    col = lambda n: pa.chunked_array([pa.array(range(n), pa.int64())])  # noqa: E731 - 8 bytes a row
    cache = ColumnCache(max_bytes=8 * 25)
    cache.put("a", {"x": col(10)})
    cache.put("b", {"x": col(10)})
    assert cache.get("a", ["x"])["x"].to_pylist() == list(range(10))  # a is now the most recent
    cache.put("c", {"x": col(10)})  # 240 bytes > 200: the least recently used (b) goes
    assert cache.get("b", ["x"]) is None and cache.get("a", ["x"]) is not None and cache.get("c", ["x"]) is not None
    assert cache.get("a", ["x", "y"]) is None  # every column asked for, or none
    cache.put("d", {"x": col(26)})  # larger than the whole cache: not kept, nothing dropped for it
    assert cache.get("d", ["x"]) is None and cache.get("a", ["x"]) is not None and cache.get("c", ["x"]) is not None
    cache.put("e", {"x": col(25)})  # exactly the cache: kept, everything else out
    assert cache.get("e", ["x"]) is not None and cache.get("a", ["x"]) is None


def test_reads_ahead_come_back_in_the_order_asked():
    import time

    from redline.view.scan import READ_AHEAD, _read_ahead

    n = READ_AHEAD * 2 + 3
    reads = [lambda i=i: (time.sleep(0.002 * (n - i)), i)[1] for i in range(n)]
    assert list(_read_ahead(reads)) == list(range(n)) and list(_read_ahead([])) == []


def test_a_source_of_several_parts_numbers_conforms_and_caches_its_rows(tmp_path, monkeypatch):
    """Rows numbered across parts in order; a column one part lacks comes back as nulls, a narrower
    type widened; small parts joined into batches of about BATCH_ROWS; a table read to its end is kept
    in the column cache, one too big for it is not; fetching rows by number follows the order asked."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from redline.errors import RedlineError
    from redline.view import scan

    monkeypatch.setattr(scan, "BATCH_ROWS", 8)
    monkeypatch.setattr(scan, "COLUMNS", scan.ColumnCache(10_000))
    pq.write_table(pa.table({"id": [f"a{i}" for i in range(5)], "x": pa.array(range(5), pa.int32())}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [f"b{i}" for i in range(6)], "x": pa.array(range(5, 11), pa.int64()),
                             "y": [f"y{i}" for i in range(6)]}), tmp_path / "b.parquet")
    pq.write_table(pa.table({"id": [f"c{i}" for i in range(7)], "x": pa.array(range(11, 18), pa.int64())}),
                   tmp_path / "c.parquet")
    source = scan.Source.of_files("t", str(tmp_path), [["a.parquet"], ["b.parquet"], ["c.parquet"]], key="v1")
    assert source.num_rows == 18 and source.starts == [0, 5, 11] and source.column_names == ["id", "x", "y"]
    batches = list(source.scan(["x", "y"]))
    assert [(at, b.num_rows) for at, b in batches] == [(0, 11), (11, 7)]  # parts joined until a batch is full
    whole = pa.concat_tables(b for _, b in batches)
    assert whole.column("x").to_pylist() == list(range(18)) and whole.schema.field("x").type == pa.int64()
    assert whole.column("y").to_pylist() == [None] * 5 + [f"y{i}" for i in range(6)] + [None] * 7
    assert scan.COLUMNS.get("v1", ["x", "y"]) is not None  # read to the end: kept
    (tmp_path / "a.parquet").unlink()  # the next scan of this version reads the cache, not the parts
    assert pa.concat_tables(b for _, b in source.scan(["x"])).column("x").to_pylist() == list(range(18))
    pq.write_table(pa.table({"id": [f"a{i}" for i in range(5)], "x": pa.array(range(5), pa.int32())}), tmp_path / "a.parquet")
    assert [r["id"] for r in source.rows([17, 0, 5, 4, 11])] == ["c6", "a0", "b0", "a4", "c0"]
    assert source.rows([6])[0] == {"id": "b1", "x": 6, "y": "y1"} and source.rows([]) == []
    parts = list(source.scan_parts([2, 0], ["x"]))
    assert [(i, start, t.column("x").to_pylist()) for i, start, t in parts] == [(2, 11, list(range(11, 18))),
                                                                                (0, 0, list(range(5)))]
    counted = list(source.scan([]))  # only a count: no columns read, nothing cached
    assert sum(b.num_rows for _, b in counted) == 18 and counted[0][1].column_names == ["__n"]

    monkeypatch.setattr(scan, "COLUMNS", scan.ColumnCache(100))  # too small for the table: never kept
    list(scan.Source.of_files("t", str(tmp_path), [["b.parquet"], ["c.parquet"]], key="v2").scan(["x"]))
    assert scan.COLUMNS.get("v2", ["x"]) is None

    with pytest.raises(RedlineError, match="table t has no files"):
        scan.Source.of_files("t", str(tmp_path), [])
    pq.write_table(pa.table({"x": ["text"]}), tmp_path / "d.parquet")
    with pytest.raises(RedlineError, match="the shards of t disagree on"):
        bad = scan.Source.of_files("t", str(tmp_path), [["c.parquet"], ["d.parquet"]])
        list(bad.scan(["x"]))

    table = pa.table({"id": [f"r{i}" for i in range(20)], "n": list(range(20))})
    mem = scan.Source.of_table(table, "mem")
    assert [b.num_rows for _, b in mem.scan(["n", "missing"][:1])] == [8, 8, 4]
    assert mem.pieces[0].take(np.array([19, 3])).column("n").to_pylist() == [19, 3]
    assert [b.column_names for b in mem.pieces[0].batches(["n", "absent"])][0] == ["n"]
    assert [b.num_rows for b in scan.TablePiece(table.slice(0, 0)).batches(["n"])] == [0]


def test_a_score_shows_the_digits_that_tell_it_from_its_neighbours():
    """Issue 53 item 8: a tiny BERT's 38 different scores all showed as 0.9965 or 0.003522 (4 digits)."""
    scores = [0.99651234, 0.99654321, 0.99648, 0.0035224, 0.0035219]
    shown = [R.cell(s) for s in scores]
    assert shown == ["0.996512", "0.996543", "0.99648", "0.0035224", "0.0035219"]
    assert len(set(shown)) == len(scores)
    assert R.cell(float("nan")) == "nan" and R.cell(None) == "" and R.cell([0.5, 1e-7]) == "0.5, 1e-07"


def test_the_run_list_sorts_and_charts_runs_by_any_headline_figure(tmp_path):
    """Which of these runs has the best F1: one choice sorts the list by that figure (runs without it
    last) and draws it, one bar per run; a figure the runs do not show is refused."""
    import json
    import re

    from starlette.testclient import TestClient

    from redline.view.app import build_app

    root = tmp_path / "runs"
    f1 = {"run-a": 0.61, "run-b": 0.93, "run-c": None, "run-d": 0.12}
    for i, (name, value) in enumerate(f1.items()):
        (root / name).mkdir(parents=True)
        summary = [] if value is None else [{"detector": "kw", "dataset": "all", "f1_toxic": value, "n": 10}]
        (root / name / "manifest.json").write_text(json.dumps({
            "pipeline": "score", "state": "complete", "run_name": name, "summary": summary,
            "started_at": f"2026-11-26T00:00:0{i}+00:00"}))
    with TestClient(build_app(str(root)), base_url="http://127.0.0.1:8765") as client:
        page = client.get("/", params={"pipeline": "score"}).text
        names = re.findall(r'<option value="([^"]+)"', page.split('name="by"')[1].split("</select>")[0])
        wanted = next(n for n in names if "F1" in n and n.startswith("kw"))
        for order, expected in (("desc", ["run-b", "run-a", "run-d", "run-c"]), ("asc", ["run-d", "run-a", "run-b", "run-c"])):
            page = client.get("/", params={"pipeline": "score", "by": wanted, "order": order}).text
            assert re.findall(r'data-id="([^"]+)"', page) == expected
            chart = page.split('id="runs-chart"')[1].split("</figure>")[0]
            assert chart.count("<rect") >= 3 and "run-c" not in chart  # a bar per run that has the figure
        refused = client.get("/", params={"by": "nope · F1"})
        assert refused.status_code == 400 and "sort by one of the figures" in refused.text
        assert client.get("/", params={"by": wanted, "order": "sideways"}).status_code == 400


def test_one_text_is_found_in_every_runs_tables_within_a_time_budget(tmp_path):
    """Where else does this text appear: every run's tables searched, newest run first, each table with
    its count and first matches and a link to them; a search past its budget says where it stopped."""
    import json
    import re

    from starlette.testclient import TestClient

    from redline.view import search
    from redline.view.app import build_app

    root = tmp_path / "runs"
    texts = {"old": ["you absolute idiot", "nice day"], "new": ["what an IDIOT move", "idiot", "hello"],
             "none": ["fine", "ok"]}
    for i, (name, values) in enumerate(texts.items()):
        (root / name).mkdir(parents=True)
        (root / name / "manifest.json").write_text(json.dumps({"pipeline": "score", "state": "complete",
                                                                "started_at": f"2026-11-26T00:00:0{i}+00:00"}))
        write(root / name / "attempts" / "part-00000.parquet",
              pa.table({"id": [f"{name}{k}" for k in range(len(values))], "text": values}))
    with TestClient(build_app(str(root)), base_url="http://127.0.0.1:8765") as client:
        page = client.get("/search", params={"q": "idiot"}).text
        hits = re.findall(r'<tr data-run="([^"]+)" data-table="([^"]+)">', page)
        assert hits == [("new", "attempts"), ("old", "attempts")]  # newest run first; a run without it is not listed
        assert "searched 3 tables of 3 runs" in page and "what an IDIOT move" in page
        assert "/run?id=new&amp;table=attempts&amp;q=idiot" in page
        rows_new = page.split('data-run="new"')[1].split("</tr>")[0]
        assert '<td class="num">2</td>' in rows_new
        assert client.get("/search", params={"q": "x" * 201}).status_code == 400
        assert 'name="q"' in client.get("/search").text and 'action="/search"' in client.get("/").text
    from redline.view import catalog, rows

    runs = catalog.find_runs(str(root))
    stopped = search.search_runs(rows.TableCache(), str(root), runs, "idiot", budget_s=-1)
    assert stopped.stopped and stopped.runs_searched == 0 and not stopped.hits


def test_a_row_page_shows_one_example_in_full_with_what_every_table_and_run_knows_of_it(tmp_path):
    """inspect's viewer opens one sample and shows everything about it: here a row's every column, its
    word diff, the same id in the run's other tables (a stage's verdict and reason), the run's config,
    and the same text in other runs."""
    import json

    from starlette.testclient import TestClient

    from redline.view.app import build_app

    root = tmp_path / "runs"
    for i, name in enumerate(("bench", "later")):
        (root / name).mkdir(parents=True)
        (root / name / "manifest.json").write_text(json.dumps({
            "pipeline": "attack", "state": "complete", "started_at": f"2026-11-26T00:00:0{i}+00:00",
            "config": {"recipes": ["deepwordbug"], "run_name": name}}))
    write(root / "bench" / "attempts" / "part-00000.parquet", pa.table({
        "id": ["a1", "a2"], "status": ["success", "failed"], "seed_text": ["you are an idiot", "have a day"],
        "perturbed_text": ["you are an idi0t", "have a dya"], "victim": ["p", "p"]}))
    write(root / "bench" / "work" / "label-judge" / "part-00000.parquet", pa.table({
        "id": ["a1"], "verdict": ["toxic"], "reason": ["an insult, spelled <b>oddly</b>"]}))
    (root / "blank").mkdir()
    (root / "blank" / "manifest.json").write_text(json.dumps({"pipeline": "attack", "state": "complete"}))
    write(root / "blank" / "attempts" / "part-00000.parquet", pa.table({"id": ["b1"], "text": ["   "]}))
    write(root / "later" / "attempts" / "part-00000.parquet", pa.table({
        "id": ["z9"], "status": ["success"], "seed_text": ["x"], "perturbed_text": ["you are an idi0t"], "victim": ["q"]}))
    with TestClient(build_app(str(root)), base_url="http://127.0.0.1:8765") as client:
        run_page = client.get("/run", params={"id": "bench", "table": "attempts"}).text
        assert 'class="row-page" href="/row?id=bench&amp;table=attempts&amp;row=a1"' in run_page
        page = client.get("/row", params={"id": "bench", "table": "attempts", "row": "a1"})
        assert page.status_code == 200
        text = page.text
        diff = text.split('id="row-diff"')[1].split("</section>")[0]
        assert "<del>idiot</del>" in diff and "<mark>idi0t</mark>" in diff  # the word the attack changed
        fields = text.split('id="row-fields"')[1].split("</section>")[0]
        assert all(f'data-col="{c}"' in fields for c in ("id", "status", "seed_text", "perturbed_text", "victim"))
        related = text.split('id="row-related"')[1].split("</section>")[0]
        assert 'data-table="work/label-judge"' in related and "toxic" in related
        assert "&lt;b&gt;oddly&lt;/b&gt;" in related  # a reason is text, never markup
        elsewhere = text.split('id="row-elsewhere"')[1].split("</section>")[0]
        assert 'data-run="later"' in elsewhere and 'data-run="bench"' not in elsewhere
        assert "deepwordbug" in text.split('id="row-config"')[1]
        assert client.get("/row", params={"id": "bench", "table": "attempts", "row": "nope"}).status_code == 404
        blank = client.get("/row", params={"id": "blank", "table": "attempts", "row": "b1"})  # nothing to look for
        assert blank.status_code == 200 and "This row has no text to look for." in blank.text
        assert client.get("/row", params={"id": "bench", "table": "nope", "row": "a1"}).status_code == 404
        assert client.get("/row", params={"id": "../etc", "table": "attempts", "row": "a1"}).status_code in (400, 404)


def test_compare_shows_every_figure_by_run_with_n_interval_and_difference_a_chosen_chart_and_the_config_diff(tmp_path):
    """Runs against runs: the metric-by-run grid (n and interval where the figure has them, the
    difference from the first run), any figure charted, and the one setting the runs differ in."""
    import json
    import re

    from starlette.testclient import TestClient

    from redline.pipelines.reporting.uncertainty import wilson
    from redline.view.app import build_app

    root = tmp_path / "runs"
    runs = {"t1": (0.5, 40, "tiny-a"), "t2": (0.25, 20, "tiny-b")}
    for name, (rate, n, model) in runs.items():
        (root / name).mkdir(parents=True)
        (root / name / "manifest.json").write_text(json.dumps({
            "pipeline": "transfer", "state": "complete", "run_name": name,
            "config": {"taebench": "runs/tb", "victims": [{"name": "kw", "kind": "hf", "model": model}], "run_name": name},
            "summary": [{"victim": "kw", "dataset": "all", "tae_rate": rate, "tae_n": n, "bae_rate": None, "bae_n": 0,
                         "seed_rate": 0.1, "seed_n": 10, "own_n": 3}]}))
    with TestClient(build_app(str(root)), base_url="http://127.0.0.1:8765") as client:
        page = client.get("/compare", params=[("id", "t1"), ("id", "t2")])
        assert page.status_code == 200
        grid = page.text.split('id="grid"')[1].split("</section>")[0]
        line = grid.split('data-figure="tae_rate"')[1].split("</tr>")[0]
        low, high = wilson(5, 20)
        assert "n 40" in line and "n 20" in line and f"[{low:.3f}, {high:.3f}]" in line and "Δ -0.250" in line
        assert 'data-figure="bae_rate"' not in grid  # a figure no run has is left out
        chart = page.text.split('id="chart"')[1].split("</section>")[0]
        assert "ASR TAE (FNR) by run" in chart  # the first headline figure by default
        chosen = client.get("/compare", params=[("id", "t1"), ("id", "t2"), ("figure", "seed_rate")]).text
        assert "FNR on seeds by run" in chosen.split('id="chart"')[1]
        assert client.get("/compare", params=[("id", "t1"), ("id", "t2"), ("figure", "nope")]).status_code == 400
        settings = page.text.split('id="config-diff"')[1].split("</section>")[0]
        assert re.findall(r'data-setting="([^"]+)"', settings) == ["victims.0.model"]
        assert "&#34;tiny-a&#34;" in settings or '"tiny-a"' in settings


def test_compare_lists_the_texts_whose_verdict_changed_between_two_score_runs(tmp_path, monkeypatch):
    """promptfoo's "Different" view: two score runs of one corpus, the (text, detector) pairs whose
    verdict differs between them, with the label and both verdicts."""
    import json
    import re

    from starlette.testclient import TestClient

    from redline.view.app import build_app

    root = tmp_path / "runs"
    flips = {3, 8, 11}
    for name in ("before", "after", "reordered"):  # reordered: after's rows in another order (another layout)
        (root / name).mkdir(parents=True)
        (root / name / "manifest.json").write_text(json.dumps({"pipeline": "score", "state": "complete", "run_name": name,
                                                                "summary": []}))
        preds = [{"id": f"r{i}", "text": f"text {i}", "label": i % 2, "detector": det, "status": "ok",
                  "pred_toxic": (i % 3 == 0) != (name != "before" and det == "a" and i in flips),
                  "toxic_score": 0.5} for i in range(20) for det in ("a", "b")]
        for k, det in enumerate(("a", "b")):
            mine = [p for p in preds if p["detector"] == det]
            write(root / name / "predictions" / f"part-00000-{k}.parquet",
                  pa.Table.from_pylist(mine[::-1] if name == "reordered" else mine))
    with TestClient(build_app(str(root)), base_url="http://127.0.0.1:8765") as client:
        for second, order in (("after", ["r3", "r8", "r11"]), ("reordered", ["r11", "r8", "r3"])):
            page = client.get("/compare", params=[("id", "before"), ("id", second)]).text
            section = page.split('id="changed"')[1].split("</section>")[0]
            assert "3 of 40 (text, detector) pairs scored in both changed" in section and "rows of each run" not in section
            assert re.findall(r'<tr data-id="([^"]+)">', section) == order  # in the second run's order
    # a request's work is bounded: the first rows of each run are compared, and the page says so
    monkeypatch.setattr("redline.view.compare.MAX_CHANGED_ROWS", 10)
    with TestClient(build_app(str(root)), base_url="http://127.0.0.1:8765") as client:
        section = client.get("/compare", params=[("id", "before"), ("id", "after")]).text.split('id="changed"')[1]
        assert "2 of 10 (text, detector) pairs scored in both changed · the first 10 rows of each run compared" in section


def test_a_table_switch_keeps_the_columns_chosen_and_long_choices_show_their_last_parts(tmp_path):
    """The column choice survives a switch to another table of the run (the columns it has); a filter
    over long paths (a corpus' provenance) shows each by its last two parts, the full path its title."""
    import json

    from starlette.testclient import TestClient

    from redline.view.app import build_app

    root = tmp_path / "runs"
    (root / "r").mkdir(parents=True)
    (root / "r" / "manifest.json").write_text(json.dumps({"pipeline": "attack", "state": "complete"}))
    long = "/data/corpora/2026/november/davidson/labeled_data.csv"
    write(root / "r" / "attempts" / "part-00000.parquet", pa.table({
        "id": ["a", "b"], "status": ["success", "failed"], "source": [long, "/x/y/other.csv"], "queries": [3, 4]}))
    write(root / "r" / "taebench" / "part-00000.parquet", pa.table({"id": ["a"], "status": ["kept"], "text": ["t"]}))
    with TestClient(build_app(str(root)), base_url="http://127.0.0.1:8765") as client:
        page = client.get("/run", params=[("id", "r"), ("table", "attempts"), ("cols", "1"), ("col", "id"),
                                          ("col", "status")]).text
        nav = page.split('<nav class="tables">')[1].split("</nav>")[0]
        assert "/run?id=r&amp;table=taebench&amp;cols=1&amp;col=id&amp;col=status#rows" in nav
        assert f'<option value="{long}" title="{long}" >…/davidson/labeled_data.csv</option>' in page
        plain = client.get("/run", params={"id": "r", "table": "attempts"}).text
        assert "/run?id=r&amp;table=taebench#rows" in plain.split('<nav class="tables">')[1]


def test_a_search_no_column_can_hold_finds_nothing_and_one_a_known_value_holds_is_read():
    """A column whose every value is known is searched only when one of its values holds the words;
    a search that no column can hold (or on a table without text) is an empty page, never every row."""
    table = pa.table({"status": ["ok", "failed", "ok"], "score": [0.1, 0.5, 0.9]})
    known = {"status": ["failed", "ok"]}
    assert R.query(table, {}, None, 1, 10, "zzz", None, known).total == 0
    assert [r["score"] for r in R.query(table, {}, "-score", 1, 10, "FAIL", None, known).rows] == [0.5]
    assert R.query(pa.table({"score": [0.1, 0.2]}), {}, None, 1, 10, "0.1").total == 0
