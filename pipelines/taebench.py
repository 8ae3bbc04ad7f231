"""`redline run taebench`: raw attack successes -> TaeBench (valid TAE) and TaeBench+ (+ valid BAE).

Stages, in the paper's order, each keeping some rows and rejecting the rest with a reason:
1. dedupe       exact (or case/whitespace-normalised) duplicates per goal; the kept row lists every
                recipe that produced the text
2. grammar      LanguageTool: more grammar errors than the seed by over `max_new_errors`
3. naturalness  an acceptability classifier's P(natural) below its threshold
4. label        LLM judge AND toxicity classifier: a TAE must still be toxic to both, a BAE benign
Each stage's full table (kept and rejected rows, with its own columns and `kept`, `reject_reason`,
`reject_kind`) is written shard by shard to `stages/<n>-<name>/` by the actors that judged it, and the
next stage reads those parts: no row passes through the driver, which merges each part's partial
sums (Table 2, the stage lines). A restarted run redoes only the shards a stage had not finished.
TaeBench and TaeBench+ are written the same way, to `taebench/` and `taebench_plus/`.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
from collections import defaultdict
from functools import partial
from typing import Annotated, Any, Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import Field, model_validator

from redline.actors.detectors import DetectorConfig
from redline.actors.detectors.worker import DetectionWorker
from redline.actors.judges import ERROR, USABLE, JudgeConfig, JudgeWorker, usage_summary
from redline.actors.quality.grammar import (
    GrammarConfig,
    GrammarWorker,
    LanguageToolClient,
)
from redline.cluster import storage
from redline.cluster.config import ActorPoolSize, Execution, Input, Result, RunConfig
from redline.cluster.runs import Run, RunDir, RunResult, Stopwatch, require_finished
from redline.cluster.runtime import ensure_ray
from redline.errors import RedlineError
from redline.pipelines.plane import runner, sharded
from redline.pipelines.plane.steps import Step, run_steps
from redline.pipelines.reporting import aggregates as A
from redline.pipelines.reporting.figures import JUDGE_USAGE, TAEBENCH, TAEBENCH_STAGE, TAEBENCH_STAGES, Table
from redline.pipelines.reporting.report import Report, png_bytes
from redline.pipelines.run_skeleton import Pipeline

log = logging.getLogger(__name__)


class NaturalnessConfig(ActorPoolSize):
    """A text-acceptability classifier (any HF sequence classifier, e.g. CoLA-style)."""

    model: str = Input(description="Hub id or local directory (see `redline train naturalness`).")
    natural_label: str | None = Result(None, description="The label meaning natural/acceptable; default label 1.")
    threshold: float = Result(0.5, ge=0, le=1, description="Reject below this probability of natural.")
    max_length: int = Result(128, gt=0)
    batch_size: int = Execution(64, gt=0)
    num_cpus: float = Execution(1.0, ge=0)
    num_gpus: float = Execution(0.0, ge=0)

    def detector(self) -> "DetectorConfig":
        """The same HF loading and batching as detectors, with `natural` in the role of the scored label."""
        extra: dict[str, Any] = {"model": self.model, "max_length": self.max_length}
        if self.natural_label:
            extra["toxic_labels"] = [self.natural_label]
        return DetectorConfig.model_validate({"name": "naturalness", "kind": "hf", "threshold": self.threshold,
                                              "rule": "score", "batch_size": self.batch_size,
                                              "actors": self.actors, "max_actors": self.max_actors,
                                              "num_cpus": self.num_cpus, "num_gpus": self.num_gpus, **extra})


class TaebenchConfig(RunConfig):
    """`redline run taebench`: filter raw attack output into TaeBench (TAE) and TaeBench+ (+ BAE)."""

    attacks: str | Annotated[list[str], Field(min_length=1)] = Input(
        description="Attack run directories (local or s3://) whose successes are filtered.")
    normalise: bool = Result(True, description="Deduplicate case- and whitespace-insensitively.")
    grammar: GrammarConfig | None = Field(default_factory=GrammarConfig,
                                          description="null turns the grammar stage off (recorded in the manifest).")
    naturalness: NaturalnessConfig | None = None
    judge: JudgeConfig | None = Field(None, description="LLM judge; a TAE needs its Yes, a BAE its No.")
    classifier: DetectorConfig | None = Field(None, description="Toxicity classifier; must agree with the judge.")
    test_fraction: float = Result(0.2, ge=0, le=1, description="Share of seeds whose examples form the test split.")
    seed: int = Result(0)
    shard_size: int = Execution(512, gt=0, description="Examples per shard: each stage's actors take a shard at a "
                                "time, and a rerun redoes only the shards a stage had not finished.")

    @property
    def attack_runs(self) -> list[str]:
        return self.attacks if isinstance(self.attacks, list) else [self.attacks]

    @model_validator(mode="after")
    def _label_filter(self) -> "TaebenchConfig":
        if self.judge is None and self.classifier is None:
            raise ValueError("the label filter needs a judge, a classifier or both")
        return self


DEDUPE_DIR = "stages/1-dedupe"
PROVENANCE = ["recipe", "transformation", "constraints", "search", "victim", "goal", "seed_id", "seed_text",
              "seed_label", "dataset", "split", "source", "source_row"]


def load_raw(config: TaebenchConfig) -> pa.Table:
    """Successful attempts of every attack run, as (id, text, label, provenance)."""
    parts = []
    for uri in config.attack_runs:
        require_finished(uri, "attack")
        parts.extend(successes(uri))
    raw = pa.concat_tables(parts, promote_options="permissive") if parts else None
    if raw is None or raw.num_rows == 0:
        raise RedlineError("the attack runs hold no successful adversarial examples to filter")
    label = pc.if_else(pc.equal(raw.column("goal"), "tae"), 1, 0).cast(pa.int8())
    cols = {"id": raw.column("id"), "text": raw.column("perturbed_text"), "label": label}
    cols.update({c: raw.column(c) for c in PROVENANCE})
    table = pa.table(cols)
    if "more_examples" not in raw.column_names or pc.sum(pc.list_value_length(raw.column("more_examples"))).as_py() in (None, 0):
        return table
    # a seed's further examples (examples_per_seed > 1): rows of their own, `<attempt id>~<n>`
    extra = []
    for row, more in zip(table.to_pylist(), raw.column("more_examples").to_pylist()):
        extra.extend({**row, "id": f"{row['id']}~{n}", "text": text} for n, text in enumerate(more or [], start=2))
    return pa.concat_tables([table, pa.Table.from_pylist(extra, schema=table.schema)])


def successes(uri: str) -> list[pa.Table]:
    """An attack run's successful attempts, part by part, with only the columns TaeBench keeps (the
    failed and skipped attempts, most of a run, are never loaded)."""
    parts = storage.list_files(storage.join(uri, "attempts"), ".parquet")
    if not parts:
        raise RedlineError(f"{storage.join(uri, 'attempts')} holds no attempts")
    wanted = ["id", "perturbed_text", "goal", "status", "more_examples", *PROVENANCE]
    out = []
    for part in parts:
        f = pq.ParquetFile(io.BytesIO(storage.read_bytes(part)))
        table = f.read(columns=[c for c in wanted if c in f.schema_arrow.names])
        out.append(table.filter(pc.equal(table.column("status"), "success")))
    return out


def _normalise(text: str, on: bool) -> str:
    return " ".join(text.lower().split()) if on else text


def dedupe(table: pa.Table, config: TaebenchConfig) -> pa.Table:
    """Every row with the dedupe verdict: the first of each (goal, text) kept, the later ones rejected;
    the kept row's `recipes` lists every recipe that produced its text."""
    firsts: dict[tuple[str, str], int] = {}
    recipes: dict[tuple[str, str], list[str]] = defaultdict(list)
    keys = [(g, _normalise(t, config.normalise)) for g, t in zip(table.column("goal").to_pylist(),
                                                                  table.column("text").to_pylist())]
    for i, (key, rec) in enumerate(zip(keys, table.column("recipe").to_pylist())):
        firsts.setdefault(key, i)
        if rec not in recipes[key]:
            recipes[key].append(rec)
    table = table.append_column("recipes", pa.array([",".join(recipes[k]) for k in keys]))
    return with_verdict(table, [None if firsts[k] == i else ("duplicate text", "duplicate text")
                                for i, k in enumerate(keys)])


