"""The whole TaeBench chain on Davidson's tweets, offline: attack -> quality filters -> transfer.

    .venv/bin/python bench/taebench_davidson.py [--seeds 300] [--recipes deepwordbug,pwws,textbugger]

Davidson is split three ways by a seeded shuffle: one part trains the label filter's tiny
classifier and a tiny LLM judge (served by redline's own OpenAI-compatible service), one part
trains a separate tiny BERT used as a transfer victim, and the rest provides attack seeds (toxic
for TAE, benign for BAE) against profanity-check. Grammar is skipped (no LanguageTool server
offline) and naturalness is off (no CoLA model offline); both are recorded in the manifest.
Prints one JSON object per row of the counts table (Table 2) and of the transfer table, and the
wall time of each pipeline.
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


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--seeds", type=int, default=300, help="Seeds per goal.")
    parser.add_argument("--recipes", default="deepwordbug,pwws,textbugger")
    parser.add_argument("--train-rows", type=int, default=3000)
    parser.add_argument("--judge-rows", type=int, default=400)
    args = parser.parse_args()


    from redline.actors.tiny_models import TinyBert, build_tiny_classifier, build_tiny_judge_lm
    from redline.cluster.config import validate_config
    from redline.cluster.net import free_port
    from redline.pipelines.attack import AttackConfig, run_attack
    from redline.pipelines.plane.corpora import CorpusConfig, read_corpus
    from redline.pipelines.quickstart import QUICKSTART_JUDGE_TEMPLATE, QUICKSTART_KEYWORDS
    from redline.pipelines.taebench import TaebenchConfig, run_taebench
    from redline.pipelines.transfer import TransferConfig, run_transfer
    from redline.serve import runner
    from redline.serve.config import ServeConfig

    work = Path(tempfile.mkdtemp(prefix="redline-taebench-davidson-"))
    rows = [r for r in read_corpus(CorpusConfig(path=args.corpus, preset="davidson")).to_pylist() if r["status"] == "ok"]
    random.Random(0).shuffle(rows)
    n = args.train_rows
    filter_part, victim_part, seed_part = rows[:n], rows[n:2 * n], rows[2 * n:]
    started = time.perf_counter()
    classifier = build_tiny_classifier([r["text"] for r in filter_part], [r["label"] for r in filter_part],
                                       work / "filter-bert", spec=TinyBert(epochs=4))
    victim_bert = build_tiny_classifier([r["text"] for r in victim_part], [r["label"] for r in victim_part],
                                        work / "victim-bert", spec=TinyBert(epochs=4, seed=1))
    judge_rows = filter_part[:args.judge_rows]
    judge = build_tiny_judge_lm([r["text"] for r in judge_rows], [r["label"] for r in judge_rows],
                                QUICKSTART_JUDGE_TEMPLATE, work / "judge", epochs=30)
    emit(measured="tiny models built (2 BERT classifiers, 1 judge LM)", wall_s=round(time.perf_counter() - started, 1))

    seeds_file = work / "seeds.jsonl"
    seeds_file.write_text("".join(json.dumps({"text": r["text"], "label": r["label"]}) + "\n" for r in seed_part))
    t = time.perf_counter()
    attack = run_attack(validate_config(AttackConfig, {
        "corpus": {"path": str(seeds_file), "text_column": "text", "label_column": "label", "toxic_values": [1],
                   "dataset": "davidson"},
        "victim": {"name": "profanity-check", "kind": "profanity-check", "batch_size": 8192},
        "recipes": args.recipes.split(","), "goals": ["tae", "bae"], "max_seeds": args.seeds,
        "actors": 2, "num_cpus": 0.9, "batch_size": 128, "output": str(work / "runs"), "run_name": "attack"}))
    emit(measured="attack", wall_s=round(time.perf_counter() - t, 1), summary=attack.summary)

    serve_cfg = ServeConfig.model_validate({"port": free_port(), "app_name": "judge", "api_key_env": None,
                                            "generators": [{"name": "tiny-judge", "model": str(judge), "num_cpus": 0.25}]})
    state = runner.start(serve_cfg, announce=lambda _: None)
    t = time.perf_counter()
    try:
        taebench = run_taebench(validate_config(TaebenchConfig, {
            "attacks": attack.run_uri, "grammar": {"skip_if_unavailable": True},
            "judge": {"base_url": state["url"] + "/v1", "model": "tiny-judge", "template": QUICKSTART_JUDGE_TEMPLATE,
                      "max_tokens": 3, "cache_dir": str(work / "judge-cache"), "concurrency": 16},
            "classifier": {"name": "filter-bert", "kind": "hf", "model": str(classifier), "num_cpus": 0.5},
            "test_fraction": 0.3, "output": str(work / "runs"), "run_name": "taebench"}))
    finally:
        runner.shutdown()
    emit(measured="taebench quality pipeline", wall_s=round(time.perf_counter() - t, 1),
         stages=taebench.manifest["stages"], judge_usage=taebench.manifest["judge_usage"])
    for row in taebench.summary:
        emit(measured="Table 2: rows remaining after each stage", **row)

    t = time.perf_counter()
    transfer = run_transfer(validate_config(TransferConfig, {
        "taebench": taebench.run_uri, "split": "test", "output": str(work / "runs"), "run_name": "transfer",
        "victims": [{"name": "profanity-check", "kind": "profanity-check", "num_cpus": 0.5},
                    {"name": "tiny-bert-other", "kind": "hf", "model": str(victim_bert), "num_cpus": 0.5},
                    {"name": "keywords", "kind": "keywords", "patterns": QUICKSTART_KEYWORDS, "num_cpus": 0.25}]}))
    emit(measured="transfer benchmark", wall_s=round(time.perf_counter() - t, 1), report=transfer.report_html)
    for row in transfer.summary:
        emit(measured="transfer table (TaeBench test split)", **row)
    emit(measured="whole chain", wall_s=round(time.perf_counter() - started, 1), work=str(work))


if __name__ == "__main__":
    main()
