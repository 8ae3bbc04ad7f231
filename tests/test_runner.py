"""The runner every pipeline's workers run on (`pipelines/plane/shard_host.py`: one Ray Data plan, each
shard one call of an autoscaling actor pool): every shard comes back once, the pool grows while
shards wait, a killed actor is replaced and its shard redone, pools side by side take turns on a
cluster too small for all, and a user error raised in a worker's constructor reaches the caller as
that error."""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from redline.errors import RedlineError, unwrap_user_error

pytestmark = pytest.mark.usefixtures("by_value")


@pytest.fixture(scope="module")
def by_value(ray_session):
    # Ray workers cannot import test modules; ship these worker classes by value.
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


class Doubler:
    """Doubles `x`; sleeps `delay` per batch; with `die`, the first call of the run kills its process
    (a lost worker) once, marked by that file; with `stagger` (a folder), the actors after the first
    are up later; with `gate` (a folder), each actor's first call signs
    in there and waits (at most a minute) until a second actor has: a pool that never grows fails,
    however slow the machine, and one that grows goes on at once."""

    input_columns = ["id", "x"]
    output_schema = pa.schema([("id", pa.string()), ("y", pa.int64()), ("pid", pa.int64())])

    def __init__(self, delay: float = 0.0, die: str | None = None, gate: str | None = None,
                 stagger: str | None = None) -> None:
        self.delay, self.die, self.gate = delay, die, gate
        if stagger:  # a folder: every actor but the first to start is up 1.5 s after it
            open(os.path.join(stagger, str(os.getpid())), "x").close()
            if len(os.listdir(stagger)) > 1:
                time.sleep(1.5)

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        if self.die and not os.path.exists(self.die):
            open(self.die, "w").close()
            os._exit(1)
        if self.gate:
            open(os.path.join(self.gate, str(os.getpid())), "w").close()
            deadline = time.monotonic() + 60
            while len(os.listdir(self.gate)) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            self.gate = None
        time.sleep(self.delay)
        return pa.table({"id": [str(i) for i in batch["id"]], "y": batch["x"] * 2,
                         "pid": np.full(len(batch["x"]), os.getpid())}, schema=self.output_schema)


class Refuses:
    input_columns = ["id"]
    output_schema = pa.schema([("id", pa.string())])

    def __init__(self) -> None:
        raise RedlineError("victim model 'nope' not found")

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        raise AssertionError("never called")


def _doubled(tmp_path, worker_kwargs=None, *, shards: int = 12, actors: int = 1, max_actors: int | None = None,
             num_cpus: float = 0.5, pools: int = 1):
    """`shards` shards of 10 rows through `pools` Doubler pools; returns the run, each pool's use and its rows."""
    from redline.cluster import storage
    from redline.pipelines.plane import runner, shard_host

    run = _run(tmp_path, "doubled")
    n = _shards(run, pa.table({"id": [f"r{i}" for i in range(shards * 10)], "x": list(range(shards * 10))}), 10)

    def joined(shard, results):
        return shard.append_column("y", results.column("y")).append_column("pid", results.column("pid"))

    work = [shard_host.ShardWork(run.dir.uri, "out", k, lambda s: s.select(["id", "x"]), joined, {}, 5)
            for k in range(pools)]
    use = runner.run_pools(run, [runner.Pool(w, Doubler, worker_kwargs or {}, actors, num_cpus, 0.0,
                                                     list(range(n)), max_actors=max_actors) for w in work],
                               [10] * n, label="doubling")
    rows = [pa.concat_tables([storage.read_parquet(run.dir.path("out", shard_host.output_part(i, k)))
                              for i in range(n)]) for k in range(pools)]
    return run, use, rows


def test_every_shard_comes_back_once_through_the_plan(ray_session, tmp_path):
    _, use, [rows] = _doubled(tmp_path, actors=2, max_actors=2)
    assert rows.column("y").to_pylist() == [2 * x for x in range(120)]
    assert use[0].rows == 120 and use[0].failed == 0


def test_the_pool_grows_while_shards_wait_and_the_cluster_has_room(ray_session, tmp_path):
    (tmp_path / "gate").mkdir()
    _, use, [rows] = _doubled(tmp_path, {"gate": str(tmp_path / "gate")}, actors=1, max_actors=3, shards=16)
    assert rows.column("y").to_pylist() == [2 * x for x in range(160)]
    assert use[0].actors >= 2, use[0].hosts  # started with one, grew


