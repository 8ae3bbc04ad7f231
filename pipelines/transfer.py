"""`redline run transfer`: benchmark detectors with TaeBench's adversarial examples (transfer attack).

Every victim scores the TaeBench TAE rows (toxic; ASR = FNR, the share it now calls benign), the
TaeBench+ BAE rows (benign; ASR = FPR, the share it calls toxic) and, for reference, the original
seeds of those TAE (FNR before the attack) — per victim and seed dataset, like the paper's Tables 4
and A9. A victim's rates leave out the examples that were made against that victim itself (they fool
it by construction: white-box success, which the attack run reports); they are counted apart
(`own_n`). Scoring is the score pipeline's own sharded, resumable machinery.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, field_validator

from redline.actors.detectors import DetectorConfig
from redline.cluster.config import Input, Result, RunConfig, unique_names
from redline.cluster.runs import Run, RunDir, RunResult, Stopwatch, require_finished
from redline.cluster.tables import STATUS_OK, conform
from redline.errors import RedlineError
from redline.pipelines.plane import sharded
from redline.pipelines.plane.schema import CORPUS_SCHEMA
from redline.pipelines.reporting.figures import TRANSFER
from redline.pipelines.reporting.report import Report, grouped_bars
from redline.pipelines.run_skeleton import Pipeline
from redline.pipelines.score import preflight as preflight_detectors
from redline.pipelines.score import score_corpus
from redline.pipelines.taebench import read_bench


class TransferConfig(RunConfig):
    """`redline run transfer`: how often TaeBench's examples fool other detectors (ASR = FNR / FPR)."""

    taebench: str = Input(description="A finished `redline run taebench` run directory (local or s3://).")
    victims: list[DetectorConfig] = Field(min_length=1, description="Detectors to attack by transfer (any kind).")
    split: Literal["test", "train", "all"] = Result("test", description="Which TaeBench split to evaluate.")
    include_seeds: bool = Result(True, description="Also score the original seeds (FNR before the attack).")
    shard_size: int = Result(2_000, gt=0)

    @field_validator("victims")
    @classmethod
    def _unique(cls, victims: list[DetectorConfig]) -> list[DetectorConfig]:
        return unique_names(victims, "victim")

    @property
    def detectors(self) -> list[DetectorConfig]:
        return self.victims


def build_corpus(config: TransferConfig) -> pa.Table:
    uri = config.taebench
    require_finished(uri, "taebench")
    plus = read_bench(uri)
    if config.split != "all":
        plus = plus.filter(pc.equal(plus.column("bench_split"), config.split))
    if plus.num_rows == 0:
        raise RedlineError(f"TaeBench at {uri} has no {config.split} rows to transfer")
    rows: list[dict[str, Any]] = []
    seen_seeds: set[str] = set()
    for r in plus.to_pylist():
        rows.append({"id": f"{r['goal']}|{r['id']}", "text": r["text"], "label": r["label"], "dataset": r["dataset"],
                     "split": r["goal"], "label_name": r["recipes"], "source": r["victim"]})
        if config.include_seeds and r["goal"] == "tae" and r["seed_id"] not in seen_seeds:
            seen_seeds.add(r["seed_id"])
            rows.append({"id": f"seed|{r['seed_id']}", "text": r["seed_text"], "label": 1, "dataset": r["dataset"],
                         "split": "seed", "label_name": None, "source": r["seed_id"]})
    table = pa.Table.from_pylist(rows)
    return conform(table.append_column("status", pa.array([STATUS_OK] * table.num_rows)), CORPUS_SCHEMA)


def execute(config: TransferConfig, run: Run, watch: Stopwatch, verbose: bool) -> list[dict[str, Any]]:
    return score_corpus(run, config, (sharded.Source(partial(build_corpus, config)),), watch, verbose, TRANSFER)


def filter_victims(classifier: Any, victims: list[Any]) -> list[str]:
    """The victims that are the label filter's own `classifier` (the same name, or the same kind and
    model): the filter kept only the examples it agrees with, so their transfer figures are 0 by
    construction. `classifier` and `victims`: detector settings (dicts or `DetectorConfig`s)."""
    def ident(d: Any) -> tuple[Any, Any, Any]:
        d = d.model_dump() if isinstance(d, DetectorConfig) else dict(d or {})
        return d.get("name"), d.get("kind"), d.get("model")

    name, kind, model = ident(classifier)
    if name is None:
        return []
    return [v for v, k, m in map(ident, victims) if v == name or (model is not None and (k, m) == (kind, model))]


def filter_victim_error(names: list[str], where: str) -> str:
    return (f"{names[0]} is the label filter's classifier in {where}: the filter kept only the examples it agrees "
            "with, so its transfer figures would be 0 by construction; leave it out of the victims, or filter "
            "TaeBench with a classifier you do not benchmark")


def preflight(config: TransferConfig) -> None:
    """A finished TaeBench run, no victim that is its own label filter, every victim loadable."""
    filtered_by = (require_finished(config.taebench, "taebench").get("config") or {}).get("classifier")
    same = filter_victims(filtered_by, config.victims)
    if same:
        raise RedlineError(filter_victim_error(same, f"the TaeBench run {config.taebench}"))
    preflight_detectors(config)  # type: ignore[arg-type]


def plot_transfer(rows: list[dict[str, Any]]) -> bytes | None:
    return grouped_bars([r for r in rows if r["dataset"] == "all"], "victim",
                        [(k, TRANSFER.figure(k).label) for k in ("seed_rate", "tae_rate", "bae_rate")],
                        "transfer attack: how often TaeBench fools each detector")


def write_report(run: RunDir, manifest: dict[str, Any]) -> None:
    rows, cols = manifest.get("summary", []), TRANSFER.columns()
    cfg = manifest.get("config", {})
    note = (f"TaeBench {cfg.get('taebench')} ({cfg.get('split')} split). ASR on TAE = share of toxic adversarial "
            "examples a victim calls benign (FNR); ASR on BAE = share of benign adversarial examples it calls toxic "
            "(FPR); FNR on seeds = the same victim on the original toxic seeds. Examples made against a victim itself "
            "are left out of its rates (counted as 'own'): they fool it by construction.")
    report = Report(run, "redline transfer-attack report", manifest, note)
    report.table("Transfer attack", rows, cols).plot("transfer", plot_transfer(rows)).write("transfer.csv", rows)


PIPELINE = Pipeline("transfer", TransferConfig, execute, write_report, "transfer attack",
                    lambda manifest: TRANSFER.columns(), preflight=preflight)


def run_transfer(config: TransferConfig, *, force: bool = False, verbose: bool = False) -> RunResult:
    return PIPELINE.run(config, force=force, verbose=verbose)
