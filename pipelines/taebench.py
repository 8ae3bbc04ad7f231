"""`redline run taebench`: raw attack successes -> TaeBench (valid TAE) and TaeBench+ (+ valid BAE).

Stages, in the paper's order, each keeping some rows and rejecting the rest with a reason:
1. dedupe       exact (or case/whitespace-normalised) duplicates per goal; the kept row lists every
                recipe that produced the text
2. grammar      LanguageTool: more grammar errors than the seed by over `max_new_errors`
3. naturalness  an acceptability classifier's P(natural) below its threshold
4. label        LLM judge AND toxicity classifier: a TAE must still be toxic to both, a BAE benign
Each stage's full table (kept and rejected rows, with its own columns) is written to
`stages/<n>-<name>.parquet` before the next starts; a restarted run resumes after the last one.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
from collections import defaultdict
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
from redline.errors import RedlineError
from redline.pipelines.figures import TAEBENCH
from redline.pipelines.report import Report, png_bytes
from redline.pipelines.stages import map_table
from redline.pipelines.template import Pipeline

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

    @property
    def attack_runs(self) -> list[str]:
        return self.attacks if isinstance(self.attacks, list) else [self.attacks]

    @model_validator(mode="after")
    def _label_filter(self) -> "TaebenchConfig":
        if self.judge is None and self.classifier is None:
            raise ValueError("the label filter needs a judge, a classifier or both")
        return self


STAGES = ("dedupe", "grammar", "naturalness", "label")
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
    firsts: dict[tuple[str, str], int] = {}
    recipes: dict[tuple[str, str], list[str]] = defaultdict(list)
    keys = [(g, _normalise(t, config.normalise)) for g, t in zip(table.column("goal").to_pylist(),
                                                                  table.column("text").to_pylist())]
    for i, (key, rec) in enumerate(zip(keys, table.column("recipe").to_pylist())):
        firsts.setdefault(key, i)
        if rec not in recipes[key]:
            recipes[key].append(rec)
    kept = [firsts[k] == i for i, k in enumerate(keys)]
    return table.append_column("recipes", pa.array([",".join(recipes[k]) for k in keys])).append_column(
        "kept", pa.array(kept)).append_column(
        "reject_reason", pa.array([None if k else "duplicate text" for k in kept], pa.string()))


def grammar(run: Run, table: pa.Table, config: TaebenchConfig, verbose: bool) -> pa.Table | str:
    g = config.grammar
    assert g is not None
    if not g.url or not LanguageToolClient(g.url, g.language, timeout=10).available():
        where = f"at {g.url}" if g.url else "(grammar.url is not set)"
        if g.skip_if_unavailable:
            return f"skipped: no LanguageTool server {where}"
        raise RedlineError(f"grammar stage: no LanguageTool server {where}; start one, or set "
                           f"grammar.skip_if_unavailable: true (or grammar: null) to run without it")
    out = map_table(run, "grammar", table, GrammarWorker, {"config": g}, size=g, num_cpus=g.num_cpus,
                    batch_size=g.batch_size, verbose=verbose, label="grammar stage",
                    redo=lambda part: pc.or_(pc.is_valid(part.column("grammar_error")),
                                             pc.is_null(part.column("grammar_errors"))))
    errs, seed_errs = out.column("grammar_errors").to_pylist(), out.column("seed_grammar_errors").to_pylist()
    failures = out.column("grammar_error").to_pylist()
    fail_on_errors("grammar", "LanguageTool", [f or (None if e is not None else "no result") for e, f in zip(errs, failures)])
    reasons = []
    for e, s in zip(errs, seed_errs):
        if e - s > g.max_new_errors:
            reasons.append(f"{e - s} more grammar errors than the seed ({e} vs {s})")
        else:
            reasons.append(None)
    return _with_verdict(out, reasons)


def naturalness(run: Run, table: pa.Table, config: TaebenchConfig, verbose: bool) -> pa.Table:
    n = config.naturalness
    assert n is not None
    det = n.detector()
    out = _detect(run, "naturalness", table, det, verbose, prefix="natural")
    fail_on_errors("naturalness", "the naturalness classifier", _detector_errors(out, "natural"))
    reasons = []
    for score in out.column("natural_score").to_pylist():
        if score < n.threshold:
            reasons.append(f"unnatural: P(natural) {score:.2f} < {n.threshold:g}")
        else:
            reasons.append(None)
    return _with_verdict(out, reasons)


def label_filter(run: Run, table: pa.Table, config: TaebenchConfig, verbose: bool) -> pa.Table:
    """Keep a TAE only if the judge says Yes and the classifier says toxic; a BAE only on No and benign."""
    out = table
    if config.judge is not None:
        j = config.judge
        out = map_table(run, "label-judge", out, JudgeWorker, {"config": j}, size=j, num_cpus=j.num_cpus,
                        batch_size=j.batch_size, verbose=verbose, label="LLM judge",
                        redo=lambda part: pc.fill_null(pc.equal(part.column("judge_verdict"), ERROR), True))
    if config.classifier is not None:
        c = config.classifier
        out = _detect(run, "label-classifier", out, c, verbose, prefix="classifier")
    col = {name: out.column(name).to_pylist() for name in out.column_names
           if name in ("judge_verdict", "judge_reason", "classifier_toxic")}
    if config.judge is not None:
        verdicts, why = col["judge_verdict"], col["judge_reason"]
        fail_on_errors("label", f"the LLM judge at {config.judge.base_url}",
                       [r if v == ERROR else None for v, r in zip(verdicts, why)])
        if verdicts and not any(v in USABLE for v in verdicts):
            first = next((r for r in why if r), "no answer")
            raise RedlineError(f"label stage: the LLM judge gave no usable answer for any of {len(verdicts)} texts "
                               f"(first: {first}); check its model and template")
    if config.classifier is not None:
        fail_on_errors("label", f"classifier '{config.classifier.name}'", _detector_errors(out, "classifier"))
    reasons = []
    for i, goal in enumerate(out.column("goal").to_pylist()):
        want_toxic = goal == "tae"
        reason = None
        if config.judge is not None:
            verdict = col["judge_verdict"][i]
            if verdict != ("yes" if want_toxic else "no"):
                why = col["judge_reason"][i]
                reason = f"judge says {verdict}" + (f" ({why})" if why else "")
        if reason is None and config.classifier is not None and col["classifier_toxic"][i] != want_toxic:
            reason = f"classifier says {'toxic' if col['classifier_toxic'][i] else 'benign'}"
        reasons.append(reason)
    return _with_verdict(out, reasons)


def _detector_errors(table: pa.Table, prefix: str) -> list[str | None]:
    return [None if s == "ok" else (r or "no result") for s, r in
            zip(table.column(f"{prefix}_status").to_pylist(), table.column(f"{prefix}_reason").to_pylist())]


def fail_on_errors(stage: str, what: str, errors: list[str | None]) -> None:
    """A text a model or service could not answer is not a rejection: the stage fails, naming the
    cause, and nothing of it is written, so a rerun asks again (answers already given are cached)."""
    failed = [e for e in errors if e]
    if failed:
        raise RedlineError(f"{stage} stage: {what} failed on {len(failed)} of {len(errors)} texts (first: "
                           f"{' '.join(failed[0].split())[:200]}); fix the cause and rerun to resume this stage")


def _detect(run: Run, stage: str, table: pa.Table, det: DetectorConfig, verbose: bool, prefix: str) -> pa.Table:
    out = map_table(run, stage, table, DetectionWorker, {"config": det}, size=det, num_cpus=det.num_cpus,
                    num_gpus=det.num_gpus, batch_size=det.batch_size, verbose=verbose, label=f"{stage} ({det.name})",
                    redo=lambda part: pc.fill_null(pc.not_equal(part.column("det_status"), "ok"), True))
    renames = {"toxic_score": f"{prefix}_score", "pred_toxic": f"{prefix}_toxic", "det_status": f"{prefix}_status",
               "det_reason": f"{prefix}_reason"}
    drop = {"detector", "probs", "seconds"}
    return pa.table({renames.get(n, n): out.column(n) for n in out.column_names if n not in drop})


def _with_verdict(table: pa.Table, reasons: list[str | None]) -> pa.Table:
    return table.append_column("kept", pa.array([r is None for r in reasons])).append_column(
        "reject_reason", pa.array(reasons, pa.string()))


def bench_split(seed_id: str, test_fraction: float, seed: int) -> str:
    """train/test by a hash of the seed id: every example of one seed lands in the same split."""
    h = int(hashlib.sha256(f"{seed}:{seed_id}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "test" if h < test_fraction else "train"


def counts_table(raw: pa.Table, after: dict[str, pa.Table | None]) -> list[dict[str, Any]]:
    """The paper's Table 2: rows remaining after each stage and % of raw, per goal and seed dataset."""
    rows = []
    groups = [("all", None)] + [(d, d) for d in sorted(set(raw.column("dataset").to_pylist()))]
    for goal in ("tae", "bae"):
        for name, dataset in groups:
            def count(t: pa.Table) -> int:
                m = pc.equal(t.column("goal"), goal)
                if dataset is not None:
                    m = pc.and_(m, pc.equal(t.column("dataset"), dataset))
                return int(pc.sum(m).as_py() or 0)

            n_raw = count(raw)
            if n_raw == 0:
                continue
            row: dict[str, Any] = {"goal": goal, "dataset": name, "raw": n_raw}
            for stage, table in after.items():
                if table is not None:
                    row[stage] = count(table)
                    row[f"{stage}_pct"] = round(100 * row[stage] / n_raw, 1)
            rows.append(row)
    return rows