def test_a_killed_actor_is_replaced_and_its_shard_redone(ray_session, tmp_path):
    _, use, [rows] = _doubled(tmp_path, {"die": str(tmp_path / "died")}, actors=2, max_actors=2)
    assert (tmp_path / "died").exists()
    assert rows.column("y").to_pylist() == [2 * x for x in range(120)]  # every row once, none lost


def test_pools_asking_more_than_the_cluster_has_take_turns(ray_session, tmp_path):
    """Three pools of 1-CPU actors on 2 CPUs: every pool finishes (one waits for another's CPUs)."""
    _, use, rows = _doubled(tmp_path, {"delay": 0.05}, actors=1, max_actors=1, num_cpus=1.0, pools=3, shards=4)
    assert [r.column("y").to_pylist() for r in rows] == [[2 * x for x in range(40)]] * 3


def test_the_manifest_holds_the_bars_own_rate_and_time_left_while_the_step_runs(ray_session, tmp_path, monkeypatch):
    """What `redline view` shows as a running step's rate and time left is what the driver's progress
    line computes (one definition), saved with the counts; gone once the step ends."""
    from redline.cluster.runs import RunDir
    from redline.pipelines.plane import runner

    monkeypatch.setattr(runner, "MANIFEST_EVERY_S", 0.0)
    saved: list[dict] = []
    write = RunDir.write_manifest
    monkeypatch.setattr(RunDir, "write_manifest", lambda self, m: (saved.append(dict(m.get("progress") or {})),
                                                                    write(self, m))[1])
    run, _, _ = _doubled(tmp_path, {"delay": 0.05}, actors=1, max_actors=1, shards=6)
    live = [p for p in saved if p]
    assert live and all(p["step"] == "doubling" and p["unit"] == "rows" and p["total"] == 60 for p in live)
    assert [p["done"] for p in live] == sorted(p["done"] for p in live) and live[-1]["done"] >= 50
    assert any(p["rate"] and p["eta_s"] is not None for p in live)  # from the second part on
    assert "progress" not in run.manifest and saved[-1] == {}


def test_a_small_run_gives_each_of_its_few_shards_a_host_of_its_own(ray_session, tmp_path):
    """Two shards, two actors' worth, the second host up 1.5 s after the first: the first takes one
    shard, not both (the sources' guess says the run is small: the read runs first, then two tasks take
    the two shards counted, at once). The gate holds each host's first call until the other has signed
    in: one host taking both shards fails here (after the gate's minute), on any machine."""
    from redline.cluster import storage
    from redline.pipelines.plane import runner, shard_host, sharded

    (tmp_path / "gate").mkdir()
    (tmp_path / "stagger").mkdir()
    run = _run(tmp_path, "read-as-it-goes")
    table = pa.table({"id": [f"r{i}" for i in range(20)], "x": list(range(20))})
    work = shard_host.ShardWork(run.dir.uri, "out", 0, lambda s: s.select(["id", "x"]),
                                lambda s, r: s.append_column("pid", r.column("pid")), {}, 5)
    pool = runner.Pool(work, Doubler, {"gate": str(tmp_path / "gate"), "stagger": str(tmp_path / "stagger")},
                           2, 0.5, 0.0, None, max_actors=2)
    source = sharded.Source(lambda: table, about=20)  # the sources' guess of their rows
    runner.run_pools(run, [pool], None, label="doubling",
                         inputs=sharded.Inputs((source,), 10, lambda t: {"rows": t.num_rows}))
    pids = [set(storage.read_parquet(run.dir.path("out", shard_host.output_part(i, 0))).column("pid").to_pylist())
            for i in range(2)]
    assert len(pids[0] | pids[1]) == 2, pids


