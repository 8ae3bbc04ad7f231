"""Small pools hosted by Ray Data tasks against the same pools on actors, in one process with Ray up:
the quickstart safety card (seven parts, every step of each one shard: attacks on three detectors,
TaeBench, transfer, clean scoring, DiaSafety generation and scoring, the trigger search), run again
from scratch in each mode, the modes interleaved so that a machine that slows down slows both.

    .venv/bin/python bench/small_pools.py [--runs 2] [--work DIR]

The baseline is the runner with every pool on actors (`runner.SMALL_POOLS_AS_TASKS = False`): each
actor is a new process that imports its libraries again, where a task runs in one of the job's task
processes, which Ray reuses. Prints one JSON object per card (wall seconds, CPU-seconds of the whole
machine), then the medians, their ratio and whether both modes published the same figures. Needs
../shared/data/diasafety (REDLINE_DIASAFETY_DIR); the card's tiny models are built on the first run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from small_runs import emit, machine_cpu_s  # bench/ is on the path of a script run from it

os.environ.setdefault("REDLINE_DIASAFETY_DIR", str(Path(__file__).resolve().parents[2] / "shared" / "data" / "diasafety"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2, help="cards in each mode, after one that builds the models")
    ap.add_argument("--work", help="where the card's runs and models go (default: a new temporary folder)")
    args = ap.parse_args()

    import ray

    from redline.cluster.runtime import SYSTEM_CONFIG, quiet_data_context
    import redline.pipelines.plane.runner as runner
    from redline.pipelines.quickstart import run_card_chain

    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             logging_level="WARNING", _system_config=dict(SYSTEM_CONFIG))
    quiet_data_context()
    work = Path(args.work or tempfile.mkdtemp(prefix="redline-small-pools-"))

    def card() -> dict:
        for old in work.glob("quickstart-card*"):  # the card's parts again; its models and classifiers kept
            shutil.rmtree(old)
        run_card_chain(str(work), say=lambda *a: None)
        return json.loads((work / "quickstart-card" / "card.json").read_text())["figures"]

    card()  # builds the tiny models and the DiaSafety classifiers; Ray Data's own actors start here
    seconds: dict[str, list[float]] = {"tasks": [], "actors": []}
    published: dict[str, dict] = {}
    for i in range(args.runs):
        for mode in ("actors", "tasks"):
            runner.SMALL_POOLS_AS_TASKS = mode == "tasks"
            cpu, started = machine_cpu_s(), time.perf_counter()
            published[mode] = card()
            wall = time.perf_counter() - started
            seconds[mode].append(wall)
            emit(figure="quickstart card", mode=mode, run=i, wall_s=round(wall, 1),
                 machine_cpu_s=round(machine_cpu_s() - cpu, 1))
    ours, base = statistics.median(seconds["tasks"]), statistics.median(seconds["actors"])
    emit(figure="quickstart card, median wall s", ours_tasks=round(ours, 1), baseline_actors=round(base, 1),
         ratio=round(base / ours, 2), same_figures=published["tasks"] == published["actors"], cpus=os.cpu_count())


if __name__ == "__main__":
    main()
