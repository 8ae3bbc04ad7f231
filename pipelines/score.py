"""`redline run score`: score labelled corpora with several detectors across Ray actor pools.

Flow: read and normalise the corpora once into input shards (written to the run directory), then
one Ray Data graph per run: the pending shards' scorable rows feed one `map_batches` actor pool per
detector; the branches are unioned and streamed back, and each shard's predictions are written
atomically as soon as all its rows have arrived. A restarted run skips shards already written.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, field_validator

from redline.actors.detectors import DetectorConfig, preflight_detector
from redline.actors.detectors.worker import DETECTION_BATCH_SCHEMA, DetectionWorker
from redline.cluster import storage
from redline.cluster.config import Result, RunConfig, unique_names
from redline.cluster.runs import Run, RunDir, RunResult, Stopwatch
from redline.cluster.tables import STATUS_ERROR, STATUS_OK, conform
from redline.errors import RedlineError
from redline.pipelines import sharded
from redline.pipelines.corpora import CorpusConfig, read_corpora
from redline.pipelines.figures import SCORE
from redline.pipelines.metrics import detector_metrics
from redline.pipelines.report import COUNT_COLUMNS, Report, grouped_bars, png_bytes
from redline.pipelines.schema import PREDICTION_SCHEMA
from redline.pipelines.template import Pipeline

log = logging.getLogger(__name__)

OUTPUT_DIR = "predictions"


class ScoreConfig(RunConfig):
    """`redline run score`: score labelled corpora with several detectors and report how each does."""

    corpus: CorpusConfig | list[CorpusConfig]
    detectors: list[DetectorConfig] = Field(min_length=1)
    shard_size: int = Result(2_000, gt=0, description="Rows per output shard (the unit of resume).")

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
    status = corpus.column("status").to_numpy(zero_copy_only=False)
    reasons = corpus.column("reason").to_pylist()
    rejected: dict[str, int] = defaultdict(int)
    for s, r in zip(status, reasons):
        if s != STATUS_OK:
            rejected[r or "unknown"] += 1
    labels = corpus.column("label").to_pylist()
    return {
        "rows_in": corpus.num_rows,
        "scorable": int((status == STATUS_OK).sum()),
        "rejected": dict(rejected),
        "toxic": sum(1 for v in labels if v == 1),
        "benign": sum(1 for v in labels if v == 0),
        "unlabelled": sum(1 for v in labels if v is None),
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


def _score_pending(config: ScoreConfig, run: Run, shards: list[pa.Table], pending: list[int],
                   verbose: bool) -> dict[str, float]:
    import ray.data

    names = [d.name for d in config.detectors]
    busy: dict[str, float] = defaultdict(float)

    def count_busy(batch: pa.Table) -> None:
        grouped = batch.group_by("detector").aggregate([("seconds", "sum")])
        for name, secs in zip(grouped.column("detector").to_pylist(), grouped.column("seconds_sum").to_pylist()):
            busy[name] += secs

    def build_stream(source: Any) -> Any:
        branches = [
            source.map_batches(
                DetectionWorker,
                fn_constructor_kwargs={"config": det},
                batch_size=det.batch_size,
                batch_format="numpy",
                compute=ray.data.ActorPoolStrategy(size=det.actors),
                num_cpus=det.num_cpus,
                num_gpus=det.num_gpus or None,
            )
            for det in config.detectors
        ]
        return branches[0].union(*branches[1:]) if len(branches) > 1 else branches[0]

    if pending:
        from redline.cluster.runtime import check_placeable

        for det in config.detectors:
            check_placeable(f"detector '{det.name}' (each actor)", det.num_cpus, det.num_gpus)
    sharded.stream_shards(
        run, shards, pending, output_dir=OUTPUT_DIR,
        select=lambda shard: shard.filter(pc.equal(shard.column("status"), STATUS_OK)).select(["id", "text"]),
        results_per_row=len(names), process=sharded.through_ray_data(build_stream),
        assemble=lambda shard, results: assemble_shard(shard, results, names),
        empty_results=DETECTION_BATCH_SCHEMA, key=["id", "detector"],
        batch_size=max(d.batch_size for d in config.detectors), actors=max(d.actors for d in config.detectors),
        label=f"scoring with {len(names)} detector(s)", verbose=verbose, on_batch=count_busy,
    )
    return dict(busy)


def score_corpus(run: Run, config: Any, build: Callable[[], pa.Table], watch: Stopwatch,
                 verbose: bool) -> pa.Table:
    """Score the corpus `build` returns with `config.detectors` into `run`'s prediction shards
    (resuming any already written); returns every prediction."""
    manifest = run.manifest
    shards = sharded.prepare_inputs(run, build, config.shard_size, corpus_counts)
    if manifest["counts"]["rows_in"] == 0:
        raise RedlineError("the corpus has no rows")
    watch.lap("read_corpus_s")
    pending = sharded.pending_shards(run, OUTPUT_DIR, len(shards))
    busy = _score_pending(config, run, shards, pending, verbose)
    watch.lap("score_s")
    predictions = sharded.read_outputs(run.dir, OUTPUT_DIR)
    manifest["counts"].update(output_counts(predictions, [d.name for d in config.detectors]))
    manifest["busy_seconds"] = {**manifest.get("busy_seconds", {}), **{k: round(v, 3) for k, v in busy.items()}}
    return predictions


def output_counts(predictions: pa.Table, detector_names: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"rows_out": predictions.num_rows, "per_detector": {}}
    for name in detector_names:
        det = predictions.filter(pc.equal(predictions.column("detector"), name))
        status = det.column("status").to_pylist()
        reasons = det.column("reason").to_pylist()
        by_reason: dict[str, int] = defaultdict(int)
        for s, r in zip(status, reasons):
            if s != STATUS_OK:
                by_reason[f"{s}: {r}"] += 1
        out["per_detector"][name] = {"rows": det.num_rows, "scored": status.count(STATUS_OK),
                                     "not_scored": dict(by_reason)}
    return out


def execute(config: ScoreConfig, run: Run, watch: Stopwatch, verbose: bool) -> list[dict[str, Any]]:
    predictions = score_corpus(run, config, lambda: read_corpora(config.corpora), watch, verbose)
    metrics = detector_metrics(predictions)
    storage.write_json(run.dir.path("metrics.json"), metrics)
    return metrics


# --------------------------------------------------------------------------------------------
# Report


def plot_roc(predictions: pa.Table) -> bytes | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import roc_curve

    fig, ax = plt.subplots(figsize=(5.2, 4.4))
    drawn = False
    for name in dict.fromkeys(predictions.column("detector").to_pylist()):
        det = predictions.filter(pc.and_(pc.equal(predictions.column("detector"), name),
                                         pc.equal(predictions.column("status"), STATUS_OK)))
        det = det.filter(pc.is_valid(det.column("label")))
        y = det.column("label").to_numpy(zero_copy_only=False)
        s = det.column("toxic_score").to_numpy(zero_copy_only=False).astype(float)
        if len(np.unique(y)) < 2:
            continue
        fpr, tpr, _ = roc_curve(y, s)
        ax.plot(fpr, tpr, label=name)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
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


def example_errors(predictions: pa.Table, per_detector: int = 5) -> list[dict[str, Any]]:
    """A few missed toxic rows (false negatives) per detector, highest-confidence misses first."""
    out = []
    for name in dict.fromkeys(predictions.column("detector").to_pylist()):
        det = predictions.filter(pc.equal(predictions.column("detector"), name))
        miss = det.filter(pc.and_(pc.equal(det.column("label"), 1), pc.equal(det.column("pred_toxic"), False)))
        miss = miss.sort_by([("toxic_score", "ascending")]).slice(0, per_detector)
        for r in miss.select(["id", "text", "toxic_score"]).to_pylist():
            text = r["text"] if len(r["text"]) <= 160 else r["text"][:157] + "..."
            out.append({"detector": name, "id": r["id"], "toxic_score": r["toxic_score"], "text": text})
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
    predictions = sharded.read_outputs(run, OUTPUT_DIR)
    metrics = manifest.get("summary", [])
    columns = [c for c in SCORE.columns() if c[0] != "dataset" or several_datasets(metrics)]
    counts = [{"what": r["what"], "n": str(r["n"])} for r in counts_rows(manifest)]
    error_cols = [("detector", "detector", "s"), ("id", "id", "s"), ("toxic_score", "score", ".3f"), ("text", "text", "s")]
    note = ("Toxic is the positive class. FNR = toxic rows predicted benign (the attack success rate on "
            "adversarial toxic rows); FPR = benign rows predicted toxic.")
    report = Report(run, "redline score report", manifest, note)
    report.table("Detectors", metrics, columns).plot("roc", plot_roc(predictions)).plot("rates", plot_rates(metrics))
    report.table("Rows", counts, COUNT_COLUMNS)
    report.table("Missed toxic rows (lowest scores first)", example_errors(predictions), error_cols)
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
