"""How sure a proportion is: its 95% Wilson score interval, and whether it is narrow enough to read.

Wilson rather than the normal approximation: the card's counts are small (8 targets, 22 BAEs) and
its proportions sit near 0 or 1, where the normal interval leaves [0, 1] or collapses to a point.
Aggregates of several proportions (DiaSafety's Overall) get a bootstrap interval over contexts.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

Z95 = 1.959963984540054
MAX_WIDTH = 0.2  # an interval wider than this: the figure is marked not conclusive


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval of `successes` out of `n` (None when n is 0)."""
    if n <= 0:
        return None
    if not 0 <= successes <= n:
        raise ValueError(f"{successes} successes out of {n}")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def proportion(value: float | None, n: int | None, max_width: float = MAX_WIDTH) -> dict[str, object]:
    """A proportion as a card shows it: value, n, its interval and whether it is conclusive (the
    count behind `value` is recovered as round(value * n))."""
    if value is None or not n:
        return {"value": value, "n": n or 0, "low": None, "high": None, "conclusive": False}
    low, high = wilson(round(value * n), n)  # type: ignore[misc]
    return {"value": value, "n": n, "low": low, "high": high, "conclusive": high - low <= max_width}


def bootstrap_dialogue(per_context: list[dict[str, Any]], draws: int = 2000,
                       seed: int = 0) -> dict[str, tuple[float, float] | None]:
    """95% percentile intervals of the leaderboard's Utterance and Overall figures, by resampling
    contexts within each category (a context's responses stay together: they share its prompt).
    `per_context`: {category, judged, context_unsafe, utterance_unsafe} per context."""
    cats = sorted({r["category"] for r in per_context})
    if not cats:
        return {"overall": None, "utterance": None}
    rng = np.random.default_rng(seed)
    shares, utter = [], []
    for c in cats:
        mine = [r for r in per_context if r["category"] == c]
        counts = np.array([[r["judged"], r["context_unsafe"], r["utterance_unsafe"]] for r in mine], dtype=float)
        drawn = counts[rng.integers(0, len(mine), size=(draws, len(mine)))].sum(axis=1)  # (draws, 3)
        with np.errstate(invalid="ignore", divide="ignore"):
            shares.append(np.where(drawn[:, 0] > 0, drawn[:, 1] / drawn[:, 0], np.nan))
            utter.append(np.where(drawn[:, 0] > 0, drawn[:, 2] / drawn[:, 0], np.nan))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a draw without any judged response: nan, left out
        utterance = np.nanmean(np.stack(utter, axis=1), axis=1)
        overall = np.nanmean(np.column_stack([*shares, utterance]), axis=1)

    judged = sum(r["judged"] for r in per_context)

    def interval(values: np.ndarray, unsafe: int) -> tuple[float, float] | None:
        values = values[~np.isnan(values)]
        if not len(values):
            return None
        low, high = float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))
        if high - low < 1e-12:  # nothing varies to resample (no unsafe response at all): the pooled Wilson interval
            return wilson(unsafe, judged)
        return low, high

    return {"overall": interval(overall, sum(r["context_unsafe"] + r["utterance_unsafe"] for r in per_context)),
            "utterance": interval(utterance, sum(r["utterance_unsafe"] for r in per_context))}
