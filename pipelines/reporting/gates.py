"""`--fail-if` rules: a release gate on a run's figures, e.g. `guard.transfer.asr_tae > 0.3` or
`triggers.hit_rate.high >= 0.5`. A rule names a figure (optionally its `.value`, `.low`, `.high` or
`.n`), a comparison and a number; it is checked when the run ends, and a rule that holds fails the
command (exit 1) with one line. A rule on a figure the run did not produce fails too: a gate that
cannot be checked does not pass."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from redline.errors import RedlineError

OPS: dict[str, Callable[[float, float], bool]] = {">=": operator.ge, "<=": operator.le, "==": operator.eq,
                                                  "!=": operator.ne, ">": operator.gt, "<": operator.lt}
PARTS = ("value", "low", "high", "n")
RULE = re.compile(r"^\s*([a-z][a-z0-9_.-]{0,99}?)(?:\.(value|low|high|n))?\s*(>=|<=|==|!=|>|<)\s*"
                  r"(-?\d+(?:\.\d+)?)\s*$")


@dataclass(frozen=True)
class Rule:
    text: str
    figure: str
    part: str
    op: str
    threshold: float

    def holds(self, value: float) -> bool:
        return OPS[self.op](value, self.threshold)


def parse(texts: Iterable[str], known: Iterable[str]) -> list[Rule]:
    """The rules, checked against the figures a run can produce (before it runs)."""
    known = tuple(known)
    rules = []
    for text in texts:
        m = RULE.match(text[:300])
        if not m:
            raise RedlineError(f"--fail-if {text[:80]!r}: expected FIGURE[.value|.low|.high|.n] OP NUMBER with OP one "
                               f"of {' '.join(OPS)}, e.g. 'guard.transfer.asr_tae > 0.3'")
        figure, part, op, number = m.groups()
        if figure not in known:
            raise RedlineError(f"--fail-if {text!r}: no figure '{figure}' (known: {', '.join(known)})")
        rules.append(Rule(text.strip(), figure, part or "value", op, float(number)))
    return rules


def failures(rules: list[Rule], figures: dict[str, dict[str, Any]]) -> list[str]:
    """One line per rule that holds, or cannot be checked."""
    out = []
    for rule in rules:
        figure = figures.get(rule.figure) or {}
        value = figure.get(rule.part)
        if value is None:
            out.append(f"--fail-if '{rule.text}': the run has no {rule.figure}.{rule.part} to check")
        elif rule.holds(float(value)):
            n, low, high = figure.get("n"), figure.get("low"), figure.get("high")
            interval = f", 95% {low:.3f}–{high:.3f}" if low is not None and high is not None else ""
            out.append(f"--fail-if '{rule.text}' holds: {rule.figure}.{rule.part} is {value:g} (n {n}{interval})")
    return out