def test_a_pool_asking_for_a_gpu_is_a_plan_ray_data_accepts(ray_session, tmp_path):
    # On an H200 every GPU run failed before any row moved: Ray Data refuses `map_batches` with
    # `num_gpus` and no batch size. Building both plans (behind the read, and from a shard list) is
    # where it refuses, so this needs no GPU.
    import ray.data

    from redline.pipelines.plane import runner, shard_host

    run = _run(tmp_path, "gpu")
    work = shard_host.ShardWork(run.dir.uri, "out", 0, lambda s: s, lambda s, r: s, {}, 5)
    pool = runner.Pool(work, Doubler, {}, 1, 1.0, 1.0, [0, 1])
    markers = ray.data.from_items([{"shard": 0, "pool": -1}])
    assert runner.chain(markers, [pool], shards=2, done={}) is not None
    assert runner.plan([pool]) is not None


@pytest.mark.parametrize("rows", [2, 1], ids=["one shard: a task", "two shards: an actor"])
def test_constructor_user_error_reaches_the_caller(ray_session, tmp_path, rows):
    from redline.pipelines.plane.steps import run_step

    run = _run(tmp_path, "refused")
    n = _shards(run, pa.table({"id": ["a", "b"]}), rows)
    with pytest.raises(Exception) as err:
        run_step(run, _step(Refuses, {}), "input", "work/refused", n)
    user = unwrap_user_error(err.value)
    assert user is not None and "victim model 'nope' not found" in str(user)


class _Made:
    """Notes each time it is made (a model load) in `log`: its process and whether that is an actor's."""

    input_columns = ["id"]
    output_schema = pa.schema([("id", pa.string())])

    def __init__(self, log: str) -> None:
        import ray

        with open(log, "a") as f:
            f.write(f"{os.getpid()} {'actor' if ray.get_runtime_context().get_actor_id() else 'task'}\n")

    def __call__(self, batch):
        return pa.table({"id": [str(i) for i in batch["id"]]}, schema=self.output_schema)


def test_a_small_pool_on_cpus_is_hosted_by_tasks_that_load_its_worker_once_per_shard(ray_session, tmp_path):
    """A pool on CPUs whose every actor would host one shard at most runs in Ray Data tasks (Ray keeps a
    job's task processes and reuses them, where each actor is a new process importing its libraries
    again); a task loads its worker only for a shard of its own, never for the rows a chain passes
    through it. More shards than actors, or a GPU, and the pool keeps its actors."""
    from redline.cluster.config import ActorPoolSize
    from redline.pipelines.plane import runner, shard_host
    from redline.pipelines.plane.steps import run_step, run_steps

    work = shard_host.ShardWork("/nowhere", "out", 0, lambda s: s, lambda s, r: s, {}, 5)
    pool = runner.Pool(work, _Made, {}, 2, 0.5, 0.0, [0, 1])
    assert [runner.as_tasks(pool, n) for n in (0, 1, 2, 3, None)] == [False, True, True, False, False]
    assert not runner.as_tasks(runner.Pool(work, _Made, {}, 2, 0.5, 1.0, [0]), 1)  # a GPU: actors
    assert not runner.as_tasks(runner.Pool(work, None, {}, 2, 0.5, 0.0, [0]), 1)  # no worker: a task anyway

    run = _run(tmp_path, "small")
    n = _shards(run, pa.table({"id": ["a", "b", "c"]}), 3)
    logs = [tmp_path / f"{k}.log" for k in range(3)]
    run_steps(run, [(_step(_Made, {"log": str(logs[0])}), "work/first"),
                    (_step(_Made, {"log": str(logs[1])}), "work/second"),
                    (_step(_Made, {"log": str(logs[2])}), "work/third")], "input", n, label="three steps")
    made = [log.read_text().split() for log in logs]
    assert all(len(m) == 2 and m[1] == "task" for m in made), made  # once each, in a task: one shard each

    more = tmp_path / "more.log"
    n = _shards(run, pa.table({"id": ["a", "b", "c"]}), 1)
    run_step(run, _step(_Made, {"log": str(more)}, size=ActorPoolSize(actors=1, max_actors=1)), "input", "work/more", n)
    assert more.read_text().split()[1::2] == ["actor"]  # three shards, one actor: made once, in it


class _CudnnLike:
    input_columns = ["id"]
    output_schema = pa.schema([("id", pa.string())])

    def __init__(self) -> None:
        pass

    def __call__(self, batch):
        raise RuntimeError("cudnn RNN backward can only be called in training mode\nmore detail")