def deduped(config: TaebenchConfig) -> pa.Table:
    """The dedupe stage's rows (run where the attack runs are read: a worker)."""
    return dedupe(load_raw(config), config)


def _dedupe_counts(table: pa.Table) -> dict[str, Any]:
    return {"raw": table.num_rows, "dedupe": A.to_json(TAEBENCH_STAGE.partials(table))}


def with_verdict(table: pa.Table, verdicts: list[tuple[str, str] | None]) -> pa.Table:
    """`table` with a stage's verdict on each row: None keeps it, (kind, reason) rejects it."""
    return table.append_column("kept", pa.array([v is None for v in verdicts], pa.bool_())).append_column(
        "reject_reason", pa.array([v and v[1] for v in verdicts], pa.string())).append_column(
        "reject_kind", pa.array([v and v[0] for v in verdicts], pa.string()))


def grammar_verdict(rows: pa.Table, max_new_errors: int) -> pa.Table:
    verdicts: list[tuple[str, str] | None] = []
    for e, s in zip(rows.column("grammar_errors").to_pylist(), rows.column("seed_grammar_errors").to_pylist()):
        new = e - s if e is not None and s is not None else 0
        verdicts.append(("more grammar errors than the seed", f"{new} more grammar errors than the seed ({e} vs {s})")
                        if new > max_new_errors else None)
    return with_verdict(rows, verdicts)


