"""`redline run advtrain`: how much adversarial training with TaeBench makes a detector robust.

The paper's Table 5 as a Ray Tune experiment. Each variant is a data recipe over the same seed
training set: `no_tae`; `unfiltered_tae` (raw attack successes, as many as TaeBench has);
`taebench`; `taebench_plus` (+ filtered BAE); `balanced_taebench_plus` (BAE oversampled to match
the TAE). Adversarial rows come from TaeBench's train split only (and never from `holdout_recipes`).
Every trial fine-tunes the base model and reports, each epoch, its validation metric and the
table's columns: seed-test F1 / ROC-AUC, ASR on TaeBench test TAE (FNR), on TaeBench+ test BAE
(FPR), balanced accuracy over TaeBench+ test, and ASR on TAE of held-out recipes. The report keeps
the best trial per variant. An interrupted sweep resumes with `Tuner.restore`.
"""

from __future__ import annotations

import json
import logging
import os
import random
import tempfile
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from redline.cluster import storage
from redline.cluster.config import Execution, Input, Result, RunConfig, Strict
from redline.cluster.runs import Run, RunDir, RunResult, Stopwatch, require_finished
from redline.errors import RedlineError, last_line
from redline.pipelines.plane.corpora import CorpusConfig, read_corpus
from redline.pipelines.reporting.figures import ADVTRAIN
from redline.pipelines.reporting.report import Report, grouped_bars
from redline.pipelines.run_skeleton import Pipeline

log = logging.getLogger(__name__)

VARIANTS = ("no_tae", "unfiltered_tae", "taebench", "taebench_plus", "balanced_taebench_plus")


class SearchSpace(Strict):
    """Hyper-parameters swept by Ray Tune: every combination of the lists, `num_samples` times each."""

    learning_rate: list[float] = Result([5e-5], min_length=1)
    batch_size: list[int] = Execution([16], min_length=1)
    epochs: list[int] = Result([3], min_length=1)
    augment_ratio: list[float] = Result([1.0], min_length=1,
                                       description="Adversarial rows added per base training row, at most (1.0: up to "
                                                   "as many as the base set has).")


class AdvTrainConfig(RunConfig):
    """`redline run advtrain`: adversarial-training variants (the paper's Table 5) as a Ray Tune sweep."""

    taebench: str = Input(description="A finished `redline run taebench` run directory.")
    train_corpus: CorpusConfig = Field(description="The seed training set every variant starts from.")
    test_corpus: CorpusConfig = Field(description="The seed test split (F1 / ROC-AUC column).")
    base_model: str = Input(description="Hub id or local directory of the model to fine-tune.")
    variants: list[Literal["no_tae", "unfiltered_tae", "taebench", "taebench_plus", "balanced_taebench_plus"]] = Result(
        list(VARIANTS), min_length=1)
    holdout_recipes: list[str] = Result(default_factory=list,
                                       description="Recipes left out of training TAE, to measure robustness to unseen attacks.")
    search: SearchSpace = Field(default_factory=SearchSpace)
    num_samples: int = Result(1, gt=0, description="Trials per grid point (different seeds).")
    scheduler: Literal["fifo", "asha"] = Result("fifo")
    grace_period: int = Result(1, gt=0, description="ASHA: epochs before a trial can be stopped.")
    reduction_factor: float = Result(2.0, gt=1)
    metric: Literal["val_f1", "val_balanced_accuracy"] = Result(
        "val_f1", description="Chooses the best trial per variant.")
    schedule: Literal["linear", "cosine_with_restarts"] = Result("linear")
    warmup_ratio: float = Result(0.1, ge=0, lt=1)
    patience: int | None = Result(None, gt=0, description="Early stopping: epochs without a better validation metric.")
    max_length: int = Result(128, gt=0)
    max_train_rows: int | None = Result(None, gt=0, description="Cap on base training rows (a seeded sample).")
    max_concurrent_trials: int | None = Result(None, gt=0)
    num_cpus: float = Execution(1.0, gt=0, description="CPUs per trial.")
    num_gpus: float = Execution(0.0, ge=0, description="GPUs per trial.")
    seed: int = Result(0)


EVAL_SETS = ("seed_test", "tae_test", "bae_test", "unseen_tae")
EPOCH_FILE = "redline_epoch.json"


def _labelled(config: Any) -> pa.Table:
    table = read_corpus(config)
    ok = table.filter(pc.and_(pc.equal(table.column("status"), "ok"), pc.is_valid(table.column("label"))))
    return pa.table({"text": ok.column("text"), "label": ok.column("label").cast(pa.int8())})


def _uses(recipes: list[str], holdout: set[str]) -> bool:
    return any(r in holdout for r in recipes)


