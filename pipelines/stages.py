"""Run one worker class over a table on a Ray Data actor pool and join its output back by `id`.

The quality and transfer pipelines are chains of such steps; each step's result is written to the
run directory before the next starts, so a restarted run resumes at the first unfinished step.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from redline.cluster.progress import progress_bar
from redline.cluster.runtime import check_placeable, ensure_ray
from redline.pipelines.sharded import block_rows


def map_table(table: pa.Table, worker: type, kwargs: dict[str, Any], *, actors: int = 1, num_cpus: float = 1.0,
              num_gpus: float = 0.0, batch_size: int = 64, verbose: bool = False, label: str | None = None) -> pa.Table:
    """`worker(**kwargs)` on every row's `worker.input_columns` (which include `id`), across `actors`
    actors; returns the worker's output columns aligned with `table`'s rows (rows it did not answer
    get nulls)."""
    columns: list[str] = worker.input_columns  # type: ignore[attr-defined]
    import ray.data

    if table.num_rows == 0:
        return table
    ensure_ray(verbose=verbose)
    check_placeable(f"each {worker.__name__} actor", num_cpus, num_gpus)
    size = block_rows(table.num_rows, batch_size, actors)
    source = table.select(columns)
    if "shard" not in columns:  # detection workers route results by shard; one shard here
        source = source.append_column("shard", pa.array([0] * source.num_rows, pa.int32()))
    ds = ray.data.from_arrow([source.slice(i, size) for i in range(0, source.num_rows, size)])
    out = ds.map_batches(worker, fn_constructor_kwargs=kwargs, batch_size=batch_size, batch_format="numpy",
                         compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=num_cpus,
                         num_gpus=num_gpus or None)
    parts = []
    with progress_bar(label or worker.__name__, total=table.num_rows) as advance:
        for batch in out.iter_batches(batch_format="pyarrow", batch_size=None):
            parts.append(batch)
            advance(batch.num_rows)
    results = pa.concat_tables(parts)
    idx = pc.index_in(table.column("id"), value_set=results.column("id"))
    taken = results.take(idx)
    for name in results.column_names:
        if name != "id" and name != "shard":
            table = table.append_column(name, taken.column(name)) if name not in table.column_names else \
                table.set_column(table.schema.get_field_index(name), name, taken.column(name))
    return table
