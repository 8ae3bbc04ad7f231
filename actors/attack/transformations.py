"""Transformations: for chosen word positions, the replacement words to try.

`swaps(text, indices)` returns {index: [replacement, ...]} for all asked positions at once, so a
model-backed transformation (masked LM) answers a whole search step in one batched forward pass.
"""

from __future__ import annotations

import functools
import hashlib
import random
from pathlib import Path
from typing import Any

import numpy as np

from redline.actors.attack.components import BuildContext, Component, register
from redline.actors.attack.text import AttackedText, match_case
from redline.actors.encoding import TextEncoder
from redline.cluster.artifacts import local_path
from redline.cluster.devices import placement
from redline.errors import RedlineError, first_line

KEYBOARD_ROWS = ["qwertyuiop", "asdfghjkl", "zxcvbnm"]


@functools.cache
def keyboard_neighbours() -> dict[str, str]:
    """Keys next to each key on a QWERTY layout (same row left/right, the rows above and below)."""
    out = {}
    for r, row in enumerate(KEYBOARD_ROWS):
        for i, c in enumerate(row):
            near = [row[j] for j in (i - 1, i + 1) if 0 <= j < len(row)]
            for r2 in (r - 1, r + 1):
                if 0 <= r2 < len(KEYBOARD_ROWS):
                    near += [KEYBOARD_ROWS[r2][j] for j in (i - 1, i, i + 1) if 0 <= j < len(KEYBOARD_ROWS[r2])]
            out[c] = "".join(sorted(set(near)))
    return out


# Visually confusable characters: digits/symbols (TextBugger's sub-C) and Cyrillic/Greek lookalikes.
HOMOGLYPHS = {
    "a": "@а", "b": "6", "c": "с", "e": "3е", "g": "9", "i": "1і", "j": "ј", "l": "1ӏ", "o": "0о", "p": "р",
    "s": "$ѕ", "t": "7", "x": "х", "y": "у", "z": "2", "A": "4А", "B": "8В", "E": "Е3", "H": "Н", "I": "1І",
    "K": "К", "M": "М", "O": "0О", "P": "Р", "S": "5Ѕ", "T": "Т", "X": "Х",
}


ONE_WORD_MARKS = str.maketrans("", "", "'-*@")  # what TextAttack's words_from_text keeps inside a word


class Transformation(Component):
    role = "transformation"
    # True: a model answers many texts' swaps in one call, so a search asks through the attacker, which
    # gathers the asks of every attempt in flight into one `swaps_many` (`search.SwapAsk`)
    batched = False

    def swaps(self, text: AttackedText, indices: list[int]) -> dict[int, list[str]]:
        raise NotImplementedError

    def swaps_many(self, asks: list[tuple[AttackedText, list[int]]]) -> list[dict[int, list[str]]]:
        """Each (text, indices) ask's swaps, in order."""
        return [self.swaps(text, indices) for text, indices in asks]

    @staticmethod
    def _dedupe(original: str, words: list[str]) -> list[str]:
        seen, out = {original}, []
        for w in words:
            if w and w not in seen:
                seen.add(w)
                out.append(w)
        return out


