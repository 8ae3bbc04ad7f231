"""Figures a report or card publishes, each against an independent computation on hand-made rows:
intervals against scipy and the normal approximation, sketches merged across resolutions against
scikit-learn, and the index's pruning where a range ends exactly on a part's bound."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest


@pytest.mark.parametrize("successes,n", [(0, 8), (1, 8), (4, 8), (8, 8), (3, 22), (17, 22), (50, 100), (999, 1000),
                                         (1, 10_000), (4_321, 9_876)])
def test_wilson_matches_scipy(successes, n):
    from scipy.stats import binomtest

    from redline.pipelines.reporting.uncertainty import wilson

    reference = binomtest(successes, n).proportion_ci(confidence_level=0.95, method="wilson")
    low, high = wilson(successes, n)
    assert low == pytest.approx(reference.low, abs=1e-9) and high == pytest.approx(reference.high, abs=1e-9)


def test_the_bootstrap_interval_is_a_95_percent_one():
    """One category, 400 contexts of one judged response each, 200 unsafe: the percentile interval's
    ends sit where the normal approximation puts a 95% interval (p +- 1.96 SE), not a 90% one
    (+- 1.645 SE, 0.008 narrower on each side)."""
    from redline.pipelines.reporting.uncertainty import bootstrap_dialogue

    n, unsafe = 400, 200
    per_context = [{"category": "c", "judged": 1, "context_unsafe": 0, "utterance_unsafe": int(i < unsafe)}
                   for i in range(n)]
    low, high = bootstrap_dialogue(per_context, draws=20_000, seed=1)["utterance"]
    p, se = unsafe / n, math.sqrt(0.25 / n)
    assert low == pytest.approx(p - 1.96 * se, abs=0.004) and high == pytest.approx(p + 1.96 * se, abs=0.004)


def test_sketches_of_two_resolutions_merge_at_the_coarser():
    """20,000 rows (their sketch coarsened to fit its bins) merged with 3,000 (still at full
    resolution): the merged ROC-AUC is scikit-learn's on all 23,000 rows, in either order."""
    from sklearn.metrics import roc_auc_score

    from redline.pipelines.reporting import aggregates as A

    rng = np.random.default_rng(7)

    def rows(n: int) -> pa.Table:
        label = rng.integers(0, 2, n)
        score = 1 / (1 + np.exp(-(rng.normal(0, 1.5, n) + 1.4 * label)))
        return pa.table({"score": score, "label": label.astype(np.int64)})

    big, small = rows(20_000), rows(3_000)
    roc = A.RocAuc("score", "label")
    first, second = (A.partials(t, (), roc.needs())[()] for t in (big, small))
    levels = {s["level"] for s in first.values()}, {s["level"] for s in second.values()}
    assert max(levels[0]) < min(levels[1])  # the big one was coarsened, the small one was not
    both = pa.concat_tables([big, small])
    exact = roc_auc_score(both.column("label").to_numpy(), both.column("score").to_numpy())
    for a, b in ((first, second), (second, first)):
        assert roc.value(A.add(dict(a), b)) == pytest.approx(exact, abs=0.002)


