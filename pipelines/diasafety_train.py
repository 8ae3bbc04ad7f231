"""`redline train dialogue-safety`: train DiaSafety context classifiers and compare them (Tables 4-7).

Variants: `one_vs_all` (one 3-way classifier per category on (context, response) pairs),
`single` (one multi-class classifier) and `one_vs_all_no_context` (the response-only ablation).
Every variant is scored on the validation split, fine-grain (per-class P/R/F1 and macro) and
coarse-grain (unsafe vs safe); utterance-level detectors add coarse rows given the response only
and given context + response concatenated. Models are saved under the run directory.
"""

from __future__ import annotations

import random
from typing import Any

from redline.actors.detectors import build_detector
from redline.actors.dialogue_safety import classifiers as C
from redline.actors.dialogue_safety.taxonomy import category, taxonomy
from redline.actors.trainer import TrainSettings
from redline.cluster import storage
from redline.cluster.config import DialogueSafetyTrainConfig
from redline.errors import RedlineError
from redline.pipelines import sharded


def _sample(rows: list[dict[str, str]], n: int | None, seed: int) -> list[dict[str, str]]:
    return rows if n is None or len(rows) <= n else random.Random(seed).sample(rows, n)


def run_dialogue_safety_training(config: DialogueSafetyTrainConfig, *, force: bool = False,
                                 verbose: bool = False) -> sharded.RunResult:
    from redline.pipelines import report

    run = sharded.open_run("dialogue-safety-train", config, config.output, config.run_name, force)
    if run.reused:
        return sharded.RunResult(run.uri, run.manifest, run.manifest.get("coarse", []), reused=True)
    if storage.is_s3(run.uri):
        raise RedlineError("dialogue-safety training writes models to a local directory; use a local output")
    watch = storage.Stopwatch()
    with sharded.lifecycle(run):
        cats = taxonomy(config.add_categories)
        train = _sample(C.load_rows(config.train), config.limit_train, config.seed)
        val = _sample(C.load_rows(config.val), config.limit_val, config.seed)
        present = sorted({r["category"] for r in train})
        chosen = config.categories or present
        for name in chosen:
            category(name, cats)
        train = [r for r in train if r["category"] in chosen]
        val = [r for r in val if r["category"] in chosen]
        if not val:
            raise RedlineError("the validation split has no rows of the chosen categories")
        settings = TrainSettings(epochs=config.epochs, learning_rate=config.learning_rate,
                                 batch_size=config.batch_size, max_length=config.max_length, seed=config.seed,
                                 precision=config.precision)
        gold = C.truth(val)
        gold_unsafe = [g != C.SAFE for g in gold]
        fine: dict[str, list[dict[str, Any]]] = {}
        coarse_rows: list[dict[str, Any]] = []
        training: dict[str, Any] = {}
        trials: dict[str, list[dict[str, Any]]] = {}
        grid = config.search.combinations() if config.search else []
        trial_resources = ({"cpu": config.trial_cpus, "gpu": config.trial_gpus}
                           if config.tune_trials or config.search else None)
        for variant in config.variants:
            out = run.dir.path("models", variant)
            with_context = variant != "one_vs_all_no_context"
            train_fn = C.train_single if variant == "single" else C.train_one_vs_all
            training[variant], trials[variant] = train_fn(
                train, val, chosen, config.base_model, out, settings, with_context=with_context,
                patience=config.patience, trial_resources=trial_resources, grid=grid)
            watch.lap(f"train_{variant}_s")
            classifiers = C.ContextClassifiers(out, batch_size=64, max_length=config.max_length,
                                               precision=config.precision)
            pred = [label for label, _ in classifiers.fine_grain([r["context"] for r in val],
                                                                 [r["response"] for r in val])]
            fine[variant] = C.fine_metrics(gold, pred, chosen)
            coarse_rows.append({"model": variant, "input": "context + response" if with_context else "response",
                                **C.coarse_metrics(gold_unsafe, C.coarse(pred))})
        for det_cfg in config.utterance_detectors:
            det = build_detector(det_cfg)
            for label, texts in (("response", [r["response"] for r in val]),
                                 ("context + response", [f"{r['context']} {r['response']}" for r in val])):
                toxic = det.detect(texts)[2].tolist()
                coarse_rows.append({"model": det_cfg.name, "input": label, **C.coarse_metrics(gold_unsafe, toxic)})
        run.manifest.update(categories=chosen, rows={"train": len(train), "val": len(val)}, training=training,
                            trials={v: t for v, t in trials.items() if t}, fine=fine, coarse=coarse_rows)
        run.manifest["timings"] = {**run.manifest.get("timings", {}), **watch.timings}
        report.write_dialogue_safety_report(run.dir, fine, coarse_rows, run.manifest)
        sharded.complete(run)
    return sharded.RunResult(run.uri, run.manifest, coarse_rows)
