"""How much of a run passes through the driver: `run score` at growing corpus sizes and `run attack` on the
CPU proxy of the GPU path, each against its ceiling and its peer, with the driver's own load sampled.

    .venv/bin/python bench/driver_scaling.py                        # 100k, 1M, 4M rows (and 4M as 8 files); attack 2k, 8k seeds
    .venv/bin/python bench/driver_scaling.py --rows 100000 --seeds 2000 --skip-peer   # a quick look

The victim is `../shared/gpu/proxy/make_victim.py`'s near-free classifier with a BERT-base vocabulary (so
what is measured is redline's own path, not the model); the corpus is Davidson repeated to each size, built
on the fly. For each run it prints one JSON line: wall time (whole process, Ray start-up included), rows/s,
its share of the bare loop (`../shared/gpu/proxy/bare.py`'s tokenizers-backend + forward figure, measured in
this run), the driver's peak RSS and CPU seconds and its share of all CPU used (sampled as
`../shared/scale/driver_load.py` does). The peer is plain Ray Data doing the same scoring
(`../shared/scale/plain_ray_data.py`). Attack's ceiling is victim-bound: the bare rate / mean queries.
A markdown table of every figure ends the output. Targets (issue 31, 2 cores, 2 actors x 0.5 CPU): score
at 1M rows >= 80% of the bare loop and at least as fast as the peer; driver RSS grows < 100 MB from 100k to
4M rows; driver CPU <= 5% of the run's; attack at 8k seeds >= 70% of victim-bound. Issue 50 adds: the largest
process of the run grows < 150 MB from 1M to 4M rows, and the first output part at 4M rows comes <= 2x as late
as at 100k (`first_part_s`, from the command's start, Ray's start-up included), and a corpus given as several
files (`--files`, at the sizes `--files-rows`) is read by one task per file: `read_tasks_at_once` is the most
of them whose reads overlapped in time (from the manifest's `input_reads`), on how many nodes.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("REDLINE_SHARED", ROOT.parent / "shared"))
DAVIDSON = SHARED / "data" / "offensive_tweet" / "labeled_data.csv"


def machine_cpu_s() -> float:
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def sampled(cmd: list[str], log: Path, parts: Path | None = None) -> dict[str, float]:
    """Run `cmd`, sampling its own process: wall, peak RSS, CPU seconds, and the machine's CPU seconds;
    with `parts`, when the first output part appeared there (seconds from the command's start).
    Each command starts its own local Ray (RAY_ADDRESS=local), never one left by the previous."""
    started, machine, first = time.time(), machine_cpu_s(), None
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "REDLINE_PROGRESS": "0", "RAY_AUTH_MODE": "disabled",
                                     "RAY_ADDRESS": "local"})
        peak, cpu, worker_peak, worker, tick = 0, 0.0, 0, "-", 0
        try:
            while proc.poll() is None:
                try:
                    peak = max(peak, rss_kb(proc.pid))
                    stat = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
                    cpu = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
                except (OSError, AttributeError):
                    pass
                if parts is not None and first is None and written_since(parts, started):
                    first = time.time() - started
                if tick % 5 == 0:  # every process below the driver (Ray's workers, actors, reading tasks), once a second
                    for pid in descendants(proc.pid):
                        if rss_kb(pid) > worker_peak:
                            worker_peak, worker = rss_kb(pid), command_of(pid)
                tick += 1
                time.sleep(0.1)
        except BaseException:  # the sampler failed (or ^C): never leave the command running
            proc.terminate()
            proc.wait(timeout=60)
            raise
    wall, used = time.time() - started, machine_cpu_s() - machine
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} failed (rc {proc.returncode}); see {log}")
    return {"wall_s": round(wall, 1), "driver_peak_rss_mb": round(peak / 1024), "driver_cpu_s": round(cpu, 1),
            "machine_cpu_s": round(used, 1), "driver_share": round(cpu / max(used, 1e-9), 3),
            "worker_peak_rss_mb": round(worker_peak / 1024), "worker_peak": worker,
            **({"first_part_s": round(first, 1) if first is not None else None} if parts is not None else {})}


def written_since(parts: Path, started: float) -> bool:
    """A part written in `parts` since `started` (a reused --work holds the last run's parts until --force
    removes them, while this looks)."""
    for part in parts.glob("part-*.parquet") if parts.is_dir() else ():
        try:
            if part.stat().st_mtime >= started:
                return True
        except OSError:
            continue
    return False


def rss_kb(pid: int) -> int:
    try:
        return int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1))
    except (OSError, AttributeError):
        return 0


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:80]
    except OSError:
        return "?"


def reads_at_once(reads: list[dict]) -> int:
    """The most read tasks whose [start, end) overlapped."""
    events = sorted([(r["started"], 1) for r in reads] + [(r["started"] + r["seconds"], -1) for r in reads])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def repeated_corpus(rows: int, out: Path) -> Path:
    with open(DAVIDSON, encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        header, body = next(reader), list(reader)
    with open(out, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for i in range(rows):  # one line per row: Ray Data's CSV reader splits files at newlines
            writer.writerow([" ".join(cell.split("\n")) for cell in body[i % len(body)]])
    return out


def bare_rate(victim: Path, work: Path) -> float:
    text = subprocess.run([sys.executable, str(SHARED / "gpu" / "proxy" / "bare.py"), str(victim), str(DAVIDSON)],
                          capture_output=True, text=True, check=True, cwd=work).stdout
    line = next(ln for ln in text.splitlines() if ln.startswith("tokenizers backend") and "forward" in ln)
    return float(line.split()[-2].replace(",", ""))


def redline(command: str, config: dict, work: Path, name: str, parts: str) -> tuple[dict[str, float], dict]:
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**config, "output": str(work / "runs"), "run_name": name}))
    figures = sampled([sys.executable, "-m", "redline", *command.split(), "--config", str(path), "--force"],
                      work / f"{name}.log", parts=work / "runs" / name / parts)
    return figures, json.loads((work / "runs" / name / "manifest.json").read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="100000,1000000,4000000", help="score corpus sizes, comma-separated")
    parser.add_argument("--seeds", default="2000,8000", help="attack seeds (DeepWordBug, TAE), comma-separated")
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--actor-cpus", type=float, default=0.5)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--files", type=int, default=8, help="the corpus as this many CSV files, read side by side")
    parser.add_argument("--files-rows", default="4000000", help="total sizes at which to score the corpus as --files files")
    parser.add_argument("--skip-peer", action="store_true", help="leave out plain Ray Data")
    parser.add_argument("--work", help="working directory (kept); default: a new temporary one")
    args = parser.parse_args()
    if not DAVIDSON.exists():
        raise SystemExit(f"no Davidson corpus at {DAVIDSON} (set REDLINE_SHARED to the shared folder)")
    work = Path(args.work or tempfile.mkdtemp(prefix="redline-driver-"))
    work.mkdir(parents=True, exist_ok=True)
    victim = work / "victim"
    if not (victim / "config.json").exists():
        subprocess.run([sys.executable, str(SHARED / "gpu" / "proxy" / "make_victim.py"), str(DAVIDSON), str(victim)],
                       check=True, capture_output=True)
    bare = bare_rate(victim, work)
    print(json.dumps({"what": "bare loop, tokenizers backend + forward", "texts_per_s": bare}), flush=True)
    detector = {"name": "proxy", "kind": "hf", "model": str(victim), "max_length": 64, "batch_size": args.batch_size,
                "actors": args.actors, "max_actors": args.actors, "num_cpus": args.actor_cpus}  # fixed, as the peer's
    table = []
    for rows in (int(r) for r in args.rows.split(",") if r):
        corpus = repeated_corpus(rows, work / f"davidson-{rows}.csv")
        figures, manifest = redline("run score", {"corpus": {"path": str(corpus), "preset": "davidson"},
                                                  "detectors": [detector]}, work, f"score-{rows}", "predictions")
        done = manifest["counts"].get("rows_out", rows)
        row = {"what": f"redline run score, {rows:,} rows", **figures, "rows_per_s": round(done / figures["wall_s"]),
               "share_of_bare": round(done / figures["wall_s"] / bare, 3)}
        print(json.dumps(row), flush=True)
        table.append(row)
        if not args.skip_peer:
            out = work / f"peer-{rows}"
            figures = sampled([sys.executable, str(SHARED / "scale" / "plain_ray_data.py"), str(victim), str(corpus),
                               str(out), str(args.actor_cpus), str(args.actors)], work / f"peer-{rows}.log")
            row = {"what": f"plain Ray Data, {rows:,} rows", **figures, "rows_per_s": round(rows / figures["wall_s"]),
                   "share_of_bare": round(rows / figures["wall_s"] / bare, 3)}
            print(json.dumps(row), flush=True)
            table.append(row)
    for rows in (int(r) for r in args.files_rows.split(",") if r and args.files > 1):
        each = rows // args.files
        corpora = [{"path": str(repeated_corpus(each, work / f"davidson-{each}-{k}.csv")), "preset": "davidson",
                    "dataset": f"davidson-{k}"} for k in range(args.files)]
        figures, manifest = redline("run score", {"corpus": corpora, "detectors": [detector]}, work,
                                    f"score-{rows}-{args.files}-files", "predictions")
        done = manifest["counts"].get("rows_out", rows)
        reads = manifest.get("input_reads") or []
        row = {"what": f"redline run score, {each * args.files:,} rows as {args.files} files", **figures,
               "rows_per_s": round(done / figures["wall_s"]), "share_of_bare": round(done / figures["wall_s"] / bare, 3),
               "read_tasks": len(reads), "read_tasks_at_once": reads_at_once(reads),
               "read_nodes": len({r["host"] for r in reads}),
               "read_s_each": sorted(round(r["seconds"], 1) for r in reads)}
        print(json.dumps(row), flush=True)
        table.append(row)
    for seeds in (int(s) for s in args.seeds.split(",") if s):
        config = {"corpus": {"path": str(DAVIDSON), "preset": "davidson", "split": "all"},
                  "victim": {**detector, "batch_size": 4096}, "recipes": ["deepwordbug"], "goals": ["tae"],
                  "max_seeds": seeds, "similarity": "never", "actors": args.actors, "max_actors": args.actors,
                  "num_cpus": args.actor_cpus, "batch_size": args.batch_size}
        for key in ("actors", "max_actors", "num_cpus"):
            config["victim"].pop(key)
        figures, manifest = redline("run attack", config, work, f"attack-{seeds}", "attempts")
        summary = manifest["summary"][0]
        decided = summary["success"] + summary["failed"]
        rate = summary["attempts"] / figures["wall_s"]
        limit = bare / max(summary["mean_queries"] or 1, 1e-9)
        row = {"what": f"redline run attack, DeepWordBug, {seeds:,} seeds", **figures,
               "attempts_per_s": round(rate, 1), "mean_queries": summary["mean_queries"], "asr": summary["asr"],
               "decided": decided, "victim_bound_per_s": round(limit, 1), "share_of_bound": round(rate / limit, 3)}
        print(json.dumps(row), flush=True)
        table.append(row)
    print(f"\nbare loop: {bare:,.0f} texts/s; {args.actors} actors x {args.actor_cpus} CPU; {os.cpu_count()} CPUs\n")
    print("| run | wall s | rows/s | share of bare (or of victim-bound) | driver peak RSS MB | driver CPU s | "
          "driver share of CPU | largest process below it, MB | first part s |\n|---|---|---|---|---|---|---|---|---|")
    for r in table:
        rate = r.get("rows_per_s") or r.get("attempts_per_s")
        share = r.get("share_of_bare", r.get("share_of_bound"))
        print(f"| {r['what']} | {r['wall_s']} | {rate:,} | {share:.0%} | {r['driver_peak_rss_mb']} | "
              f"{r['driver_cpu_s']} | {r['driver_share']:.0%} | {r['worker_peak_rss_mb']} ({r['worker_peak'][:40]}) | "
              f"{r.get('first_part_s', '-')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
