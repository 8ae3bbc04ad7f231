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

import pyarrow as pa
import pyarrow.compute as pc

from redline.actors.detectors import DetectionWorker
from redline.actors.registry import detector_class
from redline.cluster import storage
from redline.cluster.config import ScoreConfig
from redline.errors import RedlineError
from redline.pipelines import sharded
from redline.pipelines.corpora import read_corpora
from redline.pipelines.schema import DETECTION_BATCH_SCHEMA, PREDICTION_SCHEMA, STATUS_ERROR, STATUS_OK, conform

log = logging.getLogger(__name__)

OUTPUT_DIR = "predictions"


def preflight(config: ScoreConfig) -> None:
    """Fail before any actor starts on what the driver can check (missing models, bad patterns)."""
    for det in config.detectors:
        detector_class(det.kind).preflight(det)


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


def _score_pending(config: ScoreConfig, run: sharded.Run, shards: list[pa.Table], pending: list[int],
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
                fn_constructor_kwargs={"config": det.model_dump(mode="json")},
                batch_size=det.batch_size,
                batch_format="numpy",
                compute=ray.data.ActorPoolStrategy(size=det.actors),
                num_cpus=det.num_cpus,
                num_gpus=det.num_gpus or None,
            )
            for det in config.detectors
        ]
        return branches[0].union(*branches[1:]) if len(branches) > 1 else branches[0]

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


def score_corpus(run: sharded.Run, config: Any, build: Callable[[], pa.Table], watch: storage.Stopwatch,
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
    predictions = sharded.read_outputs(run, OUTPUT_DIR)
    manifest["counts"].update(output_counts(predictions, [d.name for d in config.detectors]))
    manifest["busy_seconds"] = {**manifest.get("busy_seconds", {}), **{k: round(v, 3) for k, v in busy.items()}}
    return predictions


def run_score(config: ScoreConfig, *, force: bool = False, verbose: bool = False) -> sharded.RunResult:
    from redline.pipelines import report

    preflight(config)
    run = sharded.open_run("score", config, config.output, config.run_name, force)
    if run.reused:
        return sharded.RunResult(run.uri, run.manifest, run.manifest.get("metrics", []), reused=True)
    watch = storage.Stopwatch()
    manifest = run.manifest
    with sharded.lifecycle(run):
        predictions = score_corpus(run, config, lambda: read_corpora(config.corpora), watch, verbose)
        metrics = report.detector_metrics(predictions)
        manifest["metrics"] = metrics
        report.write_score_report(run.dir, predictions, metrics, manifest)
        watch.lap("report_s")
        manifest["timings"] = {**manifest.get("timings", {}), **watch.timings}
        sharded.complete(run)
    return sharded.RunResult(run.uri, manifest, metrics)


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
