"""DiaSafety's comparisons on held-out data: single model vs one-vs-all, context vs response only,
each figure with a 95% bootstrap interval and each comparison as a paired difference on the same
rows, and the figures that say why the comparisons come out as they do.

    .venv/bin/python bench/diasafety_heldout.py RUN_DIR [--also RUN_DIR ...] [--draws 2000]

RUN_DIR: a finished `redline train dialogue-safety` run with a test split (`test:`, or
`test_from_train:` — a fixed tenth of train that no model was trained or selected on) and the
variants `one_vs_all`, `single` and `one_vs_all_no_context` (examples/dialoguesafety_train.yaml).
The test rows are rebuilt from the run's own config (`diasafety_train.splits`), the classifiers
loaded from the run, each variant's probabilities computed once, and every figure derived from them:

- fine-grain macro F1 (Safe + each category; a one-vs-all pair is Safe unless a category's head
  says Unsafe, then the most confident one: the rule the pipeline reports) and coarse-grain F1 of
  the unsafe class;
- "category given": each pair judged only by its own category's classifier (one-vs-all: that head;
  single: the category's class against Safe), Safe/Unsafe macro F1 averaged over the categories —
  the setting where each category's test rows are classified on their own;
- one-vs-all's heads at stricter thresholds (unsafe when P(Unsafe) >= t), and how often the
  combined rule is wrong because of another category's head;
- the class balance each one-vs-all head was trained on (N/A: the other categories' rows).

`--also`: other runs on the same held-out rows (e.g. one-vs-all trained with `na_ratio`, its heads
on fewer N/A rows), their variants added as "VARIANT @ RUN" and compared, paired, with the first run's
variant of that name.

Intervals: percentiles of `--draws` resamples of the test rows (the same resample for every variant,
so a difference's interval is paired). Prints JSON lines, then the tables in markdown.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import numpy as np
from sklearn.metrics import f1_score

from redline.actors.dialogue_safety import classifiers as C
from redline.cluster.config import validate_config
from redline.pipelines.diasafety_train import DialogueSafetyTrainConfig, splits

VARIANTS = ("one_vs_all", "single", "one_vs_all_no_context")
THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9)


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def probabilities(model_dir: Path, rows: list[dict[str, str]], config: DialogueSafetyTrainConfig
                  ) -> tuple[str, list[str], dict[str, np.ndarray]]:
    """(kind, categories, probabilities): one-vs-all: per category (n, 3) over Safe/Unsafe/N/A;
    single: {"*": (n, 1 + categories)} over Safe and each category."""
    loaded = C.ContextClassifiers(model_dir, batch_size=64, max_length=config.max_length, precision=config.precision)
    x = C.inputs(rows, loaded.with_context)
    return loaded.meta["kind"], loaded.categories, {name: m.predict_proba(x) for name, m in loaded.models.items()}


def fine_labels(kind: str, cats: list[str], probs: dict[str, np.ndarray], threshold: float | None = None) -> np.ndarray:
    """Each pair's fine-grain label: the pipeline's rule (argmax), or one-vs-all heads saying Unsafe
    only when P(Unsafe) >= `threshold`, the most confident such head winning."""
    if kind != "one-vs-all":
        return np.array([C.SAFE, *cats])[probs["*"].argmax(1)]
    unsafe = np.stack([probs[c][:, 1] for c in cats], 1)
    says = (np.stack([probs[c].argmax(1) == 1 for c in cats], 1) if threshold is None else unsafe >= threshold)
    best = np.where(says, unsafe, -1.0)
    return np.where(says.any(1), np.array(cats)[best.argmax(1)], C.SAFE)


def given_category(kind: str, cats: list[str], probs: dict[str, np.ndarray], rows_cat: np.ndarray) -> np.ndarray:
    """Unsafe per pair by its own category's classifier alone."""
    if kind != "one-vs-all":
        labels = [C.SAFE, *cats]
        return probs["*"].argmax(1) == np.array([labels.index(c) for c in rows_cat])
    return np.array([probs[c][i].argmax() == 1 for i, c in enumerate(rows_cat)])


