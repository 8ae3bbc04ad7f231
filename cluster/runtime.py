"""Where work runs: an embedded local Ray sized to the machine, or the cluster in RAY_ADDRESS."""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from redline.errors import RedlineError

log = logging.getLogger(__name__)


def _host_port(address: str) -> tuple[str, int] | None:
    """The TCP endpoint behind a Ray address, or None for `auto`/`local` (Ray resolves those)."""
    if address in ("auto", "local"):
        return None
    default_port = 10001 if address.startswith("ray://") else 6379
    parsed = urlparse(address if "://" in address else f"tcp://{address}")
    if not parsed.hostname:
        raise RedlineError(f"RAY_ADDRESS={address!r} is not a Ray address (expected host:port or ray://host:port)")
    try:
        port = parsed.port or default_port
    except ValueError:
        raise RedlineError(f"RAY_ADDRESS={address!r} has an invalid port") from None
    return parsed.hostname, port


def check_reachable(address: str, timeout: float = 5.0) -> None:
    endpoint = _host_port(address)
    if endpoint is None:
        return
    try:
        with socket.create_connection(endpoint, timeout=timeout):
            pass
    except OSError as err:
        raise RedlineError(f"cannot reach the Ray cluster at RAY_ADDRESS={address} ({err.strerror or err})") from None


def quiet_data_context() -> None:
    """Our own progress bars replace Ray Data's; user code errors are not retried blindly."""
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.enable_operator_progress_bars = False
    ctx.print_on_execution_start = False
    ctx.enable_auto_log_stats = False
    # A worker's own exception (a RedlineError naming the problem) reaches the driver as itself, not
    # as "UDF failed to process a data block" (Ray does not carry an exception's cause across processes).
    ctx.raise_original_map_exception = True
    # Each call of a redline actor is a whole shard: a pool grows once a shard waits behind a busy
    # actor (1.5 shards per actor on average, not Ray Data's 1.75), whether an actor keeps one shard
    # in flight (a small run: see `runner.in_flight`) or two.
    ctx.autoscaling_config.actor_pool_util_upscaling_threshold = 1.5
    # A failed task is logged by Ray Data at ERROR with its whole traceback before the driver sees it;
    # redline reports it once, as one line (the trace is in the run's error.log; -v shows Ray's logs).
    verbose = os.environ.get("REDLINE_VERBOSE") == "1"
    logging.getLogger("ray.data").setLevel(logging.WARNING if verbose else logging.CRITICAL)
    # It warns, once, that the bars we just turned off are off.
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)


# Ray kills a task's worker process 1 s after it goes idle once more processes than CPUs are alive (a
# pool's actors count), so the next task of the same run (the read, then the index at the end) paid a
# fresh process and its imports again: ~1.5-2 s per run on 2 cores. Kept for 20 s, the run reuses it:
# a 2,000-seed attack with Ray up 7.35 -> 4.29 s (its report step 2.1 -> 0.14 s), the first 11.0 -> 7.6 s.
# An idle worker holds ~100 MB while it waits. `ray start --system-config` takes the same setting.
SYSTEM_CONFIG = {"idle_worker_killing_time_threshold_ms": 20_000}


def ensure_ray(verbose: bool = False) -> None:
    """Connect to RAY_ADDRESS if set, else start an embedded local Ray (once per process).
    `RAY_ADDRESS=local` (Ray's own word for "start one here") is the embedded Ray too, with its settings:
    passed to `ray.init` as an address it started Ray's full dashboard (~3 s of every start, and its
    processes' CPU for the whole run) and none of `SYSTEM_CONFIG`."""
    import ray

    if ray.is_initialized():
        quiet_data_context()
        return
    if not verbose and os.environ.get("REDLINE_QUIET_RAY", "1") != "0":
        from redline.cluster.quiet import quiet_ray_noise

        quiet_ray_noise()
    address = os.environ.get("RAY_ADDRESS", "").strip()
    if address == "local":
        address = ""
    level = logging.INFO if verbose else logging.WARNING
    if address:
        check_reachable(address)
        log.info("connecting to Ray at %s", address)
        try:
            ray.init(address=address, logging_level=level, log_to_driver=verbose)
        except (ConnectionError, TimeoutError, RuntimeError) as err:
            raise RedlineError(f"cannot connect to the Ray cluster at RAY_ADDRESS={address}: {err}") from None
    else:
        cpus = os.cpu_count() or 1
        if not verbose:
            # Auth stays on (secure by default); only its advisory banner is hidden.
            logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
        log.info("starting an embedded local Ray with %d CPUs", cpus)
        # address="local": never attach silently to some other `ray start` cluster on this machine.
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, logging_level=level, log_to_driver=verbose,
                 configure_logging=True, _system_config=dict(SYSTEM_CONFIG))  # ray.init adds to it
    quiet_data_context()


