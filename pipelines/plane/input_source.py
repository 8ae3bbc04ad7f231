"""A run's input shards as a Ray Data source: a read task (on a worker, never the driver) reads a
corpus chunk by chunk (`sharded.shards_written`), writes each input shard into the run as soon as it is
full and emits one marker row per shard written, so the actor pools behind it in the same plan take
shard 0 while shard 1 is being read. Several sources (corpus files) are read by one task each, side
by side, as many at once as the cluster holds (`firsts`: each one's first shard number, then the
shard count). Each task ends by writing what the driver records in the manifest (rows per shard, the
corpus' counts, fingerprints of inputs the driver cannot see) into the run (`read_result_uri`), read
by the driver once the plan ends: as a row it would reach every pool as one more call, and a pool
whose one actor holds two calls grows (a 72-row run started an actor per pool it never used).

Markers are rows of the runner's summary schema with `pool = -1`, one per shard written (`rows`: its
work). Blocks are emitted one row at a time (the plan's `target_max_block_size` is 1 byte): Ray Data
would otherwise hold a task's small blocks until it ends, and no pool would start before the whole
corpus is read.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import pyarrow as pa
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from redline.cluster import storage
from redline.pipelines.plane import sharded
from redline.pipelines.plane.shard_host import READ
from redline.pipelines.plane.sharded import Inputs


class InputShards(Datasource):
    def __init__(self, run_uri: str, inputs: Inputs, n_shards: int | None, unseen: dict[str, Any],
                 schema: pa.Schema, firsts: list[int] | None = None) -> None:
        self.run_uri, self.inputs, self.n_shards, self.unseen, self.schema = run_uri, inputs, n_shards, unseen, schema
        self.firsts = firsts

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[ReadTask]:
        meta = BlockMetadata(num_rows=None, size_bytes=None, input_files=None, exec_stats=None)
        if self.firsts is None:
            return [ReadTask(partial(self._read, 0, None), meta, schema=self.schema)]
        return [ReadTask(partial(self._read, k, first), meta, schema=self.schema)
                for k, first in enumerate(self.firsts[:-1])]

    def _read(self, k: int, first: int | None) -> Iterator[pa.Table]:
        i = self.inputs
        # the inputs the driver cannot see are fingerprinted once, by the first source's task
        shards = sharded.shards_written(self.run_uri, self.n_shards, i.sources[k].build, i.shard_size, i.counts,
                                        i.rows, self.unseen if k == 0 else {}, first=first,
                                        end=None if first is None else self.firsts[k + 1])
        while True:
            try:
                shard, rows = next(shards)
            except StopIteration as done:
                storage.write_json(read_result_uri(self.run_uri, k), done.value)
                return
            yield pa.Table.from_pylist([{"shard": shard, "pool": READ, "rows": rows, "seconds": 0.0, "host": None,
                                         "partials": None, "failed": 0, "failure": None}], schema=self.schema)


def read_result_uri(run_uri: str, k: int) -> str:
    """Where read task `k` of a run leaves what it read (see the module's note)."""
    return storage.join(run_uri, sharded.INPUT_DIR, f"read-{k:05d}.json")
