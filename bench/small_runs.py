"""What a small run costs with Ray already up: the same 72-row `run score` (two detectors) several
times in one process, with the pools as configured (each may grow while shards wait) and with each
pool fixed at one actor (the least a run can start: the baseline). The two should cost the same: a
pool that grows on a run with one shard starts actors it never uses.

    .venv/bin/python bench/small_runs.py [--runs 4] [--detectors 2]

Prints one JSON object per run (wall seconds, CPU-seconds of the whole machine while it ran, the
worker processes Ray started for it) and the medians' ratio. Run it on a quiet machine: the CPU
figure counts every process.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("REDLINE_PROGRESS", "0")


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def machine_cpu_s() -> float:
    """CPU-seconds the whole machine has spent (user, nice, system, irq, softirq)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:8]]
    return (sum(ticks[:3]) + sum(ticks[5:7])) / os.sysconf("SC_CLK_TCK")


def config(work: Path, detectors: int, fixed: bool) -> Path:
    from redline.pipelines.quickstart import sample_path

    pin = {"actors": 1, "max_actors": 1} if fixed else {}
    kinds = [{"name": "profanity-check", "kind": "profanity-check", "num_cpus": 0.5},
             {"name": "keywords", "kind": "keywords", "patterns": ["idiot"], "num_cpus": 0.25},
             {"name": "keywords-2", "kind": "keywords", "patterns": ["stupid"], "num_cpus": 0.25}]
    path = work / f"score-{'fixed' if fixed else 'grows'}.json"
    path.write_text(json.dumps({
        "corpus": {"path": str(sample_path("toxic_sample_test.csv")), "text_column": "text", "label_column": "label",
                   "toxic_values": ["toxic"]},
        "detectors": [{**d, **pin} for d in kinds[:detectors]], "output": str(work / "runs")}))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=4, help="runs of each kind (the first of all warms Ray up)")
    ap.add_argument("--detectors", type=int, default=2, choices=(1, 2, 3))
    args = ap.parse_args()

    import ray

    from redline.cli import main as redline

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    logs = ray._private.worker._global_node.get_session_dir_path() + "/logs"

    def workers() -> set[str]:
        return set(glob.glob(f"{logs}/worker-*.out") + glob.glob(f"{logs}/old/worker-*.out"))

    work = Path(tempfile.mkdtemp(prefix="redline-small-runs-"))
    redline(["run", "score", "--config", str(config(work, args.detectors, False)), "--set",
             f"output={work}/warm-up"])  # Ray Data's own actors start once, with the first run
    figures: dict[str, list[tuple[float, float]]] = {"grows": [], "fixed": []}
    for i in range(args.runs):
        for kind in ("grows", "fixed"):  # interleaved: a machine that slows down slows both
            before, cpu, started = workers(), machine_cpu_s(), time.perf_counter()
            rc = redline(["run", "score", "--config", str(config(work, args.detectors, kind == "fixed")),
                          "--set", f"output={work}/{kind}-{i}"])
            wall, used = time.perf_counter() - started, machine_cpu_s() - cpu
            if rc != 0:
                raise SystemExit(f"run {kind}-{i} failed ({rc})")
            figures[kind].append((wall, used))
            emit(run=f"{kind}-{i}", wall_s=round(wall, 2), machine_cpu_s=round(used, 2),
                 new_worker_processes=len(workers() - before))
    median = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in figures.items()}
    emit(summary="median per run", detectors=args.detectors, rows=72,
         grows_wall_s=round(median["grows"][0], 2), fixed_wall_s=round(median["fixed"][0], 2),
         grows_cpu_s=round(median["grows"][1], 2), fixed_cpu_s=round(median["fixed"][1], 2),
         wall_ratio=round(median["grows"][0] / median["fixed"][0], 2),
         cpu_ratio=round(median["grows"][1] / median["fixed"][1], 2))


if __name__ == "__main__":
    main()
