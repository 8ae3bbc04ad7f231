"""Batched gibbs-enum vs the paper's one-candidate-per-forward loop, on the same tiny model and targets.

    .venv/bin/python bench/trigger_search.py [--targets 40] [--naive-targets 6] [--hidden 32] [--vocab 1000]

Trains a tiny LSTM seq2seq (attention) and LM on DiaSafety pairs (REDLINE_DIASAFETY_DIR or
../shared/data/diasafety), takes targets from its normal and mal lists, and runs the paper's
defaults (G = 100, R = 10, T <= 50, trigger length 5) both ways: our batched search over all targets
at once (bounded candidate scoring, targets sorted by length), and the one-candidate loop (one
forward pass per candidate, one backward pass per trigger) on `--naive-targets` of them (normal
and mal in the batch's proportions). Prints seconds per target, the speed-up, the share of
candidates that needed the full vocabulary, and whether both found the same triggers (in float32
a near-tie can fall the other way between a batch and a single row; float64 decides identically).
nanoGCG (the GCG comparison of the issue) needs its own environment pinned to transformers <= 4.47
and is not run here.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("REDLINE_PROGRESS", "0")


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=40)
    parser.add_argument("--naive-targets", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--search", default="o-sample-avg")
    parser.add_argument("--trigger-length", type=int, default=5, help="the paper's is 15 (3x slower)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args = parser.parse_args()

    import torch

    from redline.actors.triggers.gibbs import GibbsEnum, SearchOptions
    from redline.actors.triggers.hits import Thresholds
    from redline.actors.triggers.scorers import LSTMPrior, LSTMSeq2SeqTarget
    from redline.actors.triggers.targets import mal_list, normal_list
    from redline.actors.triggers.training import TriggerModelTrainConfig, train
    from redline.cluster.config import validate_config
    from redline.pipelines.quickstart import diasafety_data_dir

    data = diasafety_data_dir()
    work = Path(tempfile.mkdtemp(prefix="redline-trigger-bench-"))
    started = time.perf_counter()
    trained = {}
    for kind in ("seq2seq", "lm"):
        trained[kind] = train(validate_config(TriggerModelTrainConfig, {
            "pairs": {"path": str(data / "train.json")}, "vocab_size": args.vocab, "embedding_dim": args.hidden,
            "hidden_dim": args.hidden, "optimizer": "adam", "learning_rate": 0.003, "epochs": 3, "dropout": 0.1,
            "output": str(work), "name": kind}), kind)
    s2s, lm = trained["seq2seq"], trained["lm"]
    emit(measured="tiny models trained", hidden=args.hidden, vocab=len(s2s.vocab), test_ppl=s2s.metrics["test_ppl"],
         wall_s=round(time.perf_counter() - started, 1), torch_threads=torch.get_num_threads())

    inputs = [r["context"] for r in json.loads((data / "val.json").read_text())]
    half = args.targets // 2
    normal = [t.text for t in normal_list(s2s, inputs, n=half)]
    mal = [t for t in mal_list() if not s2s.vocab.oov(t)][: args.targets - len(normal)]
    targets = normal + mal
    thresholds = Thresholds(s2s.thresholds.average_logprob, lm.thresholds.average_logprob)
    dtype = getattr(torch, args.dtype)
    model, prior = LSTMSeq2SeqTarget(s2s, dtype), LSTMPrior(lm, dtype)
    opts = dict(search=args.search, trigger_length=args.trigger_length, top_g=100, restarts=10, max_sweeps=50)

    t = time.perf_counter()
    fast = GibbsEnum(model, prior, thresholds, SearchOptions(**opts))
    batched = fast.run(targets)
    batched_s = time.perf_counter() - t
    # The loop is slow: a sample with the same share of normal and mal targets as the batch.
    k = max(1, round(args.naive_targets * len(normal) / len(targets)))
    pick = list(range(min(k, len(normal)))) + list(range(len(normal), len(normal) + args.naive_targets - k))
    few = [targets[i] for i in pick]
    t = time.perf_counter()
    slow = GibbsEnum(model, prior, thresholds, SearchOptions(**opts, one_at_a_time=True))
    naive = slow.run(few)
    naive_s = time.perf_counter() - t
    same = sum(batched[i].trigger_ids == b.trigger_ids for i, b in zip(pick, naive))
    # Both paths take the same decisions, so a target costs the same number of scored sequences
    # either way: compare seconds per scored sequence, and per target at the batch's mean effort.
    seq_b, seq_n = batched_s / fast.counters.sequences, naive_s / slow.counters.sequences
    per_target_seqs = fast.counters.sequences / len(targets)
    per_b, per_n = seq_b * per_target_seqs, seq_n * per_target_seqs
    reached = {name: sum(r.reached for r in batched[i:j]) / max(1, j - i)
               for name, i, j in (("normal", 0, len(normal)), ("mal", len(normal), len(targets)))}
    emit(measured=f"gibbs-enum {args.search}: batched vs one candidate per forward pass",
         on=f"{len(targets)} targets ({len(normal)} normal, {len(mal)} mal), G=100 R=10 T<=50 length {args.trigger_length}, {args.dtype}",
         sequences_per_target=round(per_target_seqs), batched_us_per_sequence=round(1e6 * seq_b, 1),
         naive_us_per_sequence=round(1e6 * seq_n, 1), batched_s_per_target=round(per_b, 3),
         naive_s_per_target=round(per_n, 3), speedup=round(per_n / per_b, 1),
         full_vocabulary_share=round(fast.counters.exact / fast.counters.sequences, 3),
         **({"lm_scored_share": round(fast.counters.lm / fast.counters.sequences, 3)}
            if args.search.startswith("io") and hasattr(fast.counters, "lm") else {}),
         identical_triggers=f"{same}/{len(few)}", reached_batched=reached)


if __name__ == "__main__":
    main()
