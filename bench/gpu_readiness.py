"""GPU readiness: each GPU stage of redline next to a bare PyTorch loop of the same model, on one device.

    python bench/gpu_readiness.py [--corpus labeled_data.csv] [--diasafety val.json]      # on a GPU machine
    .venv/bin/python bench/gpu_readiness.py --allow-cpu --size tiny                      # the CPU proxy

Stages, each run as a user runs it (`python -m redline ...` in a subprocess, so the figures include
Ray Data, the actors and writing the run directory), with `num_gpus: 1` on a GPU:
  score        a BERT-base-size victim (random weights, 30k WordPiece trained on the corpus) over the corpus
  attack       three recipe families against the same victim (`hf` detector): deepwordbug (character edits),
               pwws (WordNet), toxictrap-mlm-delete (a BERT-base-size masked LM); bare = victim-bound limit,
               the bare rate / the recipe's mean queries per attempt
  training     `redline train dialogue-safety` (one-vs-all, 1 epoch); bare = a plain training loop
  dialogue     DiaSafety two-step scoring of pregenerated responses; bare = the utterance detector plus
               every category's classifier over the same responses in plain loops
  generation   DiaSafety chatbot generation with a GPT-2-medium-size model (10 responses of 32 tokens per
               context); bare = `generate` at batch 256
  triggers     the gibbs-enum search on the paper-size LSTM seq2seq; bare = scoring (trigger, target) pairs
  serve        `redline serve` /v1/detect with 64 concurrent clients; bare = the same server with 1 client
Prints one JSON object per stage: rate, the bare rate, share = rate / bare, GPU utilisation (mean and max of
`nvidia-smi` samples every 0.2 s) and peak memory. The bare rate of a classifier is its forward passes
over pre-tokenised batches of 1024 on a GPU (the issue's "GPU's own rate"); on a CPU it is tokenising
(tokenizers backend) plus forward, the CPU proxy's reference, since there the proxy model is near-free.
Without a GPU and without --allow-cpu it says so and exits 0. Models are built on the spot (no hub):
a random-weight model of the right size times the same as a trained one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("REDLINE_PROGRESS", "0")

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
# The papers' model sizes ("base") and a near-free proxy of each ("tiny") for checking the path on a CPU.
SIZES = {
    "base": {"bert": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
             "gpt2": dict(n_embd=1024, n_layer=24, n_head=16), "lstm": dict(embedding_dim=300, hidden_dim=600)},
    "tiny": {"bert": dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64),
             "gpt2": dict(n_embd=32, n_layer=1, n_head=2), "lstm": dict(embedding_dim=32, hidden_dim=32)},
}
RECIPES = {"character": "deepwordbug", "wordnet": "pwws", "mlm": "toxictrap-mlm-delete"}


class GpuSampler:
    """Samples utilisation and memory of GPU 0 with nvidia-smi; a no-op without one."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s, self.samples, self._stop = interval_s, [], threading.Event()
        self.available = bool(subprocess.run(["sh", "-c", "command -v nvidia-smi"], capture_output=True).stdout)

    def _poll(self) -> None:
        while not self._stop.is_set():
            out = subprocess.run(["nvidia-smi", "--id=0", "--query-gpu=utilization.gpu,memory.used",
                                  "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
            try:
                util, mem = (float(x) for x in out.strip().split(","))
                self.samples.append((util, mem))
            except ValueError:
                pass
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "GpuSampler":
        self.samples, self._stop = [], threading.Event()
        if self.available:
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self.available:
            self._thread.join()

    def figures(self) -> dict[str, float | None]:
        if not self.samples:
            return {"gpu_util_mean_pct": None, "gpu_util_max_pct": None, "gpu_peak_mem_mib": None}
        util = [u for u, _ in self.samples]
        return {"gpu_util_mean_pct": round(sum(util) / len(util), 1), "gpu_util_max_pct": max(util),
                "gpu_peak_mem_mib": max(m for _, m in self.samples)}


def redline(*args: str, timeout: float = 3600) -> None:
    proc = subprocess.run([sys.executable, "-m", "redline", *args], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"redline {' '.join(args[:2])} failed:\n{proc.stderr[-3000:]}")


def run_pipeline(work: Path, pipeline: str, config: dict, name: str | None = None) -> dict:
    name = name or pipeline
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**config, "output": str(work / "runs"), "run_name": name}))
    command = ("train", "dialogue-safety") if pipeline == "dialogue-safety-train" else ("run", pipeline)
    redline(*command, "--config", str(path), "--force")
    return json.loads((work / "runs" / name / "manifest.json").read_text())


