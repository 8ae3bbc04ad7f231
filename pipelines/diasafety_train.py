"""`redline train dialogue-safety`: train DiaSafety context classifiers and compare them (Tables 4-7).

Variants: `one_vs_all` (one 3-way classifier per category on (context, response) pairs),
`single` (one multi-class classifier) and `one_vs_all_no_context` (the response-only ablation).
Every variant is scored on the validation split (and on a test split when given), fine-grain
(per-class P/R/F1 and macro) and coarse-grain (unsafe vs safe); utterance-level detectors add coarse
rows given the response only and given context + response concatenated. Classifiers train one after
another, or in parallel as Ray Tune trials (with a hyper-parameter grid, the best per classifier by
validation macro-F1 is kept). Models are saved under the run directory.
"""

from __future__ import annotations

import hashlib
import random
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from redline.actors.detectors import DetectorConfig, build_detector, detector_class
from redline.actors.dialogue_safety import classifiers as C
from redline.actors.dialogue_safety.taxonomy import category, taxonomy
from redline.actors.trainer import TrainSettings
from redline.cluster import artifacts, storage
from redline.cluster.config import Execution, Input, Result, RunConfig, Strict
from redline.cluster.devices import PRECISION_HELP, Precision
from redline.cluster.progress import progress_bar
from redline.cluster.runs import Run, RunDir, RunResult, Stopwatch, clear
from redline.cluster.runtime import check_placeable, ensure_ray, on_a_worker, on_a_worker_reporting
from redline.errors import RedlineError, last_line
from redline.pipelines.reporting.figures import DIALOGUE_SAFETY_FINE, DIALOGUE_SAFETY_TRAIN
from redline.pipelines.reporting.report import Report, grouped_bars
from redline.pipelines.run_skeleton import Pipeline


class HyperGrid(Strict):
    """Values to try for training settings; every combination is a Ray Tune trial per classifier."""

    learning_rate: list[float] | None = Result(None, min_length=1)
    batch_size: list[int] | None = Execution(None, min_length=1)
    epochs: list[int] | None = Result(None, min_length=1)
    weight_decay: list[float] | None = Result(None, min_length=1)
    warmup_ratio: list[float] | None = Result(None, min_length=1)

    def combinations(self) -> list[dict[str, Any]]:
        import itertools

        axes = {k: v for k, v in self.model_dump().items() if v}
        return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]


class ContextBaseline(Strict):
    """A context-aware classifier as a coarse-grain baseline."""

    detector: DetectorConfig
    join: Literal["pair", "newline", "space"] = Result(
        "newline", description="pair: the model's text pair (hf cross-encoders); newline: turns on their own lines "
                               "(ParlAI's BBF/BAD history format); space: one string.")

    @model_validator(mode="after")
    def _pair_needs_hf(self) -> "ContextBaseline":
        if self.join == "pair" and not detector_class(self.detector.kind).takes_text_pairs:
            raise ValueError(f"context baseline '{self.detector.name}': join: pair needs a detector that takes "
                             f"text pairs (a model's own pair input, as hf does), not {self.detector.kind}")
        return self