def _top(reasons: list[str], n: int = 5) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for r in reasons:  # "3 more grammar errors than the seed (4 vs 1)" -> "more grammar errors than the seed"
        counts[re.sub(r"^\d+ ", "", r.split(" (")[0].split(":")[0])] += 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1])[:n])


def execute(config: TaebenchConfig, run: Run, watch: Stopwatch, verbose: bool) -> list[dict[str, Any]]:
    manifest = run.manifest
    steps: dict[str, Callable[[pa.Table], pa.Table | str] | None] = {
        "dedupe": lambda t: dedupe(t, config),
        "grammar": (lambda t: grammar(run, t, config, verbose)) if config.grammar else None,
        "naturalness": (lambda t: naturalness(run, t, config, verbose)) if config.naturalness else None,
        "label": lambda t: label_filter(run, t, config, verbose),
    }
    raw = load_raw(config)
    manifest.setdefault("stages", {})
    current, after = raw, {}
    for i, (name, step) in enumerate(steps.items(), start=1):
        path = run.dir.path("stages", f"{i}-{name}.parquet")
        if step is None:
            manifest["stages"][name] = "off (disabled in the config)"
            after[name] = None
            continue
        if storage.exists(path):
            table = storage.read_parquet(path)
        else:
            result = step(current)
            if isinstance(result, str):  # a stage that says why it did not run
                manifest["stages"][name] = result
                after[name] = None
                continue
            table = result
            storage.write_parquet(table, path)
            watch.lap(f"{name}_s")
        kept = table.filter(table.column("kept"))
        reasons = [r for r in table.column("reject_reason").to_pylist() if r]
        manifest["stages"][name] = {"in": table.num_rows, "kept": kept.num_rows, "rejected": len(reasons),
                                    "top_reasons": _top(reasons)}
        if name == "label" and config.judge is not None:
            manifest["judge_usage"] = usage_summary(table, config.judge)
        run.dir.write_manifest(manifest)
        current, after[name] = kept.drop_columns(["kept", "reject_reason"]), kept
    final = current.append_column("bench_split", pa.array(
        [bench_split(s, config.test_fraction, config.seed) for s in current.column("seed_id").to_pylist()]))
    tae = final.filter(pc.equal(final.column("goal"), "tae"))
    storage.write_parquet(tae, run.dir.path("taebench.parquet"))
    storage.write_parquet(final, run.dir.path("taebench_plus.parquet"))
    manifest["counts"] = {"raw": raw.num_rows, "taebench": tae.num_rows, "taebench_plus": final.num_rows}
    return counts_table(raw, after)


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
        stages = ["raw"] + [s for s in ("dedupe", "grammar", "naturalness", "label") if s in r]
        ax.plot(stages, [r[s] for s in stages], marker="o", label=r["goal"].upper())
    ax.set_ylabel("examples remaining")
    ax.set_title("quality filters: examples left after each stage")
    ax.legend()
    ax.grid(alpha=0.3)
    return png_bytes(fig)


def write_report(run: RunDir, manifest: dict[str, Any]) -> None:
    final = storage.read_parquet(run.path("taebench_plus.parquet"))
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
               for r in final.slice(0, 12).to_pylist()]
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
