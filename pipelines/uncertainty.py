"""How sure a proportion is: its 95% Wilson score interval, and whether it is narrow enough to read.

Wilson rather than the normal approximation: the card's counts are small (8 targets, 22 BAEs) and
its proportions sit near 0 or 1, where the normal interval leaves [0, 1] or collapses to a point.
"""

from __future__ import annotations

import math

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