def _coarsened(counts: dict[str, int], shift: int) -> dict[str, int]:
    """The reference: each bin's rows into the bin `shift` levels coarser (Python's floor division),
    bins in the order they first appear."""
    out: dict[str, int] = {}
    for key, n in counts.items():
        k = str(int(key) // 2 ** shift)
        out[k] = out.get(k, 0) + n
    return out


@pytest.mark.parametrize("seed", range(7))
def test_a_sketch_coarsens_and_bounds_as_floor_division_one_level_at_a_time(seed):
    """`coarsen` and `bounded` (vectorised) against the plain definition: floor division of every key,
    bins in order of first appearance, and a sketch over `SKETCH_BINS` halved until it fits (negative
    keys, shifts past the keys' width and bins that just fit included)."""
    from redline.pipelines.reporting import aggregates as A

    rng = np.random.default_rng(seed)
    n = [0, 5, A.SKETCH_BINS, A.SKETCH_BINS + 1, 9_000, 20_000, 50][seed]
    spread = [10, 2**12, 2**20, 2**30, 2**36, 2**36, 2**63 - 1][seed]
    keys = rng.integers(-spread, spread, n)
    counts: dict[str, int] = {}
    for k, c in zip(keys.tolist(), rng.integers(1, 6, n).tolist()):
        counts[str(k)] = counts.get(str(k), 0) + c
    sketch = {"level": 30, "counts": counts}
    for shift in (0, 1, 3, 17, 40, 62, 63, 70):
        got = A.coarsen(sketch, 30 - shift)
        assert got["level"] == 30 - shift and list(got["counts"].items()) == list(_coarsened(counts, shift).items())
    expected, level = dict(counts), 30
    while len(expected) > A.SKETCH_BINS:
        expected, level = _coarsened(expected, 1), level - 1
    got = A.bounded(sketch)
    assert got["level"] == level and list(got["counts"].items()) == list(expected.items())


def test_a_shards_sketch_per_group_is_the_plain_histogram_of_that_groups_rows():
    """A shard's sketches grouped by a column that holds nulls: each group's sketch is the histogram of
    its own counted rows' log-odds bins (floor(logit(p) * 2**30), NaN and other labels left out),
    halved until it fits `SKETCH_BINS`, computed here in plain Python."""
    from redline.pipelines.reporting import aggregates as A

    rng = np.random.default_rng(11)
    n = 12_000
    group = rng.choice(["a", "b", None], n, p=[0.6, 0.3, 0.1]).tolist()
    label = rng.integers(0, 2, n).tolist()
    score = [float("nan") if rng.random() < 0.03 else float(x) for x in rng.random(n)]
    table = pa.table({"g": group, "label": label, "score": score})
    roc = A.RocAuc("score", "label")
    found = A.partials(table, ("g",), roc.needs())
    assert set(found) == {("a",), ("b",), (None,)}
    for (g,), sums in found.items():
        for sketch, positive in zip(roc.sketches(), (1, 0)):
            bins: dict[str, int] = {}
            for gg, y, p in zip(group, label, score):
                if gg == g and y == positive and not math.isnan(p):
                    p = min(max(p, 1e-15), 1 - 1e-15)
                    key = str(math.floor(math.log(p / (1 - p)) * 2**30))
                    bins[key] = bins.get(key, 0) + 1
            level = 30
            while len(bins) > A.SKETCH_BINS:
                bins, level = _coarsened(bins, 1), level - 1
            assert sums[sketch.name] == {"level": level, "counts": bins}


@pytest.mark.parametrize("bounds,expected", [
    ((0.5, None), 3),     # from the part's greatest value: its rows at 0.5 match
    ((None, 0.1), 2),     # up to the part's least value
    ((0.1, 0.5), 5),      # exactly the part's range: every row
    ((0.5000001, None), 0), ((None, 0.0999999), 0),
])
def test_the_index_prunes_a_part_only_when_no_row_can_match(bounds, expected):
    """A range that ends exactly on a part's bound still reads (or counts) that part's rows."""
    from redline.pipelines.plane.table_index import known_rows, part_stats

    table = pa.table({"toxic_score": [0.1, 0.1, 0.5, 0.5, 0.5]})
    stats = part_stats("p", 1, table, [])
    known = known_rows(stats, {}, {"toxic_score": bounds})
    truth = sum(1 for v in table.column("toxic_score").to_pylist()
                if (bounds[0] is None or v >= bounds[0]) and (bounds[1] is None or v <= bounds[1]))
    assert truth == expected
    assert known in (None, truth)  # None: the planner reads the part, and counts it exactly
    if expected == 0 or expected == table.num_rows:
        assert known == expected


def _expected_direction(key: str) -> str:
    """Which way is better for the guard or the chatbot a card describes, from what the key measures
    (written here from the definitions, not read from any declaration)."""
    last = key.rsplit(".", 1)[-1]
    if last in ("precision", "recall", "f1", "auprc", "mean_queries"):  # more work for an attacker is better
        return "higher"
    if last.startswith("asr_") or last in ("fpr", "no_answer", "hit_rate") or key.startswith("dialogue.unsafe."):
        return "lower"
    raise AssertionError(f"no expectation written for {key}")


def test_every_card_figure_points_the_way_its_meaning_does():
    """A flipped direction inverts every card's ranks; each card figure is checked against an
    expectation written from its meaning, and against the pipeline figure it restates (the attack
    table speaks for the attacker, so its directions are the card's inverted)."""
    from redline.pipelines.reporting import card_figures as C
    from redline.pipelines.reporting import figures as F

    for figure in C.FIGURES:
        assert figure.better == _expected_direction(figure.key), figure.key
    score = {v.key: v.better for v in F.SCORE.values}
    attack = {v.key: v.better for v in F.ATTACK.values}
    flip = {"higher": "lower", "lower": "higher"}
    same = {"guard.clean.precision": score["precision_toxic"], "guard.clean.recall": score["recall_toxic"],
            "guard.clean.f1": score["f1_toxic"], "guard.clean.fpr": score["fpr"], "guard.clean.auprc": score["auprc"],
            "guard.white_box.asr_tae": flip[attack["asr"]], "guard.white_box.asr_bae": flip[attack["asr"]],
            "guard.white_box.mean_queries": flip[attack["mean_queries"]],
            "guard.transfer.asr_tae": score["fnr"], "guard.transfer.asr_bae": score["fpr"]}
    for key, better in same.items():
        assert C.BY_KEY[key].better == better, key


def test_the_index_counts_filters_and_ranges_from_a_parts_figures():
    """What the index says of a part without reading it: a count when its figures decide, 0 when no row
    can match, None when the rows must be read."""
    from redline.pipelines.plane.table_index import known_rows, part_stats

    table = pa.table({"detector": ["a", "a", "b", "b", "b", None], "goal": ["tae", "bae", "tae", "tae", "bae", "tae"],
                      "kept": [True, False, True, True, None, False],
                      "score": [0.1, 0.2, 0.3, None, 0.5, float("nan")], "n": [1, 2, 3, 4, 5, 6],
                      "empty": pa.array([None] * 6, pa.float64()), "text": ["x"] * 6})
    stats = part_stats("p", 1, table, ["detector", "goal", "kept"])
    assert known_rows(stats, {"detector": "b"}, {}) == 3 and known_rows(stats, {"detector": "zzz"}, {}) == 0
    assert known_rows(stats, {"kept": "true"}, {}) == 3 and known_rows(stats, {"kept": "yes"}, {}) is None
    assert known_rows(stats, {"detector": "b", "goal": "tae"}, {}) == 2  # the pair's own count, not a guess
    assert known_rows(stats, {"detector": "a", "goal": "bae"}, {}) == 1
    assert known_rows(stats, {"text": "x"}, {}) is None  # not a counted column
    assert known_rows(stats, {}, {"n": (1, 6)}) == 6 and known_rows(stats, {}, {"n": (None, None)}) == 6
    assert known_rows(stats, {}, {"n": (7, None)}) == 0 and known_rows(stats, {}, {"n": (None, 0)}) == 0
    assert known_rows(stats, {}, {"n": (6, None)}) is None and known_rows(stats, {}, {"n": (None, 1)}) is None
    assert known_rows(stats, {}, {"score": (0.1, 0.5)}) is None  # null and NaN rows fall outside every range
    assert known_rows(stats, {}, {"empty": (0, 1)}) == 0 and known_rows(stats, {}, {"text": (0, 1)}) is None
    assert known_rows(stats, {"detector": "b"}, {"n": (1, 6)}) == 3  # every row in range: the filter decides
    assert known_rows(stats, {"detector": "b"}, {"n": (7, 9)}) == 0
    assert known_rows(stats, {"detector": "b"}, {"n": (3, 6)}) is None  # two partial answers: read the part
