"""How a trigger search is run: one settings type with one set of defaults. The egregious config
takes these fields as its own (a run's YAML sets them at the top level), the worker receives them,
and gibbs-enum's `SearchOptions` extends them with the per-call hit type and engine knobs."""

from __future__ import annotations

from typing import Literal

from redline.cluster.config import Result, Strict


class TriggerSearchSettings(Strict):
    """The search of every target of a run (He & Glass 2019's Algorithm 1 and its baseline)."""

    method: Literal["gibbs-enum", "continuous"] = Result("gibbs-enum", description="continuous: the paper's "
                                                                                  "relaxation baseline.")
    trigger_length: int = Result(15, gt=0, description="Trigger tokens searched: the paper's full-length inputs "
                                                      "(its maximum input length, 15); shorter is faster.")
    top_g: int = Result(100, gt=0, description="Candidate tokens per position (G).")
    max_sweeps: int = Result(50, gt=0, description="At most T sweeps over the positions.")
    restarts: int = Result(10, gt=0, description="R random restarts per target.")
    lm_weight: float = Result(1.0, ge=0, description="Weight of the LM's average log-likelihood in io objectives.")
    greedy_margin_cap: float = Result(0.1, gt=0, description="o-greedy objective: margins count up to this cap; any "
                                                            "non-positive margin costs more than all capped ones "
                                                            "(0.1: chosen on the normal list, bench/table3.py --caps).")
    relaxation_steps: int = Result(200, gt=0, description="Optimiser steps of the continuous baseline.")
    seed: int = Result(0, description="Seeds each target's restarts (with the target's text).")
