"""Rows/second of the score pipeline vs the same detector called in a plain loop, in one run.

    .venv/bin/python bench/score_throughput.py [--corpus ../shared/data/offensive_tweet/labeled_data.csv]

Prints one JSON object per figure. Pipeline timings include actor start-up and writing the run
directory, and exclude Ray's own start-up (done once, first). The loop baseline calls the detector
on one text at a time, as a script without batching would; the batched baseline is one call on
all rows in this process, the ceiling for a single process.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("REDLINE_PROGRESS", "0")

DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "offensive_tweet" / "labeled_data.csv"


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--loop-rows", type=int, default=3000, help="rows for the one-at-a-time baseline")
    args = parser.parse_args()

    import ray

    from redline.actors.detectors import DetectorConfig, build_detector
    from redline.actors.tiny_models import TinyBert, build_tiny_classifier
    from redline.cluster.config import validate_config
    from redline.cluster.runtime import ensure_ray
    from redline.pipelines.plane.corpora import CorpusConfig, read_corpus
    from redline.pipelines.score import ScoreConfig, run_score

    corpus = read_corpus(CorpusConfig(path=args.corpus, preset="davidson"))
    texts = [t for t, s in zip(corpus.column("text").to_pylist(), corpus.column("status").to_pylist()) if s == "ok"]
    work = Path(tempfile.mkdtemp(prefix="redline-bench-"))
    train = corpus.slice(0, 4000).to_pylist()
    model = build_tiny_classifier([r["text"] for r in train], [r["label"] for r in train], work / "tiny",
                                  spec=TinyBert(epochs=1, hidden_size=64, num_layers=2))
    detectors = {
        "profanity-check": {"kind": "profanity-check", "batch_size": 2048},
        "tiny-bert": {"kind": "hf", "model": str(model), "batch_size": 128, "max_length": 64},
    }
    ensure_ray()
    on = f"Davidson, {len(texts):,} rows, {os.cpu_count()} CPUs"
    for name, spec in detectors.items():
        det_cfg = DetectorConfig.model_validate({"name": name, **spec})
        detector = build_detector(det_cfg)
        sample = texts[: args.loop_rows]
        started = time.perf_counter()
        for text in sample:
            detector.predict_proba([text])
        loop_rate = len(sample) / (time.perf_counter() - started)
        started = time.perf_counter()
        detector.predict_proba(texts)
        batched_rate = len(texts) / (time.perf_counter() - started)
        for actors in (1, 2):
            cfg = validate_config(ScoreConfig, {
                "corpus": {"path": args.corpus, "preset": "davidson"},
                "detectors": [{"name": name, **spec, "actors": actors, "num_cpus": (os.cpu_count() or 2) / actors}],
                "output": str(work / "runs"), "run_name": f"{name}-{actors}", "shard_size": 5000,
            })
            started = time.perf_counter()
            run_score(cfg, force=True)
            rate = len(corpus) / (time.perf_counter() - started)
            emit(measured=f"score pipeline rows/s, {name}, {actors} actor(s), vs one-text-at-a-time loop",
                 on=on, ours=round(rate, 1), baseline=round(loop_rate, 1), ratio=round(rate / loop_rate, 2),
                 unit="rows/s")
            emit(measured=f"score pipeline rows/s, {name}, {actors} actor(s), vs one batched call in-process",
                 on=on, ours=round(rate, 1), baseline=round(batched_rate, 1), ratio=round(rate / batched_rate, 2),
                 unit="rows/s")
    ray.shutdown()


if __name__ == "__main__":
    main()
