"""`redline run diasafety`: how often chatbots answer DiaSafety contexts unsafely (the paper's Table 8).

For each category, its contexts (safe and unsafe rows alike) are sent to every model, which
generates `responses_per_context` responses (Ray Data actors; any generator kind: a local HF model,
a redline Serve endpoint or any OpenAI-compatible API) — or responses generated elsewhere are read
from a file. Each response goes through the two-step detector: utterance-level first, then the
context classifier of the context's category. Per model and category: the context-sensitive and the
utterance-level unsafe proportions (of all responses to that category's contexts); the utterance
mean over categories; Overall = the mean of the context-sensitive proportions and the utterance
mean. The leaderboard is sorted by Overall (safest first).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from redline.actors.dialogue_safety.classifiers import load_rows
from redline.actors.dialogue_safety.two_step import TwoStepDetector
from redline.actors.generators import GenerationWorker
from redline.cluster import storage
from redline.cluster.config import DiaSafetyEvalConfig
from redline.errors import RedlineError
from redline.pipelines import sharded
from redline.pipelines.schema import DIALOGUE_SCORED_SCHEMA, conform
from redline.pipelines.stages import map_table


def select_contexts(config: DiaSafetyEvalConfig) -> list[dict[str, Any]]:
    rows = load_rows(config.contexts)
    present = sorted({r["category"] for r in rows})
    chosen = config.categories or present
    rng = random.Random(config.seed)
    out = []
    for cat in chosen:
        mine = [r for r in rows if r["category"] == cat]
        if not mine:
            raise RedlineError(f"category '{cat}' has no contexts in {config.contexts} (it has: {', '.join(present)})")
        if config.max_contexts_per_category and len(mine) > config.max_contexts_per_category:
            mine = rng.sample(mine, config.max_contexts_per_category)
        out += mine
    return [{"id": f"c{i}", "context": r["context"], "category": r["category"]} for i, r in enumerate(out)]


def read_pregenerated(path: str, contexts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows {context, responses[, category]}; a context's category comes from the contexts file when absent."""
    text = Path(path).read_text(encoding="utf-8") if Path(path).is_file() else None
    if text is None:
        raise RedlineError(f"pregenerated responses not found: {path}")
    try:
        rows = json.loads(text) if text.lstrip().startswith("[") else [json.loads(ln) for ln in text.splitlines() if ln.strip()]
    except ValueError as err:
        raise RedlineError(f"{path}: not valid JSON/JSONL ({err})") from None
    by_context = {c["context"]: c["category"] for c in contexts}
    out = []
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or "context" not in r or not isinstance(r.get("responses"), list):
            raise RedlineError(f"{path}: row {i} needs `context` and a list `responses`")
        cat = r.get("category") or by_context.get(r["context"])
        if cat is None:
            raise RedlineError(f"{path}: row {i} has no category and its context is not among the evaluated ones")
        out.append({"id": f"p{i}", "context": r["context"], "category": cat, "responses": [str(x) for x in r["responses"]]})
    return out


def generate(config: DiaSafetyEvalConfig, contexts: list[dict[str, Any]], verbose: bool) -> dict[str, list[dict[str, Any]]]:
    sampling = {"n": config.responses_per_context, "temperature": config.temperature, "top_p": config.top_p,
                "top_k": config.top_k, "max_tokens": config.max_tokens, "seed": config.seed}
    table = pa.Table.from_pylist(contexts)
    out = {}
    for g in config.generators:
        result = map_table(table, GenerationWorker, {"config": g.model_dump(mode="json"), "sampling": sampling},
                           columns=["id", "context"], actors=config.actors, num_cpus=config.num_cpus,
                           num_gpus=config.num_gpus, batch_size=config.batch_size, verbose=verbose)
        out[g.name] = result.to_pylist()
    return out


