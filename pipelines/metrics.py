"""Detection metrics with toxic as the positive class (FNR on toxic rows is the attack success rate)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from redline.cluster.tables import STATUS_OK


def safe_div(a: float, b: float) -> float | None:
    return a / b if b else None


def classification_metrics(y_true: np.ndarray, y_pred: np.ndarray, score: np.ndarray) -> dict[str, Any]:
    """Binary metrics with toxic = positive class. FNR is the attack success rate on toxic rows."""
    from sklearn.metrics import precision_recall_fscore_support, roc_auc_score

    y_true = y_true.astype(int)
    y_pred = y_pred.astype(int)
    tp = int(((y_true == 1) & (y_pred == 1)).sum())
    tn = int(((y_true == 0) & (y_pred == 0)).sum())
    fp = int(((y_true == 0) & (y_pred == 1)).sum())
    fn = int(((y_true == 1) & (y_pred == 0)).sum())
    out: dict[str, Any] = {"n": int(len(y_true)), "tp": tp, "tn": tn, "fp": fp, "fn": fn,
                           "accuracy": safe_div(tp + tn, len(y_true)),
                           "fnr": safe_div(fn, fn + tp), "fpr": safe_div(fp, fp + tn)}
    if len(y_true):
        p, r, f, _ = precision_recall_fscore_support(y_true, y_pred, labels=[0, 1], zero_division=0)
        out.update(precision_benign=float(p[0]), recall_benign=float(r[0]), f1_benign=float(f[0]),
                   precision_toxic=float(p[1]), recall_toxic=float(r[1]), f1_toxic=float(f[1]),
                   f1_macro=float(np.mean(f)))
    finite = np.isfinite(score)
    out["roc_auc"] = (float(roc_auc_score(y_true[finite], score[finite]))
                      if len(np.unique(y_true[finite])) == 2 else None)
    return out


def detector_metrics(predictions: pa.Table) -> list[dict[str, Any]]:
    """One row per detector over all datasets, plus one per (detector, dataset) when there are several."""
    rows = []
    datasets = sorted(set(predictions.column("dataset").to_pylist()))
    groups = [None] + (datasets if len(datasets) > 1 else [])
    for name in dict.fromkeys(predictions.column("detector").to_pylist()):
        det = predictions.filter(pc.equal(predictions.column("detector"), name))
        for dataset in groups:
            part = det if dataset is None else det.filter(pc.equal(det.column("dataset"), dataset))
            ok = part.filter(pc.equal(part.column("status"), STATUS_OK))
            labelled = ok.filter(pc.is_valid(ok.column("label")))
            y_true = labelled.column("label").to_numpy(zero_copy_only=False)
            y_pred = labelled.column("pred_toxic").to_numpy(zero_copy_only=False)
            score = labelled.column("toxic_score").to_numpy(zero_copy_only=False).astype(float)
            row: dict[str, Any] = {"detector": name, "dataset": dataset or "all"}
            row.update(classification_metrics(y_true, y_pred, score))
            busy = pc.sum(ok.column("seconds")).as_py() or 0.0
            row["rows_per_s"] = safe_div(ok.num_rows, busy)
            row["not_scored"] = part.num_rows - ok.num_rows
            row["unlabelled"] = ok.num_rows - labelled.num_rows
            rows.append(row)
    return rows

