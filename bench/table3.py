"""gibbs-enum's Table 3 on a pair corpus, measured as the paper measures it, with the planted check.

    .venv/bin/python bench/table3.py [--context attention] [--vocab 5000] [--hidden 256] [--embedding 128]
        [--epochs 8] [--optimizer adam|sgd] [--targets 60] [--trigger-length 5] [--model DIR]

The paper's sizes: --vocab 30000 (10000 for Switchboard) --embedding 300 --hidden 600 --epochs 20
--optimizer sgd.
Trains an LSTM seq2seq on DiaSafety train pairs (REDLINE_DIASAFETY_DIR or
../shared/data/diasafety), builds the lists from validation inputs — planted (greedy outputs of inputs
of exactly the trigger length), normal (distinct greedy outputs, o-greedy), normal-sample (words above
T_out, o-sample-min), random (o-greedy and o-sample-min: the paper's 0%), mal (o-sample-avg, and io-sample-min
and io-sample-avg with an LSTM LM over inputs trained alongside: the trigger must also be a likely input, its average
LM log-likelihood at least T_in) — and runs gibbs-enum
(G = 100, R = 10, T <= 50) on `--targets` of each. Prints one JSON object per list: its size, the hit
rate of its hit type, seconds per target; for planted also the share of reachable targets found and
how the misses split (a local optimum vs. an objective that ranks a miss first); for a list with few
hits, which targets were hit and under which trigger; for random and mal, hits by the target's length.
`--chunk N` prints each cell so far after every N targets (a long cell survives an interruption).
`--model` (and `--lm` for the io rows) measures models trained by an earlier run again (other lengths, more
targets) without training them anew.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from collections import Counter

os.environ.setdefault("REDLINE_PROGRESS", "0")


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", default="attention", choices=["attention", "last-h"])
    parser.add_argument("--context-feed", default="combine", choices=["combine", "input"],
                        help="where the context enters the decoder: combine (after the LSTM, redline's first "
                             "model) or input (beside the word embedding, the paper's architecture)")
    parser.add_argument("--vocab", type=int, default=5000)
    parser.add_argument("--embedding", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--optimizer", default="adam", choices=["adam", "sgd"],
                        help="sgd: the paper's schedule (lr 1, halved when validation stops improving)")
    parser.add_argument("--targets", type=int, default=60)
    parser.add_argument("--trigger-length", type=int, default=5)
    parser.add_argument("--cap", type=float, default=0.1, help="greedy_margin_cap (redline's default)")
    parser.add_argument("--caps", default=None, help="compare several greedy_margin_cap values on the same model "
                                                     "and targets, e.g. 0.1,1.0 (o-greedy lists only)")
    parser.add_argument("--model", default=None, help="a model this bench trained before (its `model trained` line "
                                                      "gives the path): measure it again without training")
    parser.add_argument("--lm", default=None, help="the LM an earlier run trained (its `lm trained` line), for the io "
                                                   "rows; without it one is trained with the seq2seq's settings")
    parser.add_argument("--chunk", type=int, default=0,
                        help="search a cell's targets this many at a time, printing the cell so far after each chunk "
                             "(a long cell's figures survive an interrupted run; each target's search is seeded by "
                             "its own text, so chunks give the same results)")
    parser.add_argument("--only", nargs="*", default=None, metavar="LIST:SEARCH",
                        help="run only these (list, search) pairs, e.g. random:o-sample-min mal:io-sample-avg")
    args = parser.parse_args()

    import torch

    from redline.actors.triggers import hits as H
    from redline.actors.triggers import models as M
    from redline.actors.triggers.gibbs import GibbsEnum, SearchOptions
    from redline.actors.triggers.scorers import LSTMPrior, LSTMSeq2SeqTarget
    from redline.actors.triggers.targets import (
        Target,
        mal_list,
        normal_list,
        normal_sample_list,
        planted_list,
        random_list,
    )
    from redline.actors.triggers.training import TriggerModelTrainConfig, train
    from redline.cluster.config import validate_config
    from redline.pipelines.quickstart import diasafety_data_dir
    from redline.pipelines.reporting.uncertainty import wilson

    data = diasafety_data_dir()
    started = time.perf_counter()
    output = tempfile.mkdtemp(prefix="redline-table3-")

    def trained_model(kind: str, name: str) -> M.TrainedModel:  # the LM shares the seq2seq's vocabulary
        return train(validate_config(TriggerModelTrainConfig, {
            "pairs": {"path": str(data / "train.json")}, "vocab_size": args.vocab, "embedding_dim": args.embedding,
            "hidden_dim": args.hidden, "context": args.context, "optimizer": args.optimizer,
            "context_feed": args.context_feed if kind == "seq2seq" else "combine",
            "learning_rate": 0.003 if args.optimizer == "adam" else 1.0,
            "epochs": args.epochs, "output": output, "name": name}), kind)

    trained = M.load(args.model) if args.model else trained_model("seq2seq", "s2s")
    spec = trained.spec
    emit(measured="model loaded" if args.model else "model trained", path=str(trained.path), context=spec.context,
         context_feed=spec.context_feed, vocab=len(trained.vocab), embedding=spec.embedding_dim, hidden=spec.hidden_dim,
         test_ppl=round(trained.metrics["test_ppl"], 1), t_out=round(trained.thresholds.average_logprob, 3),
         wall_s=round(time.perf_counter() - started, 1))
    inputs = [r["context"] for r in json.loads((data / "val.json").read_text())]
    L = args.trigger_length
    t = time.perf_counter()
    dropped = {k: Counter() for k in ("planted", "normal", "normal-sample")}
    lists = {"planted": planted_list(trained, inputs, L, n=args.targets, dropped=dropped["planted"]),
             "normal": normal_list(trained, inputs, dropped=dropped["normal"]),
             "normal-sample": normal_sample_list(trained, inputs, dropped=dropped["normal-sample"]),
             "mal": [Target(t) for t in mal_list()]}
    emit(measured="lists built", sizes={k: len(v) for k, v in lists.items()}, seconds=round(time.perf_counter() - t, 1),
         inputs=len(inputs), replies_left_out={k: dict(v) for k, v in dropped.items()})

    def sample(name: str, items: list[Target]) -> list[str]:  # a list's targets, whichever rows run before it
        return [x.text for x in random.Random(name).sample(items, min(args.targets, len(items)))]

    model = LSTMSeq2SeqTarget(trained, torch.float32)
    runs = [("planted", "o-greedy"), ("normal", "o-greedy"), ("normal-sample", "o-sample-min"),
            ("random", "o-greedy"), ("random", "o-sample-min"), ("mal", "o-sample-avg"),
            ("mal", "io-sample-min"), ("mal", "io-sample-avg")]
    if args.only or args.caps:
        runs = [tuple(pair.split(":", 1)) for pair in (args.only or ["normal:o-greedy"])]
    prior, t_in = None, None
    if any(H.uses_lm(kind) for _, kind in runs):
        t = time.perf_counter()
        lm = M.load(args.lm) if args.lm else trained_model("lm", "lm")
        if lm.vocab.words != trained.vocab.words:
            raise SystemExit(f"{lm.path}: not the seq2seq's vocabulary (train both with the same settings)")
        prior, t_in = LSTMPrior(lm, torch.float32), lm.thresholds.average_logprob
        emit(measured="lm loaded" if args.lm else "lm trained", path=str(lm.path),
             test_ppl=round(lm.metrics["test_ppl"], 1), t_in=round(t_in, 3), wall_s=round(time.perf_counter() - t, 1))
    th = H.Thresholds(trained.thresholds.average_logprob, t_in)

    def search(kind: str, cap: float | None = None) -> GibbsEnum:
        return GibbsEnum(model, prior if H.uses_lm(kind) else None, th,
                         SearchOptions(search=kind, trigger_length=L, top_g=100, restarts=10, max_sweeps=50,
                                       greedy_margin_cap=cap or args.cap))

    if args.caps:  # the same targets under each cap: which one finds more, target by target
        caps = [float(c) for c in args.caps.split(",")]
        for name, kind in runs:
            items = lists[name]
            texts = sample(name, items)
            reached = {}
            for cap in caps:
                t = time.perf_counter()
                found = {r.target: r.reached for r in search(kind, cap).run(texts) if not isinstance(r, str)}
                reached[cap] = found
                hits = sum(found.values())
                interval = wilson(hits, len(found))
                emit(list=name, hit_type=H.goal_hit(kind), cap=cap, searchable=len(found), hits=hits,
                     hit_rate=round(hits / max(1, len(found)), 3),
                     wilson_95=[round(x, 3) for x in interval] if interval else None,
                     s_per_target=round((time.perf_counter() - t) / max(1, len(texts)), 2))
            a, b = caps[0], caps[-1]
            only_a = sum(reached[a][x] and not reached[b].get(x, False) for x in reached[a])
            only_b = sum(reached[b][x] and not reached[a].get(x, False) for x in reached[b])
            emit(list=name, compared=f"cap {a} vs {b}", hit_only_with_first=only_a, hit_only_with_last=only_b)
        return

    def cell(name: str, kind: str, texts: list[str], found: list, seconds: float) -> dict:
        hits = sum(r.reached for r in found)
        interval = wilson(hits, len(found))
        row = {"list": name, "hit_type": H.goal_hit(kind), "targets": len(texts), "searchable": len(found),
               "hit_rate": round(hits / max(1, len(found)), 3), "hits": hits,
               "wilson_95": [round(x, 3) for x in interval] if interval else None,
               "s_per_target": round(seconds / max(1, len(texts)), 2), "trigger_length": L, "cap": args.cap}
        if kind != "o-greedy":  # k = 2 (the threshold log 2 lower) from the same searches: the objective has no k
            k2 = sum(f"{kind}-2-hit" in r.hits for r in found)
            row.update(hits_k2=k2, hit_rate_k2=round(k2 / max(1, len(found)), 3),
                       wilson_95_k2=[round(x, 3) for x in wilson(k2, len(found))] if found else None)
        if hits <= 10:  # a rare hit is worth reading: which target, under which trigger
            row["hit_targets"] = [{"target": r.target, "words": len(r.target.split()), "trigger": r.trigger,
                                   "target_logprobs": [round(x, 2) for x in r.target_logprobs]}
                                  for r in found if r.reached]
        if H.uses_lm(kind):  # which half of an io hit holds the misses back: the output's or the input's
            output_hit = f"{kind.removeprefix('i')}-1-hit"
            row.update(output_part=sum(output_hit in r.hits for r in found),
                       input_part=sum(r.lm_average is not None and r.lm_average >= t_in for r in found))
        if name in ("random", "mal"):  # hits by the target's length in words: short targets are the easy ones
            by_words = Counter(min(len(r.target.split()), 4) for r in found)
            hit_words = Counter(min(len(r.target.split()), 4) for r in found if r.reached)
            row["by_words"] = {f"{k}{'+' if k == 4 else ''}": f"{hit_words[k]}/{by_words[k]}" for k in sorted(by_words)}
        if name == "planted":
            misses = [r for r in found if not r.reached]
            row.update(local_optima=sum(source_obj[r.target] > r.objective for r in misses),
                       objective_defects=sum(source_obj[r.target] <= r.objective for r in misses))
        return row

    for name, kind in runs:
        items = lists.get(name)
        texts = (sample(name, items) if items is not None
                 else random_list(trained.vocab.words, n=args.targets, seed=0))
        gibbs = search(kind)
        if name == "planted":  # only targets whose source itself reaches the hit: a trigger is known to exist
            sources = {x.text: x.source for x in items}  # the first input (the planted one: of the trigger length)
            checks = gibbs.check([sources[x] for x in texts], texts)
            texts = [x for x, c in zip(texts, checks) if c is not None and c[0]]
            source_obj = {x: c[1] for x, c in zip(texts, [c for c in checks if c is not None and c[0]])}
        t = time.perf_counter()
        found = []
        step = args.chunk or len(texts) or 1
        for at in range(0, len(texts), step):
            found += [r for r in gibbs.run(texts[at:at + step]) if not isinstance(r, str)]
            if at + step < len(texts):
                emit(**cell(name, kind, texts[:at + step], found, time.perf_counter() - t), partial=True)
        emit(**cell(name, kind, texts, found, time.perf_counter() - t))


if __name__ == "__main__":
    main()