def score(config: DiaSafetyEvalConfig, model: str, rows: list[dict[str, Any]], detector: TwoStepDetector) -> pa.Table:
    flat = [(r["id"], r["category"], r["context"], j, resp) for r in rows for j, resp in enumerate(r["responses"])]
    errors = [r for r in rows if r.get("gen_error")]
    verdicts = detector.detect([f[2] for f in flat], [f[4] for f in flat], [f[1] for f in flat]) if flat else []
    rows_out = [{"model": model, "context_id": f[0], "category": f[1], "context": f[2], "response_index": f[3],
                 "response": f[4], "empty": not f[4].strip(), "verdict": v.verdict, "unsafe_category": v.category,
                 "utterance_score": v.utterance_score} for f, v in zip(flat, verdicts)]
    rows_out += [{"model": model, "context_id": r["id"], "category": r["category"], "context": r["context"],
                  "empty": False, "verdict": "error: " + r["gen_error"]} for r in errors]
    return conform(pa.Table.from_pylist(rows_out) if rows_out else DIALOGUE_SCORED_SCHEMA.empty_table(),
                   DIALOGUE_SCORED_SCHEMA)


def leaderboard(scored: pa.Table, categories: list[str]) -> list[dict[str, Any]]:
    rows = []
    for model in dict.fromkeys(scored.column("model").to_pylist()):
        mine = scored.filter(pc.equal(scored.column("model"), model))
        ok = mine.filter(pc.invert(pc.starts_with(mine.column("verdict"), "error")))
        row: dict[str, Any] = {"model": model, "responses": ok.num_rows, "errors": mine.num_rows - ok.num_rows,
                               "empty": int(pc.sum(ok.column("empty")).as_py() or 0)}
        utter = []
        for cat in categories:
            part = ok.filter(pc.equal(ok.column("category"), cat)).column("verdict").to_pylist()
            row[cat] = part.count("context-unsafe") / len(part) if part else None
            utter.append(part.count("utterance-unsafe") / len(part) if part else None)
        values = [u for u in utter if u is not None]
        row["utterance"] = sum(values) / len(values) if values else None
        parts = [row[c] for c in categories if row[c] is not None] + ([row["utterance"]] if values else [])
        row["overall"] = sum(parts) / len(parts) if parts else None
        rows.append(row)
    return sorted(rows, key=lambda r: (r["overall"] is None, r["overall"]))


def run_diasafety(config: DiaSafetyEvalConfig, *, force: bool = False, verbose: bool = False) -> sharded.RunResult:
    from redline.pipelines import report

    run = sharded.open_run("diasafety", config, config.output, config.run_name, force)
    if run.reused:
        return sharded.RunResult(run.uri, run.manifest, run.manifest.get("leaderboard", []), reused=True)
    watch = storage.Stopwatch()
    with sharded.lifecycle(run):
        contexts = select_contexts(config)
        categories = list(dict.fromkeys(c["category"] for c in contexts))
        detector = TwoStepDetector(config.utterance_detector, config.classifiers)
        responses: dict[str, list[dict[str, Any]]] = {}
        for name in [g.name for g in config.generators]:  # generated models resume per model
            path = run.dir.path("responses", f"{name}.parquet")
            if storage.exists(path):
                responses[name] = storage.read_parquet(path).to_pylist()
        todo = config.model_copy(update={"generators": [g for g in config.generators if g.name not in responses]})
        for name, rows in generate(todo, contexts, verbose).items():
            merged = [{**c, **r} for c, r in zip(contexts, rows)]
            storage.write_parquet(pa.Table.from_pylist(merged), run.dir.path("responses", f"{name}.parquet"))
            responses[name] = merged
        watch.lap("generate_s")
        for p in config.pregenerated:
            responses[p.name] = read_pregenerated(p.path, contexts)
        scored = pa.concat_tables([score(config, name, rows, detector) for name, rows in responses.items()])
        storage.write_parquet(scored, run.dir.path("scored.parquet"))
        watch.lap("score_s")
        board = leaderboard(scored, categories)
        run.manifest.update(categories=categories, contexts=len(contexts), leaderboard=board)
        run.manifest["timings"] = {**run.manifest.get("timings", {}), **watch.timings}
        report.write_diasafety_report(run.dir, board, categories, scored, run.manifest)
        sharded.complete(run)
    return sharded.RunResult(run.uri, run.manifest, board)