@register
class CharEdits(Transformation):
    """DeepWordBug / TextBugger character edits of one word: insert (a letter or a space), delete,
    swap neighbours, substitute by a keyboard neighbour, swap in a homoglyph."""

    kind = "char"
    OPS = ("insert", "insert-space", "delete", "swap", "keyboard", "homoglyph")

    def __init__(self, ops: tuple[str, ...] | list[str] = OPS, per_op: int = 2, keep_first_last: bool = True,
                 min_length: int = 3) -> None:
        ops = tuple(ops)
        unknown = set(ops) - set(self.OPS)
        if unknown:
            raise RedlineError(f"unknown character edits {sorted(unknown)} (known: {', '.join(self.OPS)})")
        self.ops, self.per_op, self.keep_ends, self.min_length = ops, per_op, keep_first_last, min_length

    def edit(self, word: str) -> list[str]:
        if len(word) < self.min_length:
            return []
        rng = random.Random(int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "big"))
        lo, hi = (1, len(word) - 1) if self.keep_ends and len(word) > 2 else (0, len(word))
        positions = list(range(lo, hi))
        if not positions:
            return []
        out = []
        for op in self.ops:
            for p in rng.sample(positions, min(self.per_op, len(positions))):
                c = word[p]
                if op == "insert":
                    out.append(word[:p] + rng.choice("abcdefghijklmnopqrstuvwxyz") + word[p:])
                elif op == "insert-space" and p > 0:
                    out.append(word[:p] + " " + word[p:])
                elif op == "delete":
                    out.append(word[:p] + word[p + 1:])
                elif op == "swap" and p + 1 < hi:
                    out.append(word[:p] + word[p + 1] + word[p] + word[p + 2:])
                elif op == "keyboard" and c.lower() in keyboard_neighbours():
                    out.append(word[:p] + match_case(c, rng.choice(keyboard_neighbours()[c.lower()])) + word[p + 1:])
                elif op == "homoglyph" and c in HOMOGLYPHS:
                    out.append(word[:p] + rng.choice(HOMOGLYPHS[c]) + word[p + 1:])
        return self._dedupe(word, out)

    def swaps(self, text: AttackedText, indices: list[int]) -> dict[int, list[str]]:
        return {i: self.edit(text.word(i)) for i in indices}


@register
class WordNetSynonyms(Transformation):
    """Single-word WordNet 3.0 synonyms (PWWS), matched to the original's case."""

    kind = "wordnet"
    requires = "WordNet (apt: wordnet-base wordnet-sense-index)"

    @classmethod
    def preflight(cls, args: dict[str, Any], ctx: BuildContext) -> None:
        from redline.actors.attack.resources import refresh_wordnet_tables

        refresh_wordnet_tables()  # built or verified on the driver; actors get them from the object store

    def __init__(self, match_case: bool = True, letters_only: bool = True) -> None:
        """`match_case`: a synonym takes the word's case (`Gang` -> `Crew`), and a lemma that differs
        from the word only in case (`miss` -> `Miss`) is no synonym; `letters_only`: a lemma of
        letters only (False: digits and hyphens too, `also-ran`, `I` -> `1`). TextAttack's
        WordSwapWordNet: `match_case: false, letters_only: false` (lemma names as WordNet spells
        them, any that differs from the word)."""
        from redline.actors.attack.resources import wordnet_tables

        wordnet_tables()  # load once, when the actor starts
        self.match_case, self.letters_only = match_case, letters_only

    @functools.lru_cache(maxsize=100_000)
    def synonyms(self, word: str) -> tuple[str, ...]:
        from redline.actors.attack.resources import wordnet_lemma_names

        lower = word.lower()
        names = [n for n in wordnet_lemma_names(lower)
                 if (n.isalpha() if self.letters_only else n.translate(ONE_WORD_MARKS).isalnum())]
        if not self.match_case:
            return tuple(self._dedupe(word, names))
        return tuple(self._dedupe(word, [match_case(word, n) for n in names if n.lower() != lower]))

    def swaps(self, text: AttackedText, indices: list[int]) -> dict[int, list[str]]:
        return {i: list(self.synonyms(text.word(i))) for i in indices}


