"""Load on redline's Serve endpoints from concurrent clients on 127.0.0.1, with and without @serve.batch.

    .venv/bin/python bench/serve_load.py [--requests 400] [--concurrency 1,8,32,64] [--gen-requests 64]

Two copies of the same app run side by side on one Serve instance: `batched` (requests merged by
@serve.batch) and `unbatched` (every request is its own model call). Each hosts profanity-check, a
tiny BERT classifier and a tiny GPT-2 built on the spot (no downloads). Clients send one text per
detection request (the typical moderation call) and one short prompt per generation request.
Prints one JSON object per figure: requests/s and p50/p95/p99 latency per endpoint, model and
concurrency, then the batched/unbatched throughput ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

TEXTS = ["you are a complete idiot", "have a lovely day", "shut up you moron", "the weather is nice today",
         "what a stupid thing to say", "thanks for the help", "go away loser", "see you tomorrow"]


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


async def load(url: str, bodies: list[dict], concurrency: int) -> dict[str, float]:
    import httpx

    latencies: list[float] = []
    errors = 0
    queue: asyncio.Queue = asyncio.Queue()
    for b in bodies:
        queue.put_nowait(b)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        async def worker() -> None:
            nonlocal errors
            while not queue.empty():
                body = queue.get_nowait()
                t = time.perf_counter()
                resp = await client.post(url, json=body)
                latencies.append(time.perf_counter() - t)
                errors += resp.status_code != 200

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    lat = np.array(latencies) * 1000
    return {"requests": len(bodies), "errors": errors, "requests_per_s": round(len(bodies) / wall, 1),
            "p50_ms": round(float(np.percentile(lat, 50)), 1), "p95_ms": round(float(np.percentile(lat, 95)), 1),
            "p99_ms": round(float(np.percentile(lat, 99)), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400, help="Detection requests per measurement.")
    parser.add_argument("--gen-requests", type=int, default=48, help="Generation requests per measurement.")
    parser.add_argument("--concurrency", default="1,8,32,64")
    parser.add_argument("--gen-concurrency", default="1,8,16")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()


    from redline.actors.tiny_models import TinyBert, build_tiny_causal_lm, build_tiny_classifier
    from redline.pipelines.plane.corpora import CorpusConfig, read_corpus
    from redline.pipelines.quickstart import sample_path
    from redline.serve import runner
    from redline.serve.config import ServeConfig

    work = Path(tempfile.mkdtemp(prefix="redline-serve-bench-"))
    os.environ["REDLINE_STATE_DIR"] = str(work / "state")
    rows = [r for r in read_corpus(CorpusConfig(path=str(sample_path("toxic_sample_train.csv")), text_column="text",
                                                label_column="label", toxic_values=["toxic"])).to_pylist()
            if r["status"] == "ok"]
    texts = [r["text"] for r in rows]
    bert = build_tiny_classifier(texts, [r["label"] for r in rows], work / "tiny-bert", spec=TinyBert(epochs=5))
    gpt = build_tiny_causal_lm(texts, work / "tiny-gpt2", epochs=1)

    def app(name: str, batched: bool) -> ServeConfig:
        batch = {"enabled": batched, "max_batch_size": 64, "wait_timeout_s": 0.005}
        return ServeConfig.model_validate({
            "port": args.port, "app_name": name, "route_prefix": f"/{name}", "api_key_env": None,
            "detectors": [{"name": "profanity-check", "kind": "profanity-check", "num_cpus": 0.1, "serve": {"batch": batch}},
                          {"name": "tiny-bert", "kind": "hf", "model": str(bert), "num_cpus": 0.1, "serve": {"batch": batch}}],
            "generators": [{"name": "tiny-gpt2", "model": str(gpt), "num_cpus": 0.1,
                            "serve": {"batch": {**batch, "max_batch_size": 16}}}],
        })

    urls = {}
    for name, batched in (("batched", True), ("unbatched", False)):
        urls[name] = runner.start(app(name, batched), announce=lambda _: None)["url"]
    on = f"127.0.0.1, 1 replica per model, {os.cpu_count()} CPUs, clients in the same machine"
    levels = [int(c) for c in args.concurrency.split(",")]
    gen_levels = [int(c) for c in args.gen_concurrency.split(",")]
    results: dict[tuple, dict] = {}
    for model in ("profanity-check", "tiny-bert"):
        bodies = [{"texts": [TEXTS[i % len(TEXTS)]], "detectors": [model]} for i in range(args.requests)]
        for c in levels:
            for name in urls:
                asyncio.run(load(urls[name] + "/v1/detect", bodies[:20], min(c, 8)))  # warm up
                r = asyncio.run(load(urls[name] + "/v1/detect", bodies, c))
                results[(model, c, name)] = r
                emit(measured=f"POST /v1/detect ({model}), {name}", concurrency=c, on=on, **r)
    gen_bodies = [{"model": "tiny-gpt2", "prompt": TEXTS[i % len(TEXTS)], "max_tokens": 16, "temperature": 0.8}
                  for i in range(args.gen_requests)]
    for c in gen_levels:
        for name in urls:
            asyncio.run(load(urls[name] + "/v1/completions", gen_bodies[:4], min(c, 4)))
            r = asyncio.run(load(urls[name] + "/v1/completions", gen_bodies, c))
            results[("tiny-gpt2", c, name)] = r
            emit(measured=f"POST /v1/completions (tiny-gpt2, 16 tokens), {name}", concurrency=c, on=on, **r)
    for (model, c, name), r in results.items():
        if name == "batched":
            base = results[(model, c, "unbatched")]
            emit(measured=f"batched vs unbatched throughput, {model}", concurrency=c, ours=r["requests_per_s"],
                 baseline=base["requests_per_s"], ratio=round(r["requests_per_s"] / base["requests_per_s"], 2),
                 unit="requests/s", p99_ms_ours=r["p99_ms"], p99_ms_baseline=base["p99_ms"])
    runner.shutdown()


if __name__ == "__main__":
    main()
