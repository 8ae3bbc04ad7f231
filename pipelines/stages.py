"""Run one worker class over a table and join its output back by `id`, hosted like every pipeline's
workers (`pipelines/shard_host.py`): the table's `worker.input_columns` are written once as input
shards under `work/<stage>/` of the run, each shard's output part is written by the actor that
made it, and a rerun after a crash redoes only the shards that have no part yet (answers a judge
was paid for are not asked again).

The quality and dialogue-safety pipelines are chains of such steps over tables they hold whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from redline.cluster import storage
from redline.cluster.config import ActorPoolSize
from redline.cluster.runs import Run
from redline.cluster.runtime import check_placeable, ensure_ray
from redline.pipelines import shard_host, sharded

WORK_DIR = "work"


def map_table(run: Run, stage: str, table: pa.Table, worker: type, kwargs: dict[str, Any], *,
              size: ActorPoolSize | None = None, num_cpus: float = 1.0, num_gpus: float = 0.0, batch_size: int = 64,
              verbose: bool = False, label: str | None = None,
              redo: Callable[[pa.Table], pa.ChunkedArray] | None = None) -> pa.Table:
    """`worker(**kwargs)` on every row's `worker.input_columns` (which include `id`), on a pool of
    `size` actors; returns `table` with the worker's output columns, aligned with its rows (rows the
    worker did not answer get nulls). `stage` names the step's room in the run directory. `redo(part)`:
    the rows whose answer is a failure, not a result; a part holding one is deleted after it is read,
    so the caller can stop with the failure and a rerun asks that part again."""
    size = size or ActorPoolSize()
    if table.num_rows == 0:
        return table
    columns: list[str] = worker.input_columns  # type: ignore[attr-defined]
    room = f"{WORK_DIR}/{stage}"
    inputs, outputs = f"{room}/{sharded.INPUT_DIR}", f"{room}/output"
    shard_rows = _write_inputs(run, stage, table.select(columns), inputs,
                               sharded.block_rows(table.num_rows, batch_size, size.actors))
    work = shard_host.ShardWork(run.dir.uri, outputs, 0, _every_row, _aligned, {}, batch_size, input_dir=inputs)
    pool = shard_host.Pool(work, worker, kwargs, size.actors, num_cpus, num_gpus,
                           shard_host.pending(run, outputs, len(shard_rows), 0), max_actors=size.max_actors)
    if pool.pending:
        ensure_ray(verbose=verbose)
        check_placeable(f"each {worker.__name__} actor", num_cpus, num_gpus)
    shard_host.run_pools(run, [pool], shard_rows, label=label or worker.__name__, verbose=verbose)
    parts = [run.dir.path(outputs, shard_host.output_part(i, 0)) for i in range(len(shard_rows))]
    results = [storage.read_parquet(p) for p in parts]
    for uri, part in zip(parts, results):
        if redo is not None and pc.any(pc.fill_null(redo(part), False)).as_py():
            storage.remove(uri)
    results = pa.concat_tables(results)
    taken = results.take(pc.index_in(table.column("id"), value_set=results.column("id")))
    for name in results.column_names:
        if name != "id":
            table = table.append_column(name, taken.column(name)) if name not in table.column_names else \
                table.set_column(table.schema.get_field_index(name), name, taken.column(name))
    return table


def _write_inputs(run: Run, stage: str, source: pa.Table, inputs: str, shard_size: int) -> list[int]:
    """The stage's input shards, written once (a resumed stage keeps the shards its parts came from)."""
    written = run.manifest.setdefault("work", {}).get(stage)
    if written is not None and len(storage.list_files(run.dir.path(inputs), ".parquet")) == len(written):
        return list(written)
    shards = [source.slice(i, shard_size) for i in range(0, source.num_rows, shard_size)]
    for i, shard in enumerate(shards):
        storage.write_parquet(shard, run.dir.path(inputs, sharded.part_name(i)))
    run.manifest["work"][stage] = [s.num_rows for s in shards]
    run.dir.write_manifest(run.manifest)
    return run.manifest["work"][stage]


def _every_row(shard: pa.Table) -> pa.Table:
    return shard


def _aligned(shard: pa.Table, results: pa.Table) -> pa.Table:
    """The worker's output columns for each row of the shard, in its order (a row without an answer: nulls)."""
    return results.drop_columns([c for c in ("shard",) if c in results.column_names]).take(
        pc.index_in(shard.column("id"), value_set=results.column("id")))
