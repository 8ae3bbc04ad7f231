"""The attack components' exact behaviour, one rule per test: which edits a character transformation
makes and where, which neighbours an embedding gives and in what order, how parts combine. A bug in
any of them still yields plausible adversarial text, so each test pins the rule by hand-derived cases.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from redline.actors.attack import constraints as C
from redline.actors.attack.goals import GOALS
from redline.actors.attack.search import (
    UNK,
    AlzantotGenetic,
    Beam,
    GreedyWIR,
    Member,
    SearchContext,
    Successes,
    _best,
)
from redline.actors.attack.text import AttackedText
from redline.actors.attack.transformations import (
    HOMOGLYPHS,
    CharEdits,
    Composite,
    EmbeddingNeighbours,
    MaskedLMSwaps,
    Transformation,
    check_model,
    describe,
    keyboard_neighbours,
)
from redline.errors import RedlineError

WORD = "monster"  # seven distinct letters: every edit is visible and no two edits collide


def changed_positions(a: str, b: str) -> list[int]:
    assert len(a) == len(b)
    return [i for i, (x, y) in enumerate(zip(a, b)) if x != y]


def test_keyboard_neighbours_are_the_adjacent_keys_of_a_qwerty_layout():
    near = keyboard_neighbours()
    assert near["q"] == "asw"  # corner: right, and the two keys below
    assert near["g"] == "bfhnrtvy"  # middle row: left, right, three above, three below
    assert near["p"] == "lo"  # end of the top row: one key below it exists
    assert near["m"] == "hjkn"  # end of the bottom row
    assert set(near) == set("qwertyuiopasdfghjklzxcvbnm")


def test_insert_adds_one_letter_inside_the_word():
    edits = CharEdits(ops=("insert",), per_op=2).edit(WORD)
    assert len(edits) == 2
    for e in edits:
        assert len(e) == len(WORD) + 1 and e[0] == "m" and e[-1] == "r"
        assert any(e[:p] + e[p + 1:] == WORD and e[p].isalpha() for p in range(1, len(WORD)))


def test_insert_space_splits_the_word_never_before_it():
    edits = CharEdits(ops=("insert-space",), per_op=10, keep_first_last=False).edit(WORD)
    # all 7 positions are drawn; position 0 would only prefix a space, so it is skipped
    assert sorted(edits) == sorted(WORD[:p] + " " + WORD[p:] for p in range(1, len(WORD)))


def test_delete_removes_one_inner_letter():
    assert sorted(CharEdits(ops=("delete",), per_op=10).edit(WORD)) == sorted(
        WORD[:p] + WORD[p + 1:] for p in range(1, len(WORD) - 1))
    assert sorted(CharEdits(ops=("delete",), per_op=10, keep_first_last=False).edit(WORD)) == sorted(
        WORD[:p] + WORD[p + 1:] for p in range(len(WORD)))


def test_swap_exchanges_two_neighbours_both_inside_the_kept_ends():
    inner = CharEdits(ops=("swap",), per_op=10).edit(WORD)
    assert sorted(inner) == sorted(WORD[:p] + WORD[p + 1] + WORD[p] + WORD[p + 2:] for p in range(1, len(WORD) - 2))
    free = CharEdits(ops=("swap",), per_op=10, keep_first_last=False).edit(WORD)
    assert sorted(free) == sorted(WORD[:p] + WORD[p + 1] + WORD[p] + WORD[p + 2:] for p in range(len(WORD) - 1))


def test_keyboard_typo_replaces_one_letter_by_a_neighbouring_key_in_the_same_case():
    for word in (WORD, WORD.upper()):
        edits = CharEdits(ops=("keyboard",), per_op=3).edit(word)
        assert len(edits) == 3
        for e in edits:
            (p,) = changed_positions(word, e)
            assert 0 < p < len(word) - 1
            assert e[p].lower() in keyboard_neighbours()[word[p].lower()] and e[p].isupper() == word.isupper()
    assert CharEdits(ops=("keyboard",), per_op=3, min_length=1).edit("1234") == []  # no key has neighbours


def test_homoglyph_replaces_one_letter_by_a_lookalike():
    word = "tasteless"  # every inner letter has a homoglyph
    edits = CharEdits(ops=("homoglyph",), per_op=3).edit(word)
    assert len(edits) == 3
    for e in edits:
        (p,) = changed_positions(word, e)
        assert 0 < p < len(word) - 1 and e[p] in HOMOGLYPHS[word[p]]
    assert CharEdits(ops=("homoglyph",), per_op=5).edit("rumdum") == []  # r, u, m, d: no lookalike listed


def test_per_op_bounds_the_edits_of_each_kind():
    assert len(CharEdits(ops=("delete",), per_op=1).edit(WORD)) == 1
    assert len(CharEdits(ops=("delete",), per_op=3).edit(WORD)) == 3
    both = CharEdits(ops=("delete", "insert-space"), per_op=2).edit(WORD)
    assert len(both) == 4 and sum(" " in e for e in both) == 2


def test_edits_are_the_same_for_the_same_word_and_never_the_word_itself():
    assert CharEdits().edit(WORD) == CharEdits().edit(WORD)
    assert CharEdits(ops=("delete",), per_op=2).edit("aaaa") == ["aaa"]  # two deletions, one text
    assert CharEdits(ops=("delete",), min_length=1).edit("a") == []  # an empty word is no candidate


def test_short_words_and_the_kept_ends():
    assert CharEdits().edit("an") == [] and CharEdits(min_length=5).edit("fool") == []
    assert CharEdits(min_length=4).edit("fool") != []
    assert CharEdits(ops=("delete",), per_op=2).edit("cat") == ["ct"]  # one inner letter to edit
    # two letters: no inner letter, so both may change even with the ends kept
    assert CharEdits(ops=("swap",), min_length=2).edit("ab") == ["ba"]


def test_char_swaps_edit_each_asked_word():
    t = AttackedText.from_text("you absolute monster")
    out = CharEdits(ops=("delete",), per_op=10).swaps(t, [0, 2])
    assert set(out) == {0, 2} and out[0] == ["yu"]
    assert set(out[2]) == set(CharEdits(ops=("delete",), per_op=10).edit(WORD))


@pytest.fixture
def vectors(tmp_path):
    f = tmp_path / "vec.txt"
    # a word2vec-style header line ("count dims") is not a word; `zero` has no direction at all
    f.write_text("4 3\nidiot 1 0 0\nfool 0.9 0.1 0\ncat 0 0 1\nmoron 0.95 0 0.05\nzero 0 0 0\n")
    return str(f)


def test_embedding_neighbours_are_ordered_by_cosine_and_cut_at_k(vectors):
    assert EmbeddingNeighbours(k=2, embeddings_file=vectors).neighbours("idiot") == ("moron", "fool")
    assert EmbeddingNeighbours(k=1, embeddings_file=vectors).neighbours("idiot") == ("moron",)
    # more neighbours asked than the file has words: all of them, nearest first, the word itself left out
    near = EmbeddingNeighbours(k=10, embeddings_file=vectors).neighbours("idiot")
    assert near[:2] == ("moron", "fool") and set(near[2:]) == {"cat", "zero"}  # both at cosine 0
    assert "4" not in EmbeddingNeighbours(k=10, embeddings_file=vectors).index


def test_embedding_neighbours_keep_only_close_words_and_the_case(vectors):
    # cosine distances from idiot: moron 0.0014, fool 0.0061, cat 1.0
    t = EmbeddingNeighbours(k=3, embeddings_file=vectors, max_cosine_distance=0.003)
    assert t.neighbours("IDIOT") == ("MORON",) and t.neighbours("Idiot") == ("Moron",)
    assert EmbeddingNeighbours(k=3, embeddings_file=vectors, max_cosine_distance=0.01).neighbours("idiot") == (
        "moron", "fool")
    assert t.swaps(AttackedText.from_text("you idiot"), [0, 1]) == {0: [], 1: ["moron"]}


def test_embedding_cosine(vectors):
    t = EmbeddingNeighbours(embeddings_file=vectors)
    assert t.cosine("idiot", "cat") == pytest.approx(0.0)
    assert t.cosine("Idiot", "fool") == pytest.approx(0.9 / (0.82 ** 0.5))
    assert t.cosine("idiot", "zero") == pytest.approx(0.0)  # a null vector stays finite
    assert t.cosine("idiot", "nope") is None and t.cosine("nope", "idiot") is None


def test_embedding_file_errors(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("just words\n")
    with pytest.raises(RedlineError, match="no `word v1 v2 ...` lines"):
        EmbeddingNeighbours(embeddings_file=str(empty))


class Fixed(Transformation):
    """A transformation that proposes given words."""

    kind = "fixed"

    def __init__(self, words: dict[int, list[str]]) -> None:
        self.words = words

    def swaps(self, text, indices):
        return {i: list(self.words.get(i, [])) for i in indices}


def test_composite_is_the_ordered_union_without_repeats_or_the_word_itself():
    t = AttackedText.from_text("you idiot")
    both = Composite([Fixed({1: ["fool", "moron"]}), Fixed({1: ["moron", "idiot", "clown"], 0: ["u"]})])
    assert both.swaps(t, [0, 1]) == {0: ["u"], 1: ["fool", "moron", "clown"]}
    assert describe(both) == "fixed + fixed" and describe(CharEdits()) == "char"


def test_check_model_names_the_missing_model_and_why(tiny_mlm):
    with pytest.raises(RedlineError, match=r"this recipe needs a fill-mask model \(cannot load '/no/such/model': "
                                           r"(?!None\)).+\)$"):
        check_model("/no/such/model", "a fill-mask model")
    check_model(str(tiny_mlm), "a fill-mask model")  # a model that loads passes


def test_masked_lm_swaps_follow_the_models_own_fill_mask_ranking(tiny_mlm):
    from transformers import pipeline

    fill = pipeline("fill-mask", model=str(tiny_mlm))
    t = AttackedText.from_text("you are a stupid idiot")
    masked = t.replace(3, fill.tokenizer.mask_token).text
    ranked = [c["token_str"].strip() for c in fill(masked, top_k=fill.model.config.vocab_size)]
    whole = [w for w in ranked if w.isalpha() and len(w) > 1 and not w.startswith("##") and w != "stupid"]
    out = MaskedLMSwaps(str(tiny_mlm), top_k=5).swaps(t, [3])
    assert out[3] == whole[:5]
    shouting = MaskedLMSwaps(str(tiny_mlm), top_k=5).swaps(AttackedText.from_text("you are a STUPID idiot"), [3])[3]
    assert shouting and all(w.isupper() for w in shouting)


def test_masked_lm_gives_nothing_for_a_word_past_its_window(tiny_mlm):
    long = AttackedText.from_text(" ".join(["word"] * 40) + " idiot")
    t = MaskedLMSwaps(str(tiny_mlm), top_k=5, max_length=16)
    out = t.swaps(long, [0, 40])
    assert out[40] == [] and len(out[0]) == 5
    assert t.swaps(long, []) == {}


def test_masked_lm_answers_many_texts_asks_in_batches_as_it_answers_each_alone(tiny_mlm):
    t = MaskedLMSwaps(str(tiny_mlm), top_k=5, max_length=16, batch_size=2)
    forwards = []
    model = t.model
    t.model = lambda **enc: forwards.append(len(enc["input_ids"])) or model(**enc)
    asks = [(AttackedText.from_text("you are a stupid idiot"), [3, 4]), (AttackedText.from_text("shut up loser"), [2]),
            (AttackedText.from_text(" ".join(["word"] * 40) + " idiot"), [0, 40]), (AttackedText.from_text("hi"), [])]
    together = t.swaps_many(asks)
    assert forwards == [2, 2, 1]  # five masked texts from three texts, in batches of two
    assert together == [t.swaps(text, idx) for text, idx in asks]
    assert together[2][40] == [] and len(together[0][3]) == 5 and together[3] == {}
    # asked for more than the model holds, it encodes no more: a long text padded into a batch still works
    held = MaskedLMSwaps(str(tiny_mlm), top_k=5, max_length=10_000)
    assert held.max_length <= held.model.config.max_position_embeddings
    assert held.swaps_many([(AttackedText.from_text(" ".join(["word"] * 300)), [1]), asks[0]])[1] == held.swaps(*asks[0])


# ---------------------------------------------------------------- constraints


def edited(t: AttackedText, n: int) -> AttackedText:
    for i in range(n):
        t = t.replace(i, t.word(i) + "x")
    return t


def test_modification_budget_is_the_larger_of_min_words_and_the_rate_rounded_up():
    rate = C.MaxModificationRate(rate=0.1, min_words=4)
    assert [rate.limit(n) for n in (0, 10, 40, 41, 50, 51)] == [4, 4, 4, 5, 5, 6]
    t = AttackedText.from_text(" ".join(f"w{i}" for i in range(41)))
    assert rate.allowed(edited(t, 4), t) == set(range(41))  # 4 of 5 used: one more may change
    assert rate.allowed(edited(t, 5), t) == set()
    assert rate.within(edited(t, 5), t) and not rate.within(edited(t, 6), t)


def test_max_words_perturbed_counts_changed_words():
    cap = C.MaxWordsPerturbed(2)
    t = AttackedText.from_text("one two three four")
    assert cap.allowed(edited(t, 1), t) == {0, 1, 2, 3} and cap.allowed(edited(t, 2), t) == set()
    assert cap.within(edited(t, 2), t) and not cap.within(edited(t, 3), t)


def test_position_rules_read_the_original_words():
    t = AttackedText.from_text("the ant ants are cats")
    assert C.MinWordLength().allowed(t, t) == {0, 1, 2, 3, 4} and C.MinWordLength(4).allowed(t, t) == {2, 4}
    changed = t.replace(0, "wolves").replace(1, "the")  # a stopword made content and back
    assert C.Stopwords().allowed(changed, t) == {1, 2, 4}
    assert C.RepeatModification().allowed(changed, t) == {2, 3, 4}
    assert C.modifiable([C.Stopwords(), C.RepeatModification()], changed, t) == [2, 4]
    assert C.PreConstraint().within(changed, t) and C.Stopwords().within(changed, t)
    so = AttackedText.from_text("So I said the")  # TextAttack's StopwordModification only knows lower case
    assert C.Stopwords().allowed(so, so) == {2} and C.Stopwords(case_sensitive=True).allowed(so, so) == {0, 1, 2}


def test_levenshtein_accepts_exactly_its_distance():
    t = AttackedText.from_text("you idiot")
    one = t.replace(1, "idi0t")
    assert C.Levenshtein(1).check(t, [one], [1]).tolist() == [True]
    assert C.Levenshtein(0).check(t, [one], [1]).tolist() == [False]
    assert C.describe([C.Stopwords(), C.Levenshtein()]) == "stopwords, levenshtein" and C.describe([]) == "–"


def test_sentence_encoder_gives_each_text_the_same_unit_vector_alone_or_in_a_padded_batch():
    import torch
    from transformers import AutoModel, AutoTokenizer

    from redline.actors.attack.resources import default_sentence_encoder

    texts = ["x", "a much longer sentence with many more words in it than the others", "you idiot", "mid length text"]
    batched = C.SentenceEncoder(batch_size=3).encode(texts)
    path = default_sentence_encoder()
    tok, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    for text, vec in zip(texts, batched):
        with torch.inference_mode():
            hidden = model(**tok(text, return_tensors="pt")).last_hidden_state[0]
        mean = hidden.mean(0).numpy()  # one text: every token counts
        np.testing.assert_allclose(vec, mean / np.linalg.norm(mean), atol=2e-5)
    assert C.SentenceEncoder().encode([]).shape == (0, 1)


def test_sentence_similarity_threshold_metric_and_window():
    enc = C.shared_encoder(None)
    t = AttackedText.from_text("the weather today is sunny and warm near the old harbour town")
    cand = t.replace(4, "rainy")
    cos = float(enc.similarity([t.window(4, 4)], [cand.window(4, 4)])[0])
    angular = float(enc.similarity([t.window(4, 4)], [cand.window(4, 4)], "angular")[0])
    assert angular == pytest.approx(1 - np.arccos(cos) / np.pi) and angular > cos
    assert C.SentenceSimilarity(min_similarity=cos, window=4).check(t, [cand], [4]).tolist() == [True]
    assert C.SentenceSimilarity(min_similarity=cos + 1e-6, window=4).check(t, [cand], [4]).tolist() == [False]
    between = (cos + angular) / 2
    angular_check = C.SentenceSimilarity(min_similarity=between, metric="angular", window=4)
    assert angular_check.check(t, [cand], [4]).tolist() == [True]
    assert C.SentenceSimilarity(min_similarity=between, window=4).check(t, [cand], [4]).tolist() == [False]
    # a change outside the window around the given word is not seen by a windowed check
    far = t.replace(0, "a")
    assert C.SentenceSimilarity(min_similarity=0.9999, window=3).check(t, [far], [9]).tolist() == [True]
    assert C.SentenceSimilarity(min_similarity=0.9999, window=None).check(t, [far], [9]).tolist() == [False]
    assert C.SentenceSimilarity().check(t, [], []).shape == (0,)


def test_sentence_similarity_skips_short_texts_and_can_compare_with_the_previous_text():
    seed = AttackedText.from_text("the weather today is sunny and warm near the old harbour town")
    step1 = seed.replace(4, "rainy")
    step2 = step1.replace(5, "cold")
    strict = C.SentenceSimilarity(min_similarity=0.9999, window=15)
    assert strict.check(seed, [step2], [5]).tolist() == [False]
    # a text of fewer words (12) than the window (15) passes unchecked when asked, as TextAttack's recipes do
    skipping = C.SentenceSimilarity(min_similarity=0.9999, window=15, skip_shorter_than_window=True)
    assert skipping.check(seed, [step2], [5]).tolist() == [True]
    assert C.SentenceSimilarity(min_similarity=0.9999, window=5, skip_shorter_than_window=True).check(
        seed, [step2], [5]).tolist() == [False]  # long enough for its window: checked
    # compare_against_original False: apply_post compares each candidate with the text it was made from
    enc = C.shared_encoder(None)
    to_previous = float(enc.similarity([step1.text], [step2.text])[0])
    to_seed = float(enc.similarity([seed.text], [step2.text])[0])
    assert to_previous > to_seed
    threshold = (to_previous + to_seed) / 2
    previous = C.SentenceSimilarity(min_similarity=threshold, window=None, compare_against_original=False)
    original = C.SentenceSimilarity(min_similarity=threshold, window=None)
    assert C.apply_post([previous], seed, [step2], [5], current=step1) == [0]
    assert C.apply_post([original], seed, [step2], [5], current=step1) == []


def test_wordnet_antonyms_are_barred_from_word_swaps():
    bar = C.NotAntonym()
    t = AttackedText.from_text("you are stupid and I hate you")
    cands = [t.replace(2, "smart"), t.replace(2, "clever"), t.replace(2, "dumb"), t.replace(5, "love"),
             t.replace(5, "loathe"), t.replace(2, "Smart")]
    # direct antonyms (hate -> love, stupid -> smart), the opposite adjective cluster (clever), any case
    assert bar.check(t, cands, [2, 2, 2, 5, 5, 2]).tolist() == [False, False, True, False, True, False]
    hated = AttackedText.from_text("they hated it")
    assert bar.check(hated, [hated.replace(1, "loved")], [1]).tolist() == [False]  # base forms: hated/loved


@pytest.mark.parametrize("text,at,new", [
    ("she hates you", 1, "loves"),          # a verb's inflection: loves -> love
    ("you are so stupid", 3, "smarter"),    # a comparative: smarter -> smart
    ("the stupidest idea", 1, "smartest"),  # a superlative, on both sides
    ("he loves it", 1, "hates"),
])
def test_an_inflected_antonym_is_barred_through_its_base_form(text, at, new):
    """Only the base forms tie these pairs (WordNet lists love/hate and smart/stupid, not their
    inflections), so the bar must reduce the new word as it does the old one."""
    from redline.actors.attack.resources import base_forms, wordnet_antonyms

    t = AttackedText.from_text(text)
    old = t.word(at).lower()
    assert not ({new} & wordnet_antonyms(old))  # not barred by the inflected form itself
    assert base_forms(new) & wordnet_antonyms(old)
    assert C.NotAntonym().check(t, [t.replace(at, new)], [at]).tolist() == [False]


def test_part_of_speech_counts_proper_nouns_as_nouns_and_tags_the_replaced_word():
    t = AttackedText.from_text("you are a stupid idiot")
    pos = C.PartOfSpeech()
    cands = [t.replace(4, "John"), t.replace(4, "quickly"), t.replace(3, "smart"), t.replace(3, "moron")]
    assert pos.check(t, cands, [4, 4, 3, 3]).tolist() == [True, False, True, False]
    assert pos.check(t, [], []).shape == (0,)
    assert C.PartOfSpeech.tag_at([(0, 3, "PRON"), (4, 7, "AUX")], (4, 7)) == "AUX"
    assert C.PartOfSpeech.tag_at([(0, 3, "PRON"), (4, 7, "AUX")], (3, 4)) is None  # touches, no overlap


def test_part_of_speech_tags_the_references_window_as_textattack_does(monkeypatch):
    """TextAttack's PartOfSpeech tags the 4 words before the swapped one and the 3 after it in the
    text compared with (the old word, then the new one, in the middle), and lets a noun replace a verb."""
    pos = C.PartOfSpeech()
    t = AttackedText.from_text("one, two three four five six seven eight nine ten")
    assert pos.context(t, 5, "SIX") == ("two three four five SIX seven eight nine", (20, 23))
    assert pos.context(t, 0, "x") == ("x two three four", (0, 1))
    asked = []
    tags = pos.tags
    monkeypatch.setattr(pos, "tags", lambda texts: asked.extend(texts) or tags(texts))
    pos.check(t, [t.replace(5, "many")], [5])
    assert asked == ["two three four five six seven eight nine", "two three four five many seven eight nine"]
    assert pos._replaces("NOUN", "VERB") and pos._replaces("VERB", "NOUN") and not pos._replaces("ADJ", "NOUN")
    assert not C.PartOfSpeech(allow_verb_noun_swap=False)._replaces("NOUN", "VERB")
    whole = C.PartOfSpeech(before=None)  # the whole texts, as redline tagged before
    asked.clear()
    monkeypatch.setattr(whole, "tags", lambda texts: asked.extend(texts) or tags(texts))
    whole.check(t, [t.replace(5, "many")], [5])
    assert asked == [t.text, t.replace(5, "many").text]


def test_word_embedding_distance_boundary_and_unknown_words(tmp_path):
    f = tmp_path / "vec.txt"
    f.write_text("idiot 1 0\nfool 0.6 0.8\ncat 0 1\n")
    t = AttackedText.from_text("you idiot")
    cands = [t.replace(1, "fool"), t.replace(1, "cat"), t.replace(1, "unseen")]
    distance = C.WordEmbeddingDistance(0.6, embeddings_file=str(f))
    assert distance.check(t, cands, [1, 1, 1]).tolist() == [True, False, False]
    assert C.WordEmbeddingDistance(0.61, embeddings_file=str(f)).check(t, cands[:1], [1]).tolist() == [False]
    exact = C.WordEmbeddingDistance(embeddings_file=str(f))
    exact.min_cosine = exact.space.cosine("idiot", "fool")  # a candidate exactly at the bound passes
    assert exact.check(t, cands[:1], [1]).tolist() == [True]


# ---------------------------------------------------------------- searches


def context(text: str, transformation, pre=(), post=(), budget=1000, deadline=30.0) -> SearchContext:
    return SearchContext(AttackedText.from_text(text), GOALS["tae"], transformation, list(pre), list(post), budget,
                         time.monotonic() + deadline)


def run_search(gen, score) -> tuple[object, list[list[str]]]:
    """Drive a search with a goal scorer text -> (score, success); returns its outcome and every request."""
    asked, reply = [], None
    try:
        while True:
            request = gen.send(reply)
            asked.append(list(request))
            reply = [score(t) for t in request]
    except StopIteration as stop:
        return stop.value, asked


def finish(gen):
    """The value of a generator that asks nothing."""
    with pytest.raises(StopIteration) as stop:
        next(gen)
    return stop.value.value


def test_context_scores_each_text_once_and_never_past_its_budget():
    ctx = context("a b c", Fixed({}), budget=3)
    gen = ctx.score(["x", "y", "x", "z", "w"])
    assert next(gen) == ["x", "y", "z"]  # repeats asked once, cut at the budget
    with pytest.raises(StopIteration) as stop:
        gen.send([(0.1, False), (0.2, False), (0.3, True)])
    assert stop.value.value == [(0.1, False), (0.2, False), (0.1, False), (0.3, True), None]
    assert ctx.queries == 3 and ctx.exhausted
    assert finish(ctx.score(["y"])) == [(0.2, False)]  # known texts cost nothing
    assert ctx.queries == 3
    assert not context("a", Fixed({}), budget=1).exhausted
    assert context("a", Fixed({}), deadline=-1).exhausted


def test_candidates_are_every_proposed_edit_that_passes_the_post_constraints():
    ctx = context("you big idiot", Fixed({1: ["huge", "enormous"], 2: ["id1ot", "fool"]}), post=[C.Levenshtein(6)])
    cands, where = finish(ctx.candidates(ctx.original, [1, 2]))
    assert [c.text for c in cands] == ["you huge idiot", "you big id1ot", "you big fool"] and where == [1, 2, 2]


def test_the_best_candidate_is_a_success_before_any_higher_failure():
    cands = [AttackedText.from_text(w) for w in "a b c d".split()]
    assert _best(cands, [(0.9, False), (0.4, True), (0.6, True), None]) == (2, True)
    assert _best(cands, [(0.2, False), (0.7, False), None, (0.1, False)]) == (1, False)
    assert _best(cands, [None, None, None, None]) is None


def test_successes_are_distinct_best_first_and_stop_at_the_number_wanted():
    a, b, c = (AttackedText.from_text(w) for w in ("a", "b", "c"))
    found = Successes(wanted=2)
    assert Successes(1).outcome() is None
    assert not found.add([a, b], [(0.6, True), (0.2, False)])
    assert found.add([b, c, a], [(0.3, False), (0.9, True), (0.99, True)])
    out = found.outcome()
    assert out.success and out.text == a and out.score == 0.6 and [t for t, _ in out.more] == [c]


def weighted(weights: dict[str, float], threshold: float = 0.5):
    """TAE scorer: toxicity is the sum of the weights of the words present; benign below the threshold."""
    def score(text: str) -> tuple[float, bool]:
        toxic = sum(weights.get(w, 0.0) for w in text.split())
        return 1 - toxic, toxic < threshold
    return score


def test_greedy_edits_words_in_order_of_importance_by_deletion_and_by_unk():
    weights = {"idiot": 0.5, "moron": 0.3, "dumb": 0.1}
    text = "dumb moron idiot"
    for method, probes in (("delete", ["moron idiot", "dumb idiot", "dumb moron"]),
                           ("unk", [f"{UNK} moron idiot", f"dumb {UNK} idiot", f"dumb moron {UNK}"])):
        ctx = context(text, Fixed({0: ["dunb"], 1: ["m0ron"], 2: ["idi0t"]}))
        scorer = weighted(weights, threshold=0.15)
        outcome, asked = run_search(GreedyWIR(method).run(ctx, scorer(text)), scorer)
        assert asked == [probes, ["dumb moron idi0t"], ["dumb m0ron idi0t"]]
        assert outcome.success and outcome.text.text == "dumb m0ron idi0t" and outcome.score == pytest.approx(0.9)
        assert ctx.queries == 5


def test_greedy_keeps_an_edit_only_when_it_raises_the_score():
    weights = {"idiot": 0.6, "moron": 0.3, "worse": 0.5}
    text = "moron idiot"
    ctx = context(text, Fixed({0: ["worse"], 1: ["idi0t"]}))  # the moron edit makes it more toxic
    scorer = weighted(weights, threshold=0.2)
    outcome, asked = run_search(GreedyWIR("delete").run(ctx, scorer(text)), scorer)
    assert asked[1:] == [["moron idi0t"], ["worse idi0t"]]
    assert not outcome.success and outcome.text.text == "moron idi0t" and outcome.score == pytest.approx(0.7)


def test_greedy_skips_words_the_constraints_forbid_and_reports_nothing_to_modify():
    weights = {"idiot": 0.6}
    ctx = context("the idiot", Fixed({0: ["a"], 1: ["idi0t"]}), pre=[C.Stopwords()])
    outcome, asked = run_search(GreedyWIR("delete").run(ctx, (0.4, False)), weighted(weights))
    assert asked == [["the"], ["the idi0t"]] and outcome.success  # only 'idiot' is probed and edited
    stuck = context("the and of", Fixed({}), pre=[C.Stopwords()])
    outcome = finish(GreedyWIR("delete").run(stuck, (0.4, False)))
    assert outcome.nothing_to_modify and not outcome.success and outcome.text == stuck.original


def test_greedy_stops_at_the_modification_budget():
    weights = {"a1": 0.2, "a2": 0.2, "a3": 0.2}
    ctx = context("a1 a2 a3", Fixed({i: [f"b{i}"] for i in range(3)}), pre=[C.MaxWordsPerturbed(1)])
    outcome, asked = run_search(GreedyWIR("delete").run(ctx, (0.4, False)), weighted(weights, threshold=0.1))
    assert len(asked) == 2 and outcome.text.modified == {0} and not outcome.success


def test_weighted_saliency_is_textattacks_softmax_of_masked_scores_times_the_best_swap_score():
    # 'idiot' matters most when deleted, but none of its swaps help; 'dumb''s swap removes it all
    weights = {"idiot": 0.5, "dumb": 0.3, "idiotic": 0.5}
    text = "dumb idiot"
    swaps = {0: ["dull", "dunce"], 1: ["idiotic"]}
    scorer = weighted({**weights, "dunce": 0.25}, threshold=0.4)
    ctx = context(text, Fixed(swaps))
    outcome, asked = run_search(GreedyWIR("wsaliency").run(ctx, scorer(text)), scorer)
    assert asked[0] == [f"{UNK} idiot", f"dumb {UNK}"]  # [UNK] saliencies
    assert asked[1] == ["dull idiot", "dunce idiot", "dumb idiotic"]  # every swap's gain
    # masked scores 0.5 and 0.7: softmax weights ~0.45 and ~0.55; best swap scores 0.5 and 0.2 -> 'dumb' first
    assert outcome.text.text == "dull idiot" and outcome.text.modified == {0}
    assert asked[2:] == [["dull idiotic"]]  # 'dumb''s swaps were scored already: no new request for them
    g = GreedyWIR("wsaliency")
    probe = context(text, Fixed(swaps))
    imp, _ = run_search(g.importance(probe, [0, 1], scorer(text)), scorer)
    soft = np.exp(np.array([0.5, 0.7]))
    # GreedyWordSwapWIR(wir_method="weighted-saliency"): softmax(leave-one-[UNK] scores) * max(swap scores),
    # the scores themselves (not their gain over the seed's 0.2), 0.0 for a word without swaps
    assert imp == pytest.approx((soft / soft.sum()) * np.array([0.5, 0.2]))
    bare = context(text, Fixed({0: ["dull"]}))
    imp, _ = run_search(g.importance(bare, [0, 1], scorer(text)), scorer)
    assert imp[1] == 0.0 and imp[0] == pytest.approx(soft[0] / soft.sum() * 0.5)


def test_greedy_rejects_an_unknown_method_and_names_itself():
    with pytest.raises(RedlineError, match="unknown word-importance method 'random'"):
        GreedyWIR("random")
    assert GreedyWIR("unk").label == "greedy-wir-unk" and GreedyWIR.is_white_box({"method": "gradient"})
    assert not GreedyWIR.is_white_box({"method": "delete"}) and GreedyWIR("gradient").needs_gradient
    assert not GreedyWIR("delete").needs_gradient


def test_gradient_importance_is_one_query_and_follows_the_gradient():
    ctx = context("dumb moron idiot", Fixed({0: ["dunb"], 1: ["m0ron"], 2: ["idi0t"]}))
    ctx.gradient = lambda text, spans: np.array([0.1, 0.2, 0.9])
    scorer = weighted({"idiot": 0.5, "moron": 0.3, "dumb": 0.1}, threshold=0.15)
    outcome, asked = run_search(GreedyWIR("gradient").run(ctx, scorer("dumb moron idiot")), scorer)
    assert asked == [["dumb moron idi0t"], ["dumb m0ron idi0t"]] and outcome.success and ctx.queries == 3


def test_beam_keeps_its_width_best_texts_each_step():
    weights = {"w0": 0.1, "w1": 0.2, "w2": 0.3, "w3": 0.35}
    text = "w0 w1 w2 w3"
    swaps = {i: [f"v{i}"] for i in range(4)}
    scorer = weighted(weights, threshold=0.05)
    ctx = context(text, Fixed(swaps), pre=[C.RepeatModification()])
    outcome, asked = run_search(Beam(width=2).run(ctx, scorer(text)), scorer)
    assert asked[0] == ["v0 w1 w2 w3", "w0 v1 w2 w3", "w0 w1 v2 w3", "w0 w1 w2 v3"]
    # the two best (w3 and w2 edited) are expanded, each by its three other words, without repeats
    assert sorted(asked[1]) == sorted(["v0 w1 w2 v3", "w0 v1 w2 v3", "w0 w1 v2 v3", "v0 w1 v2 w3", "w0 v1 v2 w3"])
    assert outcome.success and outcome.text.text == "v0 v1 v2 v3"
    assert Beam(3).label == "beam-3"


def test_beam_runs_until_no_edit_is_left_like_the_reference_or_stops_at_a_plateau_when_asked():
    """TextAttack's BeamSearch refills the beam with each step's best even when they are worse, until a
    success, no transformation left (the constraints bar repeats) or the budget; the attempt's text is
    the last step's best. `plateau_stop` ends at the first step that brings no improvement."""
    scorer = weighted({"w0": 0.6, "v0": 0.7}, threshold=0.1)  # no edit helps
    swaps = {0: ["v0"], 1: ["v1"]}
    ctx = context("w0 w1", Fixed(swaps), pre=[C.RepeatModification()])
    outcome, asked = run_search(Beam(width=2).run(ctx, scorer("w0 w1")), scorer)
    assert asked == [["v0 w1", "w0 v1"], ["v0 v1"]]  # both beam texts reach 'v0 v1': asked once
    assert not outcome.success and outcome.text.text == "v0 v1" and outcome.score == pytest.approx(0.3)
    ctx = context("w0 w1", Fixed(swaps), pre=[C.RepeatModification()])
    outcome, asked = run_search(Beam(width=2, plateau_stop=True).run(ctx, scorer("w0 w1")), scorer)
    assert asked == [["v0 w1", "w0 v1"]] and outcome.text.text == "w0 w1" and outcome.score == pytest.approx(0.4)
    assert Beam(2, plateau_stop=True).label == "beam-2-plateau"
    stuck = context("the and", Fixed({}), pre=[C.Stopwords()])
    assert finish(Beam(2).run(stuck, (0.1, False))).nothing_to_modify