def _run(tmp_path, name: str):
    from redline.cluster.runs import Run, RunDir

    run = RunDir(str(tmp_path / name))
    run.write_manifest({"state": "running"})
    return Run(run, {"state": "running"}, reused=False)


def _step(worker, kwargs, **over):
    from redline.cluster.config import ActorPoolSize
    from redline.pipelines.plane.steps import Step

    size = over.pop("size", ActorPoolSize())
    return Step(worker.__name__, worker, kwargs, size, worker.__name__, **{"num_cpus": 0.25, **over})


def _shards(run, table: pa.Table, size: int) -> int:
    from redline.cluster import storage

    for i in range(0, table.num_rows, size):
        storage.write_parquet(table.slice(i, size), run.dir.path("input", f"part-{i // size:05d}.parquet"))
    return -(-table.num_rows // size)


@pytest.mark.parametrize("rows", [2, 1], ids=["one shard: a task", "two shards: an actor"])
def test_a_failed_actor_is_recorded_by_its_cause_not_rays_wrapping(ray_session, tmp_path, rows):
    """The manifest's error is the cause in one line, never the actor's (or task's) name in terminal colours."""
    from redline.cluster.runs import lifecycle
    from redline.errors import cause_line
    from redline.pipelines.plane.steps import run_step

    run = _run(tmp_path, "run")
    n = _shards(run, pa.table({"id": ["a", "b"]}), rows)
    with pytest.raises(Exception) as info:
        run_step(run, _step(_CudnnLike, {}), "input", "work/cudnn", n)
    line = cause_line(info.value)
    assert line == "RuntimeError: cudnn RNN backward can only be called in training mode", line
    with pytest.raises(Exception), lifecycle(run):
        run_step(run, _step(_CudnnLike, {}), "input", "work/cudnn", n)
    assert run.manifest["state"] == "failed" and run.manifest["error"] == line


class _Answers:
    """Answers each text, except `down` ones while `outage` exists; logs every text it is asked."""

    input_columns = ["id", "text"]
    output_schema = pa.schema([("id", pa.string()), ("answer", pa.string())])

    def __init__(self, log: str, outage: str) -> None:
        self.log, self.outage = log, outage

    def __call__(self, batch):
        texts = [str(t) for t in batch["text"]]
        with open(self.log, "a") as f:
            f.writelines(t + "\n" for t in texts)
        down = os.path.exists(self.outage)
        answers = ["error" if down and t.startswith("down") else t.upper() for t in texts]
        return pa.table({"id": [str(i) for i in batch["id"]], "answer": answers}, schema=self.output_schema)


def _failed_answers(rows: pa.Table) -> pa.Array:
    return pc.if_else(pc.equal(rows.column("answer"), "error"), pa.scalar("the service is down"),
                      pa.scalar(None, pa.string()))


def _kept_odd(rows: pa.Table) -> pa.Table:
    keep = pc.equal(pc.bit_wise_and(rows.column("other"), 1), 1)
    return rows.append_column("kept", keep).append_column(
        "reject_reason", pc.if_else(keep, pa.scalar(None, pa.string()), "even")).append_column(
        "reject_kind", pc.if_else(keep, pa.scalar(None, pa.string()), "even"))


def test_a_step_resumes_only_the_shards_whose_answers_failed(ray_session, tmp_path):
    """Steps are hosted like every worker: each shard's answers are a part of the run written by its
    actor. A shard holding a failed answer is not written, so the rerun asks that shard again and
    never re-asks (re-pays for) the shards that were answered; the next step reads only the rows the
    one before kept."""
    from redline.cluster import storage
    from redline.pipelines.plane.steps import run_step

    texts = [f"ok {i}" for i in range(60)] + ["down 60"] + [f"ok {i}" for i in range(61, 120)]
    table = pa.table({"id": [f"r{i}" for i in range(120)], "text": texts, "other": list(range(120))})
    log, outage = tmp_path / "asked.log", tmp_path / "outage"
    outage.touch()
    run = _run(tmp_path, "stage")
    n = _shards(run, table, 30)
    step = _step(_Answers, {"log": str(log), "outage": str(outage)}, errors=_failed_answers, finish=_kept_odd)
    first = run_step(run, step, "input", "work/answers", n, total=120)
    assert (first.failed, first.asked, first.failure) == (1, 120, "the service is down")
    assert len(storage.list_files(run.dir.path("work/answers"), ".parquet")) == 3  # the failed shard: no part
    assert sorted(log.read_text().splitlines()) == sorted(texts)

    outage.unlink()
    log.unlink()
    again = run_step(run, step, "input", "work/answers", n, total=120)
    asked = log.read_text().splitlines()
    assert again.failed == 0 and "down 60" in asked and len(asked) == 30  # the one shard that failed, asked again
    parts = pa.concat_tables([storage.read_parquet(p) for p in storage.list_files(run.dir.path("work/answers"))])
    assert parts.column("answer").to_pylist() == [t.upper() for t in texts]  # every row once, in order
    assert parts.column("other").to_pylist() == list(range(120))  # the shard's own columns carried on

    log.unlink()
    nxt = run_step(run, _step(_Answers, {"log": str(log), "outage": str(outage)}), "work/answers",
                   "work/next", n, source_pool=0, total=60)
    assert sorted(log.read_text().splitlines()) == sorted(t for i, t in enumerate(texts) if i % 2)
    assert nxt.asked == 60


def _multiple_of_three(rows: pa.Table) -> pa.Table:
    return rows.filter(pc.equal(pc.subtract(rows.column("other"), pc.multiply(pc.divide(rows.column("other"), 3), 3)), 0))


def _tagged(rows: pa.Table) -> pa.Table:
    return rows.append_column("tag", pa.array([f"t{os.getpid()}"] * rows.num_rows, pa.string()))


def test_steps_run_as_one_plan_and_a_shard_a_step_failed_on_goes_no_further(ray_session, tmp_path, monkeypatch):
    """A chain of steps is one Ray Data plan (every step's actors at once, each shard taken by a step as
    soon as the step before wrote it). A shard the first step failed on is not passed on; the rerun asks
    the first step only that shard and the second only its kept rows, and the shards the first step had
    written before still reach the second. A step without a worker (rows chosen, a column added: no
    model) is made by the host of the step before it, from the part it has just written; its part
    deleted, the rerun makes it from that part again without asking the steps before."""
    from redline.cluster import storage
    from redline.cluster.config import ActorPoolSize
    from redline.pipelines.plane import runner, shard_host
    from redline.pipelines.plane.steps import Step, run_steps

    def not_one_plan(*args, **kwargs):
        raise AssertionError("a step ran in a plan of its own")

    monkeypatch.setattr(runner, "run_pools", not_one_plan)
    texts = [f"ok {i}" for i in range(60)] + ["down 60"] + [f"ok {i}" for i in range(61, 120)]
    table = pa.table({"id": [f"r{i}" for i in range(120)], "text": texts, "other": list(range(120))})
    first_log, second_log, outage = tmp_path / "first.log", tmp_path / "second.log", tmp_path / "outage"
    outage.touch()
    run = _run(tmp_path, "chain")
    n = _shards(run, table, 30)
    steps = [(_step(_Answers, {"log": str(first_log), "outage": str(outage)}, errors=_failed_answers,
                    finish=_kept_odd), "work/first"),
             (_step(_Answers, {"log": str(second_log), "outage": str(outage)}), "work/second"),
             (Step("tag", None, {}, ActorPoolSize(), "tagging", num_cpus=0.25, rows=_multiple_of_three, finish=_tagged),
              "work/third")]
    first, second, third = run_steps(run, steps, "input", n, label="three steps")
    assert (first.failed, first.asked, second.failed, second.asked) == (1, 120, 0, 45)
    assert len(storage.list_files(run.dir.path("work/second"), ".parquet")) == 3
    assert len(storage.list_files(run.dir.path("work/third"), ".parquet")) == 3
    assert "ok 61" not in second_log.read_text()  # the failed shard's kept rows never reached the second step

    outage.unlink()
    first_log.unlink()
    second_log.unlink()
    (tmp_path / "chain" / "work" / "third" / shard_host.output_part(0, 0)).unlink()  # made from the second's part again
    first, second, third = run_steps(run, steps, "input", n, label="three steps")
    assert first.failed == 0 and len(first_log.read_text().splitlines()) == 30
    assert sorted(second_log.read_text().splitlines()) == sorted(t for i, t in enumerate(texts) if i % 2 and 60 <= i < 90)
    parts = pa.concat_tables([storage.read_parquet(p) for p in storage.list_files(run.dir.path("work/second"))])
    assert parts.column("other").to_pylist() == [i for i in range(120) if i % 2]  # every kept row once, in order
    assert second.partials == first.partials == {}  # no figures declared: nothing summed
    tagged = pa.concat_tables([storage.read_parquet(p) for p in storage.list_files(run.dir.path("work/third"))])
    assert tagged.column("other").to_pylist() == [i for i in range(120) if i % 2 and i % 3 == 0]
    assert tagged.column("answer").to_pylist() == [f"OK {i}" for i in tagged.column("other").to_pylist()]
    assert os.getpid() not in {int(t[1:]) for t in tagged.column("tag").to_pylist()}  # made on the workers
    assert third.failed == 0 and third.partials == {}
    assert len(storage.list_files(run.dir.path("work/third"), ".parquet")) == 4


def test_a_chain_may_begin_with_a_step_without_a_worker(ray_session, tmp_path):
    """First in a chain, a worker-less step is a Ray Data task per shard, and the step after takes its parts."""
    from redline.cluster import storage
    from redline.cluster.config import ActorPoolSize
    from redline.pipelines.plane.steps import Step, run_steps

    log = tmp_path / "asked.log"
    run = _run(tmp_path, "lead")
    n = _shards(run, pa.table({"id": [f"r{i}" for i in range(9)], "text": [f"t{i}" for i in range(9)],
                               "other": list(range(9))}), 4)
    steps = [(Step("tag", None, {}, ActorPoolSize(), "tagging", num_cpus=0.25, rows=_multiple_of_three), "work/tag"),
             (_step(_Answers, {"log": str(log), "outage": str(tmp_path / "none")}), "work/answers")]
    tagged, answered = run_steps(run, steps, "input", n, label="two steps")
    assert (tagged.failed, answered.failed, answered.asked) == (0, 0, 3)
    parts = pa.concat_tables([storage.read_parquet(p) for p in storage.list_files(run.dir.path("work/answers"))])
    assert parts.column("answer").to_pylist() == ["T0", "T3", "T6"]


def test_steps_that_do_not_fit_at_once_take_turns_and_stop_at_a_failed_step(ray_session, tmp_path):
    from redline.pipelines.plane.steps import run_steps

    log, outage = tmp_path / "asked.log", tmp_path / "outage"
    outage.touch()
    run = _run(tmp_path, "turns")
    n = _shards(run, pa.table({"id": ["a", "b", "c"], "text": ["ok", "down", "ok too"], "other": [1, 2, 3]}), 2)
    big = {"num_cpus": 1.5}  # two of them do not fit the session's 2 CPUs at once
    steps = [(_step(_Answers, {"log": str(log), "outage": str(outage)}, errors=_failed_answers, **big), "work/a"),
             (_step(_Answers, {"log": str(log), "outage": str(outage)}, **big), "work/b")]
    results = run_steps(run, steps, "input", n, label="two steps")
    assert len(results) == 1 and results[0].failed == 1  # the second step never ran
    outage.unlink()
    results = run_steps(run, steps, "input", n, label="two steps")
    assert [r.failed for r in results] == [0, 0] and results[1].asked == 3


def test_memory_a_worker_thread_freed_goes_back_to_the_system():
    """An actor hosts shard after shard: what its threads freed must not stay in its RSS (an attacker
    grew from 0.6 to 2.5 GB over 8,000 seeds before the runner gave it back after each shard)."""
    import re
    import threading
    from pathlib import Path

    from redline.cluster.runtime import _malloc_trim, give_back_freed_memory

    if _malloc_trim() is None:
        pytest.skip("not glibc")

    def rss_mb() -> int:
        return int(re.search(r"VmRSS:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) // 1024

    kept = {}

    def churn() -> None:  # 200 MB in a thread's arena, every 100th block kept so it cannot shrink from its top
        blocks = [bytearray(2000) for _ in range(100_000)]
        kept["every_100th"] = blocks[::100]

    worker = threading.Thread(target=churn)
    worker.start()
    worker.join()
    before = rss_mb()
    give_back_freed_memory()
    assert before - rss_mb() > 100
