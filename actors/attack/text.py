"""A text under attack: words located by character spans, edited by splicing.

Word indices stay stable across edits (a replacement may contain spaces or symbols, e.g. "id iot"
or a homoglyph), so searches never re-tokenise the whole text for a one-word edit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

WORD_RE = re.compile(r"\w+(?:['’]\w+)*")


@dataclass(frozen=True)
class AttackedText:
    text: str
    spans: tuple[tuple[int, int], ...]
    modified: frozenset[int] = field(default_factory=frozenset)

    @classmethod
    def from_text(cls, text: str) -> "AttackedText":
        return cls(text, tuple(m.span() for m in WORD_RE.finditer(text)))

    @property
    def words(self) -> list[str]:
        return [self.text[a:b] for a, b in self.spans]

    def word(self, index: int) -> str:
        a, b = self.spans[index]
        return self.text[a:b]

    def __len__(self) -> int:
        return len(self.spans)

    def replace(self, index: int, new: str) -> "AttackedText":
        a, b = self.spans[index]
        delta = len(new) - (b - a)
        spans = self.spans[:index] + ((a, a + len(new)),) + tuple((s + delta, e + delta) for s, e in self.spans[index + 1:])
        return AttackedText(self.text[:a] + new + self.text[b:], spans, self.modified | {index})

    def delete(self, index: int) -> str:
        """The text without word `index` (for deletion-based word importance)."""
        a, b = self.spans[index]
        return re.sub(r"\s{2,}", " ", self.text[:a] + self.text[b:]).strip()

    def window(self, index: int, size: int) -> str:
        """The words around `index`, `size` in all (for windowed sentence similarity)."""
        lo = max(0, index - size // 2)
        hi = min(len(self.spans), lo + size)
        lo = max(0, hi - size)
        return self.text[self.spans[lo][0]:self.spans[hi - 1][1]] if self.spans else self.text


def match_case(template: str, word: str) -> str:
    if template.isupper() and len(template) > 1:
        return word.upper()
    if template[:1].isupper():
        return word[:1].upper() + word[1:]
    return word
