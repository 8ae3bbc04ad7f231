"""Worker classes over a run's sharded rows, hosted like every pipeline's workers
(`pipelines/plane/runner.py`, `pipelines/plane/shard_host.py`): each shard's output part is written by the actor that made it, and a
rerun after a crash redoes only the shards that have no part yet (answers a judge was paid for are
not asked again).

Every pipeline declares its row work as `Step`s and runs them here, the one way in to the runner:
`run_steps`, a chain of steps over the run's shards, each step reading the parts of the one
before, keeping the rows it passes, and writing its own parts and partial sums: no row reaches the
driver (the quality and dialogue-safety pipelines). The steps run in one Ray Data plan, each shard
taken by a step as soon as the step before wrote it, when the cluster holds every step's actors at
once; else one plan per step (`run_step`); a step without a worker (no model: a split assigned, rows
chosen) is made by the host of the step before it, from the part it has just written (first in a chain: a
Ray Data task per shard). `run_beside`: steps side by side over the same input
shards, read by the same plan (score's detectors, the attack, the trigger search).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from redline.cluster import storage
from redline.cluster.config import ActorPoolSize
from redline.cluster.runs import Run
from redline.pipelines.plane import runner, shard_host, sharded
from redline.pipelines.reporting import aggregates as A
from redline.pipelines.reporting.figures import Table

VERDICT = ("kept", "reject_reason", "reject_kind")  # a filtering step's verdict on each of its rows


@dataclass(frozen=True)
class Step:
    """One step of a chain: `worker(**kwargs)` (a class with `input_columns` and `output_schema`) on the
    step's rows of each shard (`rows(shard)`; default: those the step before kept, all of them when it
    gave no verdict) that `asked(rows)` holds for (default: all), its answers joined onto them by `id`
    (a row not asked: nulls), then `finish(rows)` (e.g. the step's verdict columns, `VERDICT`).
    `errors(rows)`: each row's failure (null: answered); `figures`: partial sums of its parts, by name.
    A step whose worker takes and gives other columns than `id` joins its own way: `select(shard)` (the
    worker's rows) and `assemble(shard, results)` (the part) replace the rows, asked and finish above.
    `what`: its actors as an error names them (default: by the worker class). `worker` None: the step
    calls no model, its part is `finish(rows)` (or `assemble(shard, no answers)`), made where the rows
    are (`runner.Pool.then`; no actor of its own: it would hold nothing)."""

    name: str
    worker: type | None
    kwargs: dict[str, Any]
    size: ActorPoolSize
    label: str
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    batch_size: int = 64
    finish: Callable[[pa.Table], pa.Table] | None = None
    errors: Callable[[pa.Table], pa.Array] | None = None
    figures: dict[str, Table] = field(default_factory=dict)
    rows: Callable[[pa.Table], pa.Table] | None = None
    asked: Callable[[pa.Table], pa.Array] | None = None
    select: Callable[[pa.Table], pa.Table] | None = None
    assemble: Callable[[pa.Table, pa.Table], pa.Table] | None = None
    what: str | None = None


@dataclass(frozen=True)
class StepResult:
    """A step's figures (merged over every part it wrote, earlier attempts' included) and the rows it
    could not answer in this attempt (their parts were not written)."""

    partials: dict[str, A.Partials]
    failed: int
    asked: int
    failure: str | None


def kept_rows(shard: pa.Table) -> pa.Table:
    """The rows a shard's verdict kept, without the verdict (all rows when it has none)."""
    if "kept" not in shard.column_names:
        return shard
    return shard.filter(pc.fill_null(shard.column("kept"), False)).drop_columns(
        [c for c in VERDICT if c in shard.column_names])


def run_steps(run: Run, steps: list[tuple[Step, str]], source: str, n_shards: int, *, source_pool: int | None = None,
              label: str, verbose: bool = False) -> list[StepResult]:
    """The `steps` ((step, folder): its parts go to `folder`) one after the other over the `n_shards`
    shards in `source` (input shards, or a step's parts when `source_pool` is the pool that wrote
    them): in one plan when the cluster holds every step's least actors at once (`label`: its bar's),
    else one plan per step, stopping after a step that failed on a row. A shard a step already wrote is
    skipped; a shard a step failed on goes no further. Each step's figures and failures, in order (the
    steps that ran)."""
    import ray

    from redline.cluster.runtime import ensure_ray

    ensure_ray(verbose=verbose)
    have = ray.cluster_resources()
    held = [s for s, _ in steps if s.worker is not None]  # a worker-less step's tasks hold nothing between shards
    fits = (sum(s.size.actors * s.num_cpus for s in held) <= have.get("CPU", 0) + 1e-9
            and sum(s.size.actors * s.num_gpus for s in held) <= have.get("GPU", 0) + 1e-9)
    if len(steps) < 2 or not fits:
        results = []
        for step, folder in steps:
            results.append(run_step(run, step, source, folder, n_shards, source_pool=source_pool, verbose=verbose))
            if results[-1].failed:
                break
            source, source_pool = folder, 0
        return results
    pools: list[runner.Pool] = []
    for k, (step, folder) in enumerate(steps):
        pool = _pool(run, step, source, folder, source_pool, None, tag=k, takes=k - 1 if k else shard_host.READ)
        if step.worker is None and pools:  # no model: the host of the step before makes its part, in the same call
            pools[-1] = replace(pools[-1], then=(*pools[-1].then, pool))
        else:
            pools.append(pool)
        source, source_pool = folder, 0
    used = runner.run_chain(run, pools, n_shards, label=label, verbose=verbose)
    return [_result(run, step, folder, n_shards, used[k]) for k, (step, folder) in enumerate(steps)]


def run_beside(run: Run, steps: list[Step], folder: str, *, shard_rows: list[int] | None,
               inputs: sharded.Inputs | None = None, label: str, unit: str = "rows",
               note: Callable[[Run], str] | None = None, verbose: bool = False) -> list[runner.PoolUse]:
    """`steps` side by side over the run's input shards, step k writing its part of each shard to `folder`
    as pool k (a shard a step already wrote is skipped): the shards written before (`shard_rows`), or
    with `inputs` (`shard_rows` None) read by the same plan, each shard taken as soon as it is written.
    `note(run)`: running figures for the progress line. What each step spent, in order."""
    pools = [_pool(run, step, sharded.INPUT_DIR, folder, None,
                   None if shard_rows is None else runner.pending(run, folder, len(shard_rows), k), pool=k)
             for k, step in enumerate(steps)]
    used = runner.run_pools(run, pools, shard_rows, label=label, verbose=verbose, unit=unit, note=note,
                            inputs=inputs)
    return [used[k] for k in range(len(steps))]


def _pool(run: Run, step: Step, source: str, folder: str, source_pool: int | None, todo: list[int] | None,
          pool: int = 0, **chained: Any) -> runner.Pool:
    work = shard_host.ShardWork(run.dir.uri, folder, pool, step.select or partial(_worker_rows, step=step),
                                step.assemble or partial(_joined, step=step), step.figures, step.batch_size,
                                input_dir=source, input_pool=source_pool, errors=step.errors)
    return runner.Pool(work, step.worker, step.kwargs, step.size.actors, step.num_cpus, step.num_gpus, todo,
                           max_actors=step.size.max_actors, what=step.what, **chained)


def run_step(run: Run, step: Step, source: str, folder: str, n_shards: int, *, source_pool: int | None = None,
             total: int | None = None, verbose: bool = False) -> StepResult:
    """`step` over the `n_shards` shards in `source` of the run (input shards, or a step's parts when
    `source_pool` is the pool that wrote them), each part written to `folder` by its actor; a shard
    already done is skipped. `total`: the rows the progress bar counts to."""
    todo = runner.pending(run, folder, n_shards, 0)
    use = runner.PoolUse()
    if todo:
        use = runner.run_pools(run, [_pool(run, step, source, folder, source_pool, todo)], [0] * n_shards,
                                   label=step.label, verbose=verbose, total=total)[0]
    return _result(run, step, folder, n_shards, use)


def _result(run: Run, step: Step, folder: str, n_shards: int, use: runner.PoolUse) -> StepResult:
    written = set(storage.list_files(run.dir.path(folder), ".parquet"))
    parts = {(i, 0): shard_host.output_part(i, 0) for i in range(n_shards)
             if run.dir.path(folder, shard_host.output_part(i, 0)) in written}
    partials = sharded.run_partials(run, step.figures, folder, parts)
    return StepResult(partials, use.failed, use.rows, use.failure)


def _step_rows(shard: pa.Table, step: Step) -> pa.Table:
    return step.rows(shard) if step.rows is not None else kept_rows(shard)


def _worker_rows(shard: pa.Table, step: Step) -> pa.Table:
    rows = _step_rows(shard, step)
    if step.asked is not None:
        rows = rows.filter(pc.fill_null(step.asked(rows), False))
    return rows.select(step.worker.input_columns if step.worker is not None else ["id"])  # type: ignore[attr-defined]


def _joined(shard: pa.Table, results: pa.Table, step: Step) -> pa.Table:
    rows = _step_rows(shard, step)
    answers = _aligned(rows, results)
    for name in answers.column_names:
        if name != "id":
            column = answers.column(name)
            rows = rows.append_column(name, column) if name not in rows.column_names else \
                rows.set_column(rows.schema.get_field_index(name), name, column)
    return step.finish(rows) if step.finish is not None else rows


def _aligned(shard: pa.Table, results: pa.Table) -> pa.Table:
    """The worker's output columns for each row of the shard, in its order (a row without an answer: nulls)."""
    return results.drop_columns([c for c in ("shard",) if c in results.column_names]).take(
        pc.index_in(shard.column("id"), value_set=results.column("id")))
