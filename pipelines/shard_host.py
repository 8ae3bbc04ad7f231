"""Shards processed where the work runs: each call of an actor (`pipelines/actor_pool.py`: plain Ray
actors that take work as soon as each is ready, growing while shards wait) is one whole input shard,
which the actor reads from the run directory, sends through its row worker (a detector, ...) in
model batches, joins back onto the shard, writes atomically as the shard's output part and sums
into its figures' partial sums. The driver sends shard numbers and receives one small summary row
per shard (its partial sums as JSON): no row of the corpus or of the results passes through it.

A retried call (a lost actor) rewrites the same part with the same rows, and a part's sums are
counted once (by part), so resume neither loses nor duplicates rows.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from redline.cluster import storage
from redline.cluster.progress import progress_bar
from redline.cluster.runs import Run
from redline.cluster.runtime import check_placeable, ensure_ray
from redline.errors import RedlineError
from redline.pipelines import aggregates as A
from redline.pipelines import sharded
from redline.pipelines.figures import Table

SUMMARY_SCHEMA = pa.schema([("shard", pa.int64()), ("pool", pa.int64()), ("rows", pa.int64()),
                            ("seconds", pa.float64()), ("host", pa.string()), ("partials", pa.string()),
                            ("failed", pa.int64()), ("failure", pa.string())])


MANIFEST_EVERY_S = 5.0


def output_part(index: int, pool: int) -> str:
    """Output part of shard `index` from pool `pool` (one pool per detector)."""
    return f"part-{index:05d}-{pool}.parquet"


@dataclass(frozen=True)
class ShardWork:
    """What a pool does to a shard: which rows go to its worker, how its results join back onto the
    shard, where the part goes, which figures are summed from it. `input_pool`: the shards are another
    pool's output parts (a chain of steps), not input shards. `errors(part)`: each row's failure (null:
    an answer); a part holding one is not written, so a rerun asks that shard again."""

    run_uri: str
    output_dir: str
    pool: int
    select: Callable[[pa.Table], pa.Table]
    assemble: Callable[[pa.Table, pa.Table], pa.Table]
    figures: dict[str, Table]
    batch_size: int
    input_dir: str = sharded.INPUT_DIR
    input_pool: int | None = None
    errors: Callable[[pa.Table], pa.Array] | None = None

    def input_part(self, index: int) -> str:
        name = sharded.part_name(index) if self.input_pool is None else output_part(index, self.input_pool)
        return storage.join(self.run_uri, self.input_dir, name)


@dataclass(frozen=True)
class Pool:
    """One actor pool: its row worker (a class with `output_schema`, called with numpy batches) and
    its resources; `pending`: the shards it has yet to write. `actors` start at once; the pool grows
    up to `max_actors` (None: as many as the cluster has room for) while shards wait, never beyond
    the shards pending. `what`: its actors as an error names them (default: by the worker class)."""

    work: ShardWork
    worker: type
    worker_kwargs: dict[str, Any]
    actors: int
    num_cpus: float
    num_gpus: float
    pending: list[int]
    max_actors: int | None = None
    what: str | None = None

    @property
    def sizes(self) -> tuple[int, int]:
        """The pool's least and greatest size for its pending shards."""
        n = len(self.pending)
        return min(self.actors, n), min(self.max_actors or n, n)


@dataclass
class PoolUse:
    """What a pool spent: its actors' busy seconds and how many actors took part; the rows it could
    not answer (`failed`, in parts left unwritten) and the first failure."""

    seconds: float = 0.0
    hosts: set[str] = field(default_factory=set)
    rows: int = 0
    failed: int = 0
    failure: str | None = None

    @property
    def actors(self) -> int:
        return len(self.hosts)


class ShardHost:
    """An actor hosting one row worker, called with shard numbers. A constructor error is kept and
    raised by the first call, so it reaches the driver as itself (Ray reports a failed actor
    constructor only as a message)."""

    def __init__(self, work: ShardWork, worker: type, worker_kwargs: dict[str, Any]) -> None:
        self.work, self.empty, self.error = work, worker.output_schema.empty_table(), None
        self.host = f"{socket.gethostname()}:{os.getpid()}"
        try:
            sharded.check_visible(work.run_uri)
            self.worker = worker(**worker_kwargs)
        except Exception as err:  # noqa: BLE001 - re-raised on the first call
            self.error = err

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        if self.error is not None:
            raise self.error
        return pa.Table.from_pylist([self.shard(int(i)) for i in batch["shard"]], schema=SUMMARY_SCHEMA)

    def shard(self, index: int) -> dict[str, Any]:
        w = self.work
        shard = storage.read_parquet(w.input_part(index))
        rows = w.select(shard)
        rows = rows.append_column("shard", pa.array([index] * rows.num_rows, pa.int32()))
        started = time.perf_counter()
        results = [self.worker({c: part.column(c).to_numpy(zero_copy_only=False) for c in part.column_names})
                   for part in (rows.slice(j, w.batch_size) for j in range(0, rows.num_rows, w.batch_size))]
        seconds = time.perf_counter() - started
        out = w.assemble(shard, pa.concat_tables(results) if results else self.empty)
        summary = {"shard": index, "pool": w.pool, "rows": rows.num_rows, "seconds": seconds, "host": self.host,
                   "failed": 0, "failure": None}
        errors = w.errors(out).drop_null() if w.errors is not None else []
        if len(errors):
            return {**summary, "partials": "{}", "failed": len(errors), "failure": str(errors[0].as_py())}
        storage.write_parquet(out, storage.join(w.run_uri, w.output_dir, output_part(index, w.pool)))
        partials = {name: A.to_json(table.partials(out)) for name, table in w.figures.items()}
        return {**summary, "partials": json.dumps(partials)}


