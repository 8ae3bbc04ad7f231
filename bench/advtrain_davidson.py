"""Adversarial training on Davidson (the paper's Table 5) with a TaeBench run from bench/taebench_davidson.py.

    .venv/bin/python bench/advtrain_davidson.py --taebench RUN_DIR --base-model MODEL_DIR [--train-rows 2000]

The base training set and the seed test split are disjoint slices of Davidson, shuffled with the
same seed as bench/taebench_davidson.py uses, so neither overlaps the attack seeds. Prints one JSON
object per variant (best trial) and the sweep's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("REDLINE_PROGRESS", "0")

HERE = Path(__file__).resolve().parent
DEFAULT_CORPUS = HERE.parents[1] / "shared" / "data" / "offensive_tweet" / "labeled_data.csv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--taebench", required=True)
    parser.add_argument("--base-model", required=True)
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--train-rows", type=int, default=2000)
    parser.add_argument("--test-rows", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--holdout", default="textbugger", help="Recipes kept out of training TAE.")
    args = parser.parse_args()

    from redline.cluster.config import validate_config
    from redline.pipelines.advtrain import AdvTrainConfig, run_advtrain
    from redline.pipelines.plane.corpora import CorpusConfig, read_corpus

    work = Path(tempfile.mkdtemp(prefix="redline-advtrain-davidson-"))
    rows = [r for r in read_corpus(CorpusConfig(path=args.corpus, preset="davidson")).to_pylist() if r["status"] == "ok"]
    random.Random(0).shuffle(rows)
    parts = {"train": rows[:args.train_rows], "test": rows[args.train_rows:args.train_rows + args.test_rows]}
    corpora = {}
    for name, part in parts.items():
        path = work / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"text": r["text"], "label": r["label"]}) + "\n" for r in part))
        corpora[name] = {"path": str(path), "text_column": "text", "label_column": "label", "toxic_values": [1],
                         "dataset": "davidson", "split": name}
    started = time.perf_counter()
    result = run_advtrain(validate_config(AdvTrainConfig, {
        "taebench": args.taebench, "base_model": args.base_model, "train_corpus": corpora["train"],
        "test_corpus": corpora["test"], "holdout_recipes": args.holdout.split(",") if args.holdout else [],
        "search": {"learning_rate": [1e-4], "epochs": [args.epochs], "batch_size": [32]},
        "num_cpus": 1, "output": str(work / "runs"), "run_name": "advtrain"}))
    for row in result.summary:
        print(json.dumps({"measured": "Table 5 (best trial per variant)", **{k: v for k, v in row.items() if k != "checkpoint"}}))
    print(json.dumps({"measured": "advtrain sweep", "wall_s": round(time.perf_counter() - started, 1),
                      "data": result.manifest["data"], "report": result.report_html}))


if __name__ == "__main__":
    main()
