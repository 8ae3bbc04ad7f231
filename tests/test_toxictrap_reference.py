"""ToxicTrap's step one side by side with the reference, TextAttack 0.3.11 building QData's
TextAttack-Multilabel components (bench/toxictrap_side_by_side.py). TextAttack stays out of the
project's dependencies: it runs from its own environment, bench/.textattack-venv or
REDLINE_TEXTATTACK_PYTHON (the bench's docstring says how to make it); without one, this is skipped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SHARED_DATA

ROOT = Path(__file__).resolve().parents[1]
PYTHON = Path(os.environ.get("REDLINE_TEXTATTACK_PYTHON", ROOT / "bench" / ".textattack-venv" / "bin" / "python"))


@pytest.mark.slow
@pytest.mark.reference_env
@pytest.mark.skipif(not PYTHON.exists(), reason=f"no TextAttack 0.3.11 environment at {PYTHON} "
                                                "(bench/toxictrap_side_by_side.py says how to make one)")
def test_toxictrap_step_one_matches_textattack_with_the_reference_settings(tmp_path):
    """The modifiable words, every WordNet swap and character edit, and the sentence encoder's verdicts
    match TextAttack's exactly with the reference's settings; with redline's defaults the differences
    are the ones README names (case, hyphenated lemmas, capitalised stopwords), never the encoder's."""
    import json

    out = tmp_path / "side.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "toxictrap_side_by_side.py"), "--seeds", "12",
                           "--corpus", str(SHARED_DATA / "offensive_tweet" / "labeled_data.csv"),
                           "--textattack-python", str(PYTHON), "--json", str(out)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(out.read_text())
    exact = results["the reference's settings"]
    assert all(r["agree"] == r["of"] > 0 for r in exact.values()), exact
    defaults = results["redline's defaults"]
    assert defaults["encoder"]["agree"] == defaults["encoder"]["of"] and defaults["chars"]["agree"] == defaults["chars"]["of"]
    assert defaults["wordnet"]["agree"] < defaults["wordnet"]["of"]  # case-matched synonyms: named, on purpose