def grammar_errors(rows: pa.Table) -> pa.Array:
    return pa.array([f or (None if e is not None else "no result") for e, f in
                     zip(rows.column("grammar_errors").to_pylist(), rows.column("grammar_error").to_pylist())],
                    pa.string())


def naturalness_verdict(rows: pa.Table, threshold: float) -> pa.Table:
    rows = _renamed(rows, "natural")
    return with_verdict(rows, [("unnatural", f"unnatural: P(natural) {p:.2f} < {threshold:g}")
                               if p is not None and p < threshold else None
                               for p in rows.column("natural_score").to_pylist()])


def label_verdict(rows: pa.Table, judge: bool, classifier: bool) -> pa.Table:
    """Keep a TAE only if the judge says Yes and the classifier says toxic; a BAE only on No and benign."""
    if classifier:
        rows = _renamed(rows, "classifier")
    col = {name: rows.column(name).to_pylist() for name in ("judge_verdict", "judge_reason", "classifier_toxic")
           if name in rows.column_names}
    verdicts: list[tuple[str, str] | None] = []
    for i, goal in enumerate(rows.column("goal").to_pylist()):
        want_toxic, verdict = goal == "tae", None
        if judge and col["judge_verdict"][i] != ("yes" if want_toxic else "no"):
            said, why = col["judge_verdict"][i], col["judge_reason"][i]
            verdict = (f"judge says {said}", f"judge says {said}" + (f" ({why})" if why else ""))
        if verdict is None and classifier and col["classifier_toxic"][i] != want_toxic:
            said = "toxic" if col["classifier_toxic"][i] else "benign"
            verdict = (f"classifier says {said}", f"classifier says {said}")
        verdicts.append(verdict)
    return with_verdict(rows, verdicts)


def judge_errors(rows: pa.Table) -> pa.Array:
    return pc.if_else(pc.fill_null(pc.equal(rows.column("judge_verdict"), ERROR), True),
                      pc.fill_null(rows.column("judge_reason"), "no result"), pa.scalar(None, pa.string()))


def detector_errors(prefix: str) -> Callable[[pa.Table], pa.Array]:
    return partial(_detector_errors, prefix=prefix)


def _detector_errors(rows: pa.Table, prefix: str) -> pa.Array:
    return pa.array([None if s == "ok" else (r or "no result") for s, r in
                     zip(rows.column(f"{prefix}_status").to_pylist(), rows.column(f"{prefix}_reason").to_pylist())],
                    pa.string())


def _renamed(rows: pa.Table, prefix: str) -> pa.Table:
    """A detector's answer columns named for the stage (`natural_score`, `classifier_toxic`, ...)."""
    renames = {"toxic_score": f"{prefix}_score", "pred_toxic": f"{prefix}_toxic", "det_status": f"{prefix}_status",
               "det_reason": f"{prefix}_reason"}
    keep = [n for n in rows.column_names if n not in ("detector", "probs", "seconds")]
    return rows.select(keep).rename_columns([renames.get(n, n) for n in keep])


def _detector_step(name: str, det: DetectorConfig, label: str, finish: Callable[[pa.Table], pa.Table],
                   prefix: str, figures: dict[str, Table]) -> Step:
    return Step(name, DetectionWorker, {"config": det}, det, label, num_cpus=det.num_cpus, num_gpus=det.num_gpus,
                batch_size=det.batch_size, finish=finish, figures=figures, errors=detector_errors(prefix))


