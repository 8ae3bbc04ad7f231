"""The card's uncertainty and its release gate, on hand-computed cases."""

from __future__ import annotations

import pyarrow as pa
import pytest

from redline.errors import RedlineError
from redline.pipelines.reporting import aggregates as A
from redline.pipelines.reporting import card_figures as F
from redline.pipelines.reporting import figures as declared
from redline.pipelines.reporting import gates
from redline.pipelines.reporting.uncertainty import proportion, wilson


def test_wilson_intervals_match_hand_computed_cases():
    # 4 of 8 (the quickstart card's trigger figure): p = 0.5, z = 1.96,
    # centre 0.5, half-width 1.96 * sqrt(0.25/8 + 1.96^2/256) / (1 + 1.96^2/8) = 0.2848
    low, high = wilson(4, 8)
    assert low == pytest.approx(0.2152, abs=1e-4) and high == pytest.approx(0.7848, abs=1e-4)
    assert wilson(0, 10) == (0.0, pytest.approx(0.2775, abs=1e-4))  # never below 0, never a point at 0
    assert wilson(90, 90)[1] == 1.0 and wilson(90, 90)[0] == pytest.approx(0.9591, abs=1e-4)
    assert wilson(0, 0) is None
    with pytest.raises(ValueError):
        wilson(5, 4)


def test_a_proportion_carries_its_n_and_says_whether_it_is_conclusive():
    small = proportion(0.5, 8)
    assert small["n"] == 8 and small["conclusive"] is False  # 0.22-0.78: too wide to read
    large = proportion(0.5, 2000)
    assert large["conclusive"] is True and large["high"] - large["low"] < 0.05
    assert proportion(None, 0) == {"value": None, "n": 0, "low": None, "high": None, "conclusive": False}


FIGURES = {"guard.transfer.asr_tae": {**proportion(0.412, 90)}, "triggers.hit_rate": {**proportion(0.5, 8)}}
KEYS = ("guard.transfer.asr_tae", "guard.transfer.asr_bae", "triggers.hit_rate")


def test_fail_if_rules_hold_fail_closed_and_are_checked_before_a_run():
    rules = gates.parse(["guard.transfer.asr_tae > 0.3", "triggers.hit_rate.high >= 0.9",
                         "guard.transfer.asr_tae.n < 100", "guard.transfer.asr_bae <= 0.1"], KEYS)
    failing = gates.failures(rules, FIGURES)
    assert failing[0].startswith("--fail-if 'guard.transfer.asr_tae > 0.3' holds: guard.transfer.asr_tae.value is "
                                 "0.412 (n 90, 95% ")
    assert failing[1].startswith("--fail-if 'guard.transfer.asr_tae.n < 100' holds")
    assert failing[2] == ("--fail-if 'guard.transfer.asr_bae <= 0.1': the run has no guard.transfer.asr_bae.value "
                          "to check")
    assert len(failing) == 3  # the trigger rate's upper end is 0.78: that rule does not hold
    with pytest.raises(RedlineError, match="no figure 'guard.asr'"):
        gates.parse(["guard.asr > 0.3"], KEYS)
    for bad in ("guard.transfer.asr_tae >> 0.3", "guard.transfer.asr_tae > x", "rm -rf / > 1"):
        with pytest.raises(RedlineError, match="expected FIGURE"):
            gates.parse([bad], KEYS)


def test_the_dialogue_bootstrap_resamples_contexts_and_covers_the_figure():
    from redline.pipelines.reporting.uncertainty import bootstrap_dialogue

    # two categories of 10 contexts, 2 judged responses each: a has 4 context-unsafe responses, b none;
    # 2 utterance-unsafe in b. Overall = mean(4/20, 0/20, utterance mean(0/20, 2/20)) = (0.2 + 0 + 0.05) / 3
    ctx = [{"category": "a", "judged": 2, "context_unsafe": int(i < 2) * 2, "utterance_unsafe": 0} for i in range(10)]
    ctx += [{"category": "b", "judged": 2, "context_unsafe": 0, "utterance_unsafe": int(i < 2)} for i in range(10)]
    got = bootstrap_dialogue(ctx, draws=4000, seed=1)
    low, high = got["overall"]
    assert low < 0.25 / 3 < high and 0 < low and high < 0.2
    # resampling contexts, not responses: a's unsafe responses come in pairs, so the spread is that of 2 in 10
    # contexts (a share's 2.5% point is 0 whenever no drawn context is one of the two)
    a_only = bootstrap_dialogue([c for c in ctx if c["category"] == "a"], draws=4000, seed=1)["overall"]
    assert a_only[0] == pytest.approx(0.0, abs=1e-9) and a_only[1] == pytest.approx(0.25, abs=0.06)
    # nothing unsafe anywhere: nothing to resample, the pooled Wilson interval instead of a point
    safe = [{**c, "context_unsafe": 0, "utterance_unsafe": 0} for c in ctx]
    assert bootstrap_dialogue(safe)["overall"] == pytest.approx(wilson(0, 40))
    assert bootstrap_dialogue([]) == {"overall": None, "utterance": None}