class Draws:
    """A stand-in generator whose uniform draws are given: which parent each word comes from."""

    def __init__(self, take_b: list[bool]) -> None:
        self.take_b = take_b

    def uniform(self, size):
        return np.array([0.0 if b else 0.9 for b in self.take_b])


def test_parents_are_drawn_in_favour_of_the_fitter_members():
    from redline.actors.attack.search import parent_probabilities

    # goal scores 0.9 (nearly fooled), 0.6, 0.1 at temperature 0.3: weights e^0, e^-1, e^-(8/3)
    probs = parent_probabilities(np.array([0.1, 0.9, 0.6]), 0.3)
    weights = np.exp(np.array([-8 / 3, 0.0, -1.0]))
    assert probs == pytest.approx(weights / weights.sum()) and probs.argmax() == 1 and probs.argmin() == 0
    # TextAttack 0.3.x draws with softmax(-score / T): the reverse order, which redline does not copy
    assert np.argsort(probs).tolist() == [0, 2, 1]
    assert parent_probabilities(np.array([5.0, 5.0]), 1e-9) == pytest.approx([0.5, 0.5])


def test_crossover_takes_each_word_from_the_drawn_parent_within_the_budget():
    text = "w0 w1 w2 w3 w4 w5"
    orig = AttackedText.from_text(text)
    a = Member(orig.replace(0, "a0").replace(1, "a1").replace(2, "a2"), 0.5, False)
    b = Member(orig.replace(3, "b3").replace(4, "b4").replace(5, "b5"), 0.7, False)
    g = AlzantotGenetic(population=4, iterations=2)
    free = context(text, Fixed({}))
    child = g._crossover(free, a, b, Draws([False, True, False, True, False, True]))
    assert child.text.text == "a0 w1 a2 b3 w4 b5" and child.text.modified == {0, 2, 3, 5}
    assert child.score == 0.5 and not child.success  # a child not yet scored has its weaker parent's score
    assert g._crossover(free, a, b, Draws([True] * 6)) is b  # the same text as a parent is that parent
    capped = context(text, Fixed({}), pre=[C.MaxWordsPerturbed(3)])
    assert g._crossover(capped, a, b, Draws([False, False, False, True, True, True])) is b  # over budget: fitter
    even = Member(b.text, 0.5, False)
    assert g._crossover(capped, a, even, Draws([False, False, False, True, True, True])) is a


