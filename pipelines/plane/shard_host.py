"""What runs in each actor (or task) of a pool: one call is one whole shard, which the host reads
from the run directory, sends through its row worker (a detector, ...) in model batches, joins back
onto the shard, writes atomically as the shard's output part and sums into its figures' partial sums;
it returns one small summary row (its partial sums as JSON). Behind the input source or another pool,
the rows it takes say which shards are ready for it, and every row passes on. The driver's side, the
plans these hosts run in, is `pipelines/plane/runner.py`.

A retried call (a lost actor) rewrites the same part with the same rows, and a part's sums are
counted once (by part), so resume neither loses nor duplicates rows.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from redline.cluster import storage
from redline.cluster.runtime import give_back_freed_memory
from redline.pipelines.plane import sharded
from redline.pipelines.reporting import aggregates as A
from redline.pipelines.reporting.figures import Table

SUMMARY_SCHEMA = pa.schema([("shard", pa.int64()), ("pool", pa.int64()), ("rows", pa.int64()),
                            ("seconds", pa.float64()), ("host", pa.string()), ("partials", pa.string()),
                            ("failed", pa.int64()), ("failure", pa.string())])


NO_ANSWERS = pa.schema([("id", pa.string())]).empty_table()  # a step without a worker answers no row

READ = -1  # the pool of the input source's markers (`pipelines/plane/input_source.py`)


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


class ShardHost:
    """An actor hosting one row worker, called with shard numbers. A constructor error is kept and
    raised by the first call, so it reaches the driver as itself (Ray reports a failed actor
    constructor only as a message). `lazy` (a host made for one task's call): the worker is made when
    a shard needs it, so a call that only passes rows on loads no model."""

    def __init__(self, work: ShardWork, worker: type | None, worker_kwargs: dict[str, Any],
                 done: frozenset[int] = frozenset(), tag: int | None = None, takes: int = READ,
                 then: tuple[tuple[ShardWork, int, frozenset[int]], ...] = (), lazy: bool = False) -> None:
        self.empty = NO_ANSWERS if worker is None else worker.output_schema.empty_table()
        self.work, self.error, self.done, self.worker, self.then = work, None, done, None, then
        self.tag, self.takes = work.pool if tag is None else tag, takes
        self.host = f"{socket.gethostname()}:{os.getpid()}"
        self.trimmed_at, self.trim_s = float("-inf"), 0.0
        self._make = None if worker is None else (worker, worker_kwargs)
        try:
            sharded.check_visible(work.run_uri)
            if not lazy:
                self._made_worker()
        except Exception as err:  # noqa: BLE001 - re-raised on the first call
            self.error = err

    def _made_worker(self) -> Any:
        if self.worker is None and self._make is not None:
            worker, kwargs = self._make
            self.worker = worker(**kwargs)
        return self.worker

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        """Shard numbers in, their summary rows out; or, behind the input source or another pool,
        rows of the summary schema: each row saying a shard is ready for this pool (`takes`: the
        source's shard-written markers, `pool = -1`, or the summaries of the step before, which wrote
        it) is this pool's work, and every row passes on (the pools after this one, and the driver,
        read them). A shard this pool had `done` before gets a summary without figures (null
        partials), so the step after it still takes it."""
        if self.error is not None:
            raise self.error
        if "pool" not in batch:
            return pa.Table.from_pylist([s for i in batch["shard"] for s in self.shard(int(i))], schema=SUMMARY_SCHEMA)
        passed = pa.table({name: batch[name] for name in SUMMARY_SCHEMA.names}).cast(SUMMARY_SCHEMA)
        ready = [int(i) for i, p, failed in zip(batch["shard"], batch["pool"], batch["failed"])
                 if p == self.takes and i >= 0 and not failed]
        mine = [s for i in ready for s in self.shard(i)]
        return pa.concat_tables([passed, pa.Table.from_pylist(mine, schema=SUMMARY_SCHEMA)])

    def _passed_on(self, index: int, tag: int) -> dict[str, Any]:
        """The summary of a part written before: no figures (counted from its file), passed on."""
        return {"shard": index, "pool": tag, "rows": 0, "seconds": 0.0, "host": self.host, "partials": None,
                "failed": 0, "failure": None}

    def _give_back_memory(self) -> None:
        """An actor lives for many shards: its RSS must not grow with them. Giving freed memory back
        takes ~0.1 s on an attacker's heap, so it is done at most once per 50 times that long (<= 2%)."""
        now = time.monotonic()
        if now - self.trimmed_at >= max(1.0, 50 * self.trim_s):
            give_back_freed_memory()
            self.trimmed_at = time.monotonic()
            self.trim_s = self.trimmed_at - now

    def shard(self, index: int) -> list[dict[str, Any]]:
        """Shard `index` through this pool and then its followers (`then`), each making its part from
        the rows the one before made: one summary each. A part written before is passed on (read back
        only when a follower still needs its rows); a part not written (a row failed) goes no further."""
        w = self.work
        pending = [tag for _, tag, done in self.then if index not in done]  # followers yet to make their part
        if index in self.done:
            summaries = [self._passed_on(index, self.tag)]
            out = self._written(w, index) if pending else None
        else:
            out, summary = self._made(w, self.tag, self._made_worker(), index, storage.read_parquet(w.input_part(index)))
            summaries = [summary]
        for work, tag, done in self.then:
            if summaries[-1]["failed"]:
                break
            if index in done:
                summaries.append(self._passed_on(index, tag))
                out = self._written(work, index) if any(t > tag for t in pending) else None
            else:
                assert out is not None
                out, summary = self._made(work, tag, None, index, out)
                summaries.append(summary)
        return summaries

    @staticmethod
    def _written(w: ShardWork, index: int) -> pa.Table:
        return storage.read_parquet(storage.join(w.run_uri, w.output_dir, output_part(index, w.pool)))

    def _made(self, w: ShardWork, tag: int, worker: Any, index: int,
              shard: pa.Table) -> tuple[pa.Table | None, dict[str, Any]]:
        """`w`'s part of a shard (its rows through `worker`, in model batches, joined back), written,
        and its summary; None for the part when a row failed (then it is not written)."""
        rows = w.select(shard) if worker is not None else NO_ANSWERS
        rows = rows.append_column("shard", pa.array([index] * rows.num_rows, pa.int32()))
        started = time.perf_counter()
        results = [worker({c: part.column(c).to_numpy(zero_copy_only=False) for c in part.column_names})
                   for part in (rows.slice(j, w.batch_size) for j in range(0, rows.num_rows, w.batch_size))
                   if worker is not None]
        seconds = time.perf_counter() - started
        out = w.assemble(shard, pa.concat_tables(results) if results else
                         (NO_ANSWERS if worker is None else self.empty))
        summary = {"shard": index, "pool": tag, "rows": rows.num_rows, "seconds": seconds, "host": self.host,
                   "failed": 0, "failure": None}
        errors = w.errors(out).drop_null() if w.errors is not None else []
        if worker is not None:
            self._give_back_memory()
        if len(errors):
            return None, {**summary, "partials": "{}", "failed": len(errors), "failure": str(errors[0].as_py())}
        storage.write_parquet(out, storage.join(w.run_uri, w.output_dir, output_part(index, w.pool)))
        partials = {name: A.to_json(table.partials(out)) for name, table in w.figures.items()}
        return out, {**summary, "partials": json.dumps(partials)}


def host_once(batch: dict[str, np.ndarray], **kwargs: Any) -> pa.Table:
    """A call of a pool hosted by Ray Data tasks: its host made for this call alone (a worker-less
    pool's loads nothing; a small pool's loads its worker only for a shard of its own)."""
    return ShardHost(**kwargs, lazy=True)(batch)
