"""The card's uncertainty and its release gate, on hand-computed cases."""

from __future__ import annotations

import pytest

from redline.errors import RedlineError
from redline.pipelines import gates
from redline.pipelines.uncertainty import proportion, wilson


def test_wilson_intervals_match_hand_computed_cases():
    # 4 of 8 (the quickstart card's trigger figure): p = 0.5, z = 1.96,
    # centre 0.5, half-width 1.96 * sqrt(0.25/8 + 1.96^2/256) / (1 + 1.96^2/8) = 0.2848
    low, high = wilson(4, 8)
    assert low == pytest.approx(0.2152, abs=1e-4) and high == pytest.approx(0.7848, abs=1e-4)
    assert wilson(0, 10) == (0.0, pytest.approx(0.2775, abs=1e-4))  # never below 0, never a point at 0
    assert wilson(90, 90)[1] == 1.0 and wilson(90, 90)[0] == pytest.approx(0.9591, abs=1e-4)
    assert wilson(0, 0) is None
    with pytest.raises(ValueError):
        wilson(5, 4)


def test_a_proportion_carries_its_n_and_says_whether_it_is_conclusive():
    small = proportion(0.5, 8)
    assert small["n"] == 8 and small["conclusive"] is False  # 0.22-0.78: too wide to read
    large = proportion(0.5, 2000)
    assert large["conclusive"] is True and large["high"] - large["low"] < 0.05
    assert proportion(None, 0) == {"value": None, "n": 0, "low": None, "high": None, "conclusive": False}


FIGURES = {"guard.transfer.asr_tae": {**proportion(0.412, 90)}, "triggers.hit_rate": {**proportion(0.5, 8)}}
KEYS = ("guard.transfer.asr_tae", "guard.transfer.asr_bae", "triggers.hit_rate")


def test_fail_if_rules_hold_fail_closed_and_are_checked_before_a_run():
    rules = gates.parse(["guard.transfer.asr_tae > 0.3", "triggers.hit_rate.high >= 0.9",
                         "guard.transfer.asr_tae.n < 100", "guard.transfer.asr_bae <= 0.1"], KEYS)
    failing = gates.failures(rules, FIGURES)
    assert failing[0].startswith("--fail-if 'guard.transfer.asr_tae > 0.3' holds: guard.transfer.asr_tae.value is "
                                 "0.412 (n 90, 95% ")
    assert failing[1].startswith("--fail-if 'guard.transfer.asr_tae.n < 100' holds")
    assert failing[2] == ("--fail-if 'guard.transfer.asr_bae <= 0.1': the run has no guard.transfer.asr_bae.value "
                          "to check")
    assert len(failing) == 3  # the trigger rate's upper end is 0.78: that rule does not hold
    with pytest.raises(RedlineError, match="no figure 'guard.asr'"):
        gates.parse(["guard.asr > 0.3"], KEYS)
    for bad in ("guard.transfer.asr_tae >> 0.3", "guard.transfer.asr_tae > x", "rm -rf / > 1"):
        with pytest.raises(RedlineError, match="expected FIGURE"):
            gates.parse([bad], KEYS)