@register
class MaskedLMSwaps(Transformation):
    """Top-k whole-word predictions of any HF fill-mask model for each masked word (BAE-R style):
    the positions that every attempt in flight asks for in one step, in batched forward passes, on
    the actor's GPU when it has one."""

    kind = "mlm"
    requires = "a fill-mask model (resources.mlm_model)"
    uses_gpu = True
    batched = True

    @classmethod
    def build(cls, args: dict[str, Any], ctx: BuildContext) -> "MaskedLMSwaps":
        return cls(ctx.resources.mlm_model, top_k=ctx.options.top_k or args.get("top_k", 20),
                   device=placement(ctx.num_gpus).device)

    @classmethod
    def preflight(cls, args: dict[str, Any], ctx: BuildContext) -> None:
        check_model(ctx.resources.mlm_model, "a fill-mask model: set resources.mlm_model")

    def __init__(self, model: str, top_k: int = 20, max_length: int = 256, device: str = "cpu",
                 batch_size: int = 128) -> None:
        import torch
        from transformers import AutoModelForMaskedLM, AutoTokenizer

        self.torch = torch
        try:
            path = local_path(model)
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.model = AutoModelForMaskedLM.from_pretrained(path).to(device).eval()
        except (OSError, ValueError) as err:
            raise RedlineError(f"cannot load masked LM '{model}': {first_line(err)}") from None
        if self.tokenizer.mask_token is None:
            raise RedlineError(f"'{model}' has no mask token: not a fill-mask model")
        # no longer than the model holds: a batch padded past its positions fails as a whole
        held = getattr(self.tokenizer, "model_max_length", None)
        if not held or held > 100_000:  # the tokenizer does not say
            held = getattr(self.model.config, "max_position_embeddings", None) or max_length
        self.top_k, self.max_length, self.device, self.batch_size = top_k, min(max_length, held), device, batch_size
        self.encoder = TextEncoder(self.tokenizer, self.max_length, device)
        vocab = self.tokenizer.convert_ids_to_tokens(list(range(len(self.tokenizer))))
        # Only tokens that are whole alphabetic words can replace a word.
        self.word_ids = np.array([i for i, t in enumerate(vocab) if t.lstrip("Ġ▁").isalpha()
                                  and not t.startswith("##") and len(t.lstrip("Ġ▁")) > 1])
        self.vocab = vocab
        self.word_ids_on_device = torch.as_tensor(self.word_ids, device=device)

    def swaps(self, text: AttackedText, indices: list[int]) -> dict[int, list[str]]:
        return self.swaps_many([(text, indices)])[0]

    def swaps_many(self, asks: list[tuple[AttackedText, list[int]]]) -> list[dict[int, list[str]]]:
        """Every ask's masked words in forward passes of `batch_size` masked texts, whatever text they
        come from (the attacker gathers one step of every attempt in flight)."""
        torch = self.torch
        flat = [(a, i) for a, (_, indices) in enumerate(asks) for i in indices]
        out: list[dict[int, list[str]]] = [{} for _ in asks]
        for start in range(0, len(flat), self.batch_size):
            chunk = flat[start:start + self.batch_size]
            enc = self.encoder([asks[a][0].replace(i, self.tokenizer.mask_token).text for a, i in chunk])
            with torch.inference_mode():
                logits = self.model(**enc).logits
            is_mask = enc["input_ids"] == self.tokenizer.mask_token_id
            first = is_mask.int().argmax(dim=1)  # a row without a mask: its mask fell beyond max_length
            scores = logits[torch.arange(len(chunk), device=logits.device), first][:, self.word_ids_on_device]
            k = min(self.top_k + 1, len(self.word_ids))
            tops = self.word_ids_on_device[scores.topk(k, dim=1).indices].tolist()
            for (a, i), top, masked in zip(chunk, tops, is_mask.any(dim=1).tolist()):
                word = asks[a][0].word(i)
                out[a][i] = self._dedupe(word, [match_case(word, self.vocab[t].lstrip("Ġ▁")) for t in top])[
                    : self.top_k] if masked else []
        return out


@register
class EmbeddingNeighbours(Transformation):
    """The k nearest words by cosine in a word-embedding space: counter-fitted GloVe from a text
    file when given, otherwise the input-embedding matrix of an HF model (default: MiniLM)."""

    kind = "embedding"
    requires = "word embeddings (MiniLM package, or embeddings_file)"

    @classmethod
    def build(cls, args: dict[str, Any], ctx: BuildContext) -> "EmbeddingNeighbours":
        return cls(k=ctx.options.top_k or args.get("k", 50), embeddings_file=ctx.resources.embeddings_file,
                   model=ctx.resources.embedding_model)

    def __init__(self, k: int = 50, embeddings_file: str | None = None, model: str | None = None,
                 max_cosine_distance: float | None = None) -> None:
        self.k, self.max_dist = k, max_cosine_distance
        self.words, self.unit, self.index = load_word_embeddings(embeddings_file, model)
        self.source = (f"vectors {Path(embeddings_file).name}" if embeddings_file
                       else f"input embeddings of {Path(model).name if model else 'all-MiniLM-L6-v2'}")

    @functools.lru_cache(maxsize=100_000)
    def neighbours(self, word: str) -> tuple[str, ...]:
        i = self.index.get(word.lower())
        if i is None:
            return ()
        sims = self.unit @ self.unit[i]
        take = min(self.k + 1, len(sims))  # the word itself is among the nearest
        top = np.argpartition(-sims, take - 1)[:take]
        top = top[np.argsort(-sims[top])]
        out = [self.words[j] for j in top if j != i and (self.max_dist is None or 1 - sims[j] <= self.max_dist)]
        return tuple(self._dedupe(word, [match_case(word, w) for w in out])[: self.k])

    def cosine(self, a: str, b: str) -> float | None:
        i, j = self.index.get(a.lower()), self.index.get(b.lower())
        return None if i is None or j is None else float(self.unit[i] @ self.unit[j])

    def swaps(self, text: AttackedText, indices: list[int]) -> dict[int, list[str]]:
        return {i: list(self.neighbours(text.word(i))) for i in indices}


