"""The paper's hit types (He & Glass 2019, Section 3), decided from a trigger's scores.

For a target y = (y_1 .. y_m) (</s> included for dialogue models) and a trigger x:
- o-greedy-hit: greedy decoding from x gives exactly y, i.e. at every step y_t is the argmax
  under teacher forcing (every margin log P(y_t) - max_{w != y_t} log P(w) is positive);
- o-sample-avg-k-hit: the average of log P(y_t | y_<t, x) is at least T_out - log k;
- o-sample-min-k-hit: the minimum of those log-probabilities is at least T_out - log k;
- io-sample-{avg,min}-k-hit: the same, and the LM's average log-likelihood of x is at least
  T_in - log k (the trigger is a likely input, not gibberish).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

KS = (1, 2)
SEARCHES = ("o-greedy", "o-sample-avg", "o-sample-min", "io-sample-avg", "io-sample-min")
HIT_TYPES = ("o-greedy-hit", *(f"{s}-{k}-hit" for s in SEARCHES[1:] for k in KS))


@dataclass(frozen=True)
class Thresholds:
    t_out: float
    t_in: float | None = None


def objective_of(search: str) -> str:
    """The per-target objective a search climbs: greedy margins, or the average / minimum log-prob."""
    if search not in SEARCHES:
        raise ValueError(f"unknown hit type '{search}' (known: {', '.join(SEARCHES)})")
    return search.rsplit("-", 1)[-1]  # o-greedy -> greedy, (i)o-sample-avg -> avg, (i)o-sample-min -> min


def uses_lm(search: str) -> bool:
    return search.startswith("io-")


def hit_types(target_logprobs: Sequence[float], margins: Sequence[float], lm_average: float | None,
              thresholds: Thresholds) -> list[str]:
    """Every hit type this (trigger, target) reaches, in HIT_TYPES order."""
    avg = sum(target_logprobs) / len(target_logprobs)
    low = min(target_logprobs)
    out = ["o-greedy-hit"] if all(m > 0 for m in margins) else []
    for kind, value in (("avg", avg), ("min", low)):
        for k in KS:
            if value >= thresholds.t_out - math.log(k):
                out.append(f"o-sample-{kind}-{k}-hit")
    if lm_average is not None and thresholds.t_in is not None:
        for kind, value in (("avg", avg), ("min", low)):
            for k in KS:
                if value >= thresholds.t_out - math.log(k) and lm_average >= thresholds.t_in - math.log(k):
                    out.append(f"io-sample-{kind}-{k}-hit")
    return [h for h in HIT_TYPES if h in out]


def goal_hit(search: str) -> str:
    """The hit type a search stops at: k = 1, the strictest (it implies k = 2)."""
    return "o-greedy-hit" if search == "o-greedy" else f"{search}-1-hit"