class DialogueSafetyTrainConfig(RunConfig):
    """`redline train dialogue-safety`: DiaSafety context classifiers and the paper's comparisons."""

    train: str = Input(description="DiaSafety train JSON (rows of context, response, category, label).")
    val: str = Input(description="DiaSafety validation JSON: picks each classifier's best epoch (and trial), and "
                                 "is scored.")
    test: str | None = Input(None, description="DiaSafety test JSON: scored too, next to validation (the paper "
                                               "reports test); never used to choose anything.")
    test_from_train: float | None = Result(None, gt=0, lt=0.5, description=(
        "Without a test file: hold this share of train out as the test split (the same rows on every run, "
        "chosen by each pair's text), trained on and selected on by nothing."))
    base_model: str = Input(description="Hub id or local directory (RoBERTa-base in the paper; MiniLM offline).")
    categories: list[str] | None = Result(None, min_length=1, description="Default: every category with training rows.")
    add_categories: list[dict[str, Any]] = Result(default_factory=list,
                                                 description="Extra taxonomy entries: {name, definition, personal}.")
    variants: list[Literal["one_vs_all", "single", "one_vs_all_no_context"]] = Result(
        ["one_vs_all", "single", "one_vs_all_no_context"], min_length=1)
    utterance_detectors: list[DetectorConfig] = Field(
        default_factory=list, description="Coarse-grain baselines, given the response only and context+response.")
    context_baselines: list[ContextBaseline] = Field(
        default_factory=list, description="Context-aware coarse-grain baselines (the paper compares BBF and BAD): "
                                          "a detector given (context, response) as its model's text pair, or "
                                          "joined as dialogue turns.")
    na_ratio: float | None = Result(None, gt=0, description=(
        "one-vs-all: train each category's head on at most this many N/A rows per row of its own (a seeded "
        "sample of the other categories' rows). Default: all of them, as the paper (74-86% N/A per head on "
        "DiaSafety)."))
    epochs: int = Result(10, gt=0)
    learning_rate: float = Result(2e-5, gt=0)
    batch_size: int = Execution(16, gt=0)
    max_length: int = Result(128, gt=0)
    patience: int | None = Result(2, gt=0, description="Early stopping on validation macro-F1.")
    precision: Precision = Result("auto", description=PRECISION_HELP)
    num_gpus: float = Execution(
        0.0, ge=0, description="Train on a GPU (without tune_trials; the trials get trial_gpus).")
    tune_trials: bool = Execution(False, description="Train the one-vs-all categories in parallel as Ray Tune trials.")
    search: HyperGrid | None = Field(None, description="A hyper-parameter grid, e.g. {learning_rate: [1e-5, 2e-5], "
                                                       "batch_size: [16, 32]}: every combination a Tune trial per "
                                                       "classifier (implies tune_trials); the best by validation "
                                                       "macro-F1 is kept.")
    trial_cpus: float = Execution(1.0, gt=0, description="CPUs per trial (with tune_trials).")
    trial_gpus: float = Execution(0.0, ge=0, description="GPUs per trial (with tune_trials).")
    limit_train: int | None = Result(None, gt=0, description="Train on a seeded sample of this many rows.")
    limit_val: int | None = Result(None, gt=0)
    seed: int = Result(0)

    @model_validator(mode="after")
    def _one_test_split(self) -> "DialogueSafetyTrainConfig":
        if self.test is not None and self.test_from_train is not None:
            raise ValueError("give either test (a file) or test_from_train (a share of train), not both")
        return self


def _sample(rows: list[dict[str, str]], n: int | None, seed: int) -> list[dict[str, str]]:
    return rows if n is None or len(rows) <= n else random.Random(seed).sample(rows, n)


def held_out(rows: list[dict[str, str]], share: float) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(train, test): a pair is held out when the hash of its text falls in the first `share` of the
    range, so the split depends on nothing but the rows themselves (not their order, a seed or a limit)."""
    def out(r: dict[str, str]) -> bool:
        digest = hashlib.sha256(f"{r['context']}\x1f{r['response']}\x1f{r['category']}".encode()).digest()
        return int.from_bytes(digest[:8], "big") < share * 2 ** 64

    return [r for r in rows if not out(r)], [r for r in rows if out(r)]


# --------------------------------------------------------------------------------------------
# Classifiers as Ray Tune trials


def trial(params: dict[str, Any], train: list[dict[str, str]], val: list[dict[str, str]]) -> None:
    """A Tune trial: one classifier with one hyper-parameter combination, reported once with its
    best epoch as the checkpoint."""

    from ray import tune

    settings = replace(params["settings"], **params["hp"])
    with tempfile.TemporaryDirectory() as tmp:
        best = C.fit_target(params["target"], train, val, params["categories"], params["base_model"], Path(tmp),
                            settings, params["with_context"], params["patience"], na_ratio=params["na_ratio"],
                            seed=params["seed"])
        tune.report(best, checkpoint=tune.Checkpoint.from_directory(tmp))


def train_as_trials(train: list[dict[str, str]], val: list[dict[str, str]], targets: dict[str, Path],
                    categories: list[str], base_model: str, settings: TrainSettings, with_context: bool,
                    patience: int | None, resources: dict[str, float], grid: list[dict[str, Any]],
                    storage_path: str, na_ratio: float | None = None,
                    seed: int = 0) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every (target, hyper-parameter combination) a Ray Tune trial spread over the cluster by
    `resources`; per target the best trial by validation macro-F1 is copied to `targets[target]`.
    Returns the best per target and every trial's result."""
    from ray import tune

    check_placeable("each training trial", resources.get("cpu", 0), resources.get("gpu", 0))
    tune_dir = storage_path if storage.is_s3(storage_path) else str(Path(storage_path).absolute())
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(trial, train=train, val=val), resources),
        param_space={"target": tune.grid_search(list(targets)), "hp": tune.grid_search(grid or [{}]),
                     "categories": categories, "with_context": with_context, "base_model": base_model,
                     "settings": settings, "patience": patience, "na_ratio": na_ratio, "seed": seed},
        run_config=tune.RunConfig(name="trials", storage_path=tune_dir, verbose=0))
    trials, best = [], {}
    for r in tuner.fit():
        target, hp = r.config["target"], r.config["hp"]
        if r.error or r.checkpoint is None:
            name = "single" if target == C.SINGLE else target
            raise RedlineError(f"training the '{name}' classifier with {hp or 'the base settings'} failed: "
                               f"{last_line(r.error)}")
        result = {"target": target, "hp": hp, **{k: r.metrics[k] for k in ("val_macro_f1", "epoch", "train_loss", "seconds")}}
        trials.append(result)
        if target not in best or result["val_macro_f1"] > best[target][0]["val_macro_f1"]:
            best[target] = (result, r.checkpoint)
    chosen = {}
    for target, (result, checkpoint) in best.items():
        checkpoint.to_directory(str(targets[target]))
        chosen[target] = {k: v for k, v in result.items() if k != "target"} | {"dir": targets[target].name}
    clear(tune_dir)  # every trial's checkpoint: the chosen ones are copied out
    return {t: chosen[t] for t in targets}, trials