def metric_fns(gold: np.ndarray, cats: list[str], rows_cat: np.ndarray) -> dict[str, Callable[..., float]]:
    gold_unsafe = gold != C.SAFE

    def fine(pred: np.ndarray, idx: np.ndarray) -> float:
        return float(f1_score(gold[idx], pred[idx], labels=[C.SAFE, *cats], average="macro", zero_division=0))

    def coarse(pred: np.ndarray, idx: np.ndarray) -> float:
        return float(f1_score(gold_unsafe[idx], pred[idx] != C.SAFE, zero_division=0))

    def given(unsafe: np.ndarray, idx: np.ndarray) -> float:
        scores = []
        for c in cats:
            mine = idx[rows_cat[idx] == c]
            if len(mine):
                scores.append(f1_score(gold_unsafe[mine], unsafe[mine], average="macro", zero_division=0))
        return float(np.mean(scores))

    return {"fine-grain macro F1": fine, "coarse F1 (unsafe)": coarse, "category given, mean macro F1": given}


def interval(values: list[float]) -> tuple[float, float]:
    low, high = np.percentile(values, [2.5, 97.5])
    return round(float(low), 3), round(float(high), 3)


def add_predictions(run: Path, config: DialogueSafetyTrainConfig, suffix: str, test: list[dict[str, str]],
                    gold: np.ndarray, rows_cat: np.ndarray, preds: dict[str, dict[str, np.ndarray]]) -> None:
    """Each variant of `run` on the test rows, under its name + `suffix`, with one-vs-all's stricter
    thresholds and the combined rule's diagnostics."""
    for v in [v for v in VARIANTS if (run / "models" / v).is_dir()]:
        name = v + suffix
        kind, cats, probs = probabilities(run / "models" / v, test, config)
        labels = fine_labels(kind, cats, probs)
        preds[name] = {"fine-grain macro F1": labels, "coarse F1 (unsafe)": labels,
                       "category given, mean macro F1": given_category(kind, cats, probs, rows_cat)}
        if kind == "one-vs-all":
            for t in THRESHOLDS:
                preds[f"{name} @ P(Unsafe) >= {t}"] = {"fine-grain macro F1": fine_labels(kind, cats, probs, t),
                                                      "coarse F1 (unsafe)": fine_labels(kind, cats, probs, t)}
            says = np.stack([probs[c].argmax(1) == 1 for c in cats], 1)
            own = np.array([says[i, cats.index(c)] for i, c in enumerate(rows_cat)])
            other = says.sum(1) - own
            safe = gold == C.SAFE
            emit(what="one-vs-all combined rule", variant=name,
                 safe_pairs_flagged=round(float(says[safe].any(1).mean()), 3),
                 safe_pairs_flagged_by_another_categorys_head=round(float((other[safe] > 0).mean()), 3),
                 unsafe_pairs_own_head_says_unsafe=round(float(own[~safe].mean()), 3),
                 unsafe_pairs_own_head_right_but_another_wins=round(float(
                     (labels[~safe][own[~safe]] != gold[~safe][own[~safe]]).mean()) if own[~safe].any() else 0.0, 3))


