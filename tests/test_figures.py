"""A figure is declared once (pipelines/reporting/figures.py): every figure a pipeline's summary rows carry has
one declaration, which the report tables, `status`, the viewer's headline and the card all read."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pytest

from redline.pipelines.registry import entries, entry
from redline.pipelines.reporting import figures as F


def keys(table: F.Table) -> set[str]:
    return {f.key for f in table.figures}


SUMMARIES = {
    "score": lambda: F.SCORE.summarize(pa.table({
        "detector": ["a", "a", "a"], "dataset": ["d1", "d1", "d2"], "status": ["ok"] * 3, "label": [1, 0, 1],
        "pred_toxic": [True, False, False], "toxic_score": [.9, .1, .2], "seconds": [1.0] * 3})),
    "attack": lambda: F.ATTACK.summarize(pa.table({
        "recipe": ["r"], "goal": ["tae"], "victim": ["v"], "status": ["success"], "reason": [None], "queries": [10],
        "perturbed_pct": [10.0], "similarity": [.9], "seconds": [1.0], "more_examples": [["x"]]})),
    "transfer": lambda: F.TRANSFER.summarize(pa.table({
        "victim": ["v", "v", "v"], "status": ["ok"] * 3, "dataset": ["x"] * 3, "split": ["seed", "tae", "bae"],
        "pred_toxic": [True, False, True], "source": [None, "u", "u"]})),
    "diasafety": lambda: F.leaderboard(["risk"]).summarize(pa.table({
        "model": ["m"], "category": ["risk"], "verdict": ["safe"], "empty": [False]})),
    "egregious": lambda: F.EGREGIOUS.summarize(pa.Table.from_pylist([
        {"model": "m", "list": "mal", "target": "t", "search": "o-greedy", "status": "ok", "hits": ["o-greedy-hit"]}])),
}


@pytest.mark.parametrize("name", sorted(SUMMARIES))
def test_every_summary_figure_is_declared(name):
    table = entry(name).table
    extra = {"risk"} if name == "diasafety" else set()  # a run's own categories: category_figures
    for row in SUMMARIES[name]():
        assert set(row) - extra <= keys(table), f"{name}: undeclared {sorted(set(row) - extra - keys(table))}"


def test_declarations_are_complete_and_read_by_every_view():
    for name, table in ((e.name, e.table) for e in entries()):
        assert len(keys(table)) == len(table.figures), f"{name}: a key declared twice"
        for f in table.values:
            if f.better is not None:
                assert f.description, f"{name}.{f.key}: a figure with a direction needs its definition"
    # one format per figure: the report's column and the viewer's headline are the same declaration
    for e in entries():
        for key, label, fmt in e.headline.values:
            assert fmt == e.table.figure(key).format and label in (e.table.figure(key).label, e.table.figure(key).short)
    assert dict((k, f) for k, _, f in F.ATTACK.columns())["asr"] == F.ATTACK.headline_of().values[0][2]
    # hidden counts stay in the rows but out of the tables; brief columns are a subset of the full ones
    assert "tp" in keys(F.SCORE) and "tp" not in {c[0] for c in F.SCORE.columns()}
    assert set(F.SCORE.columns(brief=True)) < set(F.SCORE.columns())
    board = F.DIASAFETY.columns(extra=F.category_figures(["risk", "offending"]))
    assert [c[0] for c in board[:3]] == ["model", "risk", "offending"]
    assert F.TAEBENCH.columns([{"goal": "tae", "dataset": "d", "raw": 3, "label": 1, "label_pct": 33.3}]) == [
        ("goal", "goal", "s"), ("dataset", "seed dataset", "s"), ("raw", "raw", "d"), ("label", "after label", "d"),
        ("label_pct", "% of raw", ".1f")]


def _attempts(n: int, seed: int = 0) -> pa.Table:
    import random

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        status = rng.choice(["success", "failed", "skipped", "error"])
        rows.append({"recipe": rng.choice(["pwws", "deepwordbug", "textbugger"]), "goal": rng.choice(["tae", "bae"]),
                     "victim": "v", "status": status, "queries": rng.choice([None, 3, 11, 40]),
                     "reason": rng.choice(["query budget spent", "time limit reached"]) if status == "failed" else None,
                     "perturbed_pct": rng.random() * 40 if status == "success" else None,
                     "similarity": rng.choice([None, rng.random()]), "seconds": rng.choice([None, rng.random()]),
                     "more_examples": rng.choice([None, [], ["x"], ["x", "y"]])})
    return pa.Table.from_pylist(rows)


def _predictions(n: int, seed: int = 0) -> pa.Table:
    import random

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        ok = rng.random() < 0.9
        rows.append({"detector": rng.choice(["a", "b"]), "dataset": rng.choice(["d1", "d2", "d3"]),
                     "status": "ok" if ok else rng.choice(["error", "rejected"]),
                     "reason": None if ok else rng.choice(["TimeoutError: slow", "HTTPError: 503", "empty text"]),
                     "label": rng.choice([None, 0, 1, 1]), "pred_toxic": rng.choice([True, False]) if ok else None,
                     "toxic_score": rng.choice([rng.random(), 1 - 1e-9 * rng.random(), 0.5]) if ok else None,
                     "seconds": rng.random() if ok else None})
    return pa.Table.from_pylist(rows)


def _searches(n: int, seed: int = 0) -> pa.Table:
    import random

    from redline.actors.triggers.hits import HIT_TYPES, SEARCHES

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        ok = rng.random() < 0.8
        rows.append({"model": rng.choice(["m", "k"]), "list": rng.choice(["mal", "normal"]),
                     "target": f"t{rng.randrange(40)}", "search": rng.choice(SEARCHES),
                     "status": "ok" if ok else "skipped", "reason": None if ok else "out of vocabulary: x",
                     "hits": rng.sample(HIT_TYPES, rng.randrange(3)) if ok else None,
                     "reached": rng.random() < 0.4 if ok else None, "source_reaches": rng.choice([None, True, False]),
                     "objective": rng.random(), "source_objective": rng.random(), "seconds": rng.random(),
                     "sequences_scored": rng.randrange(100), "sweeps": rng.randrange(5)})
    return pa.Table.from_pylist(rows)


SHARDED = {"attack": (F.ATTACK, _attempts), "score": (F.SCORE, _predictions), "egregious": (F.EGREGIOUS, _searches),
           "sources": (F.EGREGIOUS_SOURCES, _searches), "effort": (F.EGREGIOUS_EFFORT, _searches),
           "outcomes": (F.outcomes("detector"), _predictions)}


@pytest.mark.parametrize("name", sorted(SHARDED))
def test_figures_summed_shard_by_shard_equal_those_of_all_rows_in_any_finishing_order(tmp_path, name):
    """A run's figures come from each output shard's partial sums, merged as shards finish (in any
    order, a resumed run's shards counted from its files): the same rows, in the same order, as the
    figures of the whole output at once."""
    import json

    from redline.cluster import storage
    from redline.cluster.runs import RunDir
    from redline.pipelines.plane import sharded

    class FakeRun:
        def __init__(self):
            self.manifest, self.dir = {}, RunDir(str(tmp_path / "run"))

    table, rows = SHARDED[name]
    whole = rows(600)
    shards = [whole.slice(i, 50) for i in range(0, whole.num_rows, 50)]
    expected = table.summarize(whole)
    assert len(expected) > 1
    run = FakeRun()
    for i in [5, 0, 11, 3, 7, 1, 9, 2, 10, 4]:  # shards 6 and 8: written, the run stopped before counting them
        sharded.count_figures(run, {"summary": table}, i, shards[i])
    sharded.count_figures(run, {"summary": table}, 5, shards[5])  # counted once, however often it is offered
    for i in (6, 8):
        storage.write_parquet(shards[i], run.dir.path("out", sharded.part_name(i)))
    parts = {(i,): sharded.part_name(i) for i in range(len(shards))}
    got = sharded.shard_summary(run, {"summary": table}, "out", parts)["summary"]
    assert [tuple(r[k.key] for k in table.keys) for r in got] == [tuple(r[k.key] for k in table.keys) for r in expected]
    for mine, theirs in zip(got, expected):
        assert mine.keys() == theirs.keys()
        for key, value in theirs.items():
            assert mine[key] == (pytest.approx(value) if isinstance(value, float) else value), key
    assert sorted(run.manifest["partials"]["summary"]["shards"]) == [[i] for i in range(len(shards))]
    assert json.loads(json.dumps(run.manifest))["partials"] == run.manifest["partials"]  # a manifest holds them


def test_a_figure_declares_how_it_is_computed_and_its_sums_merge():
    from redline.pipelines.reporting import aggregates as A

    asr = F.ATTACK.figure("asr").compute
    assert isinstance(asr, A.Ratio) and {a.name for a in asr.needs()} == {
        "sum rows where status=success", "sum rows where status in success,failed"}
    part = A.merge({("r",): {"sum rows": 2, "x": 1.5}}, {("q",): {"sum rows": 1}}, {("r",): {"sum rows": 3}})
    assert part == {("r",): {"sum rows": 5, "x": 1.5}, ("q",): {"sum rows": 1}}
    assert A.Mean("v").value({}) is None and A.Ratio(A.Count(), A.Count()).value({"sum rows": 0}) is None


def test_every_row_condition_counts_the_rows_a_brute_force_check_finds_and_keeps_its_name():
    """Each row condition of pipelines/reporting/aggregates.py, counted through the partial sums on hand-made rows
    with nulls, against the same condition evaluated row by row in Python (a null never counts, except
    where a condition says so: `differs` holds when either side is null). Its name keys the partial sum
    in manifests already written, so a renamed condition would orphan their sums on resume: pinned."""
    from redline.pipelines.reporting import aggregates as A

    rows = pa.table({
        "a": ["x", "y", None, "xz", "x", "ab"], "b": ["x", "z", None, None, "x", "ab"],
        "n": [1, 5, None, 3, 2, 7], "m": [1, 4, 2, None, 3, 9],
        "l": pa.array([["x"], [], None, ["y", "x"], ["z", None], ["x", "x"]], pa.list_(pa.string()))})
    py = rows.to_pylist()
    cases = [  # (condition, its name, the rows it holds for)
        (A.eq("a", "x"), "a=x", lambda r: r["a"] == "x"),
        (A.ne("a", "x"), "a!=x", lambda r: r["a"] is not None and r["a"] != "x"),
        (A.prefixed("a", "x"), "a x*", lambda r: r["a"] is not None and r["a"].startswith("x")),
        (A.not_prefixed("a", "x"), "a not x*", lambda r: r["a"] is not None and not r["a"].startswith("x")),
        (A.isin("a", ("y", "ab")), "a in y,ab", lambda r: r["a"] in ("y", "ab")),
        (A.valid("n"), "n set", lambda r: r["n"] is not None),
        (A.missing("n"), "n unset", lambda r: r["n"] is None),
        (A.greater("n", "m"), "n>m", lambda r: None not in (r["n"], r["m"]) and r["n"] > r["m"]),
        (A.at_most("n", "m"), "n<=m", lambda r: None not in (r["n"], r["m"]) and r["n"] <= r["m"]),
        (A.same("a", "b"), "a==b", lambda r: r["a"] is not None and r["a"] == r["b"]),
        (A.differs("a", "b"), "a<>b", lambda r: r["a"] is None or r["a"] != r["b"]),
        (A.same("a", "nope"), "a==nope", lambda r: False),
        (A.differs("a", "nope"), "a<>nope", lambda r: True),
        (A.has("l", "x"), "x in l", lambda r: r["l"] is not None and "x" in r["l"]),
        (A.both(A.eq("a", "x"), A.valid("n")), "a=x & n set", lambda r: r["a"] == "x" and r["n"] is not None),
    ]
    sums = A.partials(rows, (), [a for w, _, _ in cases for a in (A.Count(w), A.Sum("n", w))])[()]
    for where, name, holds in cases:
        assert where.name == name
        assert A.Count(where).value(sums) == sum(map(holds, py)), name
        assert A.Sum("n", where).value(sums) == sum(r["n"] or 0 for r in py if holds(r)), name
    assert A.both(None, A.valid("n")).name == "n set" and A.both(A.valid("n"), None).name == "n set"
    assert A.both(None, None) is None
    nulls = pa.table({"l": pa.nulls(3)})  # a list column of nulls only: nothing holds a value
    assert A.Count(A.has("l", "x")).value(A.partials(nulls, (), [A.Count(A.has("l", "x"))])[()]) == 0


# ---------------------------------------------------------------- the published declarations, pinned

PUBLISHED = Path(__file__).parent / "data" / "published_figures.json"


def _declared(table: F.Table) -> dict:
    def figure(f: F.Figure) -> list:
        how = None if f.compute is None else f"{type(f.compute).__name__}: " + " | ".join(
            p.name for p in f.compute.needs())
        return [f.key, f.label, f.format, f.better, f.short, f.shown, f.rollup_only, f.description, how]

    return {"keys": [figure(f) for f in table.keys], "values": [figure(f) for f in table.values],
            "brief": table.brief and list(table.brief), "headline": list(table.headline), "first_only": table.first_only,
            "by": list(table.by), "rollup": table.rollup, "where": table.where and table.where.name,
            "renamed": [list(r) for r in table.renamed]}


def published() -> dict:
    tables = {name: value for name, value in vars(F).items() if isinstance(value, F.Table)}
    tables["leaderboard(risk, offending)"] = F.leaderboard(("risk", "offending"))
    tables["outcomes(detector)"] = F.outcomes("detector")
    return {name: _declared(table) for name, table in sorted(tables.items())}


def test_published_figures_are_the_declared_ones():
    """What reports, cards, `--fail-if`, the summary CSV and JSON and anyone reading them rely on: each
    table's figures with their keys, headings, formats, better directions (ranks follow them), what they
    mean and which partial sums they are computed from. A change on purpose is rewritten with
    `REDLINE_UPDATE_PUBLISHED=1 pytest tests/test_figures.py -k published` and reviewed in the diff."""
    now = published()
    if os.environ.get("REDLINE_UPDATE_PUBLISHED"):  # a figure a line (JSON strings hold no raw newline)
        text = re.sub(r"\[\n\s+([^\[\]{}]*?)\n\s+\]", lambda m: "[" + re.sub(r"\n\s+", " ", m.group(1)) + "]",
                      json.dumps(now, indent=1))
        PUBLISHED.write_text(text + "\n")
    before = json.loads(PUBLISHED.read_text())
    changed = sorted(name for name in set(now) | set(before) if now.get(name) != before.get(name))
    assert not changed, f"published figures changed in {changed}: if on purpose, rewrite {PUBLISHED.name} (see docstring)"
    for table in now.values():  # every format formats a value of its kind
        for key, _, fmt, *_ in table["keys"] + table["values"]:
            format({"s": "x", "d": 3}.get(fmt, 0.25), fmt)


def test_a_rate_carries_the_count_it_is_a_share_of():
    """A rate's n (the viewer's compare page shows its interval) is the declared count of its
    denominator; a rate whose denominator no count declares, or a figure that is no ratio, has none."""
    assert F.TRANSFER.count_of(F.TRANSFER.figure("tae_rate")).key == "tae_n"
    assert F.TRANSFER.count_of(F.TRANSFER.figure("bae_rate")).key == "bae_n"
    assert F.TRANSFER.count_of(F.TRANSFER.figure("seed_rate")).key == "seed_n"
    assert F.TRANSFER.count_of(F.TRANSFER.figure("tae_n")) is None  # a count, not a rate
    assert F.ATTACK.count_of(F.ATTACK.figure("recipe")) is None  # a name
    board = F.leaderboard(("risk",))
    assert board.count_of(board.figure("no_answer")) is None  # of answered-or-empty responses: no such count
    assert board.count_of(board.figure("risk")) is None  # of the category's judged responses: not declared
    assert board.count_of(board.figure("overall")) is None  # a mean of rates


def test_a_rollup_gives_all_then_each_value_and_leaves_rollup_only_figures_to_all():
    rows = pa.table({"victim": ["a", "a", "a", "b", "b"], "dataset": ["d2", "d1", "d1", "d1", "d1"],
                     "status": ["ok", "ok", "error", "ok", "ok"], "split": ["tae", "tae", "tae", "seed", "tae"],
                     "pred_toxic": [False, True, None, False, True], "source": ["u", "u", "u", None, "u"]})
    got = F.TRANSFER.summarize(rows.rename_columns(["detector", *rows.column_names[1:]]))
    assert [(r["victim"], r["dataset"]) for r in got] == [
        ("a", "all"), ("a", "d1"), ("a", "d2"), ("b", "all"), ("b", "d1"), ("b", "d2")]
    by = {(r["victim"], r["dataset"]): r for r in got}
    assert by[("a", "all")]["tae_n"] == 2 and by[("a", "all")]["tae_rate"] == 0.5
    assert by[("a", "d1")]["tae_n"] == 1 and by[("a", "d1")]["tae_rate"] == 0.0
    assert by[("a", "d2")]["tae_rate"] == 1.0 and by[("a", "all")]["not_scored"] == 1
    assert by[("a", "d1")]["not_scored"] is None  # counted on `all` only
    assert by[("b", "d2")]["tae_n"] == 0 and by[("b", "d2")]["tae_rate"] is None  # a value b has no rows of
    assert by[("b", "all")]["seed_n"] == 1 and by[("b", "all")]["seed_rate"] == 1.0
    one = F.TRANSFER.summarize(rows.filter(pa.compute.equal(rows["dataset"], "d1")).rename_columns(
        ["detector", *rows.column_names[1:]]))
    assert [(r["victim"], r["dataset"]) for r in one] == [("a", "all"), ("b", "all")]  # one value: its `all` only


def test_a_table_counts_only_its_rows_and_reads_renamed_columns():
    searches = pa.Table.from_pylist([
        {"model": "m", "list": "l", "search": "s", "status": "ok", "source_reaches": True, "reached": True,
         "objective": 1.0, "source_objective": 0.5},
        {"model": "m", "list": "l", "search": "s", "status": "ok", "source_reaches": True, "reached": False,
         "objective": 1.0, "source_objective": 2.0},
        {"model": "m", "list": "l", "search": "s", "status": "ok", "source_reaches": True, "reached": False,
         "objective": 1.0, "source_objective": 1.0},
        {"model": "m", "list": "l", "search": "s", "status": "ok", "source_reaches": False, "reached": True,
         "objective": 1.0, "source_objective": 0.0},
        {"model": "m", "list": "l", "search": "s", "status": "skipped", "source_reaches": True, "reached": None,
         "objective": None, "source_objective": None}])
    row, = F.EGREGIOUS_SOURCES.summarize(searches)  # `where`: searched targets whose source reaches
    assert (row["reachable"], row["found"], row["local_optima"], row["objective_defects"]) == (3, 1 / 3, 1, 1)
    assert F.EGREGIOUS_SOURCES.summarize(searches.slice(3)) == []  # no row it counts: no group
    scored = pa.table({"detector": ["v"], "status": ["ok"], "dataset": ["x"], "split": ["tae"], "pred_toxic": [False],
                       "source": ["u"]})
    assert F.TRANSFER.partials(scored) == {("v", "x"): F.TRANSFER.partials(scored)[("v", "x")]}  # detector -> victim


def test_columns_headline_and_brief_are_read_from_the_declarations():
    rows = [{"detector": "a", "dataset": "all", "f1_toxic": 0.5}, {"detector": "b", "tp": 3, "precision_toxic": 1.0}]
    assert [c[0] for c in F.SCORE.columns(rows)] == [  # only the columns some row has; hidden ones never
        "detector", "dataset", "precision_toxic", "f1_toxic"]
    assert [c[0] for c in F.SCORE.columns(rows, brief=True)] == ["detector", "dataset", "f1_toxic"]
    assert F.SCORE.columns(brief=True) == [c for c in F.SCORE.columns() if c[0] in F.SCORE.brief]
    extra = F.category_figures(["risk"])
    assert F.DIASAFETY.columns(extra=extra, brief=True)[1] == ("risk", "risk", ".3f")  # extra kept when brief
    head = F.TRANSFER.headline_of()
    assert head.keys == ("victim", "dataset") and head.first_only is False
    assert head.values == (("tae_rate", "ASR TAE", ".3f"), ("bae_rate", "ASR BAE", ".3f"))  # short headings
    assert F.EGREGIOUS.headline_of().first_only is True
    with pytest.raises(KeyError):
        F.SCORE.figure("nope")
