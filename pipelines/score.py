"""`redline run score`: score labelled corpora with several detectors across Ray actor pools.

Flow: read and normalise the corpora once into input shards (written to the run directory), then
one actor pool per detector (`pipelines/plane/shard_host.py`): each actor reads a pending shard, scores its
rows in model batches, writes the shard's predictions atomically as its own part and returns the
part's partial sums; the driver only merges those. A restarted run skips parts already written.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, field_validator

from redline.actors.detectors import DetectorConfig, detector_class, preflight_detector
from redline.actors.detectors.worker import DetectionWorker
from redline.cluster import storage
from redline.cluster.config import Result, RunConfig, unique_names
from redline.cluster.runs import Run, RunDir, RunResult, Stopwatch
from redline.cluster.tables import STATUS_ERROR, STATUS_OK, conform
from redline.errors import RedlineError
from redline.pipelines.plane import runner, shard_host, sharded
from redline.pipelines.plane.corpora import CorpusConfig, corpus_rows, distinct, guess_rows, iter_corpora, iter_corpus
from redline.pipelines.plane.schema import PREDICTION_SCHEMA
from redline.pipelines.plane.steps import Step, run_beside
from redline.pipelines.reporting import aggregates as A
from redline.pipelines.reporting.figures import SCORE, Table, outcomes
from redline.pipelines.reporting.report import COUNT_COLUMNS, Report, grouped_bars, png_bytes
from redline.pipelines.run_skeleton import Pipeline

log = logging.getLogger(__name__)

OUTPUT_DIR = "predictions"


class ScoreConfig(RunConfig):
    """`redline run score`: score labelled corpora with several detectors and report how each does."""

    corpus: CorpusConfig | list[CorpusConfig]
    detectors: list[DetectorConfig] = Field(min_length=1)
    shard_size: int | None = Result(None, gt=0, description=(
        "Rows per output shard (the unit of resume and of work per actor call). Unset: 2,000, or for a large "
        "corpus whose detectors all run locally about a hundredth of its rows, up to 10,000 (fewer files and "
        "summaries: 1.2-1.3x at 1M rows on 2 CPUs). A remote (API, LLM) detector keeps 2,000, so work spreads "
        "across actors and a crash loses little."))

    @field_validator("detectors")
    @classmethod
    def _unique_names(cls, detectors: list[DetectorConfig]) -> list[DetectorConfig]:
        return unique_names(detectors, "detector")

    @property
    def corpora(self) -> list[CorpusConfig]:
        return self.corpus if isinstance(self.corpus, list) else [self.corpus]


def preflight(config: ScoreConfig) -> None:
    """Fail before any actor starts on what the driver can check (missing models, bad patterns)."""
    for det in config.detectors:
        preflight_detector(det)


def corpus_counts(corpus: pa.Table) -> dict[str, Any]:
    def count(mask: Any) -> int:
        return int(pc.sum(pc.fill_null(mask, False).cast(pa.int64())).as_py() or 0)

    ok = pc.equal(corpus.column("status"), STATUS_OK)
    rejected = corpus.filter(pc.invert(ok)).column("reason").fill_null("unknown").value_counts()
    label = corpus.column("label")
    return {
        "rows_in": corpus.num_rows,
        "scorable": count(ok),
        "rejected": {r["values"]: r["counts"] for r in rejected.to_pylist()},
        "toxic": count(pc.equal(label, 1)),
        "benign": count(pc.equal(label, 0)),
        "unlabelled": count(pc.is_null(label)),
    }


def assemble_shard(shard: pa.Table, detections: pa.Table, detector_names: list[str]) -> pa.Table:
    """Join a shard's rows with each detector's outputs: one row per (corpus row, detector).

    Rejected rows stay, with null scores; rows a detector failed on get status `error`.
    """
    ids = shard.column("id")
    tables = []
    for name in detector_names:
        det = detections.filter(pc.equal(detections.column("detector"), name))
        idx = pc.index_in(ids, value_set=det.column("id"))
        taken = det.take(idx)
        det_status = taken.column("det_status")
        failed = pc.fill_null(pc.equal(det_status, STATUS_ERROR), False)
        status = pc.if_else(failed, STATUS_ERROR, shard.column("status"))
        reason = pc.if_else(failed, taken.column("det_reason"), shard.column("reason"))
        scored = pc.and_(pc.is_valid(idx), pc.invert(failed))
        table = shard.set_column(shard.schema.get_field_index("status"), "status", status)
        table = table.set_column(table.schema.get_field_index("reason"), "reason", reason)
        table = table.append_column("detector", pa.array([name] * shard.num_rows, pa.string()))
        table = table.append_column(
            "toxic_score", pc.if_else(scored, taken.column("toxic_score"), pa.scalar(None, pa.float64())))
        table = table.append_column(
            "pred_toxic", pc.if_else(scored, taken.column("pred_toxic"), pa.scalar(None, pa.bool_())))
        table = table.append_column("probs", taken.column("probs"))
        table = table.append_column("seconds", taken.column("seconds"))
        tables.append(conform(table, PREDICTION_SCHEMA))
    return pa.concat_tables(tables)


OUTCOMES = outcomes("detector")


def scorable(shard: pa.Table) -> pa.Table:
    """The rows of an input shard a detector scores."""
    return shard.filter(pc.equal(shard.column("status"), STATUS_OK)).select(["id", "text"])


def scorable_rows(shard: pa.Table) -> int:
    return scorable(shard).num_rows


SHARD_ROWS, LARGEST_SHARD = 2_000, 10_000
SHARDS_OF_A_LARGE_CORPUS = 100  # each at least SHARD_ROWS, at most LARGEST_SHARD, rounded up to thousands


def chosen_shard_size(config: Any, sources: tuple[sharded.Source, ...]) -> int:
    """`config.shard_size`, or when unset one chosen from the corpus's guessed size: a large corpus
    scored by local detectors only is cut into about a hundred shards of up to `LARGEST_SHARD` rows
    (each shard costs a read, a write, partial sums and a summary: 500 shards of 2,000 rows made a
    1M-row run 1.2-1.3x slower than 100 of 10,000); otherwise `SHARD_ROWS`. The guess comes from the
    inputs' files, so a rerun of the same run (its inputs unchanged, or it is refused) cuts the same way."""
    if config.shard_size is not None:
        return int(config.shard_size)
    guesses = [s.about for s in sources]
    if any(g is None for g in guesses) or any(detector_class(d.kind).remote for d in config.detectors):
        return SHARD_ROWS
    per_shard = -(-sum(guesses) // (SHARDS_OF_A_LARGE_CORPUS * 1_000)) * 1_000
    return min(LARGEST_SHARD, max(SHARD_ROWS, per_shard))


def score_corpus(run: Run, config: Any, sources: tuple[sharded.Source, ...], watch: Stopwatch, verbose: bool,
                 summary: Table = SCORE, examples: bool = False) -> list[dict[str, Any]]:
    """Score the corpus the `sources` yield with `config.detectors` into `run`'s prediction parts (one
    per shard and detector, written by the detector's actors; resuming any already written);
    returns `summary`'s rows, summed part by part. With `examples`, the manifest's `example_errors`
    are found in the same pass as the parts' index."""
    manifest = run.manifest
    figures = {"summary": summary, "outcomes": OUTCOMES}
    steps = [Step(det.name, DetectionWorker, {"config": det}, det, f"scoring with {det.name}", det.num_cpus,
                  det.num_gpus, det.batch_size, figures=figures, select=scorable,
                  assemble=partial(assemble_shard, detector_names=[det.name]), what=f"detector '{det.name}' (each actor)")
             for det in config.detectors]
    shard_rows = sharded.inputs_written(run)  # a resume: every input shard is written already
    before = [runner.done_parts(run, OUTPUT_DIR, k) for k in range(len(steps))]
    if shard_rows is None:
        manifest["shard_size"] = manifest.get("shard_size") or chosen_shard_size(config, sources)
    # the corpus is read by the same plan (its shards taken as they are written), unless written before
    busy = run_beside(run, steps, OUTPUT_DIR, shard_rows=shard_rows, label=f"scoring with {len(steps)} detector(s)",
                      verbose=verbose, inputs=None if shard_rows is not None else sharded.Inputs(
                          sources, manifest["shard_size"], corpus_counts, rows=scorable_rows))
    shard_rows = manifest["input_rows"]
    if manifest["counts"]["rows_in"] == 0:
        raise RedlineError("the corpus has no rows")
    manifest["resumed_shards"] = len(set(range(len(shard_rows))).intersection(*before))
    watch.lap("score_s")
    parts = {(i, k): shard_host.output_part(i, k) for i in range(len(shard_rows)) for k in range(len(steps))}
    rows = sharded.shard_summary(run, figures, OUTPUT_DIR, parts)
    found = sharded.index_output(run, OUTPUT_DIR, then=example_errors_at if examples else None, per_text=True)
    if examples:
        manifest["example_errors"] = found
    manifest["counts"].update(output_counts(rows["outcomes"], [d.name for d in config.detectors]))
    _check_answered(run, manifest["counts"]["per_detector"], config.detectors, parts)
    spent, used = manifest.get("busy_seconds", {}), manifest.get("actors_used", {})
    for k, det in enumerate(config.detectors):
        spent[det.name] = round(spent.get(det.name, 0.0) + busy[k].seconds, 3)
        used[det.name] = max(used.get(det.name, 0), busy[k].actors)
    manifest["busy_seconds"], manifest["actors_used"] = spent, used
    return rows["summary"]


def _check_answered(run: Run, per_detector: dict[str, Any], detectors: list[Any],
                    parts: dict[tuple[int, int], str]) -> None:
    """A detector that failed on every row it was given answered nothing: its stage failed (one line,
    the first cause), and its parts are removed so that a rerun asks it again."""
    for k, det in enumerate(detectors):
        counts = per_detector[det.name]
        errors = sum(n for why, n in counts["not_scored"].items() if why.startswith(f"{STATUS_ERROR}:"))
        if counts["scored"] or not errors:
            continue
        mine = [run.dir.path(OUTPUT_DIR, part) for (_, pool), part in sorted(parts.items()) if pool == k]
        first = storage.read_parquet(mine[0], ["reason"], filters=[("status", "=", STATUS_ERROR)]) if mine else None
        cause = first.column("reason")[0].as_py() if first is not None and first.num_rows else "no cause recorded"
        for uri in mine:
            storage.remove(uri)
        raise RedlineError(f"detector '{det.name}' failed on every one of its {errors:,} rows (first: "
                           f"{' '.join(str(cause).split())[:200]}); nothing was scored, and a rerun asks it again")


def output_counts(outcomes: list[dict[str, Any]], detector_names: list[str]) -> dict[str, Any]:
    """Rows out per detector: scored, and the others by status and kind of reason."""
    out: dict[str, Any] = {"rows_out": sum(r["rows"] for r in outcomes), "per_detector": {}}
    for name in detector_names:
        mine = [r for r in outcomes if r["detector"] == name]
        out["per_detector"][name] = {
            "rows": sum(r["rows"] for r in mine), "scored": sum(r["rows"] for r in mine if r["status"] == STATUS_OK),
            "not_scored": {f"{r['status']}: {why}": n for r in mine if r["status"] != STATUS_OK
                           for why, n in r["reasons"].items()}}
    return out


def corpus_sources(configs: list[CorpusConfig]) -> tuple[sharded.Source, ...]:
    """The corpora as a run's input sources: one corpus is read by one task; several are read side by
    side, one task each (their rows counted first, `corpus_rows`); ids stay distinct across them."""
    if len(configs) == 1:
        return (sharded.Source(partial(iter_corpora, configs), about=guess_rows(configs)),)
    distinct(configs)
    return tuple(sharded.Source(partial(iter_corpus, c), partial(corpus_rows, c), about=guess_rows([c]))
                 for c in configs)


def execute(config: ScoreConfig, run: Run, watch: Stopwatch, verbose: bool) -> list[dict[str, Any]]:
    metrics = score_corpus(run, config, corpus_sources(config.corpora), watch, verbose, examples=True)
    storage.write_json(run.dir.path("metrics.json"), metrics)
    return metrics


# --------------------------------------------------------------------------------------------
# Report


def plot_roc(manifest: dict[str, Any]) -> bytes | None:
    """Each detector's ROC curve over all its rows, from the run's score sketches (no output read)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    roc = SCORE.figure("roc_auc").compute
    assert isinstance(roc, A.RocAuc)
    groups = manifest.get("partials", {}).get("summary", {}).get("groups", [])
    per_detector = A.merge(*({(group[0],): sums} for group, _, sums in groups))
    curves = {name: roc.curve(sums) for (name,), sums in per_detector.items()}
    curves = {name: curve for name, curve in curves.items() if curve is not None}
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(5.2, 4.4))
    for name, (fpr, tpr) in curves.items():
        ax.plot(fpr, tpr, label=name)
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
    ax.set(xlabel="false positive rate", ylabel="true positive rate", title="ROC per detector")
    ax.legend(loc="lower right", fontsize=8)
    data = png_bytes(fig)
    plt.close(fig)
    return data


def plot_rates(metrics: list[dict[str, Any]]) -> bytes | None:
    return grouped_bars([m for m in metrics if m["dataset"] == "all"], "detector",
                        [("f1_macro", "F1 macro"), ("fnr", "FNR (toxic missed)"), ("fpr", "FPR (benign flagged)")],
                        "Detector quality")


def example_errors_at(run_uri: str) -> list[dict[str, Any]]:
    return example_errors(RunDir(run_uri))


def example_errors(run: RunDir, per_detector: int = 5) -> list[dict[str, Any]]:
    """A few missed toxic rows (false negatives) per detector, the lowest scores first: read shard by
    shard (only those rows and columns), keeping each detector's lowest so far."""
    kept: pa.Table | None = None
    for part in storage.list_files(run.path(OUTPUT_DIR), ".parquet"):
        miss = storage.read_parquet(part, ["detector", "id", "text", "toxic_score"],
                                    [("label", "=", 1), ("pred_toxic", "=", False)])
        kept = miss if kept is None else pa.concat_tables([kept, miss])
        kept = pa.concat_tables([
            kept.filter(pc.equal(kept.column("detector"), name)).sort_by("toxic_score").slice(0, per_detector)
            for name in dict.fromkeys(kept.column("detector").to_pylist())] or [kept])
    out = []
    for r in (kept.to_pylist() if kept is not None else []):
        text = r["text"] if len(r["text"]) <= 160 else r["text"][:157] + "..."
        out.append({"detector": r["detector"], "id": r["id"], "toxic_score": r["toxic_score"], "text": text})
    return out


def counts_rows(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    counts = manifest.get("counts", {})
    rows = [{"what": "rows in", "n": counts.get("rows_in")},
            {"what": "  toxic / benign / unlabelled",
             "n": f"{counts.get('toxic')} / {counts.get('benign')} / {counts.get('unlabelled')}"}]
    rows += [{"what": f"  rejected: {reason}", "n": n} for reason, n in counts.get("rejected", {}).items()]
    rows.append({"what": "rows out (one per row and detector)", "n": counts.get("rows_out")})
    for name, det in counts.get("per_detector", {}).items():
        rows.append({"what": f"  {name}: scored", "n": det["scored"]})
        rows += [{"what": f"  {name}: {why}", "n": n} for why, n in det["not_scored"].items()]
    return rows


def write_report(run: RunDir, manifest: dict[str, Any]) -> None:
    metrics = manifest.get("summary", [])
    columns = [c for c in SCORE.columns() if c[0] != "dataset" or several_datasets(metrics)]
    counts = [{"what": r["what"], "n": str(r["n"])} for r in counts_rows(manifest)]
    error_cols = [("detector", "detector", "s"), ("id", "id", "s"), ("toxic_score", "score", ".3f"), ("text", "text", "s")]
    note = ("Toxic is the positive class. FNR = toxic rows predicted benign (the attack success rate on "
            "adversarial toxic rows); FPR = benign rows predicted toxic.")
    report = Report(run, "redline score report", manifest, note)
    report.table("Detectors", metrics, columns).plot("roc", plot_roc(manifest)).plot("rates", plot_rates(metrics))
    report.table("Row counts", counts, COUNT_COLUMNS)  # "Rows" is the viewer's own section on the same page
    errors = manifest.get("example_errors")  # found by the run's worker; a run from before: read here
    report.table("Missed toxic rows (lowest scores first)", example_errors(run) if errors is None else errors,
                 error_cols)
    report.write("metrics.csv", metrics)


def several_datasets(metrics: list[dict[str, Any]]) -> bool:
    """Whether the dataset column says anything (a corpus of one dataset is `all` on every row)."""
    return any(m.get("dataset") != "all" for m in metrics)


def metric_columns(manifest: dict[str, Any]) -> list[tuple[str, str, str]]:
    several = several_datasets(manifest.get("summary", []))
    return [c for c in SCORE.columns(brief=True) if several or c[0] != "dataset"]


PIPELINE = Pipeline("score", ScoreConfig, execute, write_report, "detectors (toxic = positive class)", metric_columns,
                    preflight=preflight)


def run_score(config: ScoreConfig, *, force: bool = False, verbose: bool = False) -> RunResult:
    return PIPELINE.run(config, force=force, verbose=verbose)
