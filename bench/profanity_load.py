"""What an actor pays to host profanity-check: sklearn's pickles against redline's cached arrays (issue 50).

    .venv/bin/python bench/profanity_load.py [--rows 24783] [--repeats 3]

Each path runs in a fresh Python process, as a freshly started actor does, with a cache of its own
(the bench's temporary folder, warmed once first): `sklearn` imports alt-profanity-check (which
imports sklearn and unpickles the vectorizer and five calibrated SVMs) and calls its
`predict_prob`; `arrays` loads redline's `.npz` of the same model (`profanity_arrays.cached()`) and
calls `predict_proba`. Printed per path, the median of the repeats: CPU seconds to load the model,
CPU seconds to score the first 64 texts, seconds to score all rows, rows/s; then whether the two paths'
scores are equal bit for bit on every row (Davidson's tweets from ../shared/data).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

DAVIDSON = Path(__file__).resolve().parents[2] / "shared" / "data" / "offensive_tweet" / "labeled_data.csv"

CHILD = r"""
import json, sys, time
import numpy as np
import pyarrow.csv as pacsv

texts = pacsv.read_csv(sys.argv[2], parse_options=pacsv.ParseOptions(newlines_in_values=True)).column("tweet").to_pylist()
texts = [t for t in texts if isinstance(t, str)][: int(sys.argv[3])]
cpu = time.process_time()
if sys.argv[1] == "sklearn":
    from profanity_check import predict_prob as score
else:
    from redline.actors.detectors import profanity_arrays
    score = profanity_arrays.cached().predict_proba
loaded = time.process_time() - cpu
first = time.process_time()
score(texts[:64])
first = time.process_time() - first
wall = time.perf_counter()
probs = np.asarray(score(texts), dtype=np.float64)
wall = time.perf_counter() - wall
np.save(sys.argv[4], probs)
print(json.dumps({"load_cpu_s": loaded, "first_64_cpu_s": first, "all_s": wall, "rows": len(texts)}))
"""


def run(path: str, rows: int, out: Path, env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, path, str(DAVIDSON), str(rows), str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit(f"{path}: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=24_783)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import numpy as np

    if not DAVIDSON.is_file():
        sys.exit(f"no Davidson corpus at {DAVIDSON}")
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "REDLINE_CACHE": str(Path(tmp) / "cache"), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        run("arrays", 8, Path(tmp) / "warm.npy", env)  # makes the cache, as the first actor on a machine does
        results = {}
        for path in ("sklearn", "arrays"):
            runs = [run(path, args.rows, Path(tmp) / f"{path}.npy", env) for _ in range(args.repeats)]
            results[path] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        same = np.array_equal(np.load(Path(tmp) / "sklearn.npy"), np.load(Path(tmp) / "arrays.npy"))
    print(f"| path | load, CPU s | first 64 texts, CPU s | {results['arrays']['rows']:,.0f} rows, s | rows/s |")
    print("|---|---:|---:|---:|---:|")
    for path, r in results.items():
        print(f"| {path} | {r['load_cpu_s']:.3f} | {r['first_64_cpu_s']:.4f} | {r['all_s']:.2f} | {r['rows'] / r['all_s']:,.0f} |")
    s, a = results["sklearn"], results["arrays"]
    print(f"load: arrays {s['load_cpu_s'] / a['load_cpu_s']:.1f}x less CPU; scoring rate arrays/sklearn "
          f"{s['all_s'] / a['all_s']:.2f}x; scores bit-equal on every row: {same}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