@functools.cache
def load_word_embeddings(embeddings_file: str | None, model: str | None) -> tuple[list[str], np.ndarray, dict[str, int]]:
    """(words, unit-normalised vectors, word -> row), loaded and normalised once per process."""
    words, matrix = _read_word_embeddings(embeddings_file, model)
    unit = matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-8)
    return words, unit, {w: i for i, w in enumerate(words)}


def _read_word_embeddings(embeddings_file: str | None, model: str | None) -> tuple[list[str], np.ndarray]:
    if embeddings_file:
        words, vectors = [], []
        try:
            with open(local_path(embeddings_file), encoding="utf-8") as f:
                for line in f:
                    parts = line.rstrip().split(" ")
                    if len(parts) > 2:
                        words.append(parts[0])
                        vectors.append(np.asarray(parts[1:], dtype=np.float32))
        except OSError as err:
            raise RedlineError(f"cannot read embeddings file {embeddings_file}: {err.strerror}") from None
        if not words:
            raise RedlineError(f"{embeddings_file}: no `word v1 v2 ...` lines")
        return words, np.stack(vectors)
    from transformers import AutoModel, AutoTokenizer

    from redline.actors.attack.resources import default_sentence_encoder

    name = model or default_sentence_encoder()
    try:
        tokenizer = AutoTokenizer.from_pretrained(local_path(name))
        matrix = AutoModel.from_pretrained(local_path(name)).get_input_embeddings().weight.detach().numpy()
    except (OSError, ValueError) as err:
        raise RedlineError(f"cannot load embeddings of '{name}': {first_line(err)}") from None
    vocab = tokenizer.convert_ids_to_tokens(list(range(matrix.shape[0])))
    keep = [i for i, t in enumerate(vocab) if t.lstrip("Ġ▁").isalpha() and not t.startswith("##") and len(t) > 1]
    return [vocab[i].lstrip("Ġ▁").lower() for i in keep], matrix[keep]


class Composite(Transformation):
    """The union of several transformations' swaps (a recipe listing several transformations)."""

    kind = "composite"

    def __init__(self, parts: list[Transformation]) -> None:
        self.parts = parts
        self.batched = any(p.batched for p in parts)

    def swaps(self, text: AttackedText, indices: list[int]) -> dict[int, list[str]]:
        return self.swaps_many([(text, indices)])[0]

    def swaps_many(self, asks: list[tuple[AttackedText, list[int]]]) -> list[dict[int, list[str]]]:
        answers = [part.swaps_many(asks) for part in self.parts]
        out = []
        for a, (text, indices) in enumerate(asks):
            merged: dict[int, list[str]] = {i: [] for i in indices}
            for answer in answers:
                for i, words in answer[a].items():
                    merged[i].extend(words)
            out.append({i: self._dedupe(text.word(i), words) for i, words in merged.items()})
        return out


def describe(t: Any) -> str:
    if isinstance(t, Composite):
        return " + ".join(describe(p) for p in t.parts)
    return f"{t.kind} ({t.source})" if isinstance(t, EmbeddingNeighbours) else t.kind


def check_model(name: str, what: str) -> None:
    """A model the driver can load the config of (hub id in the cache, or a directory)."""
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(local_path(name))
    except (OSError, ValueError) as err:
        raise RedlineError(f"this recipe needs {what} (cannot load '{name}': {first_line(err)})") from None
