"""`redline run score`: score labelled corpora with several detectors across Ray actor pools.

Flow: read and normalise the corpora once into input shards (written to the run directory), then
one Ray Data graph per run: the pending shards' scorable rows feed one `map_batches` actor pool per
detector; the branches are unioned and streamed back, and each shard's predictions are written
atomically as soon as all its rows have arrived. A restarted run skips shards already written.
"""

from __future__ import annotations

import logging
import shutil
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from redline.actors.detectors import DetectionWorker
from redline.actors.registry import detector_class
from redline.cluster import storage
from redline.cluster.config import ScoreConfig, config_hash
from redline.cluster.progress import progress_bar
from redline.cluster.runtime import ensure_ray
from redline.errors import RedlineError, unwrap_user_error
from redline.pipelines.corpora import read_corpora
from redline.pipelines.schema import DETECTION_BATCH_SCHEMA, PREDICTION_SCHEMA, STATUS_ERROR, STATUS_OK, conform

log = logging.getLogger(__name__)

INPUT_DIR, OUTPUT_DIR = "input", "predictions"


@dataclass
class ScoreResult:
    run_uri: str
    manifest: dict[str, Any]
    metrics: list[dict[str, Any]] = field(default_factory=list)
    reused: bool = False

    @property
    def report_html(self) -> str:
        return storage.join(self.run_uri, "report.html")


def part_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def run_uri_for(config: ScoreConfig) -> str:
    return storage.join(config.output, config.run_name or f"score-{config_hash(config)}")


def preflight(config: ScoreConfig) -> None:
    """Fail before any actor starts on what the driver can check (missing models, bad patterns)."""
    for det in config.detectors:
        detector_class(det.kind).preflight(det)


def _clear(uri: str) -> None:
    if storage.is_s3(uri):
        fs, path = storage.resolve(uri)
        fs.delete_dir_contents(path, missing_dir_ok=True)
    else:
        shutil.rmtree(uri, ignore_errors=True)


def _prepare_inputs(run: storage.RunDir, config: ScoreConfig, manifest: dict[str, Any]) -> list[pa.Table]:
    """Input shards of the run: read back when a previous attempt wrote them, else built now."""
    n_shards = manifest.get("input_shards")
    if n_shards is not None:
        parts = storage.list_files(run.path(INPUT_DIR), ".parquet")
        if len(parts) == n_shards:
            return [storage.read_parquet(p) for p in parts]
    corpus = read_corpora(config.corpora)
    shards = [corpus.slice(i, config.shard_size) for i in range(0, corpus.num_rows, config.shard_size)]
    for i, shard in enumerate(shards):
        storage.write_parquet(shard, run.path(INPUT_DIR, part_name(i)))
    manifest["input_shards"] = len(shards)
    manifest["counts"] = corpus_counts(corpus)
    run.write_manifest(manifest)
    return shards


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


def _dedupe(detections: pa.Table) -> pa.Table:
    """Drop repeated (id, detector) rows, e.g. from a batch Ray re-ran after losing an actor."""
    keys = [f"{i}\x00{d}" for i, d in zip(detections.column("id").to_pylist(), detections.column("detector").to_pylist())]
    _, first = np.unique(np.array(keys, dtype=object), return_index=True)
    if len(first) == detections.num_rows:
        return detections
    return detections.take(pa.array(np.sort(first)))


def _score_pending(config: ScoreConfig, run: storage.RunDir, shards: list[pa.Table], pending: list[int],
                   verbose: bool) -> dict[str, float]:
    import ray.data

    names = [d.name for d in config.detectors]
    scorable: dict[int, pa.Table] = {}
    for i in pending:
        ok = shards[i].filter(pc.equal(shards[i].column("status"), STATUS_OK)).select(["id", "text"])
        scorable[i] = ok.append_column("shard", pa.array([i] * ok.num_rows, pa.int32()))
    expected = {i: t.num_rows * len(names) for i, t in scorable.items()}
    received: dict[int, list[pa.Table]] = defaultdict(list)
    counts: dict[int, int] = defaultdict(int)
    busy: dict[str, float] = defaultdict(float)
    flushed: set[int] = set()

    def flush(i: int) -> None:
        flushed.add(i)
        parts = received.pop(i, [])
        detections = pa.concat_tables(parts) if parts else DETECTION_BATCH_SCHEMA.empty_table()
        storage.write_parquet(assemble_shard(shards[i], _dedupe(detections), names), run.path(OUTPUT_DIR, part_name(i)))

    for i in [i for i in pending if expected[i] == 0]:
        flush(i)
    work = [scorable[i] for i in pending if expected[i] > 0]
    if not work:
        return {}

    ensure_ray(verbose=verbose)
    block_rows = block_size(sum(t.num_rows for t in work), config)
    blocks = [t.slice(j, block_rows) for t in work for j in range(0, t.num_rows, block_rows)]
    source = ray.data.from_arrow(blocks)
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
    stream = branches[0].union(*branches[1:]) if len(branches) > 1 else branches[0]
    total = sum(expected.values())
    with progress_bar(f"scoring with {len(names)} detector(s)", total=total) as advance:
        for batch in stream.iter_batches(batch_format="pyarrow", batch_size=None):
            if batch.num_rows == 0:
                continue
            for det_name, secs in zip(*_busy_by_detector(batch)):
                busy[det_name] += secs
            shard_ids = batch.column("shard").to_numpy()
            for i in map(int, np.unique(shard_ids)):
                if i in flushed:  # rows Ray re-sent after a retry; the shard is already written
                    continue
                part = batch.filter(pa.array(shard_ids == i))
                received[i].append(part)
                counts[i] += part.num_rows
                if counts[i] >= expected[i]:
                    flush(i)
            advance(batch.num_rows)
    unfinished = [i for i in pending if i not in flushed]
    if unfinished:
        raise RuntimeError(f"shards {unfinished} received fewer rows than sent; rerun to resume")
    return dict(busy)


