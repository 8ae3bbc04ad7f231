"""Sharded work inside a run directory: input shards written once, a stream of results (Ray Data
`map_batches` actor pools, or a plain `ActorPool`) written shard by shard, atomically, and resume.

A pipeline supplies: how to build its input table, which rows of a shard to send, how to process
blocks of those rows into results, and how to join a shard's results back onto the shard. Rows
carry a `shard` column so results can be routed; each shard is written as soon as all its expected
results arrived, and repeated rows (Ray re-running a task after losing an actor) are dropped by key.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from redline.cluster import storage
from redline.cluster.progress import progress_bar
from redline.cluster.runs import Run, RunDir
from redline.cluster.runtime import ensure_ray
from redline.errors import RedlineError
from redline.pipelines.figures import Table

INPUT_DIR = "input"


def part_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def prepare_inputs(run: Run, build: Callable[[], pa.Table], shard_size: int,
                   counts: Callable[[pa.Table], dict[str, Any]]) -> list[pa.Table]:
    """Input shards: read back when an earlier attempt wrote them all, else built and written now."""
    n_shards = run.manifest.get("input_shards")
    if n_shards is not None:
        parts = storage.list_files(run.dir.path(INPUT_DIR), ".parquet")
        if len(parts) == n_shards:
            return [storage.read_parquet(p) for p in parts]
    table = build()
    shards = [table.slice(i, shard_size) for i in range(0, table.num_rows, shard_size)]
    for i, shard in enumerate(shards):
        storage.write_parquet(shard, run.dir.path(INPUT_DIR, part_name(i)))
    run.manifest["input_shards"] = len(shards)
    run.manifest["counts"] = counts(table)
    run.dir.write_manifest(run.manifest)
    return shards


def pending_shards(run: Run, output_dir: str, n_shards: int) -> list[int]:
    done = set(storage.list_files(run.dir.path(output_dir), ".parquet"))
    pending = [i for i in range(n_shards) if run.dir.path(output_dir, part_name(i)) not in done]
    run.manifest["resumed_shards"] = n_shards - len(pending)
    return pending


def read_outputs(run: RunDir, output_dir: str) -> pa.Table:
    """Every output shard of a run directory, as one table."""
    parts = storage.list_files(run.path(output_dir), ".parquet")
    if not parts:
        raise RedlineError(f"{run.path(output_dir)} holds no output shards")
    return pa.concat_tables([storage.read_parquet(p) for p in parts])


def count_figures(run: Run, table: Table, index: int, rows: pa.Table) -> None:
    """Add output shard `index`'s partial sums to the run's running totals in its manifest (once per
    shard: a shard already counted is skipped), remembering where each group first appeared so the
    summary keeps the rows' order whatever order the shards finish in."""
    state = run.manifest.setdefault("figures", {"shards": [], "groups": []})
    if index in state["shards"]:
        return
    groups = {tuple(g): (tuple(first), sums) for g, first, sums in state["groups"]}
    for position, (group, sums) in enumerate(table.partials(rows).items()):
        first, total = groups.get(group, ((index, position), {}))
        for name, value in sums.items():
            total[name] = total.get(name, 0) + value
        groups[group] = (min(first, (index, position)), total)
    state["groups"] = [[list(g), list(first), sums] for g, (first, sums) in groups.items()]
    state["shards"].append(index)


def shard_summary(run: Run, table: Table, output_dir: str, n_shards: int) -> list[dict[str, Any]]:
    """The run's summary rows from its running totals; a shard written but not yet counted (the run
    stopped between the two) is read back and counted now, alone."""
    counted = set(run.manifest.get("figures", {}).get("shards", []))
    for i in range(n_shards):
        if i not in counted:
            count_figures(run, table, i, storage.read_parquet(run.dir.path(output_dir, part_name(i))))
    groups = sorted(run.manifest.get("figures", {}).get("groups", []), key=lambda g: tuple(g[1]))
    return table.rows({tuple(g): sums for g, _, sums in groups})


