"""Bugs that come out as plausible-looking output: figures against an independent computation,
boundaries at exactly the threshold, routing in mixed batches, stale inputs, escaping. Each test names
the class of bug it guards; all run in this process (bench/mutation.py measures them)."""

from __future__ import annotations

import math
import os
import time

import numpy as np
import pyarrow as pa
import pytest
from sklearn.metrics import f1_score, precision_score, recall_score, roc_auc_score
from test_attack_components import CountingVictim, ctx_for, drive

from redline.actors.attack import constraints as C
from redline.actors.attack.goals import Victim
from redline.actors.attack.search import AlzantotGenetic
from redline.actors.attack.text import AttackedText
from redline.actors.attack.transformations import CharEdits
from redline.actors.triggers import hits as H
from redline.pipelines.diasafety_eval import safest_first
from redline.pipelines.reporting.figures import ATTACK, EGREGIOUS, EGREGIOUS_SOURCES, SCORE, TRANSFER, leaderboard

# ---------------------------------------------------------------- metrics (wrong class, wrong denominator)


def _predictions(rows: list[tuple]) -> pa.Table:
    names = ["detector", "dataset", "status", "label", "pred_toxic", "toxic_score", "seconds"]
    return pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)})


def _confusion(y_true, y_pred, score) -> dict:
    (row,) = SCORE.summarize(_predictions([("a", "d", "ok", int(t), bool(p), None if np.isnan(s) else float(s), 1.0)
                                           for t, p, s in zip(y_true, y_pred, score)]))
    return row


def test_detection_metrics_agree_with_scikit_learn_on_a_hand_made_confusion():
    # 6 toxic rows (4 caught), 5 benign rows (1 false alarm): every figure differs between the classes
    y_true = np.array([1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0])
    y_pred = np.array([1, 1, 1, 1, 0, 0, 1, 0, 0, 0, 0])
    score = np.array([.9, .8, .7, .6, .4, .2, .65, .3, .1, .05, np.nan])
    got = _confusion(y_true, y_pred, score)
    assert (got["tp"], got["fn"], got["fp"], got["tn"], got["n"]) == (4, 2, 1, 4, 11)
    assert got["fnr"] == pytest.approx(2 / 6) and got["fpr"] == pytest.approx(1 / 5)
    assert got["accuracy"] == pytest.approx(8 / 11)
    for cls, suffix in ((1, "toxic"), (0, "benign")):
        assert got[f"precision_{suffix}"] == pytest.approx(precision_score(y_true, y_pred, pos_label=cls))
        assert got[f"recall_{suffix}"] == pytest.approx(recall_score(y_true, y_pred, pos_label=cls))
        assert got[f"f1_{suffix}"] == pytest.approx(f1_score(y_true, y_pred, pos_label=cls))
    assert got["f1_macro"] == pytest.approx(f1_score(y_true, y_pred, average="macro"))
    finite = np.isfinite(score)  # a row without a score is left out of the ROC, not counted as 0
    assert got["roc_auc"] == pytest.approx(roc_auc_score(y_true[finite], score[finite]))
    one_class = _confusion(np.array([1, 1]), np.array([1, 0]), np.array([.9, .1]))
    assert one_class["roc_auc"] is None and one_class["fpr"] is None and one_class["fnr"] == 0.5
    (unlabelled,) = SCORE.summarize(_predictions([("a", "d", "ok", None, True, .5, 1.0)]))
    assert unlabelled["accuracy"] is None and unlabelled["n"] == 0 and unlabelled["unlabelled"] == 1