def prepare_data(config: AdvTrainConfig, run: Run) -> dict[str, str]:
    """The sweep's data sets, written by a task on a worker (the corpora and TaeBench are read there,
    never on the driver); returns their paths."""
    from redline.cluster.runtime import on_a_worker

    paths, counts = on_a_worker(write_data, config, run.dir.uri)
    run.manifest["data"] = counts
    return paths


def write_data(config: AdvTrainConfig, run_uri: str) -> tuple[dict[str, str], dict[str, int]]:
    """Write the base set, each variant's adversarial rows and the evaluation sets; returns their paths
    and row counts."""
    from redline.pipelines.taebench import TaebenchConfig, bench_split, load_raw, read_bench

    manifest = require_finished(config.taebench, "taebench")
    tb_config = TaebenchConfig.model_validate(manifest["config"])
    holdout = set(config.holdout_recipes)
    rng = random.Random(config.seed)

    base = _labelled(config.train_corpus)
    if config.max_train_rows and base.num_rows > config.max_train_rows:
        base = base.take(pa.array(sorted(rng.sample(range(base.num_rows), config.max_train_rows))))
    if base.num_rows == 0 or len(set(base.column("label").to_pylist())) < 2:
        raise RedlineError("train_corpus needs labelled rows of both classes")
    plus = read_bench(config.taebench).to_pylist()
    seen = [r for r in plus if not _uses(r["recipes"].split(","), holdout)]
    tae_train = [r for r in seen if r["goal"] == "tae" and r["bench_split"] == "train"]
    bae_train = [r for r in seen if r["goal"] == "bae" and r["bench_split"] == "train"]
    raw = [r for r in load_raw(tb_config).to_pylist() if r["goal"] == "tae" and r["recipe"] not in holdout
           and bench_split(r["seed_id"], tb_config.test_fraction, tb_config.seed) == "train"]
    unfiltered = rng.sample(raw, min(len(tae_train), len(raw)))
    oversampled = [bae_train[i % len(bae_train)] for i in range(max(len(tae_train), len(bae_train)))] if bae_train else []
    adversarial = {"no_tae": [], "unfiltered_tae": unfiltered, "taebench": tae_train, "taebench_plus": tae_train + bae_train,
                   "balanced_taebench_plus": tae_train + oversampled}
    evals = {
        "seed_test": _labelled(config.test_corpus).to_pylist(),
        "tae_test": [r for r in plus if r["goal"] == "tae" and r["bench_split"] == "test"],
        "bae_test": [r for r in plus if r["goal"] == "bae" and r["bench_split"] == "test"],
        "unseen_tae": [r for r in plus if r["goal"] == "tae" and _uses(r["recipes"].split(","), holdout)],
    }
    paths = {"base": storage.join(run_uri, "data", "base.parquet")}
    storage.write_parquet(base, paths["base"])
    for name, rows in [*((f"adv_{v}", adversarial[v]) for v in config.variants), *evals.items()]:
        paths[name] = storage.join(run_uri, "data", f"{name}.parquet")
        table = pa.table({"text": pa.array([r["text"] for r in rows], pa.string()),
                          "label": pa.array([int(r["label"]) for r in rows], pa.int8())})
        storage.write_parquet(table, paths[name])
    counts = {"base_rows": base.num_rows, **{f"adv_{v}": len(adversarial[v]) for v in config.variants},
              **{k: len(v) for k, v in evals.items()}}
    if not evals["tae_test"]:
        raise RedlineError("TaeBench has no test-split TAE rows to evaluate on (raise its test_fraction or attack more seeds)")
    return paths, counts


def _rates(y: np.ndarray, p: np.ndarray) -> dict[str, float | None]:
    pred = p >= 0.5
    pos, neg = y == 1, y == 0
    tpr = float(pred[pos].mean()) if pos.any() else None
    tnr = float((~pred[neg]).mean()) if neg.any() else None
    return {"fnr": None if tpr is None else 1 - tpr, "fpr": None if tnr is None else 1 - tnr,
            "balanced_accuracy": None if tpr is None or tnr is None else (tpr + tnr) / 2}


