"""How `redline view` holds a large run: page latency and the viewer's peak memory on score runs of
1M and 10M prediction rows (generated here, in `run score`'s layout: shards of 2,000 texts, a part
per shard and detector for two detectors, and the indexes that `run score` writes when it finishes:
the predictions' own, `pipelines/plane/table_index.py`, and their per-text view's, `pipelines/plane/per_text.py`).

    .venv/bin/python bench/view_scaling.py                    # 1M and 10M rows
    .venv/bin/python bench/view_scaling.py --rows 1000000     # a quick look

Each size is generated twice by child processes (the same corpus, scored by two runs: what compare
shows), and its indexes written by another (timed: the work a finished run's worker task does).
Each way of serving is then measured in a child process of its own (so one's memory is not counted
in the other's peak), by the real viewer app (Starlette over ASGI, the same routes a browser gets):
with the indexes (planned pages: only the parts the index cannot rule out are read), and without
them (the baseline: a run written before the index, or one whose index is stale, read by scanning
its parts). For each it prints one JSON line per request kind: on the predictions, the first page
(the table opened, its filters worked out), the first page again (a new page size, so not a cached
page), a page sorted by score, a filtered page (status and a detector), a text search, a deep page
(page 400), a sorted and filtered page; on the per-text view (one row per text, the detectors side
by side), its first page, the texts the detectors disagree on, the toxic texts that fool every
detector, a page sorted by one detector's score, page 400 and a text search; the compare page of the
two runs (every figure by run, a chart, the texts whose verdict changed); and the export of one
detector's rows as CSV (half the run, streamed: rows/s and MB/s); then the child's peak RSS (before
the export: the in-process client holds a whole response body). Targets (issues 36 and 53): peak RSS
< 300 MB at 10M rows; any page < 300 ms at 1M rows, < 1 s at 10M.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARD_ROWS = 2_000

GENERATE = r"""
import json, sys, numpy as np, pyarrow as pa, pyarrow.parquet as pq
from pathlib import Path
from redline.pipelines.reporting import aggregates as A
from redline.pipelines.reporting.figures import SCORE
out, rows, shard, seed = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
words = np.array("you are a the idiot lovely day go home nice stupid people good bad".split())
texts_rng, rng = np.random.default_rng(0), np.random.default_rng(seed)  # one corpus; scores by the run's seed
sums = {}
for i, start in enumerate(range(0, rows // 2, shard)):  # a shard of `shard` texts: one part per detector
    n = min(shard, rows // 2 - start)
    ids = [f"davidson/test/{j}" for j in range(start, start + n)]
    text = [" ".join(w) for w in words[texts_rng.integers(0, len(words), (n, 8))]]
    label = texts_rng.integers(0, 2, n).astype("int8")
    for k, detector in enumerate(("proxy", "keywords")):
        score = rng.beta(2 + 3 * label, 5 - 3 * label)  # toxic texts score higher, no ties at the ends
        table = pa.table({"id": ids, "text": text, "label": label, "dataset": ["davidson"] * n,
                          "detector": [detector] * n, "status": np.where(rng.random(n) < 0.98, "ok", "rejected"),
                          "toxic_score": score, "pred_toxic": score > 0.5, "seconds": rng.random(n) / 1000})
        pq.write_table(table, out / "predictions" / f"part-{i:05d}-{k}.parquet")
        sums = A.merge(sums, SCORE.partials(table))
manifest = {"pipeline": "score", "run_name": out.name, "state": "complete", "counts": {"rows_in": rows // 2},
            "summary": SCORE.rows(sums), "config": {"seed": seed}}
(out / "manifest.json").write_text(json.dumps(manifest))
"""


def generate(root: Path, rows: int, seed: int = 0) -> str:
    """A score run of `rows` prediction rows: rows / 2 texts in shards of SHARD_ROWS, scored by two
    detectors (a part per shard and detector, as `run score` writes them); `seed`: its scores (the
    same corpus, another run of it)."""
    run_id = f"score-{rows}" + (f"-{seed}" if seed else "")
    predictions = root / run_id / "predictions"
    if not (root / run_id / "manifest.json").exists() or len(list(predictions.glob("*.parquet"))) != 2 * -(-rows // 2 // SHARD_ROWS):
        predictions.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-c", GENERATE, str(root / run_id), str(rows), str(SHARD_ROWS), str(seed)],
                       check=True)
    return run_id


def timed(client, url: str) -> tuple[float, int]:
    started = time.perf_counter()
    response = client.get(url)
    if response.status_code != 200 or "cannot show these rows" in response.text:
        raise SystemExit(f"{url}: HTTP {response.status_code}")
    return (time.perf_counter() - started) * 1000, len(response.content)


KINDS = [("first page (opens the table)", ""), ("first page, 100 rows", "&n=100"),
         ("sorted by score, descending", "&sort=-toxic_score"),
         ("filtered: status and detector", "&f_status=rejected&f_detector=proxy"),
         ("text search", "&q=stupid%20people"), ("page 400", "&page=400"),
         ("sorted and filtered, page 3", "&sort=toxic_score&f_detector=keywords&page=3")]
PER_TEXT = [("per-text: first page (opens the table)", ""), ("per-text: the detectors disagree", "&f_disagree=true"),
            ("per-text: toxic texts that fool every detector", "&f_fooled=every&f_label=toxic"),
            ("per-text: sorted by one detector's score", "&sort=-score_proxy"), ("per-text: page 400", "&page=400"),
            ("per-text: text search", "&q=stupid%20people")]
COMPARE = "compare two runs: grid, chart, changed verdicts"
EXPORT = "export CSV, one detector's rows (half the run)"


def serve(root: Path, runs: dict[int, str], indexed: bool) -> None:
    """One way of serving, in this (child) process: a JSON line per request, then the peak RSS."""
    from starlette.testclient import TestClient

    from redline.view.app import build_app

    with TestClient(build_app(str(root)), base_url="http://127.0.0.1") as client:
        for thread in threading.enumerate():  # a started viewer: its start-up work done, as before a user's first page
            if thread.name == "redline-view-warm-up":
                thread.join()
        for rows, run_id in runs.items():
            for what, query in KINDS:
                ms, size = timed(client, f"/run?id={run_id}&table=predictions{query}")
                print(json.dumps({"rows": rows, "what": what, "ms": round(ms, 1), "kb": round(size / 1024, 1)}),
                      flush=True)
            for what, query in PER_TEXT if indexed or rows <= 1_000_000 else []:  # (scanning 10M: minutes a page)
                ms, size = timed(client, f"/run?id={run_id}&table=per-text{query}")
                print(json.dumps({"rows": rows, "what": what, "ms": round(ms, 1), "kb": round(size / 1024, 1)}),
                      flush=True)
            ms, size = timed(client, f"/compare?id={run_id}&id={run_id}-1")
            print(json.dumps({"rows": rows, "what": COMPARE, "ms": round(ms, 1), "kb": round(size / 1024, 1)}),
                  flush=True)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps({"what": "peak RSS", "mb": round(peak)}), flush=True)
        for rows, run_id in runs.items():  # the rows a filter selects (one detector: half the run), streamed
            ms, size = timed(client, f"/export?id={run_id}&table=predictions&f_detector=proxy&format=csv")
            print(json.dumps({"rows": rows, "what": EXPORT, "ms": round(ms, 1), "kb": round(size / 1024, 1),
                              "rows_per_s": round(rows / 2 / (ms / 1000)),
                              "mb_per_s": round(size / 2**20 / (ms / 1000), 1)}), flush=True)


INDEX = r"""
import sys, time
from redline.pipelines.plane import per_text
from redline.pipelines.plane.table_index import write_index
started = time.perf_counter()
parts = write_index(sys.argv[1], "predictions")
between = time.perf_counter()
shards = per_text.write_index(sys.argv[1], "predictions")
print(parts, between - started, shards, time.perf_counter() - between)
"""


def child(root: Path, sizes: list[int], indexed: bool) -> list[dict]:
    done = subprocess.run([sys.executable, __file__, "--work", str(root), "--rows", ",".join(map(str, sizes)),
                           "--serve", "indexed" if indexed else "scanned"], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1000000,10000000", help="run sizes, comma-separated")
    parser.add_argument("--work", help="where the runs are generated (kept); default: a new temporary folder")
    parser.add_argument("--serve", choices=["indexed", "scanned"], help=argparse.SUPPRESS)  # a child's part
    args = parser.parse_args()
    root = Path(args.work or tempfile.mkdtemp(prefix="redline-view-"))
    root.mkdir(parents=True, exist_ok=True)
    sizes = [int(r) for r in args.rows.split(",") if r]
    if args.serve:
        runs = {rows: f"score-{rows}" for rows in sizes}
        hidden = {run_id: (root / run_id / ".index", root / run_id / ".index-off")
                  for run_id in [*runs.values(), *(f"{r}-1" for r in runs.values())]}
        for on, off in hidden.values():  # the baseline: the same runs without their index
            if args.serve == "scanned" and on.exists():
                on.rename(off)
        try:
            serve(root, runs, args.serve == "indexed")
        finally:
            for on, off in hidden.values():
                if off.exists():
                    off.rename(on)
        return 0
    started = time.perf_counter()
    runs = {rows: generate(root, rows) for rows in sizes}
    for rows in sizes:  # the same corpus scored again (compare's second run)
        generate(root, rows, seed=1)
    print(json.dumps({"what": "generated", "rows": sizes, "seconds": round(time.perf_counter() - started, 1)}),
          flush=True)
    for rows, run_id in runs.items():
        for run in (run_id, f"{run_id}-1"):
            done = subprocess.run([sys.executable, "-c", INDEX, str(root / run)], capture_output=True, text=True,
                                  check=True)
            parts, seconds, shards, per_text_s = done.stdout.split()
            print(json.dumps({"rows": rows, "run": run, "what": "index written", "parts": int(parts),
                              "seconds": round(float(seconds), 2), "per_text_shards": int(shards),
                              "per_text_seconds": round(float(per_text_s), 2)}), flush=True)
    results = {}
    for indexed in (True, False):
        results[indexed] = child(root, sizes, indexed)
        for line in results[indexed]:
            print(json.dumps({"serving": "indexed" if indexed else "scanned", **line}), flush=True)
    by = {indexed: {(r.get("rows"), r["what"]): r for r in lines} for indexed, lines in results.items()}
    print("\n| rows | request | with the index, ms | scanning the parts, ms | ratio |\n|---|---|---:|---:|---:|")
    for key, r in by[True].items():
        if "ms" not in r:
            continue
        base = by[False].get(key, {}).get("ms")
        rate = f" ({r['rows_per_s']:,} rows/s, {r['mb_per_s']} MB/s)" if "rows_per_s" in r else ""
        ratio = f"{base / r['ms']:.1f}x" if base else ""
        print(f"| {key[0]:,} | {key[1]}{rate} | {r['ms']:,.0f} | {f'{base:,.0f}' if base else '–'} | {ratio} |")
    peaks = {indexed: by[indexed][(None, "peak RSS")]["mb"] for indexed in by}
    print(f"\nviewer peak RSS: {peaks[True]:,} MB with the index, {peaks[False]:,} MB scanning the parts")
    slow = [f"{k[0]:,} rows: {k[1]}" for k, r in by[True].items() if "ms" in r and k[1] != EXPORT
            and r["ms"] > (300 if k[0] <= 1_000_000 else 1000)]
    print("targets: " + ("every page within its target" if not slow else "over target: " + "; ".join(slow))
          + f"; peak RSS {'within' if peaks[True] < 300 else 'over'} 300 MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