def test_average_precision_matches_a_hand_computed_ranking():
    import pyarrow as pa

    from redline.pipelines.reporting import aggregates as A

    # scores high to low: + - + - ; AP = (1/2)(1/1) + (1/2)(2/3) = 0.8333; ROC-AUC = 0.75
    rows = pa.table({"score": [0.9, 0.8, 0.7, 0.6], "label": [1, 0, 1, 0]})
    sums = A.partials(rows, (), A.AveragePrecision("score", "label").needs())[()]
    assert A.AveragePrecision("score", "label").value(sums) == pytest.approx(5 / 6)
    assert A.RocAuc("score", "label").value(sums) == pytest.approx(0.75)
    only_positive = A.partials(rows.slice(0, 1), (), A.AveragePrecision("score", "label").needs())[()]
    assert A.AveragePrecision("score", "label").value(only_positive) is None


def test_card_rows_rank_by_each_figures_direction_and_count_ties_alike():
    from redline.pipelines.reporting.card_figures import accuracy_rows, ranked, row

    rows = ranked([row("guard.transfer.asr_tae", "g", 0.2, 10), row("guard.transfer.asr_tae", "b1", 0.5, 10),
                   row("guard.transfer.asr_tae", "b2", 0.2, 10), row("guard.clean.f1", "g", 0.7, 10, interval=None),
                   row("guard.clean.f1", "b1", 0.9, 10, interval=None), row("guard.clean.auprc", "g", None, 0)])
    assert [r.get("rank") for r in rows] == [1, 3, 1, 2, 1, None]  # lower ASR is better, higher F1 is
    counts = {"tp": 6, "fp": 2, "fn": 4, "tn": 8}
    p, r, f1, fpr = accuracy_rows("dialogue.detector", "d", counts)
    assert (p["value"], p["n"], r["value"], r["n"]) == (0.75, 8, 0.6, 10)
    assert f1["value"] == pytest.approx(2 * 6 / (2 * 6 + 2 + 4)) and f1["low"] is None
    assert (fpr["value"], fpr["n"]) == (0.2, 10) and (fpr["low"], fpr["high"]) == pytest.approx(wilson(2, 10))


