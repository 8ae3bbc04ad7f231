"""Word-level vocabulary of the paper's dialogue models: the N most frequent words of the training
pairs plus <pad>, <unk>, <s> and </s>; lower-cased words and punctuation marks as tokens."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"
SPECIALS = (PAD, UNK, BOS, EOS)
_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?|[^\sa-z0-9]")


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


class Vocab:
    def __init__(self, words: list[str]) -> None:
        if tuple(words[: len(SPECIALS)]) != SPECIALS:
            raise ValueError("a vocabulary starts with <pad>, <unk>, <s>, </s>")
        self.words = words
        self.index = {w: i for i, w in enumerate(words)}
        self.pad, self.unk, self.bos, self.eos = range(4)

    @classmethod
    def build(cls, texts: Iterable[str], size: int) -> Vocab:
        counts = Counter(t for text in texts for t in tokenize(text))
        frequent = [w for w, _ in sorted(counts.items(), key=lambda wc: (-wc[1], wc[0]))[: max(0, size - len(SPECIALS))]]
        return cls([*SPECIALS, *frequent])

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, text: str, max_len: int | None = None) -> list[int]:
        ids = [self.index.get(t, self.unk) for t in tokenize(text)]
        return ids[:max_len] if max_len is not None else ids

    def decode(self, ids: Iterable[int]) -> str:
        return " ".join(self.words[i] for i in ids if i not in (self.pad, self.bos, self.eos))

    def oov(self, text: str) -> list[str]:
        """Words of `text` the vocabulary lacks (targets with any are not searchable)."""
        return [t for t in tokenize(text) if t not in self.index]

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.words, ensure_ascii=False))

    @classmethod
    def load(cls, path: Path) -> Vocab:
        return cls(json.loads(path.read_text()))
