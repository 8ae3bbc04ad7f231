"""DiaSafety's context classifiers, their combination rules and their metrics.

One-vs-all (the paper's design): per category a 3-way classifier over (context, response) pairs,
Safe / Unsafe for that category's rows and N/A for every other category's rows. A single multi-class
classifier (Safe + one class per category) is the comparison; `with_context: false` is the
response-only ablation. Fine-grain: safe unless some category model says Unsafe, then the most
confident such category. Coarse-grain: unsafe if any says Unsafe.
"""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from redline.actors.trainer import ClassifierTrainer, SequenceClassifier, TrainSettings
from redline.cluster import storage
from redline.cluster.artifacts import local_path
from redline.errors import RedlineError, first_line

log = logging.getLogger(__name__)

SAFE, UNSAFE, NA = "Safe", "Unsafe", "N/A"
META_FILE = "redline_dialogue_safety.json"
OVA_LABELS = (SAFE, UNSAFE, NA)
REQUIRED = ("context", "response", "category", "label")


def load_rows(path: str | Path) -> list[dict[str, str]]:
    """DiaSafety JSON rows (a list of {context, response, category, label}), local or s3://;
    one-line errors."""
    path = str(path)
    if not storage.exists(path):
        raise RedlineError(f"DiaSafety file not found: {path}")
    try:
        rows = json.loads(storage.read_bytes(path).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise RedlineError(f"{path}: not valid JSON ({first_line(err)})") from None
    if not isinstance(rows, list):
        raise RedlineError(f"{path}: expected a JSON list of rows")
    for i, r in enumerate(rows):
        missing = [k for k in REQUIRED if not isinstance(r, dict) or k not in r]
        if missing:
            raise RedlineError(f"{path}: row {i} lacks {', '.join(missing)}")
        if r["label"] not in (SAFE, UNSAFE):
            raise RedlineError(f"{path}: row {i} has label {r['label']!r} (expected Safe or Unsafe)")
    return rows


def inputs(rows: list[dict[str, str]], with_context: bool) -> list[Any]:
    return [(r["context"], r["response"]) if with_context else r["response"] for r in rows]


def truth(rows: list[dict[str, str]]) -> list[str]:
    """Fine-grain gold label: Safe, or the category of an unsafe row."""
    return [SAFE if r["label"] == SAFE else r["category"] for r in rows]


def ova_targets(rows: list[dict[str, str]], category: str) -> list[int]:
    return [OVA_LABELS.index(r["label"]) if r["category"] == category else OVA_LABELS.index(NA) for r in rows]


def ova_rows(rows: list[dict[str, str]], category: str, na_ratio: float | None = None,
             seed: int = 0) -> list[dict[str, str]]:
    """The rows a category's one-vs-all head trains on: all of its own, and the other categories' as
    N/A: every one (the paper's), or with `na_ratio` at most that many per row of its own, a seeded
    uniform sample of them. Order is kept."""
    if na_ratio is None:
        return rows
    others = [i for i, r in enumerate(rows) if r["category"] != category]
    keep = min(len(others), round(na_ratio * (len(rows) - len(others))))
    picked = set(random.Random(f"{seed}:{category}").sample(others, keep))
    return [r for i, r in enumerate(rows) if r["category"] == category or i in picked]


def macro_f1(y: list[int], pred: list[int]) -> float:
    from sklearn.metrics import f1_score

    return float(f1_score(y, pred, average="macro", zero_division=0))


def _fit(base_model: str, labels: tuple[str, ...], train_x: list[Any], train_y: list[int], val_x: list[Any],
         val_y: list[int], out_dir: Path, settings: TrainSettings, patience: int | None,
         progress: Any = None) -> dict[str, Any]:
    """Train, keep the best epoch by validation macro-F1 (saved to `out_dir`), stop early on patience."""
    trainer = ClassifierTrainer(base_model, labels, settings, len(train_x))
    best: dict[str, Any] = {"val_macro_f1": -1.0, "epoch": 0}
    for epoch in range(1, settings.epochs + 1):
        loss = trainer.train_epoch(train_x, train_y, progress)
        f1 = macro_f1(val_y, trainer.predict_proba(val_x).argmax(1).tolist())
        log.info("%s epoch %d: loss %.4f, val macro-F1 %.4f", out_dir.name, epoch, loss, f1)
        if f1 > best["val_macro_f1"]:
            best = {"val_macro_f1": f1, "epoch": epoch, "train_loss": loss}
            trainer.save(out_dir)
        elif patience is not None and epoch - best["epoch"] >= patience:
            break
    return best


SINGLE = "*"  # the target name of the single multi-class model in trials


def _task(target: str, train: list[dict[str, str]], val: list[dict[str, str]], categories: list[str],
          with_context: bool, na_ratio: float | None = None,
          seed: int = 0) -> tuple[tuple[str, ...], list[Any], list[int], list[Any], list[int]]:
    """Labels and (inputs, targets) of train and val for one classifier: a category's one-vs-all
    (Safe / Unsafe / N/A; its train rows `ova_rows`, validation whole) or, for SINGLE, the multi-class
    model (Safe + one class per category)."""
    if target == SINGLE:
        labels: tuple[str, ...] = (SAFE, *categories)
        index = {name: i for i, name in enumerate(labels)}
        return (labels, inputs(train, with_context), [index[t] for t in truth(train)], inputs(val, with_context),
                [index[t] for t in truth(val)])
    train = ova_rows(train, target, na_ratio, seed)
    return (OVA_LABELS, inputs(train, with_context), ova_targets(train, target), inputs(val, with_context),
            ova_targets(val, target))


def fit_target(target: str, train: list[dict[str, str]], val: list[dict[str, str]], categories: list[str],
               base_model: str, out_dir: Path, settings: TrainSettings, with_context: bool,
               patience: int | None, progress: Any = None, na_ratio: float | None = None,
               seed: int = 0) -> dict[str, Any]:
    """Train one classifier (a category's one-vs-all, or SINGLE) into `out_dir`; its best epoch's figures."""
    started = time.perf_counter()
    labels, train_x, train_y, val_x, val_y = _task(target, train, val, categories, with_context, na_ratio, seed)
    best = _fit(base_model, labels, train_x, train_y, val_x, val_y, out_dir, settings, patience, progress)
    return {**best, "seconds": round(time.perf_counter() - started, 1)}


# Trains several classifiers at once: {target: output directory} -> (per target its best figures with
# "dir", every trial); the pipeline passes one that runs them as Ray Tune trials.
TrainTargets = Callable[[dict[str, Path]], tuple[dict[str, Any], list[dict[str, Any]]]]


def train_variant(kind: str, train: list[dict[str, str]], val: list[dict[str, str]], categories: list[str],
                  base_model: str, out_dir: str | Path, settings: TrainSettings, *, with_context: bool = True,
                  patience: int | None = 2, train_targets: TrainTargets | None = None,
                  progress: Any = None, na_ratio: float | None = None,
                  seed: int = 0) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`one-vs-all`: a 3-way classifier per category, under `out_dir/<category key>`; `single`: one
    multi-class classifier (Safe + one class per category) in `out_dir`. Classifiers train one after
    another, or through `train_targets`. Writes the directory's `redline_dialogue_safety.json` and
    returns the best figures (per category for one-vs-all) and every trial."""
    out = Path(out_dir)
    if kind == "one-vs-all":
        for cat in categories:
            if not any(r["category"] == cat for r in train):
                raise RedlineError(f"category '{cat}' has no training rows")
        targets = {c: out / _key(c) for c in categories}
    else:
        targets = {SINGLE: out}
    if train_targets is not None:
        results, trials = train_targets(targets)
    else:
        results = {t: {**fit_target(t, train, val, categories, base_model, d, settings, with_context, patience,
                                    progress, na_ratio, seed), "dir": d.name} for t, d in targets.items()}
        trials = []
    if kind == "one-vs-all":
        meta = {"kind": "one-vs-all", "with_context": with_context, "categories": results, "base_model": base_model,
                "na_ratio": na_ratio, "trials": trials}
        best: dict[str, Any] = results
    else:
        best = {k: v for k, v in results[SINGLE].items() if k != "dir"}
        meta = {"kind": "single", "with_context": with_context, "labels": [SAFE, *categories], "base_model": base_model,
                **best, "trials": trials}
    (out / META_FILE).write_text(json.dumps(meta, indent=2))
    return best, trials


def _key(category: str) -> str:
    return category.lower().replace(" ", "_")


def check_classifiers(path: str | Path, categories: list[str] | None = None) -> dict[str, Any]:
    """The metadata of a classifiers directory from `redline train dialogue-safety`, after checking it
    knows every one of `categories`; one-line errors otherwise."""
    meta_path = Path(local_path(str(path))) / META_FILE
    if not meta_path.is_file():
        raise RedlineError(f"{path} holds no dialogue-safety classifiers (train them with "
                           "`redline train dialogue-safety`)")
    try:
        meta = json.loads(meta_path.read_text())
    except ValueError as err:
        raise RedlineError(f"{meta_path}: not valid JSON ({first_line(err)})") from None
    known = list(meta["categories"]) if meta.get("kind") == "one-vs-all" else list(meta.get("labels", [])[1:])
    missing = [c for c in categories or [] if c not in known]
    if missing:
        raise RedlineError(f"the classifiers in {path} know no category {', '.join(map(repr, missing))} "
                           f"(trained: {', '.join(known)})")
    return meta


class ContextClassifiers:
    """Trained classifiers loaded once (a one-vs-all directory or a single model) -> fine/coarse
    verdicts, on the worker's GPU when it has one."""

    def __init__(self, model_dir: str | Path, batch_size: int = 64, max_length: int = 128,
                 precision: str = "auto", num_gpus: float = 0.0) -> None:
        self.meta = check_classifiers(model_dir)
        self.with_context = self.meta["with_context"]
        settings = TrainSettings(batch_size=batch_size, max_length=max_length, precision=precision,
                                 num_gpus=num_gpus)
        if self.meta["kind"] == "one-vs-all":
            self.categories = list(self.meta["categories"])
            # Each category's model sits in its own subdirectory: resolved against this directory, never
            # the working directory (older files recorded a path; only its last part counts).
            root = Path(local_path(str(model_dir)))
            self.models = {c: SequenceClassifier(str(root / Path(info["dir"]).name), settings)
                           for c, info in self.meta["categories"].items()}
        else:
            self.categories = self.meta["labels"][1:]
            self.models = {"*": SequenceClassifier(local_path(str(model_dir)), settings)}

    def fine_grain(self, contexts: list[str], responses: list[str]) -> list[tuple[str, float]]:
        """Per pair: (Safe or the unsafe category, its confidence)."""
        x = [(c, r) for c, r in zip(contexts, responses)] if self.with_context else list(responses)
        if "*" in self.models:
            probs = self.models["*"].predict_proba(x)
            labels = [SAFE, *self.categories]
            return [(labels[int(p.argmax())], float(p.max())) for p in probs]
        probs = {c: m.predict_proba(x) for c, m in self.models.items()}
        return combine_fine(probs)

    def per_category(self, contexts: list[str], responses: list[str],
                     categories: list[str]) -> list[tuple[str, float]]:
        """Each pair judged by its own category's classifier: (category if Unsafe else Safe, confidence)."""
        out: list[tuple[str, float]] = [(SAFE, 0.0)] * len(contexts)
        for cat in sorted(set(categories)):
            idx = [i for i, c in enumerate(categories) if c == cat]
            x = [(contexts[i], responses[i]) if self.with_context else responses[i] for i in idx]
            if "*" in self.models:
                labels = [SAFE, *self.categories]
                if cat not in labels:
                    raise RedlineError(f"the classifiers know no category '{cat}'")
                probs = self.models["*"].predict_proba(x)
                p_unsafe = probs[:, labels.index(cat)]
                unsafe = probs.argmax(1) == labels.index(cat)
            else:
                if cat not in self.models:
                    raise RedlineError(f"no classifier for category '{cat}' (trained: {', '.join(self.models)})")
                probs = self.models[cat].predict_proba(x)
                p_unsafe = probs[:, OVA_LABELS.index(UNSAFE)]
                unsafe = probs.argmax(1) == OVA_LABELS.index(UNSAFE)
            for k, i in enumerate(idx):
                out[i] = (cat, float(p_unsafe[k])) if unsafe[k] else (SAFE, float(1 - p_unsafe[k]))
        return out


def combine_fine(probs: dict[str, np.ndarray]) -> list[tuple[str, float]]:
    """Safe if every category model says Safe or N/A; else the Unsafe category with the highest confidence."""
    cats = list(probs)
    n = len(next(iter(probs.values()))) if probs else 0
    out = []
    for i in range(n):
        unsafe = [(probs[c][i][1], c) for c in cats if int(np.argmax(probs[c][i])) == OVA_LABELS.index(UNSAFE)]
        if unsafe:
            p, c = max(unsafe)
            out.append((c, float(p)))
        else:
            out.append((SAFE, float(min(1 - probs[c][i][1] for c in cats))))
    return out


def coarse(fine: list[str]) -> list[bool]:
    """Coarse-grain: unsafe if any category model said Unsafe."""
    return [label != SAFE for label in fine]


def fine_metrics(gold: list[str], pred: list[str], classes: list[str]) -> list[dict[str, Any]]:
    """Per-class precision / recall / F1 (Safe and each category) and the macro average."""
    from sklearn.metrics import precision_recall_fscore_support

    labels = [SAFE, *classes]
    p, r, f, n = precision_recall_fscore_support(gold, pred, labels=labels, zero_division=0)
    rows = [{"class": lab, "precision": float(p[i]), "recall": float(r[i]), "f1": float(f[i]), "n": int(n[i])}
            for i, lab in enumerate(labels)]
    rows.append({"class": "macro", "precision": float(np.mean(p)), "recall": float(np.mean(r)),
                 "f1": float(np.mean(f)), "n": len(gold)})
    return rows


def coarse_metrics(gold_unsafe: list[bool], pred_unsafe: list[bool]) -> dict[str, float]:
    from sklearn.metrics import f1_score, precision_score, recall_score

    return {"precision": float(precision_score(gold_unsafe, pred_unsafe, zero_division=0)),
            "recall": float(recall_score(gold_unsafe, pred_unsafe, zero_division=0)),
            "f1": float(f1_score(gold_unsafe, pred_unsafe, zero_division=0)),
            "macro_f1": float(f1_score(gold_unsafe, pred_unsafe, average="macro", zero_division=0)), "n": len(gold_unsafe)}
