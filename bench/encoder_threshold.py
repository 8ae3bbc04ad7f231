"""Calibrating the sentence encoder's threshold: ToxicTrap's recipes accept a word swap when the
Universal Sentence Encoder (USE) puts the two 15-word windows at angular similarity >= 0.840845057.
redline encodes with all-MiniLM-L6-v2 (USE needs TensorFlow Hub), and that threshold means something
else on another encoder's scale. This bench finds the MiniLM threshold that accepts the same share of
candidate swaps as USE does at its own threshold:

    .venv/bin/python bench/encoder_threshold.py --seeds 40 --write-pairs pairs.csv    # here: MiniLM only
    # where TF Hub is reachable: add a `use_similarity` column to pairs.csv (USE, angular, the two
    # windows), then
    .venv/bin/python bench/encoder_threshold.py --seeds 40 --use-scores pairs.csv     # the matched threshold

The candidate pairs are step one of `toxictrap-wordnet-*` on Davidson's offensive tweets (as
`bench/toxictrap_side_by_side.py` builds them): every WordNet swap at every modifiable word, each
window against the window it was made from. Without `--use-scores` (or with `--reference-rate R`,
a share accepted measured elsewhere) it prints MiniLM's acceptance at USE's threshold and the
thresholds that would accept given shares; it cannot say which share USE accepts.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from toxictrap_side_by_side import DEFAULT_CORPUS, davidson_seeds  # noqa: E402

USE_THRESHOLD = 0.840845057


def candidate_pairs(seeds: list[str]) -> list[tuple[str, str]]:
    """(window before, window after) for every WordNet swap at every modifiable word of each seed."""
    from redline.actors.attack.constraints import modifiable
    from redline.actors.attack.recipes import AttackResources, RecipeOptions, build
    from redline.actors.attack.text import AttackedText

    recipe = build(RecipeOptions(name="toxictrap-wordnet-delete"), AttackResources())
    pairs = []
    for text in seeds:
        t = AttackedText.from_text(text)
        if len(t.words) < 15:  # the recipes skip texts shorter than the window
            continue
        idx = modifiable(recipe.pre, t, t)
        for i, words in recipe.transformation.swaps(t, idx).items():
            pairs += [(t.window(i, 15), t.replace(i, w).window(i, 15)) for w in sorted(words)]
    return pairs


def minilm_similarity(pairs: list[tuple[str, str]]) -> np.ndarray:
    from redline.actors.attack.constraints import shared_encoder

    encoder = shared_encoder(None, "cpu")
    return np.asarray(encoder.similarity([a for a, _ in pairs], [b for _, b in pairs], "angular"))


def threshold_for(similarity: np.ndarray, rate: float) -> float:
    """The threshold accepting `rate` of the pairs (the (1 - rate) quantile of their similarities)."""
    return float(np.quantile(similarity, 1 - rate))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--write-pairs", type=Path, help="write the pairs (and MiniLM's similarity) as CSV")
    parser.add_argument("--use-scores", type=Path, help="pairs CSV with a use_similarity column (USE, angular)")
    parser.add_argument("--reference-rate", type=float, help="USE's acceptance share, measured elsewhere")
    args = parser.parse_args()

    if args.use_scores:
        with open(args.use_scores, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        pairs = [(r["before"], r["after"]) for r in rows]
        use = np.asarray([float(r["use_similarity"]) for r in rows])
    else:
        seeds = davidson_seeds(args.corpus, args.seeds)
        pairs, use = candidate_pairs(seeds), None
    if not pairs:
        raise SystemExit("no candidate pairs (no seed of 15 words or more?)")
    mini = minilm_similarity(pairs)
    if args.write_pairs:
        with open(args.write_pairs, "w", newline="", encoding="utf-8") as f:
            out = csv.writer(f)
            out.writerow(["before", "after", "minilm_similarity"])
            out.writerows((a, b, f"{s:.6f}") for (a, b), s in zip(pairs, mini))
    n = len(pairs)
    accepted = float(np.mean(mini >= USE_THRESHOLD))
    half = 1.96 * math.sqrt(accepted * (1 - accepted) / n)
    print(f"{n:,} candidate swaps; MiniLM (angular) accepts {accepted:.3f} (±{half:.3f}) at USE's threshold "
          f"{USE_THRESHOLD}; MiniLM similarity quartiles {np.quantile(mini, [0.25, 0.5, 0.75]).round(4).tolist()}")
    rate = float(np.mean(use >= USE_THRESHOLD)) if use is not None else args.reference_rate
    if rate is not None:
        source = "USE on these pairs" if use is not None else "the given reference rate"
        print(f"USE accepts {rate:.3f} ({source}): MiniLM's matched threshold is {threshold_for(mini, rate):.4f}")
        if use is not None:
            agree = float(np.mean((mini >= threshold_for(mini, rate)) == (use >= USE_THRESHOLD)))
            print(f"at that threshold MiniLM and USE give the same verdict on {agree:.3f} of the pairs")
        return 0
    print("USE's share is not known here (TF Hub is a download): MiniLM thresholds that would accept")
    for share in (0.5, 0.7, 0.8, 0.9, 0.95):
        print(f"  {share:.0%} of the swaps: {threshold_for(mini, share):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