def test_genetic_settings_are_checked_and_named():
    for bad in ({"population": 1}, {"iterations": 0}, {"temperature": 0}):
        with pytest.raises(RedlineError, match="genetic search needs population >= 2"):
            AlzantotGenetic(**bad)
    assert AlzantotGenetic(population=6, iterations=4).label == "genetic-6x4"
    stuck = context("the and", Fixed({}), pre=[C.Stopwords()])
    assert finish(AlzantotGenetic().run(stuck, (0.1, False))).nothing_to_modify


def test_preflight_names_the_model_a_recipe_needs():
    from redline.actors.attack.components import BuildContext
    from redline.actors.attack.recipes import AttackResources, RecipeOptions

    missing = BuildContext(AttackResources(mlm_model="/no/such/mlm", sentence_encoder="/no/such/encoder"),
                           RecipeOptions(name="pwws"))
    with pytest.raises(RedlineError, match=r"^this recipe needs a fill-mask model: set resources.mlm_model "
                                           r"\(cannot load '/no/such/mlm': "):
        MaskedLMSwaps.preflight({}, missing)
    with pytest.raises(RedlineError, match=r"^this recipe needs a sentence encoder: set resources.sentence_encoder "
                                           r"\(cannot load '/no/such/encoder': "):
        C.SentenceSimilarity.preflight({}, missing)
    C.SentenceSimilarity.preflight({}, BuildContext(AttackResources(), RecipeOptions(name="pwws")))  # MiniLM: offline


