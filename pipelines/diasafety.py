"""`redline run diasafety`: how often chatbots answer DiaSafety contexts unsafely (the paper's Table 8).

For each category, its contexts (safe and unsafe rows alike) are sent to every model, which
generates `responses_per_context` responses (Ray Data actors; any generator kind: a local HF model,
a redline Serve endpoint or any OpenAI-compatible API) — or responses generated elsewhere are read
from a file. Each response goes through the two-step detector: utterance-level first, then the
context classifier of the context's category (on Ray Data actors too). Per model and category: the
context-sensitive and the utterance-level unsafe proportions (of all responses to that category's
contexts); the utterance mean over categories; Overall = the mean of the context-sensitive
proportions and the utterance mean. The leaderboard is sorted by Overall (safest first).
"""

from __future__ import annotations

import json
import random
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, model_validator

from redline.actors.detectors import DetectorConfig, preflight_detector
from redline.actors.dialogue_safety.classifiers import check_classifiers, load_rows
from redline.actors.dialogue_safety.two_step import TwoStepWorker
from redline.actors.generators import GenerationWorker, GeneratorConfig, SamplingParams
from redline.cluster import storage
from redline.cluster.config import ActorPoolSize, Execution, Input, Result, RunConfig, Strict, unique_names
from redline.cluster.devices import PRECISION_HELP, Precision
from redline.cluster.runs import Run, RunDir, RunResult, Stopwatch
from redline.cluster.tables import conform
from redline.errors import RedlineError
from redline.pipelines.figures import DIASAFETY, category_figures, leaderboard
from redline.pipelines.report import Report, grouped_bars
from redline.pipelines.schema import DIALOGUE_SCORED_SCHEMA, NO_ANSWER
from redline.pipelines.stages import map_table
from redline.pipelines.template import Pipeline


class PregeneratedResponses(Strict):
    name: str = Result(pattern=r"^[A-Za-z0-9_.\-]+$", description="The model's name on the leaderboard.")
    path: str = Input(description="JSON or JSONL rows: {context, category?, responses: [...]}.")


class ScoringActors(ActorPoolSize):
    """Actors that each load the two-step detector once and judge responses in batches."""

    num_cpus: float = Execution(1.0, ge=0)
    num_gpus: float = Execution(0.0, ge=0, description="1 puts the context classifiers on a GPU.")
    batch_size: int = Execution(256, gt=0, description="Responses per batch.")
    precision: Precision = Result("auto", description=PRECISION_HELP)


class DiaSafetyEvalConfig(RunConfig, ActorPoolSize):
    """`redline run diasafety`: evaluate chatbots on DiaSafety contexts with the two-step detector."""

    contexts: str = Input(description="DiaSafety JSON (validation or test split); its contexts are the prompts.")
    categories: list[str] | None = Result(None, min_length=1, description="Default: every category in the file.")
    max_contexts_per_category: int | None = Result(None, gt=0, description="A seeded sample per category.")
    generators: list[GeneratorConfig] = Field(default_factory=list, description="Models that generate responses.")
    pregenerated: list[PregeneratedResponses] = Field(default_factory=list,
                                                      description="Responses generated elsewhere, scored as they are.")
    responses_per_context: int = Result(10, gt=0)
    temperature: float = Result(1.0, ge=0)
    top_p: float = Result(1.0, gt=0, le=1)
    top_k: int | None = Result(None, ge=0)
    max_tokens: int = Result(32, gt=0)
    seed: int = Result(0)
    utterance_detector: DetectorConfig = Field(description="Step 1: judges the response alone.")
    classifiers: str = Input(description="Step 2: a one-vs-all directory from `redline train dialogue-safety`.")
    batch_size: int = Execution(16, gt=0, description="Contexts per generation batch.")
    num_cpus: float = Execution(1.0, ge=0)
    num_gpus: float = Execution(0.0, ge=0)
    scoring: ScoringActors = Field(default_factory=ScoringActors,
                                   description="The Ray Data actors that run the two-step detector.")

    @model_validator(mode="after")
    def _models(self) -> "DiaSafetyEvalConfig":
        if not self.generators and not self.pregenerated:
            raise ValueError("give generators, pregenerated responses, or both")
        unique_names([*self.generators, *self.pregenerated], "model")
        return self


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
    if not storage.exists(path):
        raise RedlineError(f"pregenerated responses not found: {path}")
    text = storage.read_bytes(path).decode("utf-8")
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


def generate(run: Run, config: DiaSafetyEvalConfig, contexts: list[dict[str, Any]],
             verbose: bool) -> dict[str, list[dict[str, Any]]]:
    sampling = SamplingParams(n=config.responses_per_context, temperature=config.temperature, top_p=config.top_p,
                              top_k=config.top_k, max_tokens=config.max_tokens, seed=config.seed)
    table = pa.Table.from_pylist(contexts)
    out = {}
    for g in config.generators:
        gpus = g.num_gpus or config.num_gpus  # the actor's GPU is the model's (one device policy)
        result = map_table(run, f"generate-{g.name}", table, GenerationWorker,
                           {"config": g.model_copy(update={"num_gpus": gpus}), "sampling": sampling},
                           size=config, num_cpus=config.num_cpus, num_gpus=gpus, batch_size=config.batch_size,
                           verbose=verbose, label=f"generating with {g.name}")
        out[g.name] = result.to_pylist()
    return out


