"""gibbs-enum vs nanoGCG on the same tiny causal LM: hit rate and median time-to-hit per list.

    .venv/bin/python bench/trigger_vs_nanogcg.py --gcg-python /tmp/gcg-venv/bin/python [--targets 8]

nanoGCG (PyPI `nanogcg`) pins transformers <= 4.47, so it runs in its own environment:
    python3.11 -m venv /tmp/gcg-venv && /tmp/gcg-venv/bin/pip install torch==2.13.0 transformers==4.47.1 nanogcg

A tiny GPT-2 is trained on DiaSafety utterances (REDLINE_DIASAFETY_DIR or ../shared/data/diasafety),
T_out is estimated on validation pairs, and both tools search, target by target, for a trigger of
the same length that reaches the o-sample-avg-1 hit (mean target log-probability >= T_out): ours
with the paper's defaults (G = 100, R = 10, T <= 50), nanoGCG with its own (search width 512,
top-k 256, up to --gcg-steps steps), stopped at its first hit. Every reported trigger is then
re-scored here by a plain forward pass of the model on its token ids; only re-verified hits count.
Lists: normal (the model's own greedy continuations of validation prompts) and mal (our mal list).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

os.environ.setdefault("REDLINE_PROGRESS", "0")


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def verify(model, tokenizer, trigger_ids: list[int], target: str, t_out: float) -> tuple[bool, float]:
    """Mean log-probability of the target after BOS + trigger, by a plain forward pass."""
    import torch

    tgt = tokenizer(" " + target.strip(), add_special_tokens=False).input_ids
    ids = torch.tensor([[tokenizer.bos_token_id, *trigger_ids, *tgt]])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, len(trigger_ids):-1].double(), dim=-1)
    mean = float(logp.gather(-1, torch.tensor(tgt)[:, None]).mean())
    return mean >= t_out, mean


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gcg-python", required=True, help="python of an environment with nanogcg installed")
    parser.add_argument("--targets", type=int, default=8, help="targets per list")
    parser.add_argument("--length", type=int, default=5, help="trigger tokens")
    parser.add_argument("--gcg-steps", type=int, default=250)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from redline.actors.tiny_models import build_tiny_causal_lm
    from redline.actors.triggers.gibbs import GibbsEnum, SearchOptions
    from redline.actors.triggers.hits import Thresholds
    from redline.actors.triggers.pairs import PairCorpusConfig, read_pairs
    from redline.actors.triggers.scorers import HFTarget
    from redline.actors.triggers.targets import mal_list
    from redline.actors.triggers.thresholds import estimate
    from redline.cluster.config import validate_config
    from redline.pipelines.quickstart import diasafety_data_dir

    data = diasafety_data_dir()
    work = Path(tempfile.mkdtemp(prefix="redline-gcg-bench-"))
    rows = json.loads((data / "train.json").read_text())
    texts = [r["response"] for r in rows[:4000]] + [r["context"] for r in rows[:4000]]
    started = time.perf_counter()
    path = build_tiny_causal_lm(texts, work / "gpt", vocab_size=2000, hidden_size=64, num_layers=2, epochs=2)
    model = HFTarget(str(path))
    val = read_pairs(validate_config(PairCorpusConfig, {"path": str(data / "val.json")}))
    t_out, _ = estimate(model, val, max_pairs=300)
    emit(measured="tiny GPT-2 trained", wall_s=round(time.perf_counter() - started, 1), t_out=round(t_out, 3))

    # normal: the model's own greedy continuations of validation prompts (5 tokens after 4)
    tok = model.tokenizer
    normal = []
    for pair in val:
        prompt = tok(pair[0], add_special_tokens=False).input_ids[:4]
        if len(prompt) < 4:
            continue
        ids = torch.tensor([[model.bos, *prompt]])
        out = model.model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
        text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()
        if text and text not in normal and model.target_ids(text)[0]:
            normal.append(text)
        if len(normal) == args.targets:
            break
    lists = {"normal": normal, "mal": mal_list()[: args.targets]}

    plain = AutoModelForCausalLM.from_pretrained(path).eval()
    plain_tok = AutoTokenizer.from_pretrained(path)
    thresholds = Thresholds(t_out, None)
    options = SearchOptions(search="o-sample-avg", trigger_length=args.length, top_g=100, restarts=10, max_sweeps=50)
    job = {"model": str(path), "t_out": t_out, "num_steps": args.gcg_steps, "search_width": 512, "topk": 256,
           "init": " ".join(["x"] * args.length), "threads": torch.get_num_threads()}
    runner = Path(__file__).with_name("nanogcg_runner.py")
    for name, targets in lists.items():
        ours = []
        for target in targets:  # one at a time, like nanoGCG: time-to-hit per target
            search = GibbsEnum(model, None, thresholds, options)
            t = time.perf_counter()
            (res,) = search.run([target])
            ok, mean = verify(plain, plain_tok, res.trigger_ids, target, t_out)
            ours.append({"hit": ok, "seconds": time.perf_counter() - t, "mean": mean, "trigger": res.trigger})
        (work / "job.json").write_text(json.dumps({**job, "targets": targets}))
        subprocess.run([args.gcg_python, str(runner), str(work / "job.json"), str(work / "gcg.jsonl")], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        theirs = []
        for line in (work / "gcg.jsonl").read_text().splitlines():
            r = json.loads(line)
            ids = plain_tok(r["trigger"], add_special_tokens=False).input_ids
            ok, mean = verify(plain, plain_tok, ids, r["target"], t_out)
            theirs.append({"hit": ok, "seconds": r["seconds"], "mean": mean, "trigger": r["trigger"], "steps": r["steps"]})
        for tool, res in (("redline gibbs-enum", ours), ("nanoGCG", theirs)):
            hits = [r for r in res if r["hit"]]
            emit(measured=f"{tool} on the {name} list", targets=len(res), hit_rate=round(len(hits) / len(res), 3),
                 median_time_to_hit_s=round(statistics.median(r["seconds"] for r in hits), 2) if hits else None,
                 mean_seconds_per_target=round(statistics.mean(r["seconds"] for r in res), 2),
                 example=(hits[0]["trigger"] if hits else None))


if __name__ == "__main__":
    main()