def test_embedding_neighbours_from_a_models_input_embeddings_keep_whole_lowercase_words(tiny_mlm):
    from transformers import AutoModel, AutoTokenizer

    from redline.actors.attack.transformations import load_word_embeddings

    words, unit, index = load_word_embeddings(None, str(tiny_mlm))
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_mlm))
    vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    whole = [t.lower() for t in vocab if t.isalpha() and len(t) > 1]  # no ##pieces, no [SPECIAL], no single letters
    assert words == whole and unit.shape == (len(whole), AutoModel.from_pretrained(str(tiny_mlm)).config.hidden_size)
    assert np.allclose(np.linalg.norm(unit, axis=1), 1, atol=1e-5) and index[words[3]] == 3
    with pytest.raises(RedlineError, match="cannot load embeddings of '/no/such/model'"):
        load_word_embeddings(None, "/no/such/model")


def test_components_built_for_a_recipe_take_its_overrides_over_their_arguments(tiny_mlm, tmp_path):
    from redline.actors.attack.components import BuildContext
    from redline.actors.attack.recipes import AttackResources, RecipeOptions

    vectors = tmp_path / "vec.txt"
    vectors.write_text("idiot 1 0\nfool 0.6 0.8\ncat 0 1\n")
    resources = AttackResources(mlm_model=str(tiny_mlm), embeddings_file=str(vectors))
    plain = BuildContext(resources, RecipeOptions(name="pwws"))
    tuned = BuildContext(resources, RecipeOptions(name="pwws", beam_width=5, top_k=3, max_mod_rate=0.5))
    assert Beam.build({"width": 2}, plain).width == 2 and Beam.build({}, plain).width == 4
    assert Beam.build({"plateau_stop": True}, plain).plateau_stop and not Beam.build({}, plain).plateau_stop
    assert Beam.build({"width": 2}, tuned).width == 5
    assert MaskedLMSwaps.build({"top_k": 7}, plain).top_k == 7 and MaskedLMSwaps.build({}, plain).top_k == 20
    mlm = MaskedLMSwaps.build({"top_k": 7}, tuned)
    assert mlm.top_k == 3 and mlm.device == "cpu" and len(mlm.swaps(AttackedText.from_text("you idiot"), [1])[1]) == 3
    rate = C.MaxModificationRate.build({"rate": 0.2, "min_words": 2}, plain)
    assert (rate.rate, rate.min_words) == (0.2, 2)
    rate = C.MaxModificationRate.build({"rate": 0.2, "min_words": 2}, tuned)
    assert (rate.rate, rate.min_words) == (0.5, 2)
    distance = C.WordEmbeddingDistance.build({"min_cosine": 0.7}, plain)
    assert distance.min_cosine == 0.7 and distance.space.cosine("idiot", "fool") == pytest.approx(0.6)
    assert C.WordEmbeddingDistance.build({}, plain).min_cosine == 0.5 and Beam().width == 4
    by_model = C.WordEmbeddingDistance(model=str(tiny_mlm))  # no file: the model's input embeddings
    words = by_model.space.words
    same_space = EmbeddingNeighbours(model=str(tiny_mlm))
    assert by_model.space.cosine(words[0], words[1]) == same_space.cosine(words[0], words[1])
    from_resources = C.WordEmbeddingDistance.build({}, BuildContext(AttackResources(embedding_model=str(tiny_mlm)),
                                                                    RecipeOptions(name="pwws")))
    assert from_resources.space.words == words  # the recipe's embedding model, not the default vectors
    assert C.SentenceSimilarity.build({"min_similarity": 0.8}, plain).min_similarity == 0.8
    own = C.SentenceSimilarity.build({}, BuildContext(AttackResources(sentence_encoder=str(tiny_mlm)),
                                                      RecipeOptions(name="pwws")))
    assert own.encoder.name == str(tiny_mlm)  # the recipe's encoder, not the default MiniLM
    assert C.SentenceSimilarity.build({"min_similarity": 0.8}, BuildContext(
        resources, RecipeOptions(name="pwws", min_similarity=0.95))).min_similarity == 0.95
    with pytest.raises(RedlineError, match=r"^cannot load sentence encoder '/no/such/encoder': \S"):
        C.SentenceEncoder("/no/such/encoder")


