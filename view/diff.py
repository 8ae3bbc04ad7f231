"""An attempt's seed beside its perturbed text, as a word diff the viewer shows (HTML, escaped)."""

from __future__ import annotations

import difflib
import html
from typing import Any


def outcome_view(row: dict[str, Any], pair: tuple[str, str]) -> tuple[str, str, str]:
    """An attempt's (before HTML, after HTML, note) by its outcome: a success as a word diff; a failed
    attempt as the diff to the best candidate, labelled as such (it fooled nothing); a skipped or
    errored attempt as its seed alone, with why (there is no candidate to diff)."""
    before, after = row.get(pair[0]), row.get(pair[1])
    status, reason = row.get("status"), row.get("reason")
    if status in ("skipped", "error") or after is None:
        note = f"{status or 'no result'}: {reason}" if reason else (status or "no result")
        return html.escape(before or ""), "", note
    left, right = word_diff(before, after)
    if status == "failed":
        return left, right, "failed: the best candidate found, which did not change the victim's decision" + (
            f" ({reason})" if reason else "")
    return left, right, ""


MAX_DIFF_CELLS = 250_000  # words before x words after (past the common ends) that difflib may compare


def word_diff(before: str | None, after: str | None) -> tuple[str, str]:
    """HTML of both texts with the words that differ marked: removed in `before`, added in `after`.
    The common first and last words are matched in linear time; difflib compares only what lies
    between them, and when that is larger than MAX_DIFF_CELLS the whole middle is marked as changed
    (an attack changes a few words; a quadratic diff of two long unrelated texts would hold a worker)."""
    a, b = (before or "").split(), (after or "").split()
    head = 0
    while head < min(len(a), len(b)) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < min(len(a), len(b)) - head and a[len(a) - 1 - tail] == b[len(b) - 1 - tail]:
        tail += 1
    mid_a, mid_b = a[head:len(a) - tail], b[head:len(b) - tail]
    if len(mid_a) * len(mid_b) <= MAX_DIFF_CELLS:
        ops = difflib.SequenceMatcher(None, mid_a, mid_b, autojunk=False).get_opcodes()
    else:
        ops = [("replace", 0, len(mid_a), 0, len(mid_b))]
    opcodes = ([("equal", 0, head, 0, head)] if head else [])
    opcodes += [(op, i1 + head, i2 + head, j1 + head, j2 + head) for op, i1, i2, j1, j2 in ops]
    if tail:
        opcodes.append(("equal", len(a) - tail, len(a), len(b) - tail, len(b)))
    left, right = [], []
    for op, i1, i2, j1, j2 in opcodes:
        old, new = html.escape(" ".join(a[i1:i2])), html.escape(" ".join(b[j1:j2]))
        if op == "equal":
            left.append(old)
            right.append(new)
            continue
        if old:
            left.append(f"<del>{old}</del>")
        if new:
            right.append(f"<mark>{new}</mark>")
    return " ".join(p for p in left if p), " ".join(p for p in right if p)
