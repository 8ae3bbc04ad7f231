"""What Ray Data's row-level checkpoints cost on a resume, at corpus scale (issue #50, item 3).

    .venv/bin/python ../shared/scale/driver_load.py -- .venv/bin/python bench/checkpoint_ids.py --rows 4000000 DIR

Ray 2.60's `CheckpointConfig(id_column=..., checkpoint_path=...)` skips rows a write sink already
wrote. On a rerun it reads every checkpointed id into ONE block, converts it to a sorted NumPy array
(`convert_and_sort_checkpointed_ids`) and every read task `ray.get`s that whole array to filter its
blocks. This bench measures that with redline-shaped ids (`<dataset>:<split>:<row>`, ~20 characters):
phase 1 writes N rows through `write_parquet` with checkpointing on (kept after success); phase 2
reruns the same plan, which must skip every row. Printed per phase: wall seconds, rows written;
`driver_load.py` around it prints the largest RSS of any one process (a read task holding the ids).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def write_source(rows: int, out: Path) -> None:
    """The corpus with redline-shaped row ids, as Parquet (checkpointing needs the id at the read)."""
    import numpy as np
    import pyarrow as pa
    import ray

    def with_ids(batch: dict[str, np.ndarray]) -> pa.Table:
        ids = batch["id"]
        return pa.table({"row_id": pa.array([f"davidson:train:{i:09d}" for i in ids]),
                         "text": pa.array([f"text of row {i}" for i in ids])})

    ray.data.range(rows, override_num_blocks=max(8, rows // 250_000)).map_batches(
        with_ids, batch_format="numpy", batch_size=100_000).write_parquet(str(out))


def plan(source: Path):  # noqa: ANN201 - a ray.data.Dataset
    import pyarrow.compute as pc
    import ray

    def score(batch):  # noqa: ANN001, ANN202 - a stand-in step that keeps the id
        return batch.append_column("chars", pc.utf8_length(batch.column("text")))

    return ray.data.read_parquet(str(source)).map_batches(score, batch_format="pyarrow")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", type=Path)
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    import ray
    from ray.data.checkpoint import CheckpointConfig

    shutil.rmtree(args.dir, ignore_errors=True)
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=2 << 30, logging_level="ERROR")
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    started = time.perf_counter()
    write_source(args.rows, args.dir / "source")
    print(json.dumps({"phase": "source", "rows": args.rows, "wall_s": round(time.perf_counter() - started, 1)}))
    ctx.checkpoint_config = CheckpointConfig(id_column="row_id", checkpoint_path=str(args.dir / "checkpoint"),
                                             delete_checkpoint_on_success=False)
    for phase in ("write", "resume"):
        started = time.perf_counter()
        plan(args.dir / "source").write_parquet(str(args.dir / "out"))
        files = list((args.dir / "out").glob("*.parquet"))
        import pyarrow.parquet as pq

        written = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
        print(json.dumps({"phase": phase, "rows": args.rows, "wall_s": round(time.perf_counter() - started, 1),
                          "rows_in_output": written}), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