def test_searches_report_nothing_to_modify_with_the_seed_and_its_score():
    for search in (Beam(2), AlzantotGenetic(population=2, iterations=1), GreedyWIR("delete")):
        stuck = context("the and", Fixed({}), pre=[C.Stopwords()])
        outcome = finish(search.run(stuck, (0.25, False)))
        assert (outcome.text, outcome.score, outcome.success, outcome.nothing_to_modify) == (
            stuck.original, 0.25, False, True)


def test_a_failed_search_returns_its_best_text_and_that_texts_score():
    weights = {"w0": 0.3, "w1": 0.3, "w2": 0.3}
    scorer = weighted(weights, threshold=0.05)  # never reached: every edit leaves some toxicity
    swaps = {0: ["x0"], 1: ["x1"], 2: ["x2"]}
    for search in (Beam(2), AlzantotGenetic(population=4, iterations=3)):
        ctx = context("w0 w1 w2", Fixed(swaps), pre=[C.MaxWordsPerturbed(2)])
        outcome, asked = run_search(search.run(ctx, scorer("w0 w1 w2")), scorer)
        assert not outcome.success and not outcome.more
        assert len(outcome.text.modified) == 2 and outcome.score == pytest.approx(scorer(outcome.text.text)[0])
        assert outcome.score == pytest.approx(max(scorer(t)[0] for step in asked for t in step))