def check_placeable(what: str, num_cpus: float, num_gpus: float = 0.0) -> None:
    """Refuse at start an actor that no node of the cluster can hold (Ray would queue it and wait
    forever, silently), unless the cluster's autoscaler adds such a node: then wait for it."""
    import ray

    from redline.cluster import autoscaling

    ensure_ray()

    def alive() -> list[dict[str, float]]:
        return [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]

    def fits() -> bool:
        return any(r.get("CPU", 0) + 1e-9 >= num_cpus and r.get("GPU", 0) + 1e-9 >= num_gpus for r in alive())

    if fits():
        return
    nodes = alive()
    most_cpus = max((r.get("CPU", 0) for r in nodes), default=0)
    most_gpus = max((r.get("GPU", 0) for r in nodes), default=0)
    if num_gpus > most_gpus:
        short = (f"num_gpus {num_gpus:g}, but no node has a GPU" if most_gpus == 0
                 else f"num_gpus {num_gpus:g}, but the largest node has {most_gpus:g} GPUs")
    elif num_cpus > most_cpus:
        short = f"num_cpus {num_cpus:g}, but the largest node has {most_cpus:g} CPUs"
    else:
        short = f"num_cpus {num_cpus:g} with num_gpus {num_gpus:g} on one node, but no node has both"
    first = autoscaling.status()
    if first is None:
        raise RedlineError(f"{what} asks for {short}, and the cluster has no autoscaler to add one: lower it")
    autoscaling.wait_for_node(what, f"num_cpus {num_cpus:g}, num_gpus {num_gpus:g}",
                              {"CPU": num_cpus, "GPU": num_gpus}, fits, first)


def on_a_worker(fn: Any, *args: Any, num_cpus: float = 1, num_gpus: float = 0) -> Any:
    """`fn(*args)` in a Ray task, waited for: the rows it reads and the models it loads stay on the
    worker; the driver receives only what it returns."""
    import ray

    ensure_ray()  # a resumed run may not have started Ray: never let `.remote()` pick a cluster itself
    return ray.get(ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_retries=2)(fn).remote(*args))


def on_a_worker_reporting(fn: Any, *args: Any, advance: Callable[[int], Any], num_cpus: float = 1,
                          num_gpus: float = 0) -> Any:
    """`on_a_worker`, for long work with a progress bar: `fn(report, *args)` runs in a Ray task and
    calls `report(n)` as it goes (n units done); each report reaches the driver's `advance` within a
    second (through a queue actor that asks no CPU). Interrupted on the driver (Ctrl-C), the task is
    cancelled."""
    import ray
    from ray.util.queue import Queue

    ensure_ray()
    queue = Queue(actor_options={"num_cpus": 0})
    ref = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_retries=0)(_reporting).remote(queue, fn, *args)

    def drain() -> None:
        done = queue.get_nowait_batch(queue.qsize()) if queue.qsize() else []
        if done:
            advance(sum(done))

    try:
        while not ray.wait([ref], timeout=0.5)[0]:
            drain()
        result = ray.get(ref)
        drain()
        return result
    except BaseException:
        ray.cancel(ref, force=True)
        raise
    finally:
        queue.shutdown()


def _reporting(queue: Any, fn: Any, *args: Any) -> Any:
    return fn(lambda n: queue.put_nowait(int(n)), *args)


@functools.cache
def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to give back this way
        return None


def give_back_freed_memory() -> None:
    """Return the memory this process has freed to the system. glibc keeps what a thread's arena
    freed (a victim scoring on its own thread, a tokenizer's buffers of every length) for reuse that
    rarely fits, so a long-lived actor's RSS grew with every shard: an attacker went from 0.6 to 2.5
    GB over 8,000 seeds, and stays at ~0.6 GB when its freed memory is given back after each shard."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
