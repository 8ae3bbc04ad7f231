"""The attack's actor pool: every batch comes back once, killed actors are replaced, and a
user error raised in a worker's constructor reaches the caller as that error."""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pyarrow as pa
import pytest

from redline.errors import RedlineError, unwrap_user_error
from redline.pipelines.actor_pool import ActorPool

pytestmark = pytest.mark.usefixtures("by_value")


@pytest.fixture(scope="module")
def by_value(ray_session):
    # Ray workers cannot import test modules; ship these worker classes by value.
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


class Doubler:
    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        time.sleep(self.delay)
        return pa.table({"x": batch["x"] * 2, "pid": np.full(len(batch["x"]), os.getpid())})


class Refuses:
    def __init__(self) -> None:
        raise RedlineError("victim model 'nope' not found")

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        raise AssertionError("never called")


def test_pool_returns_every_row_once_in_batches(ray_session):
    blocks = [pa.table({"x": np.arange(j, j + 50)}) for j in range(0, 300, 50)]
    with ActorPool(Doubler, {}, 2, num_cpus=0.5, batch_size=20) as pool:
        out = list(pool.map_unordered(blocks))
    assert all(t.num_rows <= 20 for t in out)
    assert sorted(pa.concat_tables(out).column("x").to_pylist()) == list(range(0, 600, 2))
    assert len(set(pa.concat_tables(out).column("pid").to_pylist())) == 2  # both actors worked


def test_pool_survives_a_killed_actor(ray_session):
    import ray

    blocks = [pa.table({"x": np.arange(j, j + 10)}) for j in range(0, 200, 10)]
    with ActorPool(Doubler, {"delay": 0.05}, 2, num_cpus=0.5, batch_size=10) as pool:
        results = []
        for k, table in enumerate(pool.map_unordered(blocks)):
            results.append(table)
            if k == 3:
                ray.kill(pool._actors[0], no_restart=False)
    assert sorted(pa.concat_tables(results).column("x").to_pylist()) == list(range(0, 400, 2))


def test_constructor_user_error_reaches_the_caller(ray_session):
    with ActorPool(Refuses, {}, 1, num_cpus=0.5) as pool, pytest.raises(Exception) as err:
        list(pool.map_unordered([pa.table({"x": [1]})]))
    user = unwrap_user_error(err.value)
    assert user is not None and "victim model 'nope' not found" in str(user)


class _CudnnLike:
    input_columns = ["id"]

    def __init__(self) -> None:
        pass

    def __call__(self, batch):
        raise RuntimeError("cudnn RNN backward can only be called in training mode\nmore detail")


def test_a_failed_actor_is_recorded_by_its_cause_not_rays_wrapping(ray_session, tmp_path):
    """The manifest's error is the cause in one line, never the actor's name in terminal colours."""
    from redline.cluster.runs import Run as RunState
    from redline.cluster.runs import RunDir, lifecycle
    from redline.errors import cause_line
    from redline.pipelines.stages import map_table

    table = pa.table({"id": ["a", "b"]})
    with pytest.raises(Exception) as info:
        map_table(table, _CudnnLike, {}, num_cpus=0.25)
    line = cause_line(info.value)
    assert line == "RuntimeError: cudnn RNN backward can only be called in training mode", line
    run = RunState(RunDir(str(tmp_path / "run")), {"state": "running"}, reused=False)
    with pytest.raises(Exception), lifecycle(run):
        map_table(table, _CudnnLike, {}, num_cpus=0.25)
    assert run.manifest["state"] == "failed" and run.manifest["error"] == line
