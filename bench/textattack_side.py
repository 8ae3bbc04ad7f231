"""TextAttack's half of bench/attack_vs_textattack.py. Runs inside TextAttack's own virtual
environment (textattack==0.3.11, transformers<5, alt-profanity-check):

    python bench/textattack_side.py SEEDS.jsonl RECIPE   # RECIPE: deepwordbug | pwws

Builds TextAttack's own recipe components with the targeted goal "predict benign" (class 0) on
profanity-check, attacks every seed, and prints one JSON line: ASR, mean queries, wall seconds.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np


def main() -> None:
    seeds_path, recipe = sys.argv[1], sys.argv[2]
    seeds = [json.loads(line)["text"] for line in open(seeds_path, encoding="utf-8")]
    started = time.perf_counter()
    import textattack
    from profanity_check import profanity_check as pc
    from textattack.attack_results import FailedAttackResult, SkippedAttackResult, SuccessfulAttackResult
    from textattack.constraints.overlap import LevenshteinEditDistance
    from textattack.constraints.pre_transformation import RepeatModification, StopwordModification
    from textattack.goal_functions import TargetedClassification
    from textattack.models.wrappers import ModelWrapper
    from textattack.search_methods import GreedyWordSwapWIR
    from textattack.transformations import (CompositeTransformation, WordSwapNeighboringCharacterSwap,
                                            WordSwapRandomCharacterDeletion, WordSwapRandomCharacterInsertion,
                                            WordSwapRandomCharacterSubstitution, WordSwapWordNet)

    class ProfanityCheck(ModelWrapper):
        def __init__(self) -> None:
            self.model = pc.model

        def __call__(self, texts):
            p = pc.model.predict_proba(pc.vectorizer.transform(list(texts)))[:, 1]
            return np.stack([1 - p, p], axis=1)

    goal = TargetedClassification(ProfanityCheck(), target_class=0)
    if recipe == "deepwordbug":
        transformation = CompositeTransformation([
            WordSwapNeighboringCharacterSwap(), WordSwapRandomCharacterSubstitution(),
            WordSwapRandomCharacterDeletion(), WordSwapRandomCharacterInsertion()])
        constraints = [RepeatModification(), StopwordModification(), LevenshteinEditDistance(30)]
        search = GreedyWordSwapWIR()
    elif recipe == "pwws":
        transformation = WordSwapWordNet()
        constraints = [RepeatModification(), StopwordModification()]
        search = GreedyWordSwapWIR("weighted-saliency")
    else:
        raise SystemExit(f"unknown recipe {recipe}")
    attack = textattack.Attack(goal, constraints, transformation, search)
    counts = {"success": 0, "failed": 0, "skipped": 0}
    queries = []
    for text in seeds:
        result = attack.attack(text, 1)
        if isinstance(result, SuccessfulAttackResult):
            counts["success"] += 1
        elif isinstance(result, FailedAttackResult):
            counts["failed"] += 1
        elif isinstance(result, SkippedAttackResult):
            counts["skipped"] += 1
            continue
        queries.append(result.num_queries)
    wall = time.perf_counter() - started
    tried = counts["success"] + counts["failed"]
    print(json.dumps({"recipe": recipe, **counts, "asr": counts["success"] / tried if tried else None,
                      "mean_queries": float(np.mean(queries)) if queries else None, "wall_s": wall,
                      "examples_per_s": len(seeds) / wall}))


if __name__ == "__main__":
    main()