def pending(run: Run, output_dir: str, n_shards: int, pool: int) -> list[int]:
    """The shards whose part from `pool` is not written yet."""
    done = set(storage.list_files(run.dir.path(output_dir), ".parquet"))
    older = [uri for uri in done if re.fullmatch(r"part-\d{5}\.parquet", uri.rsplit("/", 1)[-1])]
    if older:  # one part per shard, written by the driver: resuming on top would hold some rows twice
        raise RedlineError(f"{run.dir.path(output_dir)} holds parts written by an earlier redline (one per shard); "
                           "rerun with --force to redo the run")
    return [i for i in range(n_shards) if run.dir.path(output_dir, output_part(i, pool)) not in done]


def run_pools(run: Run, pools: list[Pool], shard_rows: list[int], *, label: str, verbose: bool = False,
              unit: str = "rows", note: Callable[[Run], str] | None = None,
              total: int | None = None) -> dict[int, PoolUse]:
    """Every pool's pending shards through its actors, the pools side by side; each part's partial
    sums are added to the run's manifest as its summary arrives (`note(run)`: running figures for the
    progress line; `total`: the rows the bar counts to, when `shard_rows` is not known). Returns what
    each pool spent."""
    busy = {p.work.pool: PoolUse() for p in pools}
    pools = [p for p in pools if p.pending]
    if not pools:
        return busy
    counted = run.manifest.get("partials", {})
    if any([i, p.work.pool] in counted.get(name, {}).get("shards", []) for p in pools for i in p.pending
           for name in p.work.figures):  # a counted part is gone (deleted by hand): recount every part from its file
        for name in {name for p in pools for name in p.work.figures}:
            counted.pop(name, None)
    ensure_ray(verbose=verbose)
    figures = {p.work.pool: p.work.figures for p in pools}
    if total is None:
        total = sum(shard_rows[i] for p in pools for i in p.pending)
    saved = time.monotonic()
    with progress_bar(label, total=total, unit=unit) as advance:
        for batch in _summaries(pools):
            for row in batch.to_pylist():
                use = busy[row["pool"]]
                use.seconds, use.rows = use.seconds + row["seconds"], use.rows + row["rows"]
                use.hosts.add(row["host"])
                if row["failed"]:  # a part not written: not counted, asked again by a rerun
                    use.failed += row["failed"]
                    use.failure = use.failure or row["failure"]
                else:
                    partials = {name: A.from_json(part) for name, part in json.loads(row["partials"]).items()}
                    sharded.count_partials(run, figures[row["pool"]], (row["shard"], row["pool"]), partials)
                advance(row["rows"], note(run) if note is not None else None)
            # the running totals reach the manifest every few seconds: a part counted after the last
            # save is counted again from its file on resume (sharded.run_partials), never lost
            if time.monotonic() - saved > MANIFEST_EVERY_S:
                run.dir.write_manifest(run.manifest)
                saved = time.monotonic()
    run.dir.write_manifest(run.manifest)
    return busy


def plan(pools: list[Pool]) -> Any:
    """One Ray Data plan for the pools side by side: per pool, its pending shard numbers (one block
    each) through `map_batches(ShardHost)` on an autoscaling actor pool (`ActorPoolStrategy`: its
    `actors` at least, up to `max_actors` while shards wait and the cluster has room), the pools'
    branches unioned into one stream of summary rows. One executor schedules every pool, so a pool
    whose actors cannot start yet holds no work, and one that is done gives its resources back."""
    import ray.data

    branches = []
    for p in pools:
        least, most = p.sizes
        shards = ray.data.from_arrow([pa.table({"shard": pa.array([i], pa.int64())}) for i in p.pending])
        branches.append(shards.map_batches(
            ShardHost, fn_constructor_kwargs={"work": p.work, "worker": p.worker, "worker_kwargs": p.worker_kwargs},
            compute=ray.data.ActorPoolStrategy(min_size=least, max_size=most, max_tasks_in_flight_per_actor=1),
            batch_size=1, batch_format="numpy",
            num_cpus=p.num_cpus, num_gpus=p.num_gpus or None))
    return branches[0] if len(branches) == 1 else branches[0].union(*branches[1:])


def _summaries(pools: list[Pool]) -> Iterator[pa.Table]:
    """The pools' summary rows as their shards finish (placement checked once, before anything starts)."""
    for p in pools:
        check_placeable(p.what or f"each {p.worker.__name__} actor", p.num_cpus, p.num_gpus)
    return plan(pools).iter_batches(batch_size=None, batch_format="pyarrow")