def emit(stage: str, done: float, seconds: float, unit: str, bare: float | None, sampler: GpuSampler | None,
         **extra: object) -> None:
    rate = done / seconds
    print(json.dumps({"stage": stage, "rate": round(rate, 1), "unit": unit, "bare": round(bare, 1) if bare else None,
                      "share": round(rate / bare, 3) if bare else None, "done": done, "seconds": round(seconds, 2),
                      **(sampler.figures() if sampler else {}), **extra}), flush=True)


# ---- models of the papers' sizes, random weights -------------------------------------------------------------

def build_bert(texts: list[str], out: Path, size: str, *, masked_lm: bool = False, tokenizer_from: Path | None = None,
               num_labels: int = 2) -> Path:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM, BertForSequenceClassification

    from redline.actors.tiny_models import train_wordpiece_tokenizer

    tok = (AutoTokenizer.from_pretrained(tokenizer_from) if tokenizer_from
           else train_wordpiece_tokenizer(texts, vocab_size=30000, model_max_length=128))
    labels = {0: "benign", 1: "toxic"} if num_labels == 2 else {i: str(i) for i in range(num_labels)}
    cfg = BertConfig(vocab_size=len(tok), num_labels=num_labels, id2label=labels,
                     label2id={v: k for k, v in labels.items()}, max_position_embeddings=256, **SIZES[size]["bert"])
    torch.manual_seed(0)
    (BertForMaskedLM if masked_lm else BertForSequenceClassification)(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def train_victim(model_dir: Path, texts: list[str], labels: list[int], gpu: bool, size: str) -> None:
    """A short fine-tune, so the victim gets most seeds right (an attack skips the seeds it gets wrong)."""
    import random

    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    device = torch.device("cuda" if gpu else "cpu")
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-5 if size == "base" else 2e-3)
    order = random.Random(0).sample(range(len(texts)), len(texts))
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if gpu else torch.autocast("cpu", enabled=False)
    for epoch in range(1 if size == "base" else 2):
        for i in range(0, len(order), 64):
            idx = order[i:i + 64]
            enc = tok([texts[j] for j in idx], padding=True, truncation=True, max_length=64, return_tensors="pt").to(device)
            with autocast:
                loss = model(**enc, labels=torch.tensor([labels[j] for j in idx], device=device)).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    model.eval().save_pretrained(model_dir)


