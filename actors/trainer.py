"""Fine-tune any Hugging Face sequence classifier on labelled texts and save it with `save_pretrained`.

Used by `redline train naturalness` and `redline train judge-classifier` (and by adversarial
training). AdamW with linear warm-up and decay, dynamic padding (batches sorted by length), the
best epoch on the held-out split kept, and F1 / recall / precision / AP / ROC-AUC reported on it.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from redline.actors.hf_loading import device_and_dtype, first_line, save_model
from redline.errors import RedlineError

log = logging.getLogger(__name__)


@dataclass
class TrainSettings:
    epochs: int = 3
    learning_rate: float = 5e-5
    batch_size: int = 16
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_length: int = 128
    eval_fraction: float = 0.2
    seed: int = 0
    device: str = "auto"


def split_held_out(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    order = list(range(n))
    random.Random(seed).shuffle(order)
    k = max(1, int(round(n * fraction))) if fraction > 0 else 0
    return order[k:], order[:k]


def binary_metrics(y: np.ndarray, p: np.ndarray) -> dict[str, float | None]:
    from sklearn.metrics import average_precision_score, f1_score, precision_score, recall_score, roc_auc_score

    pred = p >= 0.5
    both = len(set(y.tolist())) == 2
    return {"f1": float(f1_score(y, pred, zero_division=0)), "recall": float(recall_score(y, pred, zero_division=0)),
            "precision": float(precision_score(y, pred, zero_division=0)),
            "accuracy": float((pred == y).mean()) if len(y) else None,
            "average_precision": float(average_precision_score(y, p)) if both else None,
            "roc_auc": float(roc_auc_score(y, p)) if both else None, "n": int(len(y))}


def fine_tune(base_model: str, texts: list[str], labels: list[int], out_dir: str | Path, *,
              label_names: tuple[str, str] = ("negative", "positive"), settings: TrainSettings | None = None,
              progress: Any = None) -> dict[str, Any]:
    """Fine-tune `base_model` (hub id or directory) as a binary classifier; returns held-out metrics."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup

    s = settings or TrainSettings()
    if len(texts) != len(labels) or len(texts) < 4:
        raise RedlineError("training needs at least 4 labelled texts")
    if len(set(labels)) < 2:
        raise RedlineError("training needs both classes among the labels")
    random.seed(s.seed)
    torch.manual_seed(s.seed)
    device, _ = device_and_dtype(s.device, "float32", 1 if torch.cuda.is_available() else 0)
    try:
        tokenizer = AutoTokenizer.from_pretrained(base_model)
        model = AutoModelForSequenceClassification.from_pretrained(
            base_model, num_labels=2, id2label=dict(enumerate(label_names)),
            label2id={n: i for i, n in enumerate(label_names)}, problem_type="single_label_classification",
            ignore_mismatched_sizes=True).to(device)
    except (OSError, ValueError) as err:
        raise RedlineError(f"cannot load base model '{base_model}': {first_line(err)}") from None
    train_idx, eval_idx = split_held_out(len(texts), s.eval_fraction, s.seed)
    steps_per_epoch = (len(train_idx) + s.batch_size - 1) // s.batch_size
    optimizer = torch.optim.AdamW(model.parameters(), lr=s.learning_rate, weight_decay=s.weight_decay)
    total = steps_per_epoch * s.epochs
    scheduler = get_linear_schedule_with_warmup(optimizer, int(total * s.warmup_ratio), total)

    def batches(idx: list[int], shuffle: bool) -> Any:
        order = sorted(idx, key=lambda i: len(texts[i]))  # similar lengths per batch: little padding
        chunks = [order[k:k + s.batch_size] for k in range(0, len(order), s.batch_size)]
        if shuffle:
            random.shuffle(chunks)
        for chunk in chunks:
            enc = tokenizer([texts[i] for i in chunk], padding=True, truncation=True, max_length=s.max_length,
                            return_tensors="pt").to(device)
            yield chunk, enc

    def predict(idx: list[int]) -> np.ndarray:
        model.eval()
        out = np.zeros(len(texts))
        with torch.inference_mode():
            for chunk, enc in batches(idx, shuffle=False):
                out[chunk] = torch.softmax(model(**enc).logits.float(), -1)[:, 1].cpu().numpy()
        return out[idx]

    best: dict[str, Any] | None = None
    history = []
    for epoch in range(1, s.epochs + 1):
        model.train()
        loss_sum = 0.0
        for chunk, enc in batches(train_idx, shuffle=True):
            target = torch.tensor([labels[i] for i in chunk], device=device)
            loss = model(**enc, labels=target).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            loss_sum += loss.item() * len(chunk)
            if progress is not None:
                progress(len(chunk))
        metrics = binary_metrics(np.array([labels[i] for i in eval_idx]), predict(eval_idx)) if eval_idx else {}
        metrics.update(epoch=epoch, train_loss=loss_sum / max(len(train_idx), 1))
        history.append(metrics)
        score = metrics.get("f1", -metrics["train_loss"])
        if best is None or score > best["score"]:
            best = {"score": score, "metrics": metrics}
            save_model(model, tokenizer, out_dir)
    assert best is not None
    result = {"base_model": base_model, "rows": len(texts), "train_rows": len(train_idx), "held_out_rows": len(eval_idx),
              "best_epoch": best["metrics"]["epoch"], "held_out": best["metrics"], "history": history,
              "labels": list(label_names)}
    (Path(out_dir) / "redline_training.json").write_text(json.dumps(result, indent=2))
    return result

