"""`redline run transfer`: benchmark detectors with TaeBench's adversarial examples (transfer attack).

Every victim scores the TaeBench TAE rows (toxic; ASR = FNR, the share it now calls benign), the
TaeBench+ BAE rows (benign; ASR = FPR, the share it calls toxic) and, for reference, the original
seeds of those TAE (FNR before the attack) — per victim and seed dataset, like the paper's Tables 4
and A9. Scoring is the score pipeline's own sharded, resumable machinery.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from redline.cluster import storage
from redline.cluster.config import TransferConfig
from redline.errors import RedlineError
from redline.pipelines import sharded
from redline.pipelines.schema import CORPUS_SCHEMA, STATUS_OK, conform
from redline.pipelines.score import preflight, score_corpus

GROUPS = ("seed", "tae", "bae")  # stored in the corpus' `split` column


def build_corpus(config: TransferConfig) -> pa.Table:
    uri = config.taebench
    manifest = storage.RunDir(uri).manifest()
    if manifest is None or manifest.get("pipeline") != "taebench" or manifest.get("state") != "complete":
        raise RedlineError(f"{uri} is not a finished taebench run directory")
    plus = storage.read_parquet(storage.join(uri, "taebench_plus.parquet"))
    if config.split != "all":
        plus = plus.filter(pc.equal(plus.column("bench_split"), config.split))
    if plus.num_rows == 0:
        raise RedlineError(f"TaeBench at {uri} has no {config.split} rows to transfer")
    rows: list[dict[str, Any]] = []
    seen_seeds: set[str] = set()
    for r in plus.to_pylist():
        rows.append({"id": f"{r['goal']}|{r['id']}", "text": r["text"], "label": r["label"], "dataset": r["dataset"],
                     "split": r["goal"], "label_name": r["recipes"], "source": uri})
        if config.include_seeds and r["goal"] == "tae" and r["seed_id"] not in seen_seeds:
            seen_seeds.add(r["seed_id"])
            rows.append({"id": f"seed|{r['seed_id']}", "text": r["seed_text"], "label": 1, "dataset": r["dataset"],
                         "split": "seed", "label_name": None, "source": r["seed_id"]})
    table = pa.Table.from_pylist(rows)
    return conform(table.append_column("status", pa.array([STATUS_OK] * table.num_rows)), CORPUS_SCHEMA)


def transfer_metrics(predictions: pa.Table) -> list[dict[str, Any]]:
    """Per victim and seed dataset (and overall): seed FNR, TAE ASR (FNR), BAE ASR (FPR), with counts."""
    out = []
    ok = predictions.filter(pc.equal(predictions.column("status"), STATUS_OK))
    datasets = sorted(set(ok.column("dataset").to_pylist()))
    for victim in dict.fromkeys(predictions.column("detector").to_pylist()):
        mine = ok.filter(pc.equal(ok.column("detector"), victim))
        errors = predictions.filter(pc.equal(predictions.column("detector"), victim)).num_rows - mine.num_rows
        for dataset in ["all"] + (datasets if len(datasets) > 1 else []):
            part = mine if dataset == "all" else mine.filter(pc.equal(mine.column("dataset"), dataset))
            row: dict[str, Any] = {"victim": victim, "dataset": dataset, "not_scored": errors if dataset == "all" else None}
            for group in GROUPS:
                g = part.filter(pc.equal(part.column("split"), group))
                pred = g.column("pred_toxic").to_pylist()
                row[f"{group}_n"] = len(pred)
                fooled = sum(1 for p in pred if p == (group == "bae"))  # benign calls on toxic rows; toxic on benign
                row[f"{group}_rate"] = fooled / len(pred) if pred else None
            out.append(row)
    return out


TRANSFER_COLUMNS = [("victim", "victim", "s"), ("dataset", "seed dataset", "s"), ("seed_n", "seeds", "d"),
                    ("seed_rate", "FNR on seeds", ".3f"), ("tae_n", "TAE", "d"), ("tae_rate", "ASR TAE (FNR)", ".3f"),
                    ("bae_n", "BAE", "d"), ("bae_rate", "ASR BAE (FPR)", ".3f"), ("not_scored", "not scored", "d")]


def run_transfer(config: TransferConfig, *, force: bool = False, verbose: bool = False) -> sharded.RunResult:
    from redline.pipelines import report

    preflight(config)  # type: ignore[arg-type]
    run = sharded.open_run("transfer", config, config.output, config.run_name, force)
    if run.reused:
        return sharded.RunResult(run.uri, run.manifest, run.manifest.get("transfer", []), reused=True)
    watch = storage.Stopwatch()
    with sharded.lifecycle(run):
        predictions = score_corpus(run, config, lambda: build_corpus(config), watch, verbose)
        table = transfer_metrics(predictions)
        run.manifest["transfer"] = table
        report.write_transfer_report(run.dir, table, TRANSFER_COLUMNS, run.manifest)
        run.manifest["timings"] = {**run.manifest.get("timings", {}), **watch.timings}
        sharded.complete(run)
    return sharded.RunResult(run.uri, run.manifest, table)
