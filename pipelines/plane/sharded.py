"""Sharded work inside a run directory: input shards written once, and the run's figures as running
totals of its output parts' partial sums (counted once per part, in the manifest), so a resumed run
counts a part written before a crash from its file. The actors that write the parts are hosted by
`pipelines/plane/shard_host.py`.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from redline.cluster import fingerprints, storage
from redline.cluster.runs import Run
from redline.errors import RedlineError
from redline.pipelines.plane.table_index import write_index
from redline.pipelines.reporting import aggregates as A
from redline.pipelines.reporting.figures import Table

INPUT_DIR = "input"


def part_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


@dataclass(frozen=True)
class Source:
    """One source of a run's inputs (a corpus file, ...): `build()` yields its chunks as they are read;
    `size()`, how many rows they will be — asked (on a worker) only when several sources are read side
    by side, so that each read task knows its shard numbers before it writes one."""

    build: Callable[[], pa.Table | Iterable[pa.Table]]
    size: Callable[[], int] | None = None
    about: int | None = None  # about how many rows it yields, guessed before a row is read (None: no guess)


@dataclass(frozen=True)
class Inputs:
    """How a run's input shards are made, for a runner that reads them as it goes
    (`runner.run_pools(inputs=...)`): each source's chunks cut into shards of `shard_size` rows,
    `counts(chunk)` added up, `rows(shard)`: the work a shard is. One source is read by one task, its
    chunks in order; several (each with its `size`) by one task each, side by side, as many at once as
    the cluster holds: source k's shards are numbered after those of sources 0..k-1 and never hold
    another's rows."""

    sources: tuple[Source, ...]
    shard_size: int
    counts: Callable[[pa.Table], dict[str, Any]]
    rows: Callable[[pa.Table], int] = len

    @property
    def side_by_side(self) -> bool:
        return len(self.sources) > 1

    @property
    def foreseen_shards(self) -> int | None:
        """About how many shards the sources will make, from their `about` (None: a source has no guess)."""
        if any(s.about is None for s in self.sources):
            return None
        return sum(-(-s.about // self.shard_size) for s in self.sources)  # type: ignore[operator]


def first_shards(sizes: list[int], shard_size: int) -> list[int]:
    """The first shard number of each source read side by side, given its rows, then the shard count:
    a source's shards follow the shards of those before it."""
    firsts = [0]
    for rows in sizes:
        firsts.append(firsts[-1] - (-rows // shard_size))
    return firsts


def merge_reads(reads: list[dict[str, Any]]) -> dict[str, Any]:
    """What the read tasks of sources read side by side returned (`shards_written`, each with its
    `first` shard), as one read: rows per shard in shard order, counts added, every input's fingerprint."""
    reads = sorted(reads, key=lambda r: r.get("first", 0))
    merged: dict[str, Any] = {"rows": [], "counts": None, "inputs": {}, "reads": []}
    for r in reads:
        merged["rows"] += r["rows"]
        if r["counts"] is not None:
            merged["counts"] = add_counts(merged["counts"], r["counts"])
        merged["inputs"].update(r.get("inputs") or {})
        merged["reads"] += r.get("reads") or []
    return merged


def prepare_inputs(run: Run, build: Callable[[], pa.Table | Iterable[pa.Table]], shard_size: int,
                   counts: Callable[[pa.Table], dict[str, Any]], rows: Callable[[pa.Table], int] = len,
                   directory: str = INPUT_DIR, record: str | None = None) -> list[int]:
    """Input shards written once per run, and each shard's work (`rows(shard)`: the rows its actors
    take). `build` (reading the corpus, ...: one table, or its chunks as they are read, so that no
    process holds the whole corpus; `counts` of the chunks are added up) runs in a Ray task on a worker,
    so the driver never reads the corpus: it records the shard count, `counts(table)` and the
    rows per shard that the task returns. Resuming after every shard was written builds nothing.
    `directory`: where in the run the shards go; `record`: a second source of the same run (DiaSafety's
    pregenerated responses beside its contexts), recorded under that manifest key (shards, rows per
    shard, counts) instead of the run's inputs. (`run score` and `run attack` stream instead: the
    runner reads the shards as a Ray Data source, `sharded.Inputs`, and its pools take each shard
    as it is written.)"""
    written_before = inputs_written(run, directory, record)
    if written_before is not None:
        return written_before
    manifest = run.manifest
    n_shards = (manifest.get(record) or {}).get("shards") if record else manifest.get("input_shards")
    unseen = unseen_inputs(run)
    args = (run.dir.uri, n_shards, build, shard_size, counts, rows, unseen, directory)
    import ray

    from redline.cluster.runtime import check_placeable

    check_placeable("the task reading the inputs", 1)
    # max_calls=1: the worker process exits after, giving back the corpus' memory
    written = ray.get(ray.remote(num_cpus=1, max_calls=1, max_retries=2)(write_inputs).remote(*args))
    record_inputs(run, written, record)
    return written["rows"]


def inputs_written(run: Run, directory: str = INPUT_DIR, record: str | None = None) -> list[int] | None:
    """The rows per input shard when an earlier attempt wrote every shard (a resume reads nothing
    again), else None. `record`: a second source's manifest key (`prepare_inputs`)."""
    if record is not None:
        n_shards, per_shard = ((run.manifest.get(record) or {}).get(k) for k in ("shards", "rows"))
    else:
        n_shards, per_shard = run.manifest.get("input_shards"), run.manifest.get("input_rows")
    if n_shards is not None and per_shard is not None and len(per_shard) == n_shards:
        if len(storage.list_files(run.dir.path(directory), ".parquet")) == n_shards:
            return list(per_shard)
    return None


def unseen_inputs(run: Run) -> dict[str, dict[str, Any]]:
    """Inputs the driver cannot see (a corpus on the workers' disk): fingerprinted where they are read."""
    return {uri: fp for uri, fp in (run.manifest.get("inputs") or {}).items()
            if not storage.is_s3(uri) and not Path(uri).expanduser().exists()}


def record_inputs(run: Run, written: dict[str, Any], record: str | None = None) -> None:
    """What writing the input shards returned (`write_inputs`), in the run's manifest (`record`: under
    that key, a second source's)."""
    manifest = run.manifest
    manifest.setdefault("inputs", {}).update(written.get("inputs") or {})
    if record is not None:
        manifest[record] = {"shards": len(written["rows"]), "rows": written["rows"], "counts": written["counts"]}
        run.dir.write_manifest(manifest)
        return
    manifest["input_shards"], manifest["input_rows"] = len(written["rows"]), written["rows"]
    if written["counts"] is not None:
        manifest["counts"] = written["counts"]
    if written.get("reads"):  # sources read side by side: where and when each read ran
        manifest["input_reads"] = written["reads"]
    run.dir.write_manifest(manifest)


def write_inputs(run_uri: str, n_shards: int | None, build: Callable[[], pa.Table | Iterable[pa.Table]],
                 shard_size: int, counts: Callable[[pa.Table], dict[str, Any]], rows: Callable[[pa.Table], int],
                 unseen: dict[str, dict[str, Any]] | None = None, directory: str = INPUT_DIR) -> dict[str, Any]:
    """The input shards of a run (`shards_written`, to the end): the rows per shard, when built
    `counts(table)`, and the fingerprints of the `unseen` inputs."""
    shards = shards_written(run_uri, n_shards, build, shard_size, counts, rows, unseen, directory)
    while True:
        try:
            next(shards)
        except StopIteration as done:
            return done.value


def shards_written(run_uri: str, n_shards: int | None, build: Callable[[], pa.Table | Iterable[pa.Table]],
                   shard_size: int, counts: Callable[[pa.Table], dict[str, Any]], rows: Callable[[pa.Table], int],
                   unseen: dict[str, dict[str, Any]] | None = None,
                   directory: str = INPUT_DIR, first: int | None = None,
                   end: int | None = None) -> Generator[tuple[int, int], None, dict[str, Any]]:
    """Yields (shard, its rows) as each input shard is written: read back when an earlier attempt
    wrote all `n_shards`, else built and written now (the same rows in the same shard on every
    attempt, so a retried read rewrites the same files). Returns the rows per shard, when built
    `counts(table)`, and the fingerprints of the `unseen` inputs (the driver's node cannot see them)
    taken here, refusing one that changed since an earlier attempt recorded it. With `first` (one of
    several sources read side by side) the shards are numbered from `first` on, always built, up to
    `end` (the next source's first) exactly, and the return says `first`, where and how long the read ran."""
    check_visible(run_uri)
    started = time.time()
    parts = storage.list_files(storage.join(run_uri, directory), ".parquet")
    if first is None and n_shards is not None and len(parts) == n_shards:
        per_shard = [rows(storage.read_parquet(p)) for p in parts]
        for index, n in enumerate(per_shard):
            yield index, n
        return {"rows": per_shard, "counts": None}
    now = fingerprints.of(unseen or {})
    changed = [uri for uri, fp in (unseen or {}).items() if not fp.get("missing") and now[uri] != fp]
    if changed:
        raise RedlineError(f"input {changed[0]} changed since this run read it; pass --force to redo the run "
                           "(or restore the input)")
    built = build()
    chunks = [built] if isinstance(built, pa.Table) else built
    per_shard: list[int] = []
    total: dict[str, Any] | None = None
    held: list[pa.Table] = []

    base = first or 0

    def write(shard: pa.Table) -> tuple[int, int]:
        if end is not None and base + len(per_shard) >= end:
            raise _recounted()
        storage.write_parquet(shard, storage.join(run_uri, directory, part_name(base + len(per_shard))))
        per_shard.append(rows(shard))
        return base + len(per_shard) - 1, per_shard[-1]

    for chunk in chunks:  # a chunk at a time: a shard is written as soon as it is full
        total = add_counts(total, counts(chunk))
        held.append(chunk)
        while sum(t.num_rows for t in held) >= shard_size:
            table = pa.concat_tables(held)
            yield write(table.slice(0, shard_size))
            held = [table.slice(shard_size)]
    rest = pa.concat_tables(held) if held else None
    if rest is not None and rest.num_rows:
        yield write(rest)
    if first is None:
        return {"rows": per_shard, "counts": total, "inputs": now}
    if end is not None and first + len(per_shard) != end:  # fewer: the next source's shards would be misnumbered
        raise _recounted()
    read = {"first": first, "shards": len(per_shard), "host": socket.gethostname(), "started": round(started, 3),
            "seconds": round(time.time() - started, 3)}
    return {"rows": per_shard, "counts": total, "inputs": now, "first": first, "reads": [read]}


def _recounted() -> RedlineError:
    return RedlineError("an input holds a different number of rows than were counted before it was read (did "
                        "it change while the run read it?); rerun the same command")


def add_counts(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    """Two chunks' counts as one: numbers added, nested counts added key by key."""
    if a is None:
        return b
    out = dict(a)
    for key, value in b.items():
        mine = out.get(key)
        if isinstance(value, dict):
            out[key] = add_counts(mine if isinstance(mine, dict) else {}, value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(mine, (int, float)):
            out[key] = mine + value
        else:
            out[key] = value if mine is None else mine
    return out


def check_visible(run_uri: str) -> None:
    """This process's node sees the run directory the driver created (it reads and writes there)."""
    try:
        seen, why = storage.exists(storage.join(run_uri, "manifest.json")), ""
    except RedlineError as err:
        seen, why = False, f" ({err})"
    if not seen:
        raise RedlineError(f"this node cannot see the run directory {run_uri}{why}: on a cluster of several nodes, "
                           "put `output` where every node reaches it (s3://... or a shared filesystem)")


Part = tuple[int, ...]  # an output part: its shard (and pool, where a shard has several parts)


def count_figures(run: Run, tables: dict[str, Table], part: int | Part, rows: pa.Table) -> None:
    """Add an output part's partial sums for each of `tables` to the run's running totals."""
    count_partials(run, tables, part, {name: table.partials(rows) for name, table in tables.items()})


def count_partials(run: Run, tables: dict[str, Table], part: int | Part, partials: dict[str, A.Partials]) -> None:
    """Add an output part's partial sums (per table) to the run's running totals in its manifest (once
    per part: a part already counted is skipped), remembering where each group first appeared so the
    summary keeps the rows' order whatever order the parts finish in."""
    key = [part] if isinstance(part, int) else list(part)
    for name in tables:
        state = run.manifest.setdefault("partials", {}).setdefault(name, {"shards": [], "groups": []})
        if key in state["shards"]:
            continue
        groups = {tuple(g): (tuple(first), sums) for g, first, sums in state["groups"]}
        for position, (group, sums) in enumerate(partials[name].items()):
            first, total = groups.get(group, ((*key, position), {}))
            groups[group] = (min(first, (*key, position)), A.add(total, sums))
        state["groups"] = [[list(g), list(first), sums] for g, (first, sums) in groups.items()]
        state["shards"].append(key)


def run_partials(run: Run, tables: dict[str, Table], output_dir: str,
                 parts: dict[Part, str]) -> dict[str, A.Partials]:
    """The run's merged partial sums per table (groups in the rows' order); a part written but not
    yet counted (the run stopped between the two) is read back and counted now, alone."""
    counted = {t: {tuple(k) for k in run.manifest.get("partials", {}).get(t, {}).get("shards", [])} for t in tables}
    for part, name in parts.items():
        if any(tuple(part) not in counted[t] for t in tables):
            count_figures(run, tables, part, storage.read_parquet(run.dir.path(output_dir, name)))
    return {name: manifest_partials(run.manifest, name) for name in tables}


def manifest_partials(manifest: dict[str, Any], table: str = "summary") -> A.Partials:
    """A finished run's merged partial sums of one table, as its manifest keeps them (groups in the
    rows' order)."""
    groups = sorted(manifest.get("partials", {}).get(table, {}).get("groups", []), key=lambda g: tuple(g[1]))
    return {tuple(g): sums for g, _, sums in groups}


def shard_summary(run: Run, tables: dict[str, Table], output_dir: str,
                  parts: dict[Part, str]) -> dict[str, list[dict[str, Any]]]:
    """Each table's summary rows from the run's running totals (see `run_partials`); `parts`: every
    output part of the run (its key and file name)."""
    partials = run_partials(run, tables, output_dir, parts)
    return {name: table.rows(partials[name]) for name, table in tables.items()}


def index_output(run: Run, output_dir: str, then: Callable[[str], Any] | None = None, per_text: bool = False) -> Any:
    """Write the index of the run's finished output parts (`pipelines/plane/table_index.py`: what a viewer
    plans a page from) in a task on a worker, which reads every part once; returns how many parts,
    or with `then`, what `then(run_uri)` returns, run in the same task (a worker's start-up is
    about a second: one task, not two). `per_text`: the parts are predictions by shard and detector,
    and their per-text view (`pipelines/plane/per_text.py`) gets its index too."""
    from redline.cluster.runtime import on_a_worker

    return on_a_worker(_index_then, run.dir.uri, output_dir, then, per_text, num_cpus=0.5)


def _index_then(run_uri: str, output_dir: str, then: Callable[[str], Any] | None, per_text: bool) -> Any:
    parts = write_index(run_uri, output_dir)
    if per_text:
        from redline.pipelines.plane.per_text import write_index as write_per_text_index

        try:
            write_per_text_index(run_uri, output_dir)
        except RedlineError:  # a shard the view cannot join (no rows): the viewer joins shards when asked
            pass
    return parts if then is None else then(run_uri)
