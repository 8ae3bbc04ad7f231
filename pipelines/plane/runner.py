"""The runner every pipeline's rows go through: one Ray Data plan per stage (`run_pools`, or
`run_chain` for steps one behind the other), in which each call of a pool's actor
(`map_batches(ShardHost)` on an autoscaling `ActorPoolStrategy`, `pipelines/plane/shard_host.py`) is one
whole input shard. The driver receives one small summary row per shard and part (its partial sums as
JSON), adds them to the run's manifest and feeds the progress bar: no row of the corpus or of the
results passes through it. With `inputs`, the plan's own read task writes the input shards and the
pools take each as it is written (`pipelines/plane/input_source.py`). Resume is by part: a part written is
a shard done for its pool (`done_parts`), never a list of ids.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redline.cluster import storage
from redline.cluster.progress import progress_bar
from redline.cluster.runs import Run
from redline.cluster.runtime import check_placeable, ensure_ray
from redline.errors import RedlineError
from redline.pipelines.plane import sharded
from redline.pipelines.plane.shard_host import READ, SUMMARY_SCHEMA, ShardHost, ShardWork, host_once
from redline.pipelines.plane.sharded import Inputs
from redline.pipelines.reporting import aggregates as A

MANIFEST_EVERY_S = 5.0
@dataclass(frozen=True)
class Pool:
    """One actor pool: its row worker (a class with `output_schema`, called with numpy batches) and
    its resources; `pending`: the shards it has yet to write. `actors` start at once; the pool grows
    up to `max_actors` (None: as many as the cluster has room for) while shards wait, never beyond
    the shards pending. `what`: its actors as an error names them (default: by the worker class).
    Without a worker (`worker` None: the part is the shard's rows as `work.assemble` makes them, no
    model call) a pool is best one of another pool's `then`: the host of the step before makes its
    part from the rows it has just written, in the same call (a Ray Data operator of its own waited
    ~10 s for room beside the chain's actors on 2 CPUs); alone, each shard is a Ray Data task."""

    work: ShardWork
    worker: type | None
    worker_kwargs: dict[str, Any]
    actors: int
    num_cpus: float
    num_gpus: float
    pending: list[int] | None
    max_actors: int | None = None
    what: str | None = None
    tag: int | None = None
    takes: int = READ
    then: tuple["Pool", ...] = ()  # worker-less pools its host runs on each part it has just made, in turn

    @property
    def id(self) -> int:
        """The pool's number in the plan's summary rows: `tag`, or its parts' pool (`work.pool`).
        Steps of one chain write parts as pool 0 each, in rooms of their own, and are told apart by tag."""
        return self.work.pool if self.tag is None else self.tag

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


def pending(run: Run, output_dir: str, n_shards: int, pool: int) -> list[int]:
    """The shards whose part from `pool` is not written yet."""
    done = done_parts(run, output_dir, pool)
    return [i for i in range(n_shards) if i not in done]


def done_parts(run: Run, output_dir: str, pool: int) -> frozenset[int]:
    """The shards `pool` has written a part for."""
    names = [uri.rsplit("/", 1)[-1] for uri in storage.list_files(run.dir.path(output_dir), ".parquet")]
    if any(re.fullmatch(r"part-\d{5}\.parquet", name) for name in names):
        # one part per shard, written by the driver: resuming on top would hold some rows twice
        raise RedlineError(f"{run.dir.path(output_dir)} holds parts written by an earlier redline (one per shard); "
                           "rerun with --force to redo the run")
    mine = re.compile(rf"part-(\d+)-{pool}\.parquet")
    return frozenset(int(m.group(1)) for m in map(mine.fullmatch, names) if m)


def run_pools(run: Run, pools: list[Pool], shard_rows: list[int] | None, *, label: str, verbose: bool = False,
              unit: str = "rows", note: Callable[[Run], str] | None = None, total: int | None = None,
              inputs: Inputs | None = None) -> dict[int, PoolUse]:
    """Every pool's pending shards through its actors, the pools side by side; each part's partial
    sums are added to the run's manifest as its summary arrives (`note(run)`: running figures for the
    progress line; `total`: the rows the bar counts to, when `shard_rows` is not known). Returns what
    each pool spent.

    With `inputs` (the input shards are not all written yet; `shard_rows` None, each pool's `pending`
    None: every shard but those it has a part for), the same plan reads them: the read task writes
    each shard and the pools take it at once, chained (each shard through every pool in turn), when
    the cluster holds the read and every pool's least actors at once; else the read runs to its end
    first and the pools take turns as above. The manifest records the shards when the read ends."""
    busy = {p.id: PoolUse() for p in pools}
    ensure_ray(verbose=verbose)
    if inputs is not None:
        done = {p.id: done_parts(run, p.work.output_dir, p.work.pool) for p in pools}
        firsts = None
        if inputs.side_by_side:
            check_layout(run, done)
            firsts = _first_shards(inputs)
        shards = inputs.foreseen_shards if firsts is None else firsts[-1]
        chained = _beside_the_read(pools, shards)
        source = _read(run, inputs, firsts)
        _drive(run, source, chained, done, busy, label=label if chained else "reading the inputs", unit=unit,
               note=note, total=total or 0, streaming=True, shards=shards, exact=firsts is not None,
               reads=len(firsts or [0, 0]) - 1)
        if chained:
            return busy
        shard_rows = run.manifest["input_rows"]
        pools = [p if p.pending is not None else dataclasses.replace(
            p, pending=[i for i in range(len(shard_rows)) if i not in done[p.id]]) for p in pools]
    assert shard_rows is not None
    pools = [p for p in pools if p.pending]
    if not pools:
        return busy
    _recount_if_gone(run, pools)
    if total is None:
        total = sum(shard_rows[i] for p in pools for i in p.pending or [])
    _drive(run, plan(pools), pools, {}, busy, label=label, unit=unit, note=note, total=total, streaming=False)
    return busy


def run_chain(run: Run, pools: list[Pool], n_shards: int, *, label: str, verbose: bool = False) -> dict[int, PoolUse]:
    """The pools one behind the other in one plan, every pool's actors started at once: the first takes
    shards 0..n_shards-1, each next one (`takes`: the one before's tag) a shard as soon as the one
    before wrote its part. A pool skips the shards it has a part for but still passes them on; a shard
    a pool failed on goes no further (a rerun asks it again). The bar counts parts to write."""
    every = with_followers(pools)
    busy = {p.id: PoolUse() for p in every}
    ensure_ray(verbose=verbose)
    done = {p.id: done_parts(run, p.work.output_dir, p.work.pool) for p in every}
    todo = sum(n_shards - len(done[p.id]) for p in every)
    if not todo:
        return busy
    _recount_if_gone(run, [dataclasses.replace(p, pending=[i for i in range(n_shards) if i not in done[p.id]])
                           for p in every])
    markers = blocks([{"shard": i, "pool": READ, "rows": 0, "seconds": 0.0, "host": "", "partials": None, "failed": 0,
                       "failure": None} for i in range(n_shards)])
    _drive(run, markers, pools, done, busy, label=label, unit="parts", note=None, total=todo, streaming=True,
           shards=n_shards, read=False)
    return busy


def with_followers(pools: list[Pool]) -> list[Pool]:
    """The pools and, after each, the worker-less pools its host runs (`Pool.then`)."""
    return [q for p in pools for q in (p, *p.then)]


def _recount_if_gone(run: Run, pools: list[Pool]) -> None:
    """A pending part counted before is gone (deleted by hand): every part is recounted from its file."""
    counted = run.manifest.get("partials", {})
    if any([i, p.work.pool] in counted.get(name, {}).get("shards", []) for p in pools for i in p.pending or []
           for name in p.work.figures):
        for name in {name for p in pools for name in p.work.figures}:
            counted.pop(name, None)


def _drive(run: Run, stream: Any, pools: list[Pool], done: dict[int, frozenset[int]], busy: dict[int, PoolUse], *,
           label: str, unit: str, note: Callable[[Run], str] | None, total: int, streaming: bool,
           shards: int | None = None, exact: bool = True, read: bool = True, reads: int = 1) -> None:
    """Run the plan `stream` (ending in `pools`, placement checked first; `streaming`: the pools chained
    behind it) and take its rows: each summary's partial sums into the manifest, each marker's shard
    into the bar's total (behind the input source, `read`: what each of its `reads` read tasks left in
    the run, together, records the input shards). With `unit` "parts" the bar counts parts written, else rows."""
    for p in pools:
        check_placeable(p.what or (f"each {p.worker.__name__} actor" if p.worker else f"each task of {p.work.output_dir}"),
                        p.num_cpus, p.num_gpus)
    if streaming:
        stream = chain(stream, pools, shards=shards, done=done, exact=exact)
    figures = {p.id: p.work.figures for p in with_followers(pools)}
    part_pool = {p.id: p.work.pool for p in with_followers(pools)}  # the pool its parts are named and counted by
    saved = time.monotonic()
    with progress_bar(label, total=total, unit=unit) as advance:
        for batch in stream.iter_batches(batch_size=None, batch_format="pyarrow"):
            for row in batch.to_pylist():
                if row["pool"] == READ:
                    if not pools:
                        advance(row["rows"], more=row["rows"])
                    else:  # each pool without a part for it takes the shard
                        advance(0, more=row["rows"] * sum(row["shard"] not in done.get(p.id, ()) for p in pools))
                    continue
                if row["partials"] is None and not row["failed"]:
                    continue  # a part written before: counted from its file, passed on for the next step
                use = busy[row["pool"]]
                use.seconds, use.rows = use.seconds + row["seconds"], use.rows + row["rows"]
                use.hosts.add(row["host"])
                if row["failed"]:  # a part not written: not counted, asked again by a rerun
                    use.failed += row["failed"]
                    use.failure = use.failure or row["failure"]
                else:
                    partials = {name: A.from_json(part) for name, part in json.loads(row["partials"]).items()}
                    sharded.count_partials(run, figures[row["pool"]], (row["shard"], part_pool[row["pool"]]), partials)
                advance(1 if unit == "parts" else row["rows"], note(run) if note is not None else None)
            # the running totals reach the manifest every few seconds: a part counted after the last
            # save is counted again from its file on resume (sharded.run_partials), never lost; with
            # them the bar's own figures, which `redline view` shows as the step's rate and time left
            if time.monotonic() - saved > MANIFEST_EVERY_S:
                run.manifest["progress"] = {"step": label, "unit": unit, **advance.pace.figures()}
                run.dir.write_manifest(run.manifest)
                saved = time.monotonic()
    run.manifest.pop("progress", None)
    if streaming and read:
        from redline.pipelines.plane.input_source import read_result_uri

        uris = [read_result_uri(run.dir.uri, k) for k in range(reads)]
        written = [storage.read_json(uri) for uri in uris if storage.exists(uri)]
        if len(written) != reads:
            raise RuntimeError(f"{reads - len(written)} of the input source's {reads} read tasks ended without "
                               "their result")
        sharded.record_inputs(run, written[0] if reads == 1 else sharded.merge_reads(written))
    run.dir.write_manifest(run.manifest)


def _beside_the_read(pools: list[Pool], shards: int | None) -> list[Pool]:
    """The pools sized to start beside the read task: a pool whose actors would leave it no CPU
    starts with fewer (at least one; it grows back to its size once the read is done: its
    `max_actors` is at least its `actors`). None of them fit, or a small run (`shards` foreseen, no
    more than two per actor) would need to shrink one: [] (the read runs first: a short read, and no
    pool short of an actor for the whole short run, its shards taken before it could grow). [] too
    where the guess says tasks host every pool (`as_tasks`): they are chosen on the shards counted
    after the read, never on a guess (a guess too low would load a model once per shard of many)."""
    import ray

    if all(as_tasks(p, shards) for p in pools):
        return []
    have = ray.cluster_resources()
    if sum(p.actors * p.num_gpus for p in pools) > have.get("GPU", 0) + 1e-9:  # pools taking turns on GPUs
        return []
    sizes = [p.actors for p in pools]
    while 1 + sum(n * p.num_cpus for n, p in zip(sizes, pools)) > have.get("CPU", 0) + 1e-9:
        if in_flight(shards, sum(p.actors for p in pools)) == 1:  # a small run
            return []
        k = max(range(len(pools)), key=lambda j: (sizes[j] - 1) * pools[j].num_cpus)
        if sizes[k] == 1:
            return []
        sizes[k] -= 1
    return [dataclasses.replace(p, pending=None, actors=n, max_actors=None if p.max_actors is None else
                                max(p.actors, p.max_actors)) for n, p in zip(sizes, pools)]


PER_SOURCE = "per source"  # the manifest's `input_layout` when sources are cut into shards side by side


def check_layout(run: Run, done: dict[int, frozenset[int]]) -> None:
    """Sources read side by side are cut into shards per source (`sharded.first_shards`); before
    2026-11-28 redline cut several corpora as one stream. A run whose parts were written under the
    other numbering must not take them as done (rows would be lost or held twice): refused, one line.
    Records the layout before the first part is written."""
    if run.manifest.get("input_layout") == PER_SOURCE:
        return
    if any(done.values()):
        raise RedlineError(f"{run.dir.uri} was started by an earlier redline, which cut its corpora into shards "
                           "another way, and stopped before it had read them all; rerun with --force to redo the run")
    run.manifest["input_layout"] = PER_SOURCE
    run.dir.write_manifest(run.manifest)


def _first_shards(inputs: Inputs) -> list[int]:
    """Each source's first shard number, then the shard count, from the sources' rows counted on the
    workers (one task per source, side by side; the driver reads no corpus)."""
    import ray

    check_placeable("the tasks counting the inputs' rows", 1)
    count = ray.remote(num_cpus=1, max_retries=2)(_size)
    return sharded.first_shards(ray.get([count.remote(s) for s in inputs.sources]), inputs.shard_size)


def _size(source: sharded.Source) -> int:
    if source.size is None:
        raise RuntimeError("a source read beside others needs its size")
    return source.size()


def _read(run: Run, inputs: Inputs, firsts: list[int] | None) -> Any:
    """The plan's source: the read tasks writing the run's input shards (`pipelines/plane/input_source.py`):
    one, or with `firsts` one per source, each given a CPU, run as many at once as the cluster holds."""
    import ray.data

    from redline.pipelines.plane.input_source import InputShards, read_result_uri

    check_placeable("the task reading the inputs", 1)
    for k in range(len(firsts or [0, 0]) - 1):  # an earlier attempt's: the driver reads this run's
        storage.remove(read_result_uri(run.dir.uri, k))
    source = InputShards(run.dir.uri, inputs, run.manifest.get("input_shards"), sharded.unseen_inputs(run),
                         SUMMARY_SCHEMA, firsts)
    # The read streams (a few shards held at once), so its worker process may stay: the task that
    # indexes the run's parts after the plan then starts in it at once instead of in a new process
    # (the pool's actors take the idle workers; a new one costs 1-2 s of a small run).
    return ray.data.read_datasource(source, override_num_blocks=len(firsts or [0, 0]) - 1, num_cpus=1)


def in_flight(shards: int | None, actors: int) -> int:
    """Shards an actor holds at once: two, so it never waits on the scheduler between shards (one
    in flight made `run score` at 1M rows 5-14% slower); one when the run has no more than two shards
    per actor (`shards`: known or foreseen), or the first actor up takes two of the few shards while
    the others are a moment from ready (Ray Data hands queued shards only to actors already up)."""
    return 1 if shards is not None and shards <= 2 * max(actors, 1) else 2


SMALL_POOLS_AS_TASKS = True  # False: every pool on actors (`bench/small_pools.py`'s baseline)


def as_tasks(p: Pool, shards: int | None) -> bool:
    """Whether pool `p` hosts its `shards` in Ray Data tasks rather than actors: a pool on CPUs whose
    every actor would host one shard at most. An actor is a process of its own, started for it (its
    libraries imported again: ~4-5 s for a torch model on 2 cores); a task runs in one of the job's
    task processes, which Ray keeps and reuses, so after the first a small step pays only its model's
    load, which an actor hosting one shard pays as well."""
    return (SMALL_POOLS_AS_TASKS and p.worker is not None and not p.num_gpus and shards is not None
            and 0 < shards <= p.actors)


def _hosted(stream: Any, p: Pool, *, least: int, most: int | None, in_flight: int, batch_size: int | None,
            done: frozenset[int] = frozenset(), then_done: dict[int, frozenset[int]] | None = None,
            tasks: bool = False) -> Any:
    """`stream` through pool `p`'s actors: `map_batches(ShardHost)` on an autoscaling actor pool of
    `least` to `most` actors (None: as many as the cluster has room for), each holding `in_flight`
    calls; a pool without a worker: one Ray Data task per call."""
    import ray.data

    kwargs = {"work": p.work, "worker": p.worker, "worker_kwargs": p.worker_kwargs, "done": done, "tag": p.id,
              "takes": p.takes, "then": tuple((q.work, q.id, (then_done or {}).get(q.id, frozenset())) for q in p.then)}
    if p.worker is None or tasks:
        return stream.map_batches(host_once, fn_kwargs=kwargs, batch_size=batch_size, batch_format="numpy",
                                  num_cpus=p.num_cpus)
    return stream.map_batches(
        ShardHost, fn_constructor_kwargs=kwargs,
        compute=ray.data.ActorPoolStrategy(min_size=least, max_size=most, max_tasks_in_flight_per_actor=in_flight),
        batch_size=batch_size, batch_format="numpy", num_cpus=p.num_cpus, num_gpus=p.num_gpus or None)


def chain(stream: Any, pools: list[Pool], *, shards: int | None, done: dict[int, frozenset[int]],
          exact: bool = True) -> Any:
    """The pools one behind the other after the read `stream`, each taking the shards it has not `done`
    (`shards`: how many, or with `exact` False the sources' guess). One marker row per call (Ray Data
    also insists on a batch size where a pool asks for GPUs)."""
    for p in pools:
        todo = shards - len(done.get(p.id, ())) if shards is not None and exact else None
        stream = _hosted(stream, p, least=p.actors, most=p.max_actors, in_flight=in_flight(shards, p.actors),
                         batch_size=1, done=done.get(p.id, frozenset()), then_done=done, tasks=as_tasks(p, todo))
    stream.context.target_max_block_size = 1  # a shard's marker reaches the pools as soon as it is written
    return stream


def blocks(rows: list[dict[str, Any]]) -> Any:
    """A small plan source, one row per block, built on the driver: `from_items`, since `from_arrow`
    runs a Ray task per table for its metadata (~1 s of a run's first plan)."""
    import ray.data

    return ray.data.from_items(rows, override_num_blocks=len(rows))


def plan(pools: list[Pool]) -> Any:
    """One Ray Data plan for the pools side by side: per pool, its pending shard numbers (one block
    each) through `map_batches(ShardHost)` on an autoscaling actor pool (`ActorPoolStrategy`: its
    `actors` at least, up to `max_actors` while shards wait and the cluster has room), the pools'
    branches unioned into one stream of summary rows. One executor schedules every pool, so a pool
    whose actors cannot start yet holds no work, and one that is done gives its resources back."""
    branches = []
    for p in pools:
        least, most = p.sizes
        shards = blocks([{"shard": i} for i in p.pending or []])
        branches.append(_hosted(shards, p, least=least, most=most, in_flight=in_flight(len(p.pending or []), most),
                                batch_size=1, tasks=as_tasks(p, len(p.pending or []))))
    return branches[0] if len(branches) == 1 else branches[0].union(*branches[1:])