def load_run(run: Path) -> tuple[DialogueSafetyTrainConfig, list[str], dict[str, list[dict[str, str]]]]:
    manifest = json.loads((run / "manifest.json").read_text())
    config = validate_config(DialogueSafetyTrainConfig, manifest["config"])
    chosen, rows = splits(config)
    if "test" not in rows:
        raise SystemExit(f"{run}: the run has no test split (give test: or test_from_train:)")
    return config, chosen, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a finished `redline train dialogue-safety` run directory")
    parser.add_argument("--also", nargs="*", default=[], metavar="RUN",
                        help="other runs on the same held-out rows (e.g. one-vs-all trained with na_ratio): their "
                             "variants join as 'VARIANT @ RUN' and are compared, paired, with the first run's")
    parser.add_argument("--draws", type=int, default=2000)
    args = parser.parse_args()
    run = Path(args.run)
    _, chosen, rows = load_run(run)
    test = rows["test"]
    gold = np.array(C.truth(test))
    rows_cat = np.array([r["category"] for r in test])
    emit(what="rows", train=len(rows["train"]), val=len(rows["val"]), test=len(test),
         test_per_class=dict(Counter(gold.tolist())))
    preds: dict[str, dict[str, np.ndarray]] = {}
    pairs = [("one_vs_all", "single", "one-vs-all − single (context + response)"),
             ("one_vs_all", "one_vs_all_no_context", "context + response − response only (one-vs-all)")]
    for path in [run, *map(Path, args.also)]:
        config, _, run_rows = load_run(path)
        suffix = f" @ {path.name}" if path != run else ""
        if path != run:
            if [(r["context"], r["response"]) for r in run_rows["test"]] != [(r["context"], r["response"]) for r in test]:
                raise SystemExit(f"{path}: its held-out test rows are not {run}'s: no paired comparison")
            pairs += [(v + suffix, v, f"{v}: {path.name} − {run.name}") for v in VARIANTS
                      if (path / "models" / v).is_dir() and (run / "models" / v).is_dir()]
        for c in chosen:  # what each one-vs-all head learns from (the run's na_ratio, if any)
            head_rows = C.ova_rows(run_rows["train"], c, config.na_ratio, config.seed)
            targets = Counter(C.OVA_LABELS[t] for t in C.ova_targets(head_rows, c))
            emit(what="one-vs-all head's training labels", run=path.name, category=c, **targets,
                 na_share=round(targets[C.NA] / len(head_rows), 3))
        add_predictions(path, config, suffix, test, gold, rows_cat, preds)
    fns = metric_fns(gold, chosen, rows_cat)
    rng = np.random.default_rng(0)
    draws = [rng.integers(0, len(test), len(test)) for _ in range(args.draws)]
    whole = np.arange(len(test))
    table: dict[tuple[str, str], tuple[float, tuple[float, float]]] = {}
    sampled: dict[tuple[str, str], list[float]] = {}
    for name, by_metric in preds.items():
        for metric, pred in by_metric.items():
            sampled[(name, metric)] = [fns[metric](pred, idx) for idx in draws]
            table[(name, metric)] = (round(fns[metric](pred, whole), 3), interval(sampled[(name, metric)]))
            emit(what="figure", variant=name, metric=metric, value=table[(name, metric)][0],
                 ci95=table[(name, metric)][1])
    diffs = []
    for a, b, what in pairs:
        for metric in fns:
            if (a, metric) in sampled and (b, metric) in sampled:
                d = [x - y for x, y in zip(sampled[(a, metric)], sampled[(b, metric)])]
                diffs.append((what, metric, round(table[(a, metric)][0] - table[(b, metric)][0], 3), interval(d)))
                emit(what="paired difference", comparison=what, metric=metric, value=diffs[-1][2], ci95=diffs[-1][3])
    print(f"\n{len(test)} held-out test pairs; 95% intervals from {args.draws} resamples\n")
    metrics = list(fns)
    print("| classifier | " + " | ".join(metrics) + " |\n|---|" + "---:|" * len(metrics))
    for name in preds:
        cells = [f"{table[(name, m)][0]:.3f} ({table[(name, m)][1][0]:.3f}–{table[(name, m)][1][1]:.3f})"
                 if (name, m) in table else "–" for m in metrics]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\n| comparison | figure | difference | 95% interval |\n|---|---|---:|---:|")
    for what, metric, value, (low, high) in diffs:
        print(f"| {what} | {metric} | {value:+.3f} | {low:+.3f} to {high:+.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