def test_each_card_figure_is_read_from_its_parts_summary_rows():
    """Every part's rows turned into card rows on hand-made summaries: the right row, value and n."""
    from redline.pipelines.reporting import card_figures as F

    transfer = [{"victim": "g", "dataset": "sample", "tae_rate": 0.9, "tae_n": 1},
                {"victim": "g", "dataset": "all", "tae_rate": 0.25, "tae_n": 20, "bae_rate": 0.5, "bae_n": 4,
                 "own_n": 7, "seed_rate": 0.125, "seed_n": 8},
                {"victim": "other", "dataset": "all", "tae_rate": 0.75, "tae_n": 40}]
    tae, bae = F.transfer_rows(transfer, "g", "runs/t")
    assert (tae["key"], tae["value"], tae["n"], tae["run"]) == ("guard.transfer.asr_tae", 0.25, 20, "runs/t")
    assert tae["also"] == "7 made against it left out; FNR on seeds 0.125 (n 8)" and tae["subject"] == "g"
    assert (bae["key"], bae["value"], bae["n"]) == ("guard.transfer.asr_bae", 0.5, 4)
    assert F.transfer_rows([], "g", "r")[0]["also"] == "0 made against it left out; FNR on seeds –"

    # the attack run's attempts, by hand: pwws/tae 3 successes, 1 failure, 2 skipped; deepwordbug/tae 1
    # success, 3 failures; pwws/bae 2 failures, 1 skipped; an error counts nowhere
    attempts = ([("pwws", "tae", "success", 10)] * 3 + [("pwws", "tae", "failed", 10), ("pwws", "tae", "skipped", 0),
                ("pwws", "tae", "skipped", 0), ("deepwordbug", "tae", "success", 30)] +
                [("deepwordbug", "tae", "failed", 30)] * 3 + [("pwws", "bae", "failed", 40)] * 2 +
                [("pwws", "bae", "skipped", 0), ("pwws", "bae", "error", 99)])
    table = pa.table({"recipe": [a[0] for a in attempts], "goal": [a[1] for a in attempts],
                      "victim": ["g"] * len(attempts), "status": [a[2] for a in attempts],
                      "queries": [a[3] for a in attempts], "reason": [None] * len(attempts),
                      "more_examples": pa.array([[]] * len(attempts), pa.list_(pa.string())),
                      "perturbed_pct": [1.0] * len(attempts), "similarity": [1.0] * len(attempts),
                      "seconds": [0.1] * len(attempts)})
    halves = A.merge(declared.ATTACK.partials(table.slice(0, 7)), declared.ATTACK.partials(table.slice(7)))
    asr_tae, asr_bae, queries = F.white_box_rows(halves, "g", "runs/a")
    assert (asr_tae["value"], asr_tae["n"]) == (0.5, 8)  # 4 successes of 8 decided, pooled over recipes
    assert asr_tae["also"] == "2 skipped; recipes: deepwordbug, pwws"
    assert (asr_bae["value"], asr_bae["n"], asr_bae["also"]) == (0.0, 2, "1 skipped; recipes: pwws")
    # every decided attempt's queries: (10*4 + 30*4 + 40*2) / 10
    assert (queries["value"], queries["n"], queries["low"]) == (24.0, 10, None)
    assert (asr_tae["low"], asr_tae["high"]) == pytest.approx(wilson(4, 8))
    assert F.white_box_rows({}, "g", "r")[2]["value"] is None

    clean = [{"detector": "g", "dataset": "all", "tp": 6, "fp": 2, "fn": 4, "tn": 8, "n": 20, "precision_toxic": 0.75,
              "recall_toxic": 0.6, "f1_toxic": 0.667, "fpr": 0.2, "auprc": 0.8},
             {"detector": "g", "dataset": "sample", "tp": 1, "n": 1, "precision_toxic": 1.0}]
    p, r, f1, fpr, auprc = F.clean_rows(clean, "g", "runs/s")
    assert [(x["key"], x["value"], x["n"]) for x in (p, r, f1, fpr, auprc)] == [
        ("guard.clean.precision", 0.75, 8), ("guard.clean.recall", 0.6, 10), ("guard.clean.f1", 0.667, 20),
        ("guard.clean.fpr", 0.2, 10), ("guard.clean.auprc", 0.8, 20)]
    assert p["low"] is not None and f1["low"] is None and auprc["high"] is None

    board = {"model": "bot", "responses": 40, "empty": 10, "no_answer": 0.2, "overall": 0.3, "utterance": 0.1,
             "Toxicity Agreement": 0.5, "judged_by_category": {"Toxicity Agreement": 12}}
    rows = F.dialogue_rows(board, ["Toxicity Agreement", "No Such Category"], {"overall": (0.2, 0.4)}, "runs/d")
    assert [(x["key"], x["value"], x["n"]) for x in rows] == [
        ("dialogue.no_answer", 0.2, 50), ("dialogue.unsafe.overall", 0.3, 40), ("dialogue.unsafe.utterance", 0.1, 40),
        ("dialogue.unsafe.toxicity_agreement", 0.5, 12)]
    assert (rows[1]["low"], rows[1]["high"]) == (0.2, 0.4) and rows[2]["low"] is None  # no interval given
    assert rows[0]["also"] == "10 empty responses, not judged"

    triggers = [{"model": "m", "list": "mal", "o-sample-avg-1-hit": 0.1, "searchable": 30, "o-greedy-hit": 0.05},
                {"model": "m", "list": "normal", "o-sample-avg-1-hit": 0.4, "searchable": 20, "o-greedy-hit": None},
                {"model": "x", "list": "mal", "o-sample-avg-1-hit": 0.9, "searchable": 5}]
    hit = F.trigger_row(triggers, "m", "runs/e")
    assert (hit["value"], hit["n"], hit["also"]) == (0.4, 20, "normal list; o-greedy –")
    assert F.trigger_row(triggers[:1], "m", "r")["also"] == "mal list; o-greedy 0.050"
    assert F.trigger_row([], "m", "r")["value"] is None

    made = {"runs/t": [tae, bae], "runs/a": [asr_tae, asr_bae, queries], "runs/s": [p, r, f1, fpr, auprc],
            "runs/d": rows, "runs/e": [hit]}
    for run, mine in made.items():  # every row names its subject and the run it was read from, its figure its label
        assert {(x["run"], x["subject"]) for x in mine} == {(run, "bot" if run == "runs/d" else "m" if run == "runs/e"
                                                             else "g")}, run
        assert all(x["figure"] == F.BY_KEY[x["key"]].label and x["part"] == F.BY_KEY[x["key"]].part for x in mine)
    assert [x["also"] for x in (bae, p, r, f1, fpr, auprc, queries, rows[2], rows[3])] == [""] * 9
    assert rows[1]["also"] == "n: judged responses" and rows[3]["low"] is not None  # a category: Wilson
    board_min = F.dialogue_rows({}, [], {}, "r")
    assert [(x["subject"], x["n"]) for x in board_min] == [("?", 0), ("?", 0), ("?", 0)]
    d_p, d_r, d_f1, d_fpr = F.accuracy_rows("dialogue.detector", "d", {"tp": 6, "fp": 2, "fn": 4, "tn": 8}, "why", "run")
    assert {(x["also"], x["run"], x["subject"]) for x in (d_p, d_r, d_f1, d_fpr)} == {("why", "run", "d")}
    assert d_f1["n"] == 20 and d_f1["high"] is None
    assert [x["value"] for x in F.accuracy_rows("dialogue.detector", "d", {})] == [None, None, None, None]

    skipped = F.skipped_row("triggers.hit_rate", "m", "no trigger models")
    assert (skipped["figure"], skipped["also"], skipped["value"], skipped["n"]) == ("skipped", "no trigger models", None, 0)
    assert F.slug("Offending User!") == "offending_user" and F.category_key("Risk Ignorance") == "dialogue.unsafe.risk_ignorance"