def quality_steps(config: TaebenchConfig) -> list[tuple[str, str, Step | None]]:
    """(stage, folder, step) after dedupe, in order; a stage of two steps (the judge, then the classifier)
    keeps the first's parts under work/; None: a stage turned off."""
    out: list[tuple[str, str, Step | None]] = []
    stage = {"grammar": TAEBENCH_STAGE}
    g = config.grammar
    out.append(("grammar", "stages/2-grammar", None if g is None else Step(
        "grammar", GrammarWorker, {"config": g}, g, "grammar stage", num_cpus=g.num_cpus, batch_size=g.batch_size,
        finish=partial(grammar_verdict, max_new_errors=g.max_new_errors), errors=grammar_errors, figures=stage)))
    n = config.naturalness
    out.append(("naturalness", "stages/3-naturalness", None if n is None else _detector_step(
        "naturalness", n.detector(), "naturalness stage", partial(naturalness_verdict, threshold=n.threshold),
        "natural", {"naturalness": TAEBENCH_STAGE})))
    j, c = config.judge, config.classifier
    verdict = partial(label_verdict, judge=j is not None, classifier=c is not None)
    if j is not None:
        out.append(("label", "work/label-judge" if c is not None else "stages/4-label", Step(
            "label-judge", JudgeWorker, {"config": j}, j, "label stage: LLM judge", num_cpus=j.num_cpus,
            batch_size=j.batch_size, finish=None if c is not None else verdict, errors=judge_errors,
            figures={"judge": JUDGE_USAGE, **({} if c is not None else {"label": TAEBENCH_STAGE})})))
    if c is not None:
        out.append(("label", "stages/4-label", _detector_step(
            "label-classifier", c, f"label stage: classifier {c.name}", verdict, "classifier",
            {"label": TAEBENCH_STAGE})))
    return out


_WHAT = {"grammar": lambda c: "LanguageTool", "naturalness": lambda c: "the naturalness classifier",
         "label-judge": lambda c: f"the LLM judge at {c.judge.where()}",
         "label-classifier": lambda c: f"classifier '{c.classifier.name}'"}


def _grammar_unavailable(config: TaebenchConfig) -> str | None:
    """Why the grammar stage is skipped (None: it runs); an error when it may not be skipped."""
    g = config.grammar
    assert g is not None
    if g.url and LanguageToolClient(g.url, g.language, timeout=10).available():
        return None
    where = f"at {g.url}" if g.url else "(grammar.url is not set)"
    if g.skip_if_unavailable:
        return f"skipped: no LanguageTool server {where}"
    raise RedlineError(f"grammar stage: no LanguageTool server {where}; start one, or set "
                       f"grammar.skip_if_unavailable: true (or grammar: null) to run without it")


def _stage_figure(key: str, sums: A.Sums) -> Any:
    """One of a stage's figures (`in`, `kept`, `reasons`) from its partial sums."""
    compute = TAEBENCH_STAGE.figure(key).compute
    assert compute is not None
    return compute.value(sums)


def _totals(partials: A.Partials) -> A.Sums:
    return A.merge(*({(): sums} for sums in partials.values())).get((), {})


def _stage_line(partials: A.Partials) -> dict[str, Any]:
    sums = _totals(partials)
    n_in, kept, reasons = (_stage_figure(k, sums) for k in ("in", "kept", "reasons"))
    return {"in": n_in, "kept": kept, "rejected": n_in - kept,
            "top_reasons": dict(sorted(reasons.items(), key=lambda kv: -kv[1])[:5])}


def counts_table(stages: dict[str, A.Partials | None]) -> list[dict[str, Any]]:
    """The paper's Table 2: rows remaining after each stage and % of raw, per goal and seed dataset
    (the dedupe stage's rows, `all` first); a stage that did not run (None) has no column."""
    rows = []
    for first in sorted(TAEBENCH_STAGE.rows(stages["dedupe"] or {}), key=lambda r: r["goal"] != "tae"):
        goal, dataset = first["goal"], first["dataset"]
        row: dict[str, Any] = {"goal": goal, "dataset": dataset, "raw": first["in"]}
        for stage, partials in stages.items():
            if partials is None:
                continue
            row[stage] = sum(_stage_figure("kept", sums) for (g, d), sums in partials.items()
                             if g == goal and dataset in ("all", d))
            row[f"{stage}_pct"] = round(100 * row[stage] / row["raw"], 1) if row["raw"] else 0.0
        rows.append(row)
    return rows