def splits(config: DialogueSafetyTrainConfig) -> tuple[list[str], dict[str, list[dict[str, str]]]]:
    """The chosen categories and the train / val (/ test) rows of them."""
    cats = taxonomy(config.add_categories)
    train = C.load_rows(config.train)
    if config.test_from_train:
        train, rows_test = held_out(train, config.test_from_train)
    rows = {"train": _sample(train, config.limit_train, config.seed),
            "val": _sample(C.load_rows(config.val), config.limit_val, config.seed)}
    if config.test:
        rows["test"] = C.load_rows(config.test)
    elif config.test_from_train:
        rows["test"] = rows_test
    chosen = config.categories or sorted({r["category"] for r in rows["train"]})
    for name in chosen:
        category(name, cats)
    rows = {split: [r for r in part if r["category"] in chosen] for split, part in rows.items()}
    for split in ("val", "test"):
        if split in rows and not rows[split]:
            raise RedlineError(f"the {split} split has no rows of the chosen categories")
    return chosen, rows


def _scores(classifiers: C.ContextClassifiers, rows: list[dict[str, str]],
            chosen: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Fine-grain per-class rows and the coarse-grain figures of trained classifiers on `rows`."""
    gold = C.truth(rows)
    pred = [label for label, _ in classifiers.fine_grain([r["context"] for r in rows], [r["response"] for r in rows])]
    return C.fine_metrics(gold, pred, chosen), C.coarse_metrics([g != C.SAFE for g in gold], C.coarse(pred))


# --------------------------------------------------------------------------------------------
# The work, each part in a task on a worker: the driver reads no row, trains and scores nothing


def settings_of(config: DialogueSafetyTrainConfig) -> TrainSettings:
    return TrainSettings(epochs=config.epochs, learning_rate=config.learning_rate, batch_size=config.batch_size,
                         max_length=config.max_length, seed=config.seed, precision=config.precision,
                         num_gpus=config.num_gpus)


def shape(config: DialogueSafetyTrainConfig) -> dict[str, Any]:
    """The chosen categories, each split's rows and what one epoch of each variant trains on."""
    chosen, rows = splits(config)
    train = rows["train"]
    per_variant = {v: len(train) if v == "single" else
                   sum(len(C.ova_rows(train, c, config.na_ratio, config.seed)) for c in chosen)
                   for v in config.variants}
    return {"categories": chosen, "rows": {s: len(r) for s, r in rows.items()}, "examples": per_variant}


def train_one_variant(report: Callable[[int], Any], config: DialogueSafetyTrainConfig, variant: str, models: str,
                      tune_root: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One variant's classifiers trained (one after another, reporting examples as they train, or as
    Tune trials) and saved under `models` (the run directory's, uploaded when it is on s3://)."""
    chosen, rows = splits(config)
    train, val = rows["train"], rows["val"]
    settings, with_context = settings_of(config), variant != "one_vs_all_no_context"
    as_trials = None
    if config.tune_trials or config.search:
        grid = config.search.combinations() if config.search else []
        resources = {"cpu": config.trial_cpus, "gpu": config.trial_gpus}
        trial_settings = replace(settings, num_gpus=config.trial_gpus)

        def as_trials(targets: dict[str, Path]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
            # Trials may run on any node: their checkpoints go where every node can write (the run dir).
            return train_as_trials(train, val, targets, chosen, config.base_model, trial_settings, with_context,
                                   config.patience, resources, grid, tune_root, config.na_ratio, config.seed)
    with artifacts.local_output(models) as out:
        return C.train_variant("single" if variant == "single" else "one-vs-all", train, val, chosen,
                               config.base_model, out, settings, with_context=with_context, patience=config.patience,
                               train_targets=as_trials, progress=report, na_ratio=config.na_ratio, seed=config.seed)


def score_variant(config: DialogueSafetyTrainConfig, variant: str, models: str) -> dict[str, Any]:
    """A trained variant's fine-grain rows and coarse-grain figures on each split it is scored on."""
    chosen, rows = splits(config)
    classifiers = C.ContextClassifiers(artifacts.local_path(models), batch_size=64, max_length=config.max_length,
                                       precision=config.precision, num_gpus=config.num_gpus)
    out = {}
    for split in (s for s in ("val", "test") if s in rows):
        fine, coarse = _scores(classifiers, rows[split], chosen)
        out[split] = {"fine": fine, "coarse": coarse}
    return out


def baseline_rows(config: DialogueSafetyTrainConfig) -> list[dict[str, Any]]:
    """The utterance-level detectors' and context baselines' coarse-grain rows on each split."""
    _, rows = splits(config)
    out: list[dict[str, Any]] = []
    for det_cfg in config.utterance_detectors:
        det = build_detector(det_cfg)
        for split in (s for s in ("val", "test") if s in rows):
            gold_unsafe = [g != C.SAFE for g in C.truth(rows[split])]
            for label, texts in (("response", [r["response"] for r in rows[split]]),
                                 ("context + response", [f"{r['context']} {r['response']}" for r in rows[split]])):
                out.append({"model": det_cfg.name, "split": split, "input": label,
                            **C.coarse_metrics(gold_unsafe, det.detect(texts)[2].tolist())})
    for base in config.context_baselines:
        det = build_detector(base.detector)
        for split in (s for s in ("val", "test") if s in rows):
            gold_unsafe = [g != C.SAFE for g in C.truth(rows[split])]
            if base.join == "pair":
                unsafe = det.detect_pairs([(r["context"], r["response"]) for r in rows[split]])[2]
            else:
                sep = "\n" if base.join == "newline" else " "
                unsafe = det.detect([f"{r['context']}{sep}{r['response']}" for r in rows[split]])[2]
            out.append({"model": base.detector.name, "split": split, "input": f"context + response ({base.join})",
                        **C.coarse_metrics(gold_unsafe, unsafe.tolist())})
    return out


def execute(config: DialogueSafetyTrainConfig, run: Run, watch: Stopwatch, verbose: bool) -> list[dict[str, Any]]:
    """Each variant trained in a task on a worker (its GPU: `num_gpus`; Tune trials from a task that asks no
    CPU), then scored in another, and the baselines scored in a third: the driver records what they
    return, variant by variant, so a stopped run resumes with the variants it had not finished."""
    ensure_ray(verbose=verbose)
    found = on_a_worker(shape, config, num_cpus=0.5)
    chosen, examples = found["categories"], found["examples"]
    trials_run = bool(config.tune_trials or config.search)
    fine: dict[str, dict[str, list[dict[str, Any]]]] = {s: {} for s in ("val", "test") if s in found["rows"]}
    coarse_rows: list[dict[str, Any]] = []
    training: dict[str, Any] = {}
    trials: dict[str, list[dict[str, Any]]] = {}
    with progress_bar("training dialogue-safety classifiers",
                      total=config.epochs * sum(examples[v] for v in config.variants), unit="examples") as advance:
        for variant in config.variants:
            models = run.dir.path("models", variant)
            done = run.manifest.setdefault("trained", {}).get(variant)
            if done is not None and artifacts.exists(storage.join(models, C.META_FILE)):
                # a resumed run: this variant's classifiers were trained and saved before it stopped
                training[variant], trials[variant] = done["training"], done["trials"]
                advance(config.epochs * examples[variant])
            else:
                training[variant], trials[variant] = on_a_worker_reporting(
                    train_one_variant, config, variant, models, run.dir.path("tune", variant),
                    advance=advance, num_cpus=0 if trials_run else 1,
                    num_gpus=0 if trials_run else config.num_gpus)
                run.manifest["trained"][variant] = {"training": training[variant], "trials": trials[variant]}
                run.dir.write_manifest(run.manifest)
                watch.lap(f"train_{variant}_s")
            scored = on_a_worker(score_variant, config, variant, models, num_gpus=config.num_gpus)
            for split, figures in scored.items():
                fine[split][variant] = figures["fine"]
                coarse_rows.append({"model": variant, "split": split, "input": "response"
                                    if variant == "one_vs_all_no_context" else "context + response", **figures["coarse"]})
    if config.utterance_detectors or config.context_baselines:
        gpus = max([d.num_gpus for d in config.utterance_detectors] + [b.detector.num_gpus for b in config.context_baselines])
        coarse_rows += on_a_worker(baseline_rows, config, num_gpus=gpus)
    run.manifest.update(categories=chosen, rows=found["rows"], training=training,
                        trials={v: t for v, t in trials.items() if t}, fine=fine["val"],
                        fine_test=fine.get("test", {}))
    return coarse_rows


# --------------------------------------------------------------------------------------------
# Report


def write_report(run: RunDir, manifest: dict[str, Any]) -> None:
    fine, coarse_rows = manifest.get("fine", {}), manifest.get("summary", [])
    rows = manifest.get("rows", {})
    tested = f" and {rows['test']} test rows" if rows.get("test") else ""
    note = (f"Trained on {rows.get('train')} rows, evaluated on {rows.get('val')} validation rows{tested} (the best "
            "epoch of each classifier is chosen on validation alone); categories: "
            + ", ".join(manifest.get("categories", [])) + ". Fine-grain: Safe or the unsafe category; coarse-grain: "
            "unsafe vs safe.")
    bars = [{"model": v, "macro_f1": t[-1]["f1"]} for v, t in fine.items()]
    bars += [{"model": f"{r['model']} ({r['input']})", "f1": r["f1"]} for r in coarse_rows
             if r.get("split", "val") == "val"]
    report = Report(run, "redline dialogue-safety classifiers", manifest, note)
    report.table("Coarse-grain", coarse_rows, DIALOGUE_SAFETY_TRAIN.columns())
    report.plot("classifiers", grouped_bars(bars, "model", [("macro_f1", "fine-grain macro F1"),
                                                            ("f1", "coarse F1 (unsafe)")], "dialogue-safety classifiers"))
    for variant, table in fine.items():
        report.table(f"Fine-grain (validation): {variant}", table, DIALOGUE_SAFETY_FINE.columns())
    for variant, table in manifest.get("fine_test", {}).items():
        report.table(f"Fine-grain (test): {variant}", table, DIALOGUE_SAFETY_FINE.columns())
    trials = [{"variant": variant, "classifier": "single" if t["target"] == C.SINGLE else t["target"],
               "settings": ", ".join(f"{k}={v}" for k, v in t["hp"].items()) or "base", "val_macro_f1": t["val_macro_f1"],
               "epoch": t["epoch"], "seconds": t["seconds"]}
              for variant, rows in manifest.get("trials", {}).items() for t in rows]
    if trials:
        report.table("Hyper-parameter trials (best epoch of each; the best trial per classifier is kept)", trials,
                     [("variant", "variant", "s"), ("classifier", "classifier", "s"), ("settings", "settings", "s"),
                      ("val_macro_f1", "val macro F1", ".3f"), ("epoch", "epoch", "d"), ("seconds", "seconds", ".1f")])
    report.write("coarse.csv", coarse_rows)


def notes(manifest: dict[str, Any]) -> list[str]:
    return [f"fine-grain macro F1 ({split}), {variant}: {rows[-1]['f1']:.3f}"
            for split, key in (("validation", "fine"), ("test", "fine_test"))
            for variant, rows in manifest.get(key, {}).items()]


PIPELINE = Pipeline("dialogue-safety-train", DialogueSafetyTrainConfig, execute, write_report,
                    "coarse-grain (unsafe vs safe) per split", lambda manifest: DIALOGUE_SAFETY_TRAIN.columns(),
                    notes=notes)


def run_dialogue_safety_training(config: DialogueSafetyTrainConfig, *, force: bool = False,
                                 verbose: bool = False) -> RunResult:
    return PIPELINE.run(config, force=force, verbose=verbose)