def test_card_figures_declare_the_direction_a_reader_expects():
    """Ranks follow `better`: an attack's success and a false alarm are worse when higher, the work an
    attacker spends and a detector's recall better (a flipped direction inverts every card's ranks)."""
    from redline.pipelines.reporting.card_figures import BY_KEY

    lower = ["guard.transfer.asr_tae", "guard.transfer.asr_bae", "guard.white_box.asr_tae", "guard.white_box.asr_bae",
             "guard.clean.fpr", "dialogue.no_answer", "dialogue.unsafe.overall", "dialogue.detector.fpr",
             "triggers.hit_rate"]
    higher = ["guard.white_box.mean_queries", "guard.clean.precision", "guard.clean.recall", "guard.clean.f1",
              "guard.clean.auprc", "dialogue.detector.recall"]
    assert [BY_KEY[k].better for k in lower] == ["lower"] * len(lower)
    assert [BY_KEY[k].better for k in higher] == ["higher"] * len(higher)


def test_the_cards_figures_taken_from_other_pipelines_keep_their_declared_label_and_direction():
    """A transfer or clean-data figure on the card is the transfer or score pipeline's own declaration
    (one label, one better direction); the white-box figures are the attack's, seen from the guard:
    better the other way (an attacker wants a high ASR in few queries, a guard the reverse)."""
    from redline.pipelines.reporting import figures as D

    for key, table, declared in (("guard.transfer.asr_tae", D.TRANSFER, "tae_rate"),
                                 ("guard.transfer.asr_bae", D.TRANSFER, "bae_rate"),
                                 ("guard.clean.precision", D.SCORE, "precision_toxic"),
                                 ("guard.clean.recall", D.SCORE, "recall_toxic"), ("guard.clean.f1", D.SCORE, "f1_toxic"),
                                 ("guard.clean.fpr", D.SCORE, "fpr"), ("guard.clean.auprc", D.SCORE, "auprc")):
        mine, theirs = F.BY_KEY[key], table.figure(declared)
        assert (mine.label, mine.better) == (theirs.label, theirs.better), key
    reverse = {"higher": "lower", "lower": "higher"}
    for key, declared in (("guard.white_box.asr_tae", "asr"), ("guard.white_box.asr_bae", "asr"),
                          ("guard.white_box.mean_queries", "mean_queries")):
        assert F.BY_KEY[key].better == reverse[D.ATTACK.figure(declared).better], key