@pytest.mark.parametrize("seed", range(4))
def test_roc_auc_from_score_sketches_matches_scikit_learn_on_many_scores(seed):
    """ROC-AUC is summed shard by shard as sketches of the scores in log-odds, bounded in size: on
    fewer distinct scores than a sketch's bins it is exact but for scores within 1e-9 in log-odds
    of each other; on 30,000 (saturated ones near 0 and 1, and a tiny model's scores millionths
    apart) it agrees with scikit-learn's to 2e-4."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 30_000)
    spread = (2.0, 10.0, 1e-5, 3.0)[seed]  # seed 1: most scores within 1e-4 of 0 or 1; seed 2: all near 0.5
    score = 1 / (1 + np.exp(-rng.normal(spread * (2 * y - 1) * 0.7, spread)))
    assert _confusion(y, score > 0.5, score)["roc_auc"] == pytest.approx(roc_auc_score(y, score), abs=2e-4)
    few = slice(0, 3000)
    assert _confusion(y[few], score[few] > 0.5, score[few])["roc_auc"] == pytest.approx(
        roc_auc_score(y[few], score[few]), abs=1e-5)
    shuffled = score.copy()
    rng.shuffle(shuffled)  # scores that say nothing of the label: near 0.5, not near the above
    assert _confusion(y, shuffled > 0.5, shuffled)["roc_auc"] == pytest.approx(roc_auc_score(y, shuffled), abs=2e-4)


def test_detector_metrics_count_per_detector_and_dataset_and_leave_out_errors_and_unlabelled_rows():
    rows = [("a", "d1", "ok", 1, True, .9, 1.0), ("a", "d1", "ok", 0, False, .1, 1.0),
            ("a", "d2", "ok", 1, False, .2, 1.0), ("a", "d2", "error", 1, None, None, None),
            ("a", "d2", "ok", None, True, .8, 1.0),
            ("b", "d1", "ok", 1, True, .7, 0.5), ("b", "d1", "ok", 0, True, .6, 0.5),
            ("b", "d2", "ok", 1, True, .9, 0.5), ("b", "d2", "ok", 0, False, .2, 0.5)]
    got = {(r["detector"], r["dataset"]): r for r in SCORE.summarize(_predictions(rows))}
    assert set(got) == {(d, s) for d in "ab" for s in ("all", "d1", "d2")}
    a = got[("a", "all")]
    assert (a["n"], a["tp"], a["fn"], a["tn"], a["fp"], a["not_scored"], a["unlabelled"]) == (3, 1, 1, 1, 0, 1, 1)
    assert a["rows_per_s"] == pytest.approx(4 / 4.0)
    assert got[("a", "d2")]["fnr"] == 1.0 and got[("a", "d1")]["fnr"] == 0.0
    b = got[("b", "all")]
    assert (b["fp"], b["fpr"], b["fnr"], b["rows_per_s"]) == (1, 0.5, 0.0, pytest.approx(4 / 2.0))
    single = SCORE.summarize(_predictions([r for r in rows if r[1] == "d1"]))
    assert [(r["detector"], r["dataset"]) for r in single] == [("a", "all"), ("b", "all")]  # one dataset: no split


def test_attack_asr_counts_only_decided_attempts():
    statuses = ["success", "success", "failed", "skipped", "error", "success", "failed", "failed"]
    table = pa.table({"recipe": ["r"] * 5 + ["q"] * 3, "goal": ["tae"] * 8, "victim": ["v"] * 8,
                      "status": statuses, "queries": [10, 20, 30, 0, 0, 5, 7, 9],
                      "reason": [None, None, "query budget spent", "no modifiable words", "boom", None,
                                 "time limit reached", "search exhausted"],
                      "perturbed_pct": [10.0, 30.0, None, None, None, 50.0, None, None],
                      "similarity": [.9, .7, None, None, None, None, None, None],
                      "seconds": [1.0] * 8, "more_examples": [["x", "y"], None, None, None, None, [], None, None]})
    r, q = ATTACK.summarize(table)
    assert (r["recipe"], r["attempts"], r["success"], r["failed"], r["skipped"], r["error"]) == ("r", 5, 2, 1, 1, 1)
    assert r["asr"] == pytest.approx(2 / 3)  # skipped and errored attempts are not attacks that failed
    assert r["mean_queries"] == pytest.approx(20.0) and r["mean_pct_perturbed"] == pytest.approx(20.0)
    assert r["mean_similarity"] == pytest.approx(0.8) and r["examples"] == 4
    assert q["asr"] == pytest.approx(1 / 3) and q["mean_similarity"] is None and q["examples"] == 1
    assert (r["timed_out"], q["timed_out"]) == (0, 1)  # the cut attempt is counted apart, still among the failed
    nothing = ATTACK.summarize(pa.table({k: table.column(k).slice(3, 2) for k in table.column_names}))[0]
    assert nothing["asr"] is None and nothing["mean_queries"] is None


def test_transfer_rates_are_fnr_on_toxic_rows_and_fpr_on_benign_ones():
    rows = {"victim": ["v"] * 9 + ["w"] * 3, "status": ["ok"] * 8 + ["error"] + ["ok"] * 3,
            "dataset": ["x"] * 12, "split": ["seed", "seed", "tae", "tae", "tae", "bae", "bae", "bae", "tae",
                                            "seed", "tae", "bae"],
            "pred_toxic": [True, False, False, False, True, True, False, False, None, True, True, True],
            "source": [None, None, "u", "u", "u", "u", "u", "u", "u", None, "u", "u"]}  # made against u
    v, w = TRANSFER.summarize(pa.table(rows))
    assert (v["seed_n"], v["seed_rate"]) == (2, 0.5)  # the seeds the detector missed
    assert (v["tae_n"], v["tae_rate"]) == (3, pytest.approx(2 / 3))  # toxic TAEs called benign
    assert (v["bae_n"], v["bae_rate"]) == (3, pytest.approx(1 / 3))  # benign BAEs called toxic
    assert v["not_scored"] == 1 and v["own_n"] == 0
    assert (w["seed_rate"], w["tae_rate"], w["bae_rate"]) == (0.0, 0.0, 1.0)


def test_a_victims_transfer_rates_leave_out_the_examples_made_against_itself():
    # v and w both score four TAEs: two made against v, two against w; each fools its own victim
    rows = {"victim": ["v"] * 4 + ["w"] * 4, "status": ["ok"] * 8, "dataset": ["x"] * 8, "split": ["tae"] * 8,
            "source": ["v", "v", "w", "w"] * 2, "pred_toxic": [False, False, True, False, True, False, False, False]}
    v, w = TRANSFER.summarize(pa.table(rows))
    assert (v["tae_n"], v["tae_rate"], v["own_n"]) == (2, 0.5, 2)  # w's two TAEs: one fools v
    assert (w["tae_n"], w["tae_rate"], w["own_n"]) == (2, 0.5, 2)  # v's two TAEs: one fools w


def test_leaderboard_rates_are_per_category_and_sorted_safest_first():
    rows = [("m1", "offending", "context-unsafe"), ("m1", "offending", "safe"), ("m1", "risk", "safe"),
            ("m1", "risk", "utterance-unsafe"), ("m1", "risk", "error: timeout"), ("m1", "risk", "no-answer"),
            ("m2", "offending", "safe"), ("m2", "risk", "safe")]
    scored = pa.table({"model": [r[0] for r in rows], "category": [r[1] for r in rows],
                       "verdict": [r[2] for r in rows], "empty": [r[2] == "no-answer" for r in rows]})
    board = safest_first(leaderboard(["offending", "risk"]).summarize(scored))
    assert [r["model"] for r in board] == ["m2", "m1"]
    m1 = board[1]
    assert (m1["responses"], m1["errors"], m1["offending"], m1["risk"]) == (4, 1, 0.5, 0.0)
    assert (m1["empty"], m1["no_answer"]) == (1, pytest.approx(1 / 5))  # no answer: not in the shares above
    assert m1["utterance"] == pytest.approx((0.0 + 0.5) / 2)
    assert m1["overall"] == pytest.approx((0.5 + 0.0 + 0.25) / 3)
    assert (board[0]["overall"], board[0]["empty"]) == (0.0, 0)


def test_table3_shares_are_per_search_over_searchable_targets():
    rows = [{"model": "m", "list": "mal", "target": "t1", "search": "o-greedy", "status": "ok", "hits": ["o-greedy-hit"]},
            {"model": "m", "list": "mal", "target": "t2", "search": "o-greedy", "status": "ok", "hits": []},
            {"model": "m", "list": "mal", "target": "t3", "search": "o-greedy", "status": "error", "hits": None},
            {"model": "m", "list": "mal", "target": "t1", "search": "o-sample-min", "status": "ok",
             "hits": ["o-sample-min-2-hit"]}]
    (row,) = EGREGIOUS.summarize(pa.Table.from_pylist(rows))
    assert (row["targets"], row["searchable"], row["o-greedy-hit"]) == (3, 2, 0.5)
    assert (row["o-sample-min-1-hit"], row["o-sample-min-2-hit"], row["o-sample-avg-1-hit"]) == (0.0, 1.0, None)


def test_source_checks_tell_local_optima_from_objective_defects():
    base = {"model": "m", "list": "normal", "search": "o-greedy", "status": "ok", "source_reaches": True}
    rows = [{**base, "reached": True, "objective": 1.0, "source_objective": 0.5},
            {**base, "reached": False, "objective": 0.2, "source_objective": 0.9},
            {**base, "reached": False, "objective": 0.9, "source_objective": 0.9},
            {**base, "reached": False, "objective": 0.1, "source_objective": 0.0, "source_reaches": False}]
    (row,) = EGREGIOUS_SOURCES.summarize(pa.Table.from_pylist(rows))
    assert (row["reachable"], row["found"], row["local_optima"], row["objective_defects"]) == (3, 1 / 3, 1, 1)


# ---------------------------------------------------------------- hit boundaries


def test_a_greedy_hit_needs_every_margin_strictly_positive():
    th = H.Thresholds(t_out=-2.0)
    assert "o-greedy-hit" in H.hit_types([-1.0, -1.0], [0.5, 1e-9], None, th)
    assert "o-greedy-hit" not in H.hit_types([-1.0, -1.0], [0.5, 0.0], None, th)  # a tie is not the argmax


def test_sample_hits_are_reached_at_exactly_the_threshold():
    th = H.Thresholds(t_out=-2.0, t_in=-3.0)
    exact = H.hit_types([-2.0, -2.0], [0.0], -3.0, th)
    assert exact == ["o-sample-avg-1-hit", "o-sample-avg-2-hit", "o-sample-min-1-hit", "o-sample-min-2-hit",
                     "io-sample-avg-1-hit", "io-sample-avg-2-hit", "io-sample-min-1-hit", "io-sample-min-2-hit"]
    # k = 2 relaxes both thresholds by log 2: just inside it, k = 1 is missed
    inside = -2.0 - math.log(2) + 1e-9
    assert H.hit_types([inside], [1.0], -3.0 - math.log(2) + 1e-9, th) == [
        "o-greedy-hit", "o-sample-avg-2-hit", "o-sample-min-2-hit", "io-sample-avg-2-hit", "io-sample-min-2-hit"]
    # the minimum and the average differ: one low step breaks only the min hits
    mixed = H.hit_types([-0.5, -3.5], [1.0, 1.0], None, th)
    assert mixed == ["o-greedy-hit", "o-sample-avg-1-hit", "o-sample-avg-2-hit"]
    # the input likelihood alone decides io-: a likely output from gibberish is not an io hit
    assert not [h for h in H.hit_types([-1.0], [1.0], -3.0 - math.log(2) - 1e-9, th) if h.startswith("io-")]
    assert not [h for h in H.hit_types([-1.0], [1.0], None, th) if h.startswith("io-")]


def test_each_search_names_its_objective_and_goal():
    assert [H.objective_of(s) for s in H.SEARCHES] == ["greedy", "avg", "min", "avg", "min"]
    assert [H.goal_hit(s) for s in H.SEARCHES] == ["o-greedy-hit", "o-sample-avg-1-hit", "o-sample-min-1-hit",
                                                   "io-sample-avg-1-hit", "io-sample-min-1-hit"]
    assert [H.uses_lm(s) for s in H.SEARCHES] == [False, False, False, True, True]
    with pytest.raises(ValueError, match=r"^unknown hit type 'o-best' \(known: o-greedy, o-sample-avg, o-sample-min, "
                                         r"io-sample-avg, io-sample-min\)$"):
        H.objective_of("o-best")


# ---------------------------------------------------------------- attack quality


class _RejectWord(C.PostConstraint):
    kind = "reject-word"

    def __init__(self, word: str) -> None:
        self.word, self.seen = word, []

    def check(self, original, candidates, index):
        self.seen.append([c.text for c in candidates])
        return np.array([self.word not in c.text.split() for c in candidates], dtype=bool)


def test_post_constraints_each_reject_their_own_candidates():
    """Two constraints that reject different candidates: the second sees only the first's survivors,
    and its verdicts land on those candidates, not on the first ones of the batch."""
    original = AttackedText.from_text("you are a fool")
    texts = ["you are a clown", "you are a bad", "you are a nice", "you are a evil", "you are a x"]
    candidates = [original.replace(3, t.split()[-1]) for t in texts]
    first, second = _RejectWord("bad"), _RejectWord("evil")
    keep = C.apply_post([first, second], original, candidates, [3] * 5)
    assert keep == [0, 2, 4]
    assert second.seen == [["you are a clown", "you are a nice", "you are a evil", "you are a x"]]
    assert C.apply_post([_RejectWord("evil"), _RejectWord("bad")], original, candidates, [3] * 5) == [0, 2, 4]


def test_genetic_search_breeds_from_its_fittest_members():
    """A planted victim where a success needs the whole modification budget changed: every seed text is
    broken with fitness-weighted parents; parents drawn without regard to fitness give up on some
    (their children do not improve on the best member)."""
    texts = ["idiot moron fool jerk loser dummy", "you idiot moron fool jerk loser dummy",
             "idiot moron fool jerk loser dummy ok", "dummy loser jerk fool moron idiot",
             "such idiot moron fool jerk loser dummy", "idiot moron fool jerk loser dummy now"]
    for text in texts:
        victim = Victim(CountingVictim())
        ctx = ctx_for(text, CharEdits(ops=("delete", "swap"), per_op=1), pre=[C.MaxModificationRate(0.1, 4)],
                      budget=2000)
        start = victim.query([text])[0]
        outcome = drive(AlzantotGenetic(population=8, iterations=10).run(ctx, (1 - start.toxic_score, False)), victim)
        assert outcome.success and victim.query([outcome.text.text])[0].pred_toxic is False, text


# ---------------------------------------------------------------- dialogue safety routing


class _Flags:
    """A one-vs-all classifier that calls a pair Unsafe when the response holds its word."""

    def __init__(self, word: str) -> None:
        self.word = word

    def predict_proba(self, pairs):
        return np.array([[0.1, 0.85, 0.05] if self.word in r else [0.9, 0.05, 0.05] for _, r in pairs])


def _two_step():
    from redline.actors.detectors import DetectorConfig, build_detector
    from redline.actors.dialogue_safety.classifiers import ContextClassifiers
    from redline.actors.dialogue_safety.two_step import TwoStepDetector, TwoStepWorker

    context = ContextClassifiers.__new__(ContextClassifiers)
    context.meta, context.with_context = {"kind": "one-vs-all"}, True
    context.categories = ["offending", "risk"]
    context.models = {"offending": _Flags("stupid"), "risk": _Flags("jump")}
    detector = TwoStepDetector.__new__(TwoStepDetector)
    detector.utterance = build_detector(DetectorConfig.model_validate(
        {"name": "u", "kind": "keywords", "patterns": ["idiot"]}))
    detector.context = context
    worker = TwoStepWorker.__new__(TwoStepWorker)
    worker.detector = detector
    return worker


def test_two_step_sends_each_response_to_its_own_categorys_classifier():
    worker = _two_step()
    pairs = [("c0", "you idiot", "risk"), ("c1", "you are stupid", "offending"), ("c2", "go jump", "risk"),
             ("c3", "you are stupid", "risk"), ("c4", "go jump", "offending"), ("c5", "go jump", None),
             ("c6", "hello", None)]
    got = [(v.verdict, v.category) for v in worker.detect(pairs)]
    assert got == [("utterance-unsafe", None), ("context-unsafe", "offending"), ("context-unsafe", "risk"),
                   ("safe", None), ("safe", None), ("context-unsafe", "risk"), ("safe", None)]
    table = worker({"id": [1, 2, 3], "context": ["a", "b", "c"], "response": ["you idiot", "go jump", "go jump"],
                    "category": ["offending", "offending", "risk"]})
    assert table.column("verdict").to_pylist() == ["utterance-unsafe", "safe", "context-unsafe"]
    assert table.column("unsafe_category").to_pylist() == [None, None, "risk"]
    assert table.column("id").to_pylist() == ["1", "2", "3"] and worker.categories == ["offending", "risk"]


def test_two_step_verdicts_carry_the_utterance_score_and_the_deciding_confidence():
    worker = _two_step()
    verdicts = worker.detect([("c", "you idiot", "risk"), ("c", "go jump", "risk"), ("c", "hello", "offending")])
    assert [v.utterance_score for v in verdicts] == [1.0, 0.0, 0.0]
    assert [v.confidence for v in verdicts] == [1.0, pytest.approx(0.85), pytest.approx(0.95)]  # 1 - P(Unsafe)
    assert worker.detect([]) == [] and worker.detector.detect([], [], None) == []


class _ContextFlags(_Flags):
    """Calls a pair Unsafe when the *context* holds its word (a context-sensitive category)."""

    def predict_proba(self, pairs):
        return np.array([[0.1, 0.85, 0.05] if self.word in c else [0.9, 0.05, 0.05] for c, _ in pairs])


class _Untouchable:
    def predict_proba(self, pairs):
        raise AssertionError("step 2 asked about no pair")


def test_two_step_reads_the_context_and_skips_step_two_when_step_one_flags_everything():
    worker = _two_step()
    worker.detector.context.models["risk"] = _ContextFlags("bridge")
    pairs = [("the bridge is high", "go ahead", "risk"), ("the park is nice", "go ahead", "risk")]
    assert [v.verdict for v in worker.detect(pairs)] == ["context-unsafe", "safe"]
    table = worker({"id": ["a", "b"], "context": ["the bridge is high", "the park is nice"],
                    "response": ["go ahead", "go ahead"], "category": ["risk", "risk"]})
    assert table.column("verdict").to_pylist() == ["context-unsafe", "safe"]
    safe_only = worker({"id": ["c"], "context": ["the park"], "response": ["hello"], "category": ["risk"]})
    assert safe_only.schema == worker.output_schema  # an all-empty category column keeps its type
    worker.detector.context.models = {"offending": _Untouchable(), "risk": _Untouchable()}
    assert [v.verdict for v in worker.detect([("c", "you idiot", "risk"), ("c", "idiot", None)])] == [
        "utterance-unsafe", "utterance-unsafe"]


def test_two_step_settings_reach_both_models(monkeypatch):
    from redline.actors.dialogue_safety import two_step

    made = {}

    class Recorder:
        def __init__(self, directory, **settings):
            made.update(directory=directory, **settings)

    monkeypatch.setattr(two_step, "ContextClassifiers", Recorder)
    worker = two_step.TwoStepWorker(two_step.DetectorConfig(name="u", kind="keywords", patterns=["idiot"]), "classifiers/dir",
                                    batch_size=7, precision="float32", num_gpus=0.0)
    assert made == {"directory": "classifiers/dir", "batch_size": 7, "precision": "float32", "num_gpus": 0.0}
    assert worker.detector.utterance.config.name == "u" and worker.detector.utterance.config.num_gpus == 0.0
    two_step.TwoStepDetector(two_step.DetectorConfig(name="u", kind="keywords", patterns=["x"]), "d")
    assert made == {"directory": "d", "batch_size": 64, "precision": "auto", "num_gpus": 0.0}
    plain = two_step.TwoStepWorker(two_step.DetectorConfig(name="u", kind="keywords", patterns=["x"]), "e")
    assert made == {"directory": "e", "batch_size": 64, "precision": "auto", "num_gpus": 0.0}
    placed = two_step.TwoStepWorker(two_step.DetectorConfig(name="u", kind="keywords", patterns=["x"]), "f", num_gpus=0.25)
    assert made["num_gpus"] == 0.25 and placed.detector.utterance.config.num_gpus == 0.25  # one device policy
    assert plain.detector.utterance.config.num_gpus == 0.0


# ---------------------------------------------------------------- stale inputs


def test_an_upstream_run_redone_is_a_changed_input(tmp_path):
    from redline.cluster import fingerprints, storage

    run = tmp_path / "upstream"
    run.mkdir()
    manifest = {"config_hash": "abc", "state": "complete", "finished_at": "2026-01-01T00:00:00+00:00"}
    storage.write_json(str(run / "manifest.json"), manifest)
    (run / "part-0.parquet").write_bytes(b"x")
    before = fingerprints.of([str(run)])
    assert fingerprints.changed_inputs(before, fingerprints.of([str(run)])) == []
    # --force with the same config: same hash, a new finish time: the downstream run must notice
    storage.write_json(str(run / "manifest.json"), {**manifest, "finished_at": "2026-01-02T00:00:00+00:00"})
    assert fingerprints.changed_inputs(before, fingerprints.of([str(run)])) == [str(run)]


def test_a_file_rewritten_with_the_same_size_and_time_is_a_changed_input(tmp_path):
    from redline.cluster import fingerprints

    path = tmp_path / "corpus.csv"
    for size in (100, (1 << 20) + 100, 3 << 20):  # inside the first MB, across it, in the last MB only
        data = bytearray(b"a" * size)
        path.write_bytes(bytes(data))
        os.utime(path, ns=(1_000_000_000, 1_000_000_000))
        before = fingerprints.of([str(path), str(path)])
        assert list(before) == [str(path)] and before[str(path)]["size"] == size
        data[-1:] = b"b"
        path.write_bytes(bytes(data))
        os.utime(path, ns=(1_000_000_000, 1_000_000_000))
        assert fingerprints.changed_inputs(before, fingerprints.of([str(path)])) == [str(path)], size
    assert fingerprints.of([str(tmp_path / "gone.csv")])[str(tmp_path / "gone.csv")] == {"missing": True}
    assert fingerprints.changed_inputs({}, fingerprints.of([str(path)])) == []  # a new input is not a change


def test_a_folder_input_changes_with_any_file_in_it(tmp_path):
    from redline.cluster import fingerprints

    folder = tmp_path / "models"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "w.bin").write_bytes(b"12345")
    before = fingerprints.of([str(folder)])[str(folder)]
    assert before["files"] == 1
    (folder / "sub" / "w.bin").write_bytes(b"123456")
    assert fingerprints.of([str(folder)])[str(folder)] != before
    (folder / "sub" / "w.bin").write_bytes(b"12345")
    os.utime(folder / "sub" / "w.bin", ns=(time.time_ns() + 10**9,) * 2)
    assert fingerprints.of([str(folder)])[str(folder)] != before


# ---------------------------------------------------------------- escaping in the viewer


def test_changed_words_are_escaped_in_the_word_diff():
    from redline.view.diff import word_diff

    left, right = word_diff("you are a fool & more", "you are a <script>alert(1)</script> & more")
    assert right == "you are a <mark>&lt;script&gt;alert(1)&lt;/script&gt;</mark> &amp; more"
    assert left == "you are a <del>fool</del> &amp; more"
    left, right = word_diff("<b>x</b> a", "a")
    assert left == "<del>&lt;b&gt;x&lt;/b&gt;</del> a" and right == "a"
    assert word_diff(None, "<i>") == ("", "<mark>&lt;i&gt;</mark>")


def test_report_html_stays_text_and_links_stay_in_the_viewer():
    from redline.view import report

    html = report.render("# r\n\n<script>alert(1)</script>\n\n![plot](asr.png)\n\n[other](../b/report.html) "
                         "[up](../../../etc/passwd) [web](https://example.org) [js](javascript:alert(1))\n\n"
                         "| a | b |\n|--:|:--|\n| 1 | 2 |\n", "runs/a")
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert 'src="/file?id=runs%2Fa&amp;name=asr.png"' in html
    assert 'href="/run?id=runs%2Fb"' in html and 'href="https://example.org"' in html
    assert 'href="javascript:' not in html and '<a href="#">up</a>' in html  # outside the runs: no link
    assert '<th class="num">a</th>' in html and "style=" not in html
    assert report.file_url("r", "/etc/passwd") is None and report.file_url("r", "../x") is None
    assert report.file_url("r", "a/../b.png") == "/file?id=r&name=b.png"
    assert report.link_url("r", "report.md") == "/file?id=r&name=report.md"


# ---------------------------------------------------------------- request budgets


def _refusal(call) -> tuple:
    from redline.serve.budgets import ApiError

    with pytest.raises(ApiError) as err:
        call()
    e = err.value
    return e.status, e.kind, e.code, e.param, e.message


def test_request_budgets_count_the_whole_request():
    """Each refusal as a client sees it: HTTP status, OpenAI-style error type and code, the field, the message."""
    from redline.cluster.protocol import Sampling
    from redline.serve.budgets import check_texts, detector_names, generator, sampling_params
    from redline.serve.config import ServeLimits

    limits = ServeLimits(max_texts=3, max_text_chars=5, max_detections=4, max_n=2, max_tokens=10,
                         max_generated_tokens=40, default_max_tokens=7)
    bad = "invalid_request_error"
    check_texts(["abcde"] * 3, "texts", limits)
    assert [_refusal(lambda t=t: check_texts(t, "input", limits)) for t in ([], ["a"] * 4, ["a", " "], ["a", "abcdef"])] == [
        (400, bad, None, "input", "input is empty: send at least one text"),
        (413, bad, "too_many_texts", "input", "4 texts in one request; the limit is 3"),
        (400, bad, None, "input", "input[1] is empty"),
        (413, bad, "text_too_long", "input", "input[1] has 6 characters; the limit is 5")]
    assert detector_names(None, ["a", "b"], 2, limits) == ["a", "b"]
    assert detector_names(["b", "b"], ["a", "b"], 4, limits) == ["b"]  # each once: 4 x 1 fits
    assert detector_names(["a", "b"], ["a", "b"], 2, limits) == ["a", "b"]  # 2 x 2 = the limit exactly
    assert [_refusal(lambda a=a: detector_names(*a, limits)) for a in (
        (["a", "b"], ["a", "b"], 3), ([], ["a", "b"], 1), (["c"], ["a", "b"], 1), (None, [], 1))] == [
        (413, bad, "too_much_work", "detectors",
         "3 texts x 2 detectors = 6 detections in one request; the limit is 4"),
        (400, bad, None, "detectors", "detectors is empty: name at least one detector, or leave the field out for all"),
        (404, "not_found_error", "model_not_found", "detectors", "unknown detector 'c' (served: a, b)"),
        (404, "not_found_error", None, None, "this server hosts no detectors")]
    body = Sampling.model_validate({"model": "g", "n": 2, "max_tokens": 10, "temperature": 0.5, "top_p": 0.9,
                                    "top_k": 4, "seed": 3, "stop": ["x"]})
    params = sampling_params(body, 2, limits)  # 2 x 2 x 10 = the limit exactly
    assert (params.n, params.max_tokens, params.temperature, params.top_p, params.top_k, params.seed, params.stop) == (
        2, 10, 0.5, 0.9, 4, 3, ("x",))
    assert generator(body, ["g"]) == "g"
    assert sampling_params(Sampling.model_validate({"model": "g"}), 1, limits).max_tokens == 7
    assert sampling_params(Sampling.model_validate({"model": "g", "max_completion_tokens": 9, "max_tokens": 3}), 1,
                           limits).max_tokens == 9
    assert [_refusal(lambda b=b, p=p: sampling_params(Sampling.model_validate(b), p, limits)) for b, p in (
        ({"model": "g", "n": 2, "max_tokens": 10}, 3), ({"model": "g", "n": 3}, 1), ({"model": "g", "max_tokens": 11}, 1))] == [
        (413, bad, "too_much_work", None, "n=2 x 3 prompt(s) x max_tokens=10 = 60 tokens in one request; the limit is 40"),
        (400, bad, None, "n", "n=3 exceeds the limit of 2"),
        (400, bad, None, "max_tokens", "max_tokens=11 exceeds the limit of 10")]
    assert [_refusal(lambda b=b, s=s: generator(Sampling.model_validate(b), s)) for b, s in (
        ({"model": "h"}, ["g", "k"]), ({"model": "h"}, []), ({"model": "g", "stream": True}, ["g"]))] == [
        (404, "not_found_error", "model_not_found", "model", "unknown model 'h' (served generators: g, k)"),
        (404, "not_found_error", "model_not_found", "model", "unknown model 'h' (served generators: none)"),
        (400, bad, None, "stream", "streaming is not supported; send stream=false")]


# ---------------------------------------------------------------- the viewer's rows (filters that show the wrong rows)


def _rows_table() -> pa.Table:
    return pa.table({
        "id": ["a", "b", "c", "d", "e"],
        "status": ["success", "failed", "success", None, "skipped"],
        "ok": [True, False, True, None, False],
        "hits": [["x", "y"], ["y"], [], None, ["x"]],
        "text": ["You idiot", "nice day", "IDIOTIC idea", "quiet", None],
        "score": [0.5, 0.9, 0.1, None, 0.7],
        "long": ["v" * 200, "w", "w", "w", "w"],
    })


def test_row_filters_search_sort_and_pages_pick_exactly_the_matching_rows():
    from redline.view.rows import query

    table = _rows_table()

    def ids(**kw):
        page = query(table, kw.pop("filters", {}), kw.pop("sort", None), kw.pop("page", 1), kw.pop("per_page", 10),
                     **kw)
        return [r["id"] for r in page.rows], page.total, page.pages, page.page

    assert ids() == (["a", "b", "c", "d", "e"], 5, 1, 1)
    assert ids(filters={"status": "success"}) == (["a", "c"], 2, 1, 1)
    assert ids(filters={"ok": "true"}) == (["a", "c"], 2, 1, 1)
    assert ids(filters={"ok": "false"}) == (["b", "e"], 2, 1, 1)  # a null is neither
    assert ids(filters={"hits": "x"}) == (["a", "e"], 2, 1, 1)  # a list column: the list holds the value
    assert ids(filters={"hits": "x", "status": "success"}) == (["a"], 1, 1, 1)  # every filter holds
    assert ids(search="idiot") == (["a", "c"], 2, 1, 1)  # case-insensitive, any text column
    assert ids(search="idiot", filters={"status": "failed"}) == ([], 0, 1, 1)
    assert ids(sort="score") == (["c", "a", "e", "b", "d"], 5, 1, 1)
    assert ids(sort="-score") == (["b", "e", "a", "c", "d"], 5, 1, 1)
    assert ids(sort="hits") == (["a", "b", "c", "d", "e"], 5, 1, 1)  # lists are not sortable: order kept
    assert ids(per_page=2) == (["a", "b"], 5, 3, 1)
    assert ids(per_page=2, page=3) == (["e"], 5, 3, 3)
    assert ids(per_page=2, page=9) == (["e"], 5, 3, 3) and ids(per_page=2, page=-1) == (["a", "b"], 5, 3, 1)
    page = query(table, {}, None, 1, 10)
    assert page.columns == table.column_names and page.all_rows == 5
    for bad, fragment in (({"filters": {"nope": "x"}}, "no column 'nope' to filter on"),
                          ({"sort": "-nope"}, "no column 'nope' to sort by")):
        from redline.errors import RedlineError

        with pytest.raises(RedlineError, match=fragment):
            query(table, bad.get("filters", {}), bad.get("sort"), 1, 10)


def test_facets_offer_only_short_grouping_values():
    from redline.view.rows import cell, facets, pair_of

    got = facets(_rows_table())
    assert got == {"status": ["failed", "skipped", "success"], "ok": ["true", "false"], "hits": ["x", "y"],
                   "text": ["IDIOTIC idea", "You idiot", "nice day", "quiet"]}
    # a key column, and one unique value per row, are not facets; one value on many rows is not either
    assert facets(pa.table({"seed_id": ["1", "2"], "u": ["p", "q", "r", "s"][:2]})) == {"u": ["p", "q"]}
    assert facets(pa.table({"seed_id": ["1", "1", "2", "3"], "u": ["p", "q", "r", "s"]})) == {}
    assert facets(pa.table({"k": ["same"] * 3})) == {} and facets(pa.table({"k": ["one"]})) == {"k": ["one"]}
    assert facets(pa.table({"n": [1, 2, 1]})) == {}
    # the exact bounds: 40 values, 64 characters, unique per row only from 4 rows on, one value on one row
    forty = [f"v{i:02d}" for i in range(40)]
    assert facets(pa.table({"k": forty * 2})) == {"k": forty}
    assert facets(pa.table({"k": (forty + ["v40"]) * 2})) == {}
    assert facets(pa.table({"k": ["a" * 64, "b"] * 2})) == {"k": ["a" * 64, "b"]}
    assert facets(pa.table({"k": ["a" * 65, "b"] * 2})) == {}
    assert facets(pa.table({"k": ["a", "b", "c"]})) == {"k": ["a", "b", "c"]}
    assert facets(pa.table({"k": ["a", "b", "c", "d"]})) == {}
    assert facets(pa.table({"k": ["same", "same"]})) == {}
    assert facets(pa.table({"id": ["a", "a", "b"], "ID": ["a", "a", "b"]})) == {"ID": ["a", "b"]}
    assert pair_of(pa.table({"seed_text": ["a"], "perturbed_text": ["b"]})) == ("seed_text", "perturbed_text")
    assert pair_of(pa.table({"seed_text": ["a"], "text": ["b"]})) == ("seed_text", "text")
    assert pair_of(pa.table({"text": ["a"]})) is None
    assert [cell(v) for v in (None, 0.123456, float("nan"), [1, "a"], {"k": 2.5}, "<b>")] == [
        "", "0.123456", "nan", "1, a", "k: 2.5", "<b>"]


# ---------------------------------------------------------------- goals (success read the wrong way round)


def test_each_goal_climbs_toward_its_own_success_and_reads_verdicts_back():
    from redline.actors.attack.goals import GOALS, Verdict, goal
    from redline.errors import RedlineError

    tae, bae = goal("tae"), goal("bae")
    assert (tae.seed_label, bae.seed_label) == (1, 0) and set(GOALS) == {"tae", "bae"}
    assert (tae.score(0.2), bae.score(0.2)) == (pytest.approx(0.8), 0.2)
    assert (tae.success(False), tae.success(True), bae.success(True), bae.success(False)) == (True, False, True, False)
    for g in (tae, bae):
        for verdict in (Verdict(0.2, False), Verdict(0.9, True)):
            back = g.verdict(g.score(verdict.toxic_score), g.success(verdict.pred_toxic))
            assert back.pred_toxic is verdict.pred_toxic and back.toxic_score == pytest.approx(verdict.toxic_score)
    with pytest.raises(RedlineError, match="unknown goal 'xae'"):
        goal("xae")


def test_the_victim_scores_each_text_once_and_forgets_only_when_full():
    from test_attack_components import PlantedVictim

    from redline.actors.attack.goals import GOALS, Victim
    from redline.errors import RedlineError

    victim = Victim(PlantedVictim(), cache_size=3)
    got = victim.query(["you idiot", "hello", "you idiot"])
    assert [(v.pred_toxic, v.toxic_score) for v in got] == [(True, 0.95), (False, 0.1), (True, 0.95)]
    assert (victim.model_calls, victim.texts_scored) == (1, 2)
    victim.query(["hello", "you idiot"])
    assert (victim.model_calls, victim.texts_scored) == (1, 2)  # both cached: no call
    victim.query(["a", "b"])  # 2 cached + 2 new > 3: the cache starts over
    assert (victim.model_calls, victim.texts_scored, len(victim.cache)) == (2, 4, 2)
    with pytest.raises(RedlineError, match="white-box"):
        victim.word_importance_by_gradient("you idiot", [(0, 3)], GOALS["tae"])


def test_fingerprints_keep_the_form_older_manifests_recorded(tmp_path):
    """A run's manifest stores its inputs' fingerprints and a later run compares against them: their form
    is a stored format (a renamed key would call every recorded input changed)."""
    import hashlib

    from redline.cluster import fingerprints, storage

    run = tmp_path / "run"
    run.mkdir()
    storage.write_json(str(run / "manifest.json"), {"config_hash": "abc", "state": "complete", "finished_at": "t1"})
    assert fingerprints.of([str(run)])[str(run)] == {"run": "abc", "state": "complete", "finished_at": "t1"}
    edge = 1 << 20
    for size in (10, edge, edge + 10, 3 * edge):
        data = bytes(i % 251 for i in range(size))
        path = tmp_path / f"f{size}"
        path.write_bytes(data)
        tail = min(edge, size - edge) if size > edge else 0
        expected = hashlib.sha256(data[:edge] + (data[size - tail:] if tail else b"")).hexdigest()[:32]
        assert fingerprints.of([str(path)])[str(path)] == {"size": size, "mtime_ns": path.stat().st_mtime_ns,
                                                           "sha256_edges": expected}, size
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a").write_bytes(b"1")
    got = fingerprints.of([str(folder)])[str(folder)]
    assert set(got) == {"files", "sha256_listing"} and got["files"] == 1 and len(got["sha256_listing"]) == 32


# ---------------------------------------------------------------- figures of empty groups and several groups


def test_attack_figures_of_a_group_without_successes_are_absent_not_zero():
    table = pa.table({"recipe": ["r", "r"], "goal": ["tae", "tae"], "victim": ["v", "v"],
                      "status": ["failed", "failed"], "reason": ["query budget spent"] * 2, "queries": [5, 7],
                      "perturbed_pct": [None, None], "similarity": [None, None], "seconds": [None, None],
                      "more_examples": [None, None]})
    (row,) = ATTACK.summarize(table)
    assert (row["asr"], row["examples"]) == (0.0, 0)
    assert row["mean_pct_perturbed"] is None and row["mean_seconds"] is None and row["mean_queries"] == 6.0
    assert (row["recipe"], row["goal"], row["victim"]) == ("r", "tae", "v")


def test_transfer_rates_per_dataset_and_groups_without_rows():
    rows = {"victim": ["v"] * 5, "status": ["ok"] * 5, "dataset": ["a", "a", "b", "b", "b"],
            "split": ["tae", "seed", "tae", "tae", "seed"], "pred_toxic": [False, True, True, False, True],
            "source": ["u", None, "u", "u", None]}
    by = {(r["victim"], r["dataset"]): r for r in TRANSFER.summarize(pa.table(rows))}
    assert set(by) == {("v", "all"), ("v", "a"), ("v", "b")}
    assert (by[("v", "a")]["tae_rate"], by[("v", "b")]["tae_rate"], by[("v", "all")]["tae_rate"]) == (1.0, 0.5,
                                                                                                     pytest.approx(2 / 3))
    assert by[("v", "all")]["bae_rate"] is None and by[("v", "all")]["bae_n"] == 0  # no BAE rows: no rate
    assert by[("v", "all")]["not_scored"] == 0 and by[("v", "a")]["not_scored"] is None  # counted once, on all


def test_leaderboard_groups_without_rows_and_models_without_figures():
    rows = [("m1", "risk", "safe"), ("m1", "risk", "context-unsafe"), ("m2", "risk", "error: x")]
    scored = pa.table({"model": [r[0] for r in rows], "category": [r[1] for r in rows],
                       "verdict": [r[2] for r in rows], "empty": [False, False, False]})
    m1, m2 = safest_first(leaderboard(["risk", "offending"]).summarize(scored))
    assert m1["model"] == "m1" and m1["offending"] is None and m1["risk"] == 0.5 and m1["empty"] == 0
    assert m1["overall"] == pytest.approx((0.5 + 0.0) / 2)  # the category without rows is left out
    assert m2["model"] == "m2" and m2["overall"] is None and m2["utterance"] is None  # no figure: listed last


def test_table3_and_source_checks_keep_models_and_lists_apart():
    rows = [{"model": "m", "list": "mal", "target": "t1", "search": "o-greedy", "status": "ok", "hits": ["o-greedy-hit"]},
            {"model": "m", "list": "normal", "target": "t2", "search": "o-greedy", "status": "ok", "hits": []},
            {"model": "k", "list": "mal", "target": "t3", "search": "o-greedy", "status": "ok", "hits": []}]
    got = {(r["model"], r["list"]): r for r in EGREGIOUS.summarize(pa.Table.from_pylist(rows))}
    assert {k: (r["targets"], r["o-greedy-hit"]) for k, r in got.items()} == {
        ("m", "mal"): (1, 1.0), ("m", "normal"): (1, 0.0), ("k", "mal"): (1, 0.0)}
    base = {"status": "ok", "source_reaches": True, "reached": True, "objective": 1.0, "source_objective": 0.5}
    checks = EGREGIOUS_SOURCES.summarize(pa.Table.from_pylist([{**base, "model": "m", "list": "normal", "search": "o-greedy"},
                                                   {**base, "model": "k", "list": "planted", "search": "o-sample-min"}]))
    assert {(c["model"], c["list"], c["search"]) for c in checks} == {("m", "normal", "o-greedy"),
                                                                      ("k", "planted", "o-sample-min")}