def execute(config: TaebenchConfig, run: Run, watch: Stopwatch, verbose: bool) -> list[dict[str, Any]]:
    manifest = run.manifest
    ensure_ray(verbose=verbose)
    shard_rows = sharded.prepare_inputs(run, lambda: deduped(config), config.shard_size, _dedupe_counts,
                                        directory=DEDUPE_DIR)
    n_shards = len(shard_rows)
    if "dedupe" in manifest.get("counts", {}):  # the dedupe stage's sums, from the task that wrote its parts
        sharded.count_partials(run, {"dedupe": TAEBENCH_STAGE}, 0,
                               {"dedupe": A.from_json(manifest["counts"].pop("dedupe"))})
    dedupe = sharded.run_partials(run, {"dedupe": TAEBENCH_STAGE}, DEDUPE_DIR, {})["dedupe"]  # merged in the manifest
    found: dict[str, A.Partials | None] = {"dedupe": dedupe}
    stage_lines = manifest.setdefault("stages", {})
    stage_lines["dedupe"] = _stage_line(found["dedupe"] or {})
    run.dir.write_manifest(manifest)
    if manifest["counts"]["raw"] == 0:
        raise RedlineError("the attack runs hold no successful adversarial examples to filter")
    chain: list[tuple[str, Step, str]] = []  # the stages that run: (stage, step, folder)
    for stage, folder, step in quality_steps(config):
        if step is None:
            stage_lines[stage], found[stage] = "off (disabled in the config)", None
            continue
        if stage == "grammar" and runner.pending(run, folder, n_shards, 0):
            skipped = _grammar_unavailable(config)
            if skipped:
                stage_lines[stage], found[stage] = skipped, None
                continue
        chain.append((stage, step, folder))
    names = ", ".join(dict.fromkeys(stage for stage, _, _ in chain))
    # the benchmark's own tables are the chain's last two steps: each shard's kept rows with their split
    # as soon as the label stage wrote it (TaeBench+), then its TAE rows (TaeBench)
    chain += [("bench", step, folder) for folder, step in bench_steps(config)]
    results = run_steps(run, [(step, folder) for _, step, folder in chain], DEDUPE_DIR, n_shards,
                        label=f"quality stages ({names})", verbose=verbose)
    for (stage, step, folder), result in zip(chain, results):
        if result.failed:
            raise RedlineError(f"{stage} stage: {_WHAT[step.name](config)} failed on {result.failed} of "
                               f"{result.asked} texts (first: {' '.join((result.failure or '').split())[:200]}); "
                               "fix the cause and rerun to resume this stage")
        if "judge" in result.partials:
            _check_judge(run, config, result.partials["judge"])
        if stage in result.partials:
            found[stage] = result.partials[stage]
            stage_lines[stage] = _stage_line(found[stage] or {})
        run.dir.write_manifest(manifest)
    watch.lap("stages_s")
    label = found["label"] or {}
    tae = sum(_stage_figure("kept", sums) for (goal, _), sums in label.items() if goal == "tae")
    manifest["counts"].update(taebench=tae, taebench_plus=_stage_figure("kept", _totals(label)))
    return counts_table(found)


def _check_judge(run: Run, config: TaebenchConfig, partials: A.Partials) -> None:
    """The judge's usage into the manifest; a judge that gave no usable answer at all fails the stage."""
    assert config.judge is not None
    usage = usage_summary(JUDGE_USAGE.rows(partials)[0] if partials else
                          {**dict.fromkeys(("texts", "cache_hits", "retries", "prompt_tokens", "completion_tokens"), 0),
                           "by_verdict": {}}, config.judge)
    run.manifest["judge_usage"] = usage
    if usage["texts"] and not any(v in USABLE for v in usage["by_verdict"]):
        raise RedlineError(f"label stage: the LLM judge gave no usable answer for any of {usage['texts']} texts "
                           f"(answers: {usage['by_verdict']}); check its model and template")


def bench_steps(config: TaebenchConfig) -> list[tuple[str, Step]]:
    """(folder, step): TaeBench+ (every row the stages kept, with its train/test split) and TaeBench (its
    TAE rows), a part per shard; no model, so each shard is a task, not an actor's call."""
    split = partial(with_bench_split, test_fraction=config.test_fraction, seed=config.seed)
    return [("taebench_plus", Step("taebench+", None, {}, ActorPoolSize(), "TaeBench+", num_cpus=0.25, finish=split)),
            ("taebench", Step("taebench", None, {}, ActorPoolSize(), "TaeBench", num_cpus=0.25, rows=tae_rows))]


