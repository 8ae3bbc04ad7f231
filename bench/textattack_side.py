"""TextAttack's half of bench/attack_vs_textattack.py. Runs inside TextAttack's own virtual
environment (textattack==0.3.11, transformers<5, alt-profanity-check):

    python bench/textattack_side.py SEEDS.jsonl RECIPE [--victim profanity-check|HF_DIR] [--per-seed OUT.jsonl]

Builds TextAttack's own recipe components with the targeted goal "predict benign" (class 0) on
profanity-check (or an HF classifier directory, through TextAttack's HuggingFaceModelWrapper),
attacks every seed, and prints one JSON line: ASR, mean queries, wall seconds. With --per-seed it
also writes each seed's outcome and perturbed text (to compare attacks).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def load_tokenizer(transformers, path: str):
    """transformers 5 saves `tokenizer_class: TokenizersBackend`, which 4.x (TextAttack's) lacks:
    fall back to the fast tokenizer file with the saved special tokens."""
    try:
        return transformers.AutoTokenizer.from_pretrained(path)
    except ValueError:
        saved = json.load(open(f"{path}/tokenizer_config.json", encoding="utf-8"))
        special = {k: v for k, v in saved.items() if k.endswith("_token") and isinstance(v, str)}
        return transformers.PreTrainedTokenizerFast(tokenizer_file=f"{path}/tokenizer.json",
                                                    model_max_length=saved.get("model_max_length", 512), **special)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("seeds")
    parser.add_argument("recipe")
    parser.add_argument("--victim", default="profanity-check")
    parser.add_argument("--per-seed")
    args = parser.parse_args()
    seeds_path, recipe = args.seeds, args.recipe
    seeds = [json.loads(line)["text"] for line in open(seeds_path, encoding="utf-8")]
    started = time.perf_counter()
    import textattack
    from profanity_check import profanity_check as pc
    from textattack.attack_results import (
        FailedAttackResult,
        SkippedAttackResult,
        SuccessfulAttackResult,
    )
    from textattack.constraints.overlap import LevenshteinEditDistance
    from textattack.constraints.pre_transformation import (
        RepeatModification,
        StopwordModification,
    )
    from textattack.goal_functions import TargetedClassification
    from textattack.models.wrappers import ModelWrapper
    from textattack.search_methods import GreedyWordSwapWIR
    from textattack.transformations import (
        CompositeTransformation,
        WordSwapNeighboringCharacterSwap,
        WordSwapRandomCharacterDeletion,
        WordSwapRandomCharacterInsertion,
        WordSwapRandomCharacterSubstitution,
        WordSwapWordNet,
    )

    class ProfanityCheck(ModelWrapper):
        def __init__(self) -> None:
            self.model = pc.model

        def __call__(self, texts):
            p = pc.model.predict_proba(pc.vectorizer.transform(list(texts)))[:, 1]
            return np.stack([1 - p, p], axis=1)

    if args.victim == "profanity-check":
        model = ProfanityCheck()
    else:
        import transformers
        from textattack.models.wrappers import HuggingFaceModelWrapper

        model = HuggingFaceModelWrapper(transformers.AutoModelForSequenceClassification.from_pretrained(args.victim),
                                        load_tokenizer(transformers, args.victim))
    goal = TargetedClassification(model, target_class=0)
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
    per_seed = open(args.per_seed, "w", encoding="utf-8") if args.per_seed else None
    for text in seeds:
        result = attack.attack(text, 1)
        if per_seed:
            per_seed.write(json.dumps({"text": text, "outcome": type(result).__name__, "queries": result.num_queries,
                                       "perturbed": result.perturbed_result.attacked_text.text}) + "\n")
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
