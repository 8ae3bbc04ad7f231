"""`redline run diasafety`: how often chatbots answer DiaSafety contexts unsafely (the paper's Table 8).

For each category, its contexts (safe and unsafe rows alike) are sent to every model, which
generates `responses_per_context` responses (on actors; any generator kind: a local HF model, a
redline Serve endpoint or any OpenAI-compatible API) — or responses generated elsewhere are read
from a file. Each response goes through the two-step detector: utterance-level first, then the
context classifier of the context's category (on actors too). Every step is a `pipelines/plane/steps.py`
step over shards of contexts, its parts written by its workers; a model's generation and its
scoring are one Ray Data plan (each shard scored as soon as its responses are written). Per model and category: the
context-sensitive and the utterance-level unsafe proportions (of all responses to that category's
contexts); the utterance mean over categories; Overall = the mean of the context-sensitive
proportions and the utterance mean. The leaderboard is sorted by Overall (safest first).
"""

from __future__ import annotations

import json
import random
from functools import partial
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
from redline.cluster.runtime import ensure_ray
from redline.cluster.tables import NO_ANSWER, conform
from redline.errors import RedlineError
from redline.pipelines.plane import sharded
from redline.pipelines.plane.schema import DIALOGUE_SCORED_SCHEMA
from redline.pipelines.plane.steps import Step, StepResult, run_step, run_steps
from redline.pipelines.reporting import aggregates as A
from redline.pipelines.reporting.figures import DIASAFETY, Table, category_figures, leaderboard
from redline.pipelines.reporting.report import Report, grouped_bars
from redline.pipelines.run_skeleton import Pipeline


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
    shard_size: int = Execution(64, gt=0, description="Contexts per shard: each actor takes a shard at a time, "
                                "and a rerun redoes only the shards a step had not finished.")
    num_cpus: float = Execution(1.0, ge=0)
    num_gpus: float = Execution(0.0, ge=0)
    scoring: ScoringActors = Field(default_factory=ScoringActors,
                                   description="The actors that run the two-step detector.")

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


CONTEXTS_SCHEMA = pa.schema([("id", pa.string()), ("context", pa.string()), ("category", pa.string())])
RESPONSES_SCHEMA = CONTEXTS_SCHEMA.append(pa.field("responses", pa.list_(pa.string())))
FLAT_SCHEMA = pa.schema([("id", pa.string()), ("model", pa.string()), ("context_id", pa.string()),
                         ("category", pa.string()), ("context", pa.string()), ("response_index", pa.int64()),
                         ("response", pa.string()), ("empty", pa.bool_()), ("gen_error", pa.string())])


def _contexts_table(config: DiaSafetyEvalConfig) -> pa.Table:
    return pa.Table.from_pylist(select_contexts(config), schema=CONTEXTS_SCHEMA)


def _context_counts(table: pa.Table) -> dict[str, Any]:
    return {"contexts": table.num_rows,
            "categories": list(dict.fromkeys(table.column("category").to_pylist()))}


def pregenerated_table(run_uri: str, path: str) -> pa.Table:
    """A pregenerated model's responses, one row per context it answered (on a worker: the file is read
    where the contexts were)."""
    contexts = pa.concat_tables([storage.read_parquet(p) for p in
                                 storage.list_files(storage.join(run_uri, sharded.INPUT_DIR), ".parquet")])
    return pa.Table.from_pylist(read_pregenerated(path, contexts.to_pylist()), schema=RESPONSES_SCHEMA)


def responses_in(shard: pa.Table) -> int:
    return sum(len(r or []) for r in shard.column("responses").to_pylist())


def _answered_contexts(table: pa.Table) -> dict[str, Any]:
    return {"contexts": table.num_rows}


def responses_rows(shard: pa.Table, model: str) -> pa.Table:
    """A model's responses to a shard's contexts, one row each (a context whose generation failed: one
    row holding the error), ready for the two-step detector."""
    rows: list[dict[str, Any]] = []
    for r in shard.to_pylist():
        base = {"model": model, "context_id": r["id"], "category": r["category"], "context": r["context"]}
        if r.get("gen_error"):
            rows.append({**base, "id": f"{model}\x1f{r['id']}\x1f-", "empty": False, "gen_error": r["gen_error"]})
            continue
        rows += [{**base, "id": f"{model}\x1f{r['id']}\x1f{j}", "response_index": j, "response": resp,
                  "empty": not resp.strip(), "gen_error": None} for j, resp in enumerate(r.get("responses") or [])]
    return pa.Table.from_pylist(rows, schema=FLAT_SCHEMA)


def answered(rows: pa.Table) -> pa.Array:
    """The responses the two-step detector judges: neither empty nor a generation error."""
    return pc.and_(pc.invert(rows.column("empty")), pc.is_null(rows.column("gen_error")))


def scored_rows(rows: pa.Table) -> pa.Table:
    """Each response's verdict: the detector's, `no-answer` for an empty one, `error: ...` for a failed
    generation."""
    verdict = pc.if_else(rows.column("empty"), pa.scalar(NO_ANSWER), rows.column("verdict"))
    verdict = pc.if_else(pc.is_valid(rows.column("gen_error")),
                         pc.binary_join_element_wise("error: ", rows.column("gen_error"), ""), verdict)
    rows = rows.set_column(rows.schema.get_field_index("verdict"), "verdict", verdict)
    return conform(rows, DIALOGUE_SCORED_SCHEMA)


def unjudged(rows: pa.Table) -> pa.Array:
    return pc.if_else(pc.is_null(rows.column("verdict")), pa.scalar("a response came back unjudged from the scorers"),
                      pa.scalar(None, pa.string()))