def build_gpt2(texts: list[str], out: Path, size: str) -> Path:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from redline.actors.tiny_models import train_bpe_tokenizer

    tok = train_bpe_tokenizer(texts, vocab_size=8000, model_max_length=256)
    cfg = GPT2Config(vocab_size=len(tok), n_positions=512, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                     pad_token_id=tok.pad_token_id, **SIZES[size]["gpt2"])
    torch.manual_seed(0)
    GPT2LMHeadModel(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


# ---- bare loops: the same model in plain PyTorch, on the same device ------------------------------------------

def timed(fn, *, repeat_s: float = 3.0) -> float:
    """Seconds per call of fn, after one warm-up call, averaged over at least repeat_s."""
    import torch

    fn()
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    n, started = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        sync()
        if time.perf_counter() - started >= repeat_s:
            return (time.perf_counter() - started) / n


def bare_classifier(model_dir: Path, texts: list[str], gpu: bool, *, max_length: int = 64, batch: int = 1024,
                    pairs: list[tuple[str, str]] | None = None) -> float:
    """Texts/s of a plain inference loop: forward passes on pre-tokenised batches (GPU, fp16), or tokenising
    with the tokenizers backend plus forward (CPU: the proxy's reference)."""
    import numpy as np
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    device = torch.device("cuda" if gpu else "cpu")
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(
        model_dir, dtype=torch.float16 if gpu else torch.float32).to(device).eval()
    backend = tok.backend_tokenizer
    backend.enable_truncation(max_length)
    backend.enable_padding(pad_id=tok.pad_token_id, pad_token=tok.pad_token)
    items = (pairs or texts)
    items = (items * (batch // max(1, len(items)) + 1))[:batch]

    def encode() -> dict:
        encs = backend.encode_batch(items)
        return {"input_ids": torch.from_numpy(np.array([e.ids for e in encs], dtype=np.int64)).to(device),
                "attention_mask": torch.from_numpy(np.array([e.attention_mask for e in encs], dtype=np.int64)).to(device)}

    ready = encode()
    with torch.inference_mode():
        step = (lambda: model(**ready).logits.float().softmax(-1)) if gpu else \
               (lambda: model(**encode()).logits.softmax(-1).numpy())
        return batch / timed(step)


def bare_training(model_dir: Path, pairs: list[tuple[str, str]], gpu: bool, batch: int = 64, max_length: int = 64) -> float:
    """Samples/s of a plain fine-tuning loop (AdamW, bf16 autocast on a GPU) on pre-tokenised batches."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    device = torch.device("cuda" if gpu else "cpu")
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    items = (pairs * (batch // len(pairs) + 1))[:batch]
    enc = tok([c for c, _ in items], [r for _, r in items], padding=True, truncation=True, max_length=max_length,
              return_tensors="pt").to(device)
    labels = torch.zeros(batch, dtype=torch.long, device=device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if gpu else torch.autocast("cpu", enabled=False)

    def step() -> None:
        with autocast:
            loss = model(**enc, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return batch / timed(step)


def bare_generation(model_dir: Path, prompts: list[str], gpu: bool, batch: int = 256, new_tokens: int = 32) -> float:
    """Responses/s of `generate` (sampling, `new_tokens` tokens) at one batch of prompts."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = torch.device("cuda" if gpu else "cpu")
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float16 if gpu else torch.float32).to(device).eval()
    items = (prompts * (batch // len(prompts) + 1))[:batch]
    enc = tok([p + tok.eos_token for p in items], padding=True, truncation=True, max_length=128,
              return_tensors="pt").to(device)
    with torch.inference_mode():
        return batch / timed(lambda: model.generate(**enc, do_sample=True, max_new_tokens=new_tokens,
                                                    min_new_tokens=new_tokens, pad_token_id=tok.pad_token_id),
                             repeat_s=5.0)


def bare_seq2seq(model_dir: Path, gpu: bool, batch: int = 8192, trigger_length: int = 15, target_length: int = 10) -> float:
    """(trigger, target) pairs/s the trigger search's own scorer rates in plain batches, float32."""
    import torch

    from redline.actors.triggers.models import load
    from redline.actors.triggers.scorers import LSTMSeq2SeqTarget

    target = LSTMSeq2SeqTarget(load(model_dir, "cuda" if gpu else "cpu"), torch.float32)
    g = torch.Generator().manual_seed(0)
    trig = torch.randint(4, target.vocab_size, (batch, trigger_length), generator=g).to(target.device)
    tgt = torch.randint(4, target.vocab_size, (batch, target_length), generator=g).to(target.device)
    with torch.inference_mode():
        return batch / timed(lambda: target.scores(trig, tgt, need_margin=False))


# ---- the stages ------------------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(DATA / "offensive_tweet" / "labeled_data.csv"))
    parser.add_argument("--diasafety", default=str(DATA / "diasafety" / "val.json"))
    parser.add_argument("--size", choices=sorted(SIZES), default="base", help="model sizes: the papers' or tiny")
    parser.add_argument("--seeds", type=int, default=1000, help="attack seeds per recipe")
    parser.add_argument("--rows", type=int, default=None, help="score at most this many corpus rows")
    parser.add_argument("--contexts", type=int, default=None, help="DiaSafety contexts for dialogue stages")
    parser.add_argument("--stages", default="score,attack,training,dialogue,generation,triggers,serve")
    parser.add_argument("--recipes", default=",".join(RECIPES), help="attack families to run: " + ", ".join(RECIPES))
    parser.add_argument("--allow-cpu", action="store_true", help="run the stages without a GPU (the CPU proxy)")
    args = parser.parse_args()
    stages = set(args.stages.split(","))

    import torch

    gpu = torch.cuda.is_available()
    if not gpu and not args.allow_cpu:
        print(json.dumps({"gpu": None, "note": "no GPU on this machine (torch.cuda.is_available() is False); "
                          "nothing to measure. --allow-cpu runs the stages on CPU against CPU bare loops."}))
        return
    gpus = 1 if gpu else 0
    from redline.pipelines.plane.corpora import CorpusConfig, read_corpus

    work = Path(tempfile.mkdtemp(prefix="redline-gpu-"))
    rows = [r for r in read_corpus(CorpusConfig(path=args.corpus, preset="davidson", limit=args.rows)).to_pylist()
            if r["status"] == "ok"]
    texts = [r["text"] for r in rows]
    victim = build_bert(texts, work / "victim", args.size)
    train_victim(victim, texts, [r["label"] for r in rows], gpu, args.size)
    print(json.dumps({"gpu": torch.cuda.get_device_name(0) if gpu else None, "size": args.size, "rows": len(rows),
                      "torch": torch.__version__, "work": str(work)}), flush=True)
    detector = {"name": "victim", "kind": "hf", "model": str(victim), "batch_size": 1024, "max_length": 64,
                "num_gpus": gpus, "num_cpus": 1}
    corpus = {"path": args.corpus, "preset": "davidson", "limit": args.rows}
    bare = bare_classifier(victim, texts, gpu)
    print(json.dumps({"bare": "victim classifier", "texts_per_s": round(bare, 1)}), flush=True)
    sampler = GpuSampler()

    if "score" in stages:
        with sampler:
            m = run_pipeline(work, "score", {"corpus": corpus, "detectors": [detector], "shard_size": 20000})
        emit("score", m["counts"]["rows_out"], m["timings"]["score_s"], "rows/s", bare, sampler)

    if "attack" in stages:
        mlm = build_bert(texts, work / "mlm", args.size, masked_lm=True, tokenizer_from=victim)
        for family, recipe in RECIPES.items():
            if family not in args.recipes.split(","):
                continue
            with sampler:
                m = run_pipeline(work, "attack", {
                    "corpus": {**corpus, "limit": None}, "victim": {k: v for k, v in detector.items() if k != "num_gpus"},
                    "recipes": [recipe], "max_seeds": args.seeds, "batch_size": 256, "num_gpus": gpus,
                    "resources": {"mlm_model": str(mlm)}, "shard_size": max(100, args.seeds // 4)},
                    name=f"attack-{family}")
            queries = m["summary"][0]["mean_queries"] or 1.0
            emit(f"attack {recipe} ({family})", m["counts"]["attempts_out"], m["timings"]["attack_s"], "attempts/s",
                 bare / queries, sampler, mean_queries=round(queries, 1), asr=m["summary"][0]["asr"])

    dialogue = stages & {"training", "dialogue", "generation"}
    ds = json.loads(Path(args.diasafety).read_text())[: args.contexts] if dialogue else []
    pairs = [(r["context"], r["response"]) for r in ds]
    if stages & {"training", "dialogue"}:
        data = work / "diasafety.json"
        data.write_text(json.dumps(ds))
        with sampler:
            m = run_pipeline(work, "dialogue-safety-train", {
                "train": str(data), "val": str(data), "base_model": str(victim), "variants": ["one_vs_all"],
                "epochs": 1, "batch_size": 64, "max_length": 64, "num_gpus": gpus})
        emit("dialogue-safety training (one-vs-all, 1 epoch)", len(ds) * len(m["categories"]),
             m["timings"]["train_one_vs_all_s"], "examples/s", bare_training(victim, pairs, gpu), sampler)
    if "dialogue" in stages:
        responses = work / "responses.jsonl"
        responses.write_text("".join(json.dumps({"context": r["context"], "category": r["category"],
                                                 "responses": [r["response"]] * 10}) + "\n" for r in ds))
        with sampler:
            m = run_pipeline(work, "diasafety", {
                "contexts": str(data), "pregenerated": [{"name": "pregenerated", "path": str(responses)}],
                "classifiers": str(work / "runs" / "dialogue-safety-train" / "models" / "one_vs_all"),
                "utterance_detector": {**detector, "name": "utterance"}, "responses_per_context": 10,
                "scoring": {"num_gpus": gpus, "batch_size": 1024}})
        scored = sum(r["responses"] + r["empty"] + r["errors"] for r in m["summary"])
        per_pair = bare_classifier(victim, texts, gpu, pairs=pairs, max_length=128)
        two_step = 1 / (1 / bare + len(m["categories"]) / per_pair)
        emit("dialogue-safety two-step scoring", scored, m["timings"]["score_s"], "responses/s", two_step, sampler)

    if "generation" in stages:
        gen = build_gpt2([t for p in pairs for t in p], work / "gpt2", args.size)
        with sampler:
            m = run_pipeline(work, "diasafety", {
                "contexts": args.diasafety, "max_contexts_per_category": max(1, (args.contexts or 600) // 6),
                "generators": [{"name": "gpt2", "kind": "hf", "model": str(gen), "num_gpus": gpus}],
                "responses_per_context": 10, "max_tokens": 32, "batch_size": 32, "num_gpus": gpus,
                "classifiers": str(work / "runs" / "dialogue-safety-train" / "models" / "one_vs_all"),
                "utterance_detector": {**detector, "name": "utterance"}, "scoring": {"num_gpus": gpus}},
                name="generation")
        made = sum(r["responses"] + r["empty"] + r["errors"] for r in m["summary"])
        emit("chatbot generation (10 x 32 tokens per context)", made, m["timings"]["generate_s"], "responses/s",
             bare_generation(gen, [c for c, _ in pairs], gpu), sampler)

    if "triggers" in stages:
        trig = work / "seq2seq.yaml"
        trig.write_text(yaml.safe_dump({"pairs": {"path": args.diasafety}, "name": "seq2seq", "output": str(work / "models"),
                                        "epochs": 1, "num_gpus": gpus, **SIZES[args.size]["lstm"]}))
        redline("train", "seq2seq", "-c", str(trig))
        with sampler:
            m = run_pipeline(work, "egregious", {
                "models": [{"name": "s2s", "path": str(work / "models" / "seq2seq")}],
                "lists": [{"name": "mal", "limit": 64}], "searches": ["o-greedy", "o-sample-avg"], "num_gpus": gpus,
                "trigger_length": 15, "restarts": 2, "max_sweeps": 5})
        import pyarrow.parquet as pq

        results = pq.read_table(work / "runs" / "egregious" / "triggers").to_pylist()
        sequences = sum(r["sequences_scored"] or 0 for r in results)
        emit("trigger search (gibbs-enum, length 15)", sequences, m["timings"]["search_s"], "sequences/s",
             bare_seq2seq(work / "models" / "seq2seq", gpu), sampler, targets=len(results))

    if "serve" in stages:
        serve_stage(work, detector, sampler)


def serve_stage(work: Path, detector: dict, sampler: GpuSampler) -> None:
    import asyncio

    sys.path.insert(0, str(Path(__file__).parent))
    from serve_load import TEXTS, load

    from redline.cluster.net import free_port

    port = free_port()
    config = work / "serve.yaml"
    config.write_text(yaml.safe_dump({"port": port, "api_key_env": None, "app_name": "gpu", "detectors": [detector]}))
    # `redline serve` serves until stopped: start it beside this process and wait until it answers
    server = subprocess.Popen([sys.executable, "-m", "redline", "serve", "-c", str(config)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx

        deadline = time.time() + 300
        while True:
            if server.poll() is not None:
                raise SystemExit(f"redline serve failed:\n{server.stderr.read()[-3000:]}")
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise SystemExit("redline serve did not come up in 300 s")
            time.sleep(1)
        one = asyncio.run(load(url + "/v1/detect", [{"texts": [TEXTS[i % len(TEXTS)]], "detectors": ["victim"]}
                                                    for i in range(300)], 1))
        bodies = [{"texts": [TEXTS[i % len(TEXTS)]], "detectors": ["victim"]} for i in range(4000)]
        with sampler:
            stats = asyncio.run(load(url + "/v1/detect", bodies, 64))
        emit("serve /v1/detect, 64 clients, 1 text per request", len(bodies), len(bodies) / stats["requests_per_s"],
             "requests/s", one["requests_per_s"], sampler, bare_is="the same server with 1 client",
             errors=stats["errors"], p50_ms=stats["p50_ms"], p99_ms=stats["p99_ms"])
    finally:
        subprocess.run([sys.executable, "-m", "redline", "serve", "stop", "--port", str(port)], capture_output=True)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    main()