def with_bench_split(rows: pa.Table, test_fraction: float, seed: int) -> pa.Table:
    return rows.append_column("bench_split", pa.array(
        [bench_split(s, test_fraction, seed) for s in rows.column("seed_id").to_pylist()], pa.string()))


def tae_rows(rows: pa.Table) -> pa.Table:
    return rows.filter(pc.equal(rows.column("goal"), "tae"))


def read_bench(uri: str, name: str = "taebench_plus", limit: int | None = None) -> pa.Table:
    """A TaeBench run's `taebench` or `taebench_plus` rows, part by part (the first `limit` rows only
    when given); a run written before parts (one file) is read as it is."""
    parts = storage.list_files(storage.join(uri, name), ".parquet") or [storage.join(uri, f"{name}.parquet")]
    return storage.read_parts(parts, limit=limit)


def bench_split(seed_id: str, test_fraction: float, seed: int) -> str:
    """train/test by a hash of the seed id: every example of one seed lands in the same split."""
    h = int(hashlib.sha256(f"{seed}:{seed_id}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "test" if h < test_fraction else "train"


# --------------------------------------------------------------------------------------------
# Report


def taebench_columns(rows: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """Table 2's columns: the stages this run has (every stage of the declaration a row carries)."""
    return TAEBENCH.columns(rows or [{"goal": 0, "dataset": 0, "raw": 0}])


def plot_funnel(rows: list[dict[str, Any]]) -> bytes | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    overall = [r for r in rows if r["dataset"] == "all"]
    if not overall:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    for r in overall:
        stages = ["raw"] + [s for s in TAEBENCH_STAGES if s in r]
        ax.plot(stages, [r[s] for s in stages], marker="o", label=r["goal"].upper())
    ax.set_ylabel("examples remaining")
    ax.set_title("quality filters: examples left after each stage")
    ax.legend()
    ax.grid(alpha=0.3)
    return png_bytes(fig)


def write_report(run: RunDir, manifest: dict[str, Any]) -> None:
    final = read_bench(run.uri, limit=12)
    table2 = manifest.get("summary", [])
    stage_rows = []
    for name, info in manifest.get("stages", {}).items():
        if isinstance(info, dict):
            top = "; ".join(f"{k} ({v})" for k, v in info["top_reasons"].items()) or "–"
            stage_rows.append({"stage": name, "in": info["in"], "kept": info["kept"], "rejected": info["rejected"],
                               "reasons": top})
        else:
            stage_rows.append({"stage": name, "in": None, "kept": None, "rejected": None, "reasons": info})
    stage_cols = [("stage", "stage", "s"), ("in", "in", "d"), ("kept", "kept", "d"), ("rejected", "rejected", "d"),
                  ("reasons", "main rejection reasons", "s")]
    samples = [{"goal": r["goal"], "recipes": r["recipes"], "seed": r["seed_text"], "example": r["text"]}
               for r in final.to_pylist()]
    sample_cols = [("goal", "goal", "s"), ("recipes", "recipes", "s"), ("seed", "seed", "s"), ("example", "kept example", "s")]
    counts = manifest.get("counts", {})
    note = (f"{counts.get('raw')} raw adversarial examples -> TaeBench {counts.get('taebench')} (valid TAE), "
            f"TaeBench+ {counts.get('taebench_plus')} (valid TAE + BAE).")
    report = Report(run, "redline TaeBench report", manifest, note)
    report.table("Rows remaining after each stage (Table 2)", table2, taebench_columns(table2))
    report.plot("funnel", plot_funnel(table2)).table("Stages", stage_rows, stage_cols)
    if manifest.get("judge_usage"):
        report.text("LLM judge usage", json.dumps(manifest["judge_usage"], indent=2))
    report.table("Sample kept examples", samples, sample_cols).write("counts.csv", table2)


def notes(manifest: dict[str, Any]) -> list[str]:
    out = [f"stage {name}: {info}" for name, info in manifest.get("stages", {}).items() if not isinstance(info, dict)]
    counts = manifest.get("counts", {})
    return out + [f"TaeBench: {counts.get('taebench')} rows, TaeBench+: {counts.get('taebench_plus')} rows"]


PIPELINE = Pipeline("taebench", TaebenchConfig, execute, write_report, "rows remaining after each stage",
                    lambda manifest: taebench_columns(manifest.get("summary", [])), notes=notes)


def run_taebench(config: TaebenchConfig, *, force: bool = False, verbose: bool = False) -> RunResult:
    return PIPELINE.run(config, force=force, verbose=verbose)