def trial(params: dict[str, Any], config: AdvTrainConfig, paths: dict[str, str]) -> None:
    """One Tune trial: fine-tune on base + this variant's adversarial rows, report every epoch. The
    sweep's axes come in `params`; the typed config and data paths through the object store."""
    from ray import tune

    from redline.actors.trainer import (
        ClassifierTrainer,
        TrainSettings,
        binary_metrics,
        split_held_out,
    )

    base = storage.read_parquet(paths["base"]).to_pylist()
    adv = storage.read_parquet(paths[f"adv_{params['variant']}"]).to_pylist()
    rng = random.Random(params["seed"])
    rng.shuffle(adv)
    adv = adv[: int(params["augment_ratio"] * len(base))]
    rows = base + adv
    train_idx, val_idx = split_held_out(len(rows), 0.1, params["seed"])
    texts = [rows[i]["text"] for i in train_idx]
    labels = [int(rows[i]["label"]) for i in train_idx]
    val_texts, val_y = [rows[i]["text"] for i in val_idx], np.array([rows[i]["label"] for i in val_idx])
    evals = {name: storage.read_parquet(paths[name]).to_pylist() for name in EVAL_SETS}
    settings = TrainSettings(epochs=params["epochs"], learning_rate=params["learning_rate"],
                             batch_size=params["batch_size"], warmup_ratio=config.warmup_ratio, schedule=config.schedule,
                             max_length=config.max_length, seed=params["seed"])
    # Resumed after an interruption: continue from the last checkpoint's weights and epoch (the
    # optimizer and schedule restart for the remaining epochs).
    source, start, workdir = config.base_model, 1, tempfile.mkdtemp(prefix="redline-trial-")
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        source = checkpoint.to_directory(os.path.join(workdir, "resume"))
        start = json.loads(open(os.path.join(source, EPOCH_FILE)).read())["epoch"] + 1
    trainer = ClassifierTrainer(source, ("benign", "toxic"), settings, len(texts))
    best, since_best = -1.0, 0
    for epoch in range(start, params["epochs"] + 1):
        loss = trainer.train_epoch(texts, labels)
        val_p = trainer.predict(val_texts)
        val, val_metrics = _rates(val_y, val_p), binary_metrics(val_y, val_p)
        # what this variant really trained on: its adversarial rows, and the benign-labelled (BAE) ones
        metrics: dict[str, Any] = {"epoch": epoch, "train_loss": loss, "train_rows": len(texts),
                                   "train_adv_rows": sum(i >= len(base) for i in train_idx),
                                   "train_bae_rows": sum(i >= len(base) and int(rows[i]["label"]) == 0 for i in train_idx),
                                   "val_f1": val_metrics["f1"], "val_balanced_accuracy": val["balanced_accuracy"]}
        for name, data in evals.items():
            if not data:
                continue
            y, p = np.array([r["label"] for r in data]), trainer.predict([r["text"] for r in data])
            if name == "seed_test":
                m = binary_metrics(y, p)
                metrics.update(seed_f1=m["f1"], seed_roc_auc=m["roc_auc"])
            elif name == "tae_test":
                metrics["tae_asr"] = _rates(y, p)["fnr"]
                tae_y, tae_p = y, p
            elif name == "bae_test":
                metrics["bae_asr"] = _rates(y, p)["fpr"]
                metrics["plus_balanced_accuracy"] = _rates(np.concatenate([tae_y, y]), np.concatenate([tae_p, p]))[
                    "balanced_accuracy"]
            else:
                metrics["unseen_tae_asr"] = _rates(y, p)["fnr"]
        with tempfile.TemporaryDirectory() as tmp:
            trainer.save(tmp)
            with open(os.path.join(tmp, EPOCH_FILE), "w") as f:
                json.dump({"epoch": epoch, "variant": params["variant"]}, f)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmp))
        score = metrics[config.metric] or 0.0
        best, since_best = (score, 0) if score > best else (best, since_best + 1)
        if config.patience is not None and since_best >= config.patience:
            break


