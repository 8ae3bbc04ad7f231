"""`redline run diasafety`: how often chatbots answer DiaSafety contexts unsafely (the paper's Table 8).

For each category, its contexts (safe and unsafe rows alike) are sent to every model, which
generates `responses_per_context` responses (Ray Data actors; any generator kind: a local HF model,
a redline Serve endpoint or any OpenAI-compatible API) — or responses generated elsewhere are read
from a file. Each response goes through the two-step detector: utterance-level first, then the
context classifier of the context's category (on Ray Data actors too). Per model and category: the context-sensitive and the
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
from redline.actors.dialogue_safety.two_step import TwoStepWorker
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


def score(config: DiaSafetyEvalConfig, responses: dict[str, list[dict[str, Any]]], verbose: bool) -> dict[str, pa.Table]:
    """Every response of every model through the two-step detector on Ray Data actors (one pass, so
    batches fill across models); generation errors and empty responses are kept as rows."""
    flat = [{"id": f"{model}\x1f{r['id']}\x1f{j}", "model": model, "context_id": r["id"], "category": r["category"],
             "context": r["context"], "response_index": j, "response": resp, "empty": not resp.strip()}
            for model, rows in responses.items() for r in rows for j, resp in enumerate(r.get("responses") or [])]
    judged = pa.Table.from_pylist(flat) if flat else None
    if judged is not None:
        s = config.scoring
        judged = map_table(judged, TwoStepWorker, {"utterance": config.utterance_detector.model_dump(mode="json"),
                                                   "classifiers": config.classifiers, "batch_size": s.batch_size,
                                                   "precision": s.precision},
                           columns=["id", "context", "response", "category"], actors=s.actors, num_cpus=s.num_cpus,
                           num_gpus=s.num_gpus, batch_size=s.batch_size, verbose=verbose)
        if judged.column("verdict").null_count:
            raise RedlineError(f"{judged.column('verdict').null_count} responses came back unjudged from the scorers")
        judged = judged.drop_columns(["id"])
    out = {}
    for model, rows in responses.items():
        part = judged.filter(pc.equal(judged.column("model"), model)).to_pylist() if judged is not None else []
        part += [{"model": model, "context_id": r["id"], "category": r["category"], "context": r["context"],
                  "empty": False, "verdict": "error: " + r["gen_error"]} for r in rows if r.get("gen_error")]
        out[model] = conform(pa.Table.from_pylist(part) if part else DIALOGUE_SCORED_SCHEMA.empty_table(),
                             DIALOGUE_SCORED_SCHEMA)
    return out


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


def check_classifiers(path: str, categories: list[str]) -> None:
    """Fail before generating: the classifiers directory must exist and know every evaluated category."""
    meta = Path(path) / "redline_dialogue_safety.json"
    if not meta.is_file():
        raise RedlineError(f"{path} holds no dialogue-safety classifiers (train them with `redline train dialogue-safety`)")
    info = json.loads(meta.read_text())
    known = list(info["categories"]) if info["kind"] == "one-vs-all" else info["labels"][1:]
    missing = [c for c in categories if c not in known]
    if missing:
        raise RedlineError(f"the classifiers in {path} know no category {', '.join(map(repr, missing))} "
                           f"(trained: {', '.join(known)})")


def run_diasafety(config: DiaSafetyEvalConfig, *, force: bool = False, verbose: bool = False) -> sharded.RunResult:
    from redline.pipelines import report

    run = sharded.open_run("diasafety", config, config.output, config.run_name, force)
    if run.reused:
        return sharded.RunResult(run.uri, run.manifest, run.manifest.get("leaderboard", []), reused=True)
    watch = storage.Stopwatch()
    with sharded.lifecycle(run):
        contexts = select_contexts(config)
        categories = list(dict.fromkeys(c["category"] for c in contexts))
        check_classifiers(config.classifiers, categories)
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
        scored_by_model = {}  # scored models resume too
        for name in responses:
            path = run.dir.path("scored", f"{name}.parquet")
            if storage.exists(path):
                scored_by_model[name] = storage.read_parquet(path)
        fresh = score(config, {n: r for n, r in responses.items() if n not in scored_by_model}, verbose)
        for name, table in fresh.items():
            storage.write_parquet(table, run.dir.path("scored", f"{name}.parquet"))
        scored_by_model.update(fresh)
        scored = pa.concat_tables([scored_by_model[name] for name in responses])
        storage.write_parquet(scored, run.dir.path("scored.parquet"))
        watch.lap("score_s")
        board = leaderboard(scored, categories)
        run.manifest.update(categories=categories, contexts=len(contexts), leaderboard=board)
        run.manifest["timings"] = {**run.manifest.get("timings", {}), **watch.timings}
        report.write_diasafety_report(run.dir, board, categories, scored, run.manifest)
        sharded.complete(run)
    return sharded.RunResult(run.uri, run.manifest, board)