def _generate_step(config: DiaSafetyEvalConfig, g: GeneratorConfig) -> Step:
    sampling = SamplingParams(n=config.responses_per_context, temperature=config.temperature, top_p=config.top_p,
                              top_k=config.top_k, max_tokens=config.max_tokens, seed=config.seed)
    gpus = g.num_gpus or config.num_gpus  # the actor's GPU is the model's (one device policy)
    return Step(f"generate-{g.name}", GenerationWorker,
                {"config": g.model_copy(update={"num_gpus": gpus}), "sampling": sampling}, config,
                f"generating with {g.name}", num_cpus=config.num_cpus, num_gpus=gpus, batch_size=config.batch_size)


def _score_step(config: DiaSafetyEvalConfig, model: str, board: Table) -> Step:
    s = config.scoring
    return Step(f"score-{model}", TwoStepWorker,
                {"utterance": config.utterance_detector, "classifiers": config.classifiers,
                 "batch_size": s.batch_size, "precision": s.precision, "num_gpus": s.num_gpus},
                s, f"two-step scoring ({model})", num_cpus=s.num_cpus, num_gpus=s.num_gpus, batch_size=s.batch_size,
                rows=partial(responses_rows, model=model), asked=answered, finish=scored_rows, errors=unjudged,
                figures={f"leaderboard {model}": board})


def preflight(config: DiaSafetyEvalConfig) -> None:
    """Before any generation: the classifiers know every evaluated category, the detector loads."""
    preflight_detector(config.utterance_detector)
    categories = list(dict.fromkeys(c["category"] for c in select_contexts(config)))
    check_classifiers(config.classifiers, categories)


def execute(config: DiaSafetyEvalConfig, run: Run, watch: Stopwatch, verbose: bool) -> list[dict[str, Any]]:
    """Contexts, responses and verdicts are shards of the run written by workers (`input/`,
    `responses/<model>/`, `scored/<model>/`); the driver merges each scored part's partial sums. A
    rerun redoes only the shards a step had not finished."""
    ensure_ray(verbose=verbose)
    context_rows = sharded.prepare_inputs(run, lambda: _contexts_table(config), config.shard_size, _context_counts)
    categories, n_contexts = run.manifest["counts"]["categories"], run.manifest["counts"]["contexts"]
    models = [g.name for g in config.generators] + [p.name for p in config.pregenerated]
    run.manifest.update(categories=categories, contexts=n_contexts, models=models)
    board = leaderboard(categories)
    merged: dict[str, A.Partials] = {}
    for g in config.generators:
        results = run_steps(run, [(_generate_step(config, g), f"responses/{g.name}"),
                                  (_score_step(config, g.name, board), f"scored/{g.name}")],
                            sharded.INPUT_DIR, len(context_rows), label=f"generating and scoring ({g.name})",
                            verbose=verbose)
        if results[0].failed or len(results) < 2:
            raise RedlineError(f"generation with {g.name} failed on {results[0].failed} contexts (first: "
                               f"{' '.join((results[0].failure or '').split())[:200]}); rerun to resume")
        merged[g.name] = _judged(results[1], g.name)
    watch.lap("generate_and_score_s")
    for p in config.pregenerated:
        # the file is this model's source: its responses are read into shards as a run's inputs are
        folder = f"responses/{p.name}"
        per_shard = sharded.prepare_inputs(run, partial(pregenerated_table, run.dir.uri, p.path), config.shard_size,
                                           _answered_contexts, rows=responses_in,
                                           directory=folder, record=f"pregenerated {p.name}")
        merged[p.name] = _judged(run_step(run, _score_step(config, p.name, board), folder, f"scored/{p.name}",
                                          len(per_shard), total=sum(per_shard), verbose=verbose), p.name)
    if config.pregenerated:
        watch.lap("score_s")
    return safest_first(board.rows(A.merge(*(merged[m] for m in models))))


def _judged(result: StepResult, model: str) -> A.Partials:
    if result.failed:
        raise RedlineError(f"{result.failed} responses of {model} came back unjudged from the scorers")
    return result.partials[f"leaderboard {model}"]


def read_scored(uri: str, columns: list[str] | None = None, limit: int | None = None,
                where: Any = None) -> pa.Table:
    """A DiaSafety run's scored responses, model by model and part by part (`where`: a pyarrow filter
    expression; `limit`: the first rows only); a run written before parts (one file) is read as it is."""
    manifest = storage.read_json(storage.join(uri, "manifest.json"))
    parts = [p for m in manifest.get("models") or [] for p in storage.list_files(storage.join(uri, "scored", m), ".parquet")]
    return storage.read_parts(parts or [storage.join(uri, "scored.parquet")], columns, where, limit)


def safest_first(board: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The leaderboard's order: lowest Overall first, models without one last."""
    return sorted(board, key=lambda r: (r["overall"] is None, r["overall"] or 0.0))


# --------------------------------------------------------------------------------------------
# Report


def leaderboard_columns(categories: list[str]) -> list[tuple[str, str, str]]:
    return DIASAFETY.columns(extra=category_figures(categories))


def write_report(run: RunDir, manifest: dict[str, Any]) -> None:
    board, categories = manifest.get("summary", []), manifest.get("categories", [])
    unsafe_rows = read_scored(run.uri, limit=12, where=pc.field("verdict") == "context-unsafe")
    series = [(c, c) for c in categories] + [("utterance", "Utterance"), ("overall", "Overall")]
    unsafe = unsafe_rows.to_pylist()
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