def summarize(results: Any, config: AdvTrainConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every trial at its best epoch, and the best trial per variant (the report's table)."""
    trials = []
    for r in results:
        if r.metrics_dataframe is None or r.metrics_dataframe.empty:
            trials.append({"variant": r.config["variant"], "status": "error", "error": str(r.error)[:300]})
            continue
        df = r.metrics_dataframe
        best = df.loc[df[config.metric].fillna(-1).idxmax()]
        row = {"variant": r.config["variant"], "status": "error" if r.error else "done",
               "learning_rate": r.config["learning_rate"], "batch_size": r.config["batch_size"],
               "epochs": r.config["epochs"], "augment_ratio": r.config["augment_ratio"],
               "epochs_run": int(df["epoch"].max()), "checkpoint": r.checkpoint.path if r.checkpoint else None}
        for key, *_ in ADVTRAIN.columns():
            if key in best and key not in row:
                value = best[key]
                row[key] = None if value != value else (int(value) if key in ("epoch", "train_rows", "train_adv_rows",
                                                                             "train_bae_rows") else float(value))
        row[config.metric] = float(best[config.metric])
        trials.append(row)
    table = []
    for variant in config.variants:
        mine = [t for t in trials if t["variant"] == variant and t["status"] == "done"]
        if mine:
            table.append(max(mine, key=lambda t: t[config.metric]))
    return trials, table


def execute(config: AdvTrainConfig, run: Run, watch: Stopwatch, verbose: bool) -> list[dict[str, Any]]:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    from redline.cluster.runtime import check_placeable, ensure_ray

    ensure_ray(verbose=verbose)
    paths = run.manifest.get("data_paths") or prepare_data(config, run)
    run.manifest["data_paths"] = paths
    run.dir.write_manifest(run.manifest)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    check_placeable("each advtrain trial", config.num_cpus, config.num_gpus)
    trainable = tune.with_resources(tune.with_parameters(trial, config=config, paths=paths),
                                    {"cpu": config.num_cpus, "gpu": config.num_gpus})
    storage_path = run.uri if storage.is_s3(run.uri) else os.path.abspath(run.uri)
    sweep = storage.join(storage_path, "sweep")
    if tune.Tuner.can_restore(sweep):
        log.info("resuming the sweep in %s", sweep)
        tuner = tune.Tuner.restore(sweep, trainable=trainable, resume_errored=True)
        run.manifest["resumed_sweep"] = True
    else:
        s = config.search
        space = {"variant": tune.grid_search(list(config.variants)),
                 "learning_rate": tune.grid_search(s.learning_rate), "batch_size": tune.grid_search(s.batch_size),
                 "epochs": tune.grid_search(s.epochs), "augment_ratio": tune.grid_search(s.augment_ratio),
                 "seed": tune.randint(0, 2**31 - 1) if config.num_samples > 1 else config.seed}
        scheduler = (ASHAScheduler(time_attr="training_iteration", max_t=max(s.epochs),
                                   grace_period=config.grace_period, reduction_factor=config.reduction_factor)
                     if config.scheduler == "asha" else None)
        tuner = tune.Tuner(
            trainable, param_space=space,
            tune_config=tune.TuneConfig(metric=config.metric, mode="max", num_samples=config.num_samples,
                                        scheduler=scheduler, max_concurrent_trials=config.max_concurrent_trials),
            # Two checkpoints kept, not one: a sweep stopped between a trial's new checkpoint and the
            # experiment's next snapshot must still find the one that snapshot names. A trial that
            # fails (e.g. its node went away) is retried once from its last checkpoint.
            run_config=tune.RunConfig(name="sweep", storage_path=storage_path, verbose=1 if verbose else 0,
                                      failure_config=tune.FailureConfig(max_failures=1),
                                      checkpoint_config=tune.CheckpointConfig(
                                          num_to_keep=2, checkpoint_score_attribute=config.metric,
                                          checkpoint_score_order="max")))
    results = tuner.fit()
    watch.lap("sweep_s")
    trials, table = summarize(results, config)
    failed = [t for t in trials if t["status"] == "error"]
    run.manifest["failed_trials"] = len(failed)
    if not table:
        first = last_line(failed[0].get("error") or "no result") if failed else "no trials ran"
        raise RedlineError(f"every trial of the sweep failed ({len(failed)}); the last line of the first error: {first}")
    run.manifest["trials"] = trials
    return table


def plot_advtrain(table: list[dict[str, Any]]) -> bytes | None:
    return grouped_bars(table, "variant", [(k, ADVTRAIN.figure(k).label) for k in
                                           ("seed_f1", "tae_asr", "bae_asr", "plus_balanced_accuracy")],
                        "adversarial training variants (best trial each)")


def write_report(run: RunDir, manifest: dict[str, Any]) -> None:
    table, trials, cols = manifest.get("summary", []), manifest.get("trials", []), ADVTRAIN.columns()
    trial_cols = [("variant", "variant", "s"), ("status", "status", "s"), ("learning_rate", "lr", ".0e"),
                  ("batch_size", "batch", "d"), ("epochs", "epochs", "d"), ("augment_ratio", "aug. ratio", ".2f"),
                  ("epochs_run", "epochs run", "d"), ("tae_asr", "TaeBench ASR", ".3f"), ("seed_f1", "seed F1", ".3f")]
    data = manifest.get("data", {})
    note = (f"Base training rows {data.get('base_rows')}; adversarial rows per variant "
            + ", ".join(f"{k[4:]} {v}" for k, v in data.items() if k.startswith("adv_"))
            + f"; evaluated on {data.get('seed_test')} seed-test rows, {data.get('tae_test')} TaeBench test TAE, "
              f"{data.get('bae_test')} TaeBench+ test BAE, {data.get('unseen_tae')} TAE of held-out recipes. "
              "ASR = FNR on TAE, FPR on BAE (lower is more robust).")
    report = Report(run, "redline adversarial-training report", manifest, note)
    report.table("Best trial per variant (Table 5)", table, cols).plot("advtrain", plot_advtrain(table))
    report.table("All trials", trials, trial_cols).write("table.csv", table)


PIPELINE = Pipeline("advtrain", AdvTrainConfig, execute, write_report, "adversarial training: best trial per variant",
                    lambda manifest: ADVTRAIN.columns())


def run_advtrain(config: AdvTrainConfig, *, force: bool = False, verbose: bool = False) -> RunResult:
    return PIPELINE.run(config, force=force, verbose=verbose)