def block_size(rows: int, config: ScoreConfig) -> int:
    """Rows per Ray Data block: several blocks per actor so every actor of a pool gets work, but
    each many model batches long so per-task overhead stays small."""
    batch = max(d.batch_size for d in config.detectors)
    actors = max(d.actors for d in config.detectors)
    return int(min(max(rows // (4 * actors), batch, 64), batch * 16))


def _busy_by_detector(batch: pa.Table) -> tuple[list[str], list[float]]:
    grouped = batch.group_by("detector").aggregate([("seconds", "sum")])
    return grouped.column("detector").to_pylist(), grouped.column("seconds_sum").to_pylist()


def run_score(config: ScoreConfig, *, force: bool = False, verbose: bool = False) -> ScoreResult:
    from redline.pipelines import report

    preflight(config)
    run = storage.RunDir(run_uri_for(config))
    previous = run.manifest()
    if previous and previous.get("state") == "complete" and not force:
        return ScoreResult(run.uri, previous, previous.get("metrics", []), reused=True)
    if force and previous:
        _clear(run.uri)
        previous = None
    if previous and previous.get("config_hash") not in (None, config_hash(config)):
        raise RedlineError(f"{run.uri} holds a run of a different config; choose another run_name or pass --force")

    watch = storage.Stopwatch()
    manifest: dict[str, Any] = previous or {}
    manifest.update(
        pipeline="score",
        state="running",
        run_uri=run.uri,
        config=config.model_dump(mode="json"),
        config_hash=config_hash(config),
        versions=storage.package_versions(),
        started_at=manifest.get("started_at") or storage.now_iso(),
        attempts=int(manifest.get("attempts", 0)) + 1,
    )
    manifest.pop("error", None)
    run.write_manifest(manifest)
    try:
        shards = _prepare_inputs(run, config, manifest)
        if manifest["counts"]["rows_in"] == 0:
            raise RedlineError("the corpus has no rows")
        watch.lap("read_corpus_s")
        done = {name for name in (storage.list_files(run.path(OUTPUT_DIR), ".parquet"))}
        pending = [i for i in range(len(shards)) if run.path(OUTPUT_DIR, part_name(i)) not in done]
        manifest["resumed_shards"] = len(shards) - len(pending)
        busy = _score_pending(config, run, shards, pending, verbose)
        watch.lap("score_s")
        predictions = pa.concat_tables(
            [storage.read_parquet(p) for p in storage.list_files(run.path(OUTPUT_DIR), ".parquet")]
        )
        manifest["counts"].update(output_counts(predictions, [d.name for d in config.detectors]))
        manifest["busy_seconds"] = {**manifest.get("busy_seconds", {}), **{k: round(v, 3) for k, v in busy.items()}}
        metrics = report.detector_metrics(predictions)
        manifest["metrics"] = metrics
        report.write_score_report(run, predictions, metrics, manifest)
        watch.lap("report_s")
        manifest["timings"] = {**manifest.get("timings", {}), **watch.timings}
        manifest["state"] = "complete"
        manifest["finished_at"] = storage.now_iso()
        run.write_manifest(manifest)
        return ScoreResult(run.uri, manifest, metrics)
    except BaseException as err:
        user = unwrap_user_error(err)
        manifest["state"] = "failed"
        manifest["error"] = str(user or err).splitlines()[0] if str(user or err) else type(err).__name__
        try:
            run.write_manifest(manifest)
        except RedlineError:
            pass
        if user is not None and user is not err:
            raise user from None
        raise


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