def block_rows(rows: int, batch_size: int, actors: int) -> int:
    """Rows per Ray Data block: several blocks per actor so every actor of a pool gets work, each
    many model batches long so per-task overhead stays small."""
    return int(min(max(rows // (4 * actors), batch_size, 1), batch_size * 16))


def row_keys(table: pa.Table, key: list[str]) -> list[str]:
    return ["\x00".join(map(str, k)) for k in zip(*(table.column(c).to_pylist() for c in key))]


def dedupe(results: pa.Table, key: list[str]) -> pa.Table:
    keys = row_keys(results, key)
    _, first = np.unique(np.array(keys, dtype=object), return_index=True)
    return results if len(first) == results.num_rows else results.take(pa.array(np.sort(first)))


def through_ray_data(build_stream: Callable[[Any], Any]) -> Callable[[list[pa.Table]], Iterable[pa.Table]]:
    """`process` for `stream_shards`: the blocks become a Ray Data dataset, `build_stream` adds
    its `map_batches` actor pools, and the output batches stream back."""
    def process(blocks: list[pa.Table]) -> Iterable[pa.Table]:
        import ray.data

        return build_stream(ray.data.from_arrow(blocks)).iter_batches(batch_format="pyarrow", batch_size=None)

    return process


def stream_shards(
    run: Run,
    shards: list[pa.Table],
    pending: list[int],
    *,
    output_dir: str,
    select: Callable[[pa.Table], pa.Table],
    results_per_row: int,
    process: Callable[[list[pa.Table]], Iterable[pa.Table]],
    assemble: Callable[[pa.Table, pa.Table], pa.Table],
    empty_results: pa.Schema,
    key: list[str],
    batch_size: int,
    actors: int,
    label: str,
    verbose: bool = False,
    on_batch: Callable[[pa.Table], None] | None = None,
    note: Callable[[pa.Table], str] | None = None,
    unit: str = "rows",
    figures: Table | None = None,
) -> None:
    """Send each pending shard's selected rows, in blocks, through `process` (`through_ray_data`
    or an `ActorPool`), and write each shard's assembled output atomically once all
    `results_per_row * rows` results for it have arrived. `note(batch)` adds running figures (e.g.
    hits so far) to the progress line; `figures`: the table whose partial sums are counted as each
    shard is written (see `shard_summary`)."""
    work: dict[int, pa.Table] = {}
    for i in pending:
        rows = select(shards[i])
        work[i] = rows.append_column("shard", pa.array([i] * rows.num_rows, pa.int32()))
    expected = {i: t.num_rows * results_per_row for i, t in work.items()}
    received: dict[int, list[pa.Table]] = defaultdict(list)
    seen: dict[int, set[str]] = defaultdict(set)  # result keys per shard: a re-sent row counts once
    flushed: set[int] = set()

    def flush(i: int) -> None:
        flushed.add(i)
        parts = received.pop(i, [])
        results = dedupe(pa.concat_tables(parts), key) if parts else empty_results.empty_table()
        out = assemble(shards[i], results)
        storage.write_parquet(out, run.dir.path(output_dir, part_name(i)))
        if figures is not None:
            count_figures(run, figures, i, out)
            run.dir.write_manifest(run.manifest)

    for i in [i for i in pending if expected[i] == 0]:
        flush(i)
    tables = [work[i] for i in pending if expected[i] > 0]
    if not tables:
        return
    ensure_ray(verbose=verbose)
    size = block_rows(sum(t.num_rows for t in tables), batch_size, actors)
    blocks = [t.slice(j, size) for t in tables for j in range(0, t.num_rows, size)]
    with progress_bar(label, total=sum(expected.values()), unit=unit) as advance:
        for batch in process(blocks):
            if batch.num_rows == 0:
                continue
            if on_batch is not None:
                on_batch(batch)
            shard_ids = batch.column("shard").to_numpy()
            for i in map(int, np.unique(shard_ids)):
                if i in flushed:  # rows Ray re-sent after a retry; the shard is already written
                    continue
                part = batch.filter(pa.array(shard_ids == i))
                keys = row_keys(part, key)
                fresh = [k not in seen[i] and not seen[i].add(k) for k in keys]  # type: ignore[func-returns-value]
                if not all(fresh):
                    part = part.filter(pa.array(fresh))
                received[i].append(part)
                if len(seen[i]) >= expected[i]:
                    flush(i)
            advance(batch.num_rows, note(batch) if note is not None else None)
    unfinished = [i for i in pending if i not in flushed]
    if unfinished:
        raise RuntimeError(f"shards {unfinished} received fewer results than sent; rerun to resume")