def test_beam_expands_only_texts_that_did_not_succeed_and_a_plateau_stop_stops_on_a_tie():
    # step 1: 'v0 w1' succeeds (kept aside) and 'w0 v1' improves; step 2 from 'w0 v1' only
    scorer = weighted({"w0": 0.5, "w1": 0.2, "v1": 0.1, "u0": 0.5}, threshold=0.25)
    ctx = context("w0 w1", Fixed({0: ["v0", "u0"], 1: ["v1"]}), pre=[C.RepeatModification()])
    ctx.wanted = 2
    outcome, asked = run_search(Beam(width=3).run(ctx, scorer("w0 w1")), scorer)
    assert asked[0] == ["v0 w1", "u0 w1", "w0 v1"]
    assert asked[1] == ["v0 v1", "u0 v1"]  # the beam held 'u0 w1' (no gain) and 'w0 v1'; only new texts asked
    tie = weighted({"w0": 0.5, "v0": 0.4, "w1": 0.4, "v1": 0.5}, threshold=0.05)
    ctx = context("w0 w1", Fixed({0: ["v0"], 1: ["v1"]}), pre=[C.RepeatModification()])
    outcome, asked = run_search(Beam(width=1, plateau_stop=True).run(ctx, tie("w0 w1")), tie)
    assert asked == [["v0 w1", "w0 v1"], ["v0 v1"]]  # 'v0 v1' scores as 'v0 w1' did: no gain, stop
    assert outcome.text.text == "v0 w1" and not outcome.success
    ctx = context("w0 w1", Fixed({0: ["v0"], 1: ["v1"]}), pre=[C.RepeatModification()])
    outcome, asked = run_search(Beam(width=1).run(ctx, tie("w0 w1")), tie)
    assert asked == [["v0 w1", "w0 v1"], ["v0 v1"]] and outcome.text.text == "v0 v1"  # the reference: last step's best