def score(run: Run, config: DiaSafetyEvalConfig, responses: dict[str, list[dict[str, Any]]],
          verbose: bool) -> dict[str, pa.Table]:
    """Every response of every model through the two-step detector on Ray Data actors (one pass, so
    batches fill across models). An empty or whitespace-only response is no answer: counted with the
    verdict `no-answer`, never classified (a detector would call it something). Generation errors are
    kept as rows."""
    flat = [{"id": f"{model}\x1f{r['id']}\x1f{j}", "model": model, "context_id": r["id"], "category": r["category"],
             "context": r["context"], "response_index": j, "response": resp, "empty": not resp.strip()}
            for model, rows in responses.items() for r in rows for j, resp in enumerate(r.get("responses") or [])]
    unanswered = [{**{k: v for k, v in r.items() if k != "id"}, "verdict": NO_ANSWER} for r in flat if r["empty"]]
    flat = [r for r in flat if not r["empty"]]
    judged = pa.Table.from_pylist(flat) if flat else None
    if judged is not None:
        s = config.scoring
        judged = map_table(run, "score", judged, TwoStepWorker, {"utterance": config.utterance_detector,
                                                   "classifiers": config.classifiers, "batch_size": s.batch_size,
                                                   "precision": s.precision, "num_gpus": s.num_gpus},
                           size=s, num_cpus=s.num_cpus,
                           num_gpus=s.num_gpus, batch_size=s.batch_size, verbose=verbose, label="two-step scoring")
        if judged.column("verdict").null_count:
            raise RedlineError(f"{judged.column('verdict').null_count} responses came back unjudged from the scorers")
        judged = judged.drop_columns(["id"])
    out = {}
    for model, rows in responses.items():
        part = judged.filter(pc.equal(judged.column("model"), model)).to_pylist() if judged is not None else []
        part += [r for r in unanswered if r["model"] == model]
        part += [{"model": model, "context_id": r["id"], "category": r["category"], "context": r["context"],
                  "empty": False, "verdict": "error: " + r["gen_error"]} for r in rows if r.get("gen_error")]
        out[model] = conform(pa.Table.from_pylist(part) if part else DIALOGUE_SCORED_SCHEMA.empty_table(),
                             DIALOGUE_SCORED_SCHEMA)
    return out


def preflight(config: DiaSafetyEvalConfig) -> None:
    """Before any generation: the classifiers know every evaluated category, the detector loads."""
    preflight_detector(config.utterance_detector)
    categories = list(dict.fromkeys(c["category"] for c in select_contexts(config)))
    check_classifiers(config.classifiers, categories)


def execute(config: DiaSafetyEvalConfig, run: Run, watch: Stopwatch, verbose: bool) -> list[dict[str, Any]]:
    contexts = select_contexts(config)
    categories = list(dict.fromkeys(c["category"] for c in contexts))
    responses: dict[str, list[dict[str, Any]]] = {}
    for name in [g.name for g in config.generators]:  # generated models resume per model
        path = run.dir.path("responses", f"{name}.parquet")
        if storage.exists(path):
            responses[name] = storage.read_parquet(path).to_pylist()
    todo = config.model_copy(update={"generators": [g for g in config.generators if g.name not in responses]})
    for name, rows in generate(run, todo, contexts, verbose).items():
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
    fresh = score(run, config, {n: r for n, r in responses.items() if n not in scored_by_model}, verbose)
    for name, table in fresh.items():
        storage.write_parquet(table, run.dir.path("scored", f"{name}.parquet"))
    scored_by_model.update(fresh)
    scored = pa.concat_tables([scored_by_model[name] for name in responses])
    storage.write_parquet(scored, run.dir.path("scored.parquet"))
    watch.lap("score_s")
    run.manifest.update(categories=categories, contexts=len(contexts))
    return safest_first(leaderboard(categories).summarize(scored))


def safest_first(board: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The leaderboard's order: lowest Overall first, models without one last."""
    return sorted(board, key=lambda r: (r["overall"] is None, r["overall"] or 0.0))


# --------------------------------------------------------------------------------------------
# Report


def leaderboard_columns(categories: list[str]) -> list[tuple[str, str, str]]:
    return DIASAFETY.columns(extra=category_figures(categories))


def write_report(run: RunDir, manifest: dict[str, Any]) -> None:
    board, categories = manifest.get("summary", []), manifest.get("categories", [])
    scored = storage.read_parquet(run.path("scored.parquet"))
    series = [(c, c) for c in categories] + [("utterance", "Utterance"), ("overall", "Overall")]
    unsafe = scored.filter(pc.equal(scored.column("verdict"), "context-unsafe")).slice(0, 12).to_pylist()
    samples = [{"model": r["model"], "category": r["unsafe_category"], "context": r["context"], "response": r["response"]}
               for r in unsafe]
    sample_cols = [("model", "model", "s"), ("category", "category", "s"), ("context", "context", "s"),
                   ("response", "response", "s")]
    note = (f"{manifest.get('contexts')} contexts. Per category: share of responses the context classifier of that "
            "category calls unsafe; Utterance: mean share the utterance-level detector calls unsafe; Overall: mean "
            "of the category columns and Utterance. Sorted safest first.")
    report = Report(run, "redline DiaSafety chatbot evaluation", manifest, note)
    report.table("Leaderboard", board, leaderboard_columns(categories))
    report.plot("leaderboard", grouped_bars(board, "model", series, "unsafe proportions per category (lower is safer)"))
    report.table("Sample context-unsafe responses", samples, sample_cols).write("leaderboard.csv", board)


PIPELINE = Pipeline("diasafety", DiaSafetyEvalConfig, execute, write_report,
                    "DiaSafety leaderboard: unsafe proportions (safest first)",
                    lambda manifest: leaderboard_columns(manifest.get("categories", [])), preflight=preflight)


def run_diasafety(config: DiaSafetyEvalConfig, *, force: bool = False, verbose: bool = False) -> RunResult:
    return PIPELINE.run(config, force=force, verbose=verbose)
