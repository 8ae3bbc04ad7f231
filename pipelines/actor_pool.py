"""A pool of long-lived Ray actors of one worker class, fed batches directly: every pipeline's workers
are hosted on it (`pipelines/shard_host.py`), each call one shard.

A Ray Data actor pool would add start-up: it spawns fresh worker processes that import Ray Data
before the worker's constructor even runs (about 1.5 s per run on a small machine, most of a
2,000-seed attack), and waits for all its actors before the first block. Plain actors start on
Ray's pre-started workers and take work as soon as each is ready. The worker class is the same one `map_batches` would host, called the same
way (a dict of numpy columns in, an Arrow table out); Ray restarts a killed actor and retries its
calls, and the caller drops rows it has already seen by key.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from redline.cluster.runtime import check_placeable, ensure_ray

GROW_EVERY_S = 1.0


class _Host:
    """Hosts one worker. A constructor error is kept and raised by the first call, so it reaches
    the driver as that exception (Ray reports a failed actor constructor only as a message)."""

    def __init__(self, worker: type, kwargs: dict[str, Any]) -> None:
        try:
            self.worker, self.error = worker(**kwargs), None
        except Exception as err:  # noqa: BLE001 - re-raised on the first call
            self.worker, self.error = None, err

    def __call__(self, batch: dict[str, Any]) -> pa.Table:
        if self.error is not None:
            raise self.error
        return self.worker(batch)  # type: ignore[misc]

    def ready(self) -> bool:
        """Answers once the constructor has run (the actor got its resources and started)."""
        return True


class ActorPool:
    def __init__(self, worker: type, kwargs: dict[str, Any], size: int, *, num_cpus: float, num_gpus: float = 0,
                 batch_size: int = 256, in_flight: int = 2, max_restarts: int = 3, max_size: int | None = None,
                 what: str | None = None) -> None:
        """Starts `size` actors at once (their constructors run while the caller prepares work) and
        adds more, up to `max_size`, while batches wait and the cluster has room for one (a node that
        joined, a CPU another step gave back); each call gets at most `batch_size` rows. `what`: the
        actors as an error names them (default: by the worker class)."""
        import ray

        ensure_ray()
        check_placeable(what or f"each {worker.__name__} actor", num_cpus, num_gpus)
        self._remote = ray.remote(_Host).options(num_cpus=num_cpus, num_gpus=num_gpus or None,
                                                 max_restarts=max_restarts, max_task_retries=max_restarts)
        self._args = (worker, kwargs)
        self._needs = {"CPU": num_cpus, "GPU": num_gpus}
        self._actors = [self._remote.remote(*self._args) for _ in range(size)]
        self.started = size  # actors started in all
        self._max_size = max(size, max_size or size)
        self._in_flight = max(1, in_flight)
        self._batch_size = batch_size
        self._looked = 0.0

    def limit(self, max_size: int) -> None:
        """Grow to at most `max_size` actors (never fewer than those already started)."""
        self._max_size = max(len(self._actors), max_size)

    def _room_for_one(self) -> bool:
        """Whether the cluster has room for another actor now (looked up at most every second)."""
        import ray

        if len(self._actors) >= self._max_size or time.monotonic() - self._looked < GROW_EVERY_S:
            return False
        self._looked = time.monotonic()
        free = ray.available_resources()
        return all(free.get(k, 0.0) + 1e-9 >= need for k, need in self._needs.items() if need)

    def map_unordered(self, batches: Iterable[pa.Table]) -> Iterator[pa.Table]:
        """Each batch's output as soon as it is ready. An actor gets work once it has started (one
        still waiting for resources holds none, so pools side by side never wait on each other), then
        keeps `in_flight` batches queued so it never waits on the driver between batches. When the
        batches are done the actors are shut down, handing their resources to whoever waits."""
        import ray

        slices = (b.slice(j, self._batch_size) for b in batches for j in range(0, b.num_rows, self._batch_size))
        waiting = [next(slices, None)]  # the next batch, looked at before it is sent
        owner: dict[Any, Any] = {}
        starting = {actor.ready.remote(): actor for actor in self._actors}

        def submit(actor: Any) -> bool:
            batch, waiting[0] = waiting[0], (next(slices, None) if waiting[0] is not None else None)
            if batch is None:
                return False
            columns = {name: batch.column(name).to_numpy(zero_copy_only=False) for name in batch.column_names}
            owner[actor.__call__.remote(columns)] = actor
            return True

        while owner or (starting and waiting[0] is not None):
            done, _ = ray.wait([*owner, *starting], num_returns=1)
            if done[0] in starting:
                actor = starting.pop(done[0])
                ray.get(done[0])
                for _ in range(self._in_flight):
                    submit(actor)
                continue
            actor = owner.pop(done[0])
            result = ray.get(done[0])
            submit(actor)
            if waiting[0] is not None and not starting and self._room_for_one():
                self._actors.append(self._remote.remote(*self._args))
                self.started += 1
                starting[self._actors[-1].ready.remote()] = self._actors[-1]
            yield result
        self.shutdown()

    def shutdown(self) -> None:
        import ray

        for actor in self._actors:
            ray.kill(actor)
        self._actors = []

    def __enter__(self) -> ActorPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