def test_genetic_settings_at_their_bounds():
    assert AlzantotGenetic(population=2, iterations=1).give_up is True
    assert AlzantotGenetic(temperature=1e-9).temperature == 1e-9
    with pytest.raises(RedlineError, match=r"^genetic search needs population >= 2, iterations >= 1 and "
                                           r"temperature > 0$"):
        AlzantotGenetic(temperature=0)


def test_genetic_stops_at_the_first_success_and_survives_a_transformation_with_nothing_to_offer():
    scorer = weighted({"w0": 0.6, "w1": 0.6}, threshold=0.7)
    ctx = context("w0 w1", Fixed({0: ["v0"], 1: ["v1"]}))
    outcome, asked = run_search(AlzantotGenetic(population=4, iterations=5).run(ctx, scorer("w0 w1")), scorer)
    assert outcome.success and outcome.text.text in ("v0 w1", "w0 v1")
    assert len(asked) == 1  # both one-word edits succeed in the first step: nothing more is asked
    dry = context("w0 w1", Fixed({}))  # words to modify, but no candidate for any of them
    outcome, asked = run_search(AlzantotGenetic(population=3, iterations=2).run(dry, (0.2, False)), scorer)
    assert asked == [] and not outcome.success and outcome.text == dry.original and outcome.score == 0.2
