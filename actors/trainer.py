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

from redline.actors.hf_loading import save_model
from redline.cluster.artifacts import local_path
from redline.cluster.devices import placement
from redline.errors import RedlineError, first_line

log = logging.getLogger(__name__)


@dataclass
class TrainSettings:
    epochs: int = 3
    learning_rate: float = 5e-5
    batch_size: int = 16
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    schedule: str = "linear"  # linear | cosine_with_restarts
    num_cycles: int = 2  # restarts of the cosine schedule
    patience: int | None = None  # stop after this many epochs without a better held-out F1
    max_length: int = 128
    eval_fraction: float = 0.2
    seed: int = 0
    num_gpus: float = 0.0  # the worker's GPUs: > 0 trains on its GPU (the device policy)
    precision: str = "auto"  # auto (bfloat16 autocast on GPU, float32 on CPU) | float32 | bfloat16 | float16


def split_held_out(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    order = list(range(n))
    random.Random(seed).shuffle(order)
    k = max(1, int(round(n * fraction))) if fraction > 0 else 0
    return order[k:], order[:k]


def binary_metrics(y: np.ndarray, p: np.ndarray) -> dict[str, float | None]:
    from sklearn.metrics import (
        average_precision_score,
        f1_score,
        precision_score,
        recall_score,
        roc_auc_score,
    )

    pred = p >= 0.5
    both = len(set(y.tolist())) == 2
    return {"f1": float(f1_score(y, pred, zero_division=0)), "recall": float(recall_score(y, pred, zero_division=0)),
            "precision": float(precision_score(y, pred, zero_division=0)),
            "accuracy": float((pred == y).mean()) if len(y) else None,
            "average_precision": float(average_precision_score(y, p)) if both else None,
            "roc_auc": float(roc_auc_score(y, p)) if both else None, "n": int(len(y))}


class SequenceClassifier:
    """A HF sequence classifier loaded once: batched class probabilities for texts or text pairs,
    length-sorted batches padded per batch (dynamic padding), bfloat16 autocast on GPU (and on CPU
    with `precision: bfloat16`)."""

    def __init__(self, model: str, settings: TrainSettings, label_names: tuple[str, ...] | None = None) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.s = settings
        self.torch = torch
        random.seed(settings.seed)
        torch.manual_seed(settings.seed)
        # float32 master weights; half-precision autocast where the hardware runs it fast
        self.placement = placement(settings.num_gpus, settings.precision, training=True)
        self.device = self.placement.torch_device
        self.autocast_dtype = getattr(torch, self.placement.autocast) if self.placement.autocast else None
        head = {} if label_names is None else {
            "id2label": dict(enumerate(label_names)),  # sets num_labels too
            "label2id": {n: i for i, n in enumerate(label_names)}, "problem_type": "single_label_classification",
            "ignore_mismatched_sizes": True}
        if head:  # a fresh head is the point: its "newly initialised weights" report is noise here
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_error()
        try:
            model = local_path(model)
            self.tokenizer = AutoTokenizer.from_pretrained(model)
            self.model = AutoModelForSequenceClassification.from_pretrained(model, **head).to(self.device)
        except (OSError, ValueError) as err:
            raise RedlineError(f"cannot load model '{model}': {first_line(err)}") from None
        # Never longer than the model can take (small models have few position embeddings).
        positions = getattr(self.model.config, "max_position_embeddings", None)
        self.max_length = min(settings.max_length, getattr(self.tokenizer, "model_max_length", None) or 10**6,
                              (positions - 2) if positions else 10**6)

    def _batches(self, texts: list[Any], shuffle: bool) -> Any:
        """Texts are strings or (first, second) pairs, the latter encoded as the tokenizer's text pair."""
        order = sorted(range(len(texts)), key=lambda i: len(str(texts[i])))  # similar lengths: little padding
        chunks = [order[k:k + self.s.batch_size] for k in range(0, len(order), self.s.batch_size)]
        if shuffle:
            random.shuffle(chunks)
        pairs = bool(texts) and isinstance(texts[0], tuple)
        for chunk in chunks:
            if pairs:
                first, second = [texts[i][0] for i in chunk], [texts[i][1] for i in chunk]
                enc = self.tokenizer(first, second, padding=True, truncation="longest_first",
                                     max_length=self.max_length, return_tensors="pt")
            else:
                enc = self.tokenizer([texts[i] for i in chunk], padding=True, truncation=True,
                                     max_length=self.max_length, return_tensors="pt")
            yield chunk, enc.to(self.device)

    def _autocast(self) -> Any:
        return self.placement.autocast_context()

    def predict_proba(self, texts: list[Any]) -> np.ndarray:
        """Class probabilities, shape (len(texts), n_labels)."""
        self.model.eval()
        out = np.zeros((len(texts), self.model.config.num_labels))
        with self.torch.inference_mode(), self._autocast():
            for chunk, enc in self._batches(texts, shuffle=False):
                out[chunk] = self.torch.softmax(self.model(**enc).logits.float(), -1).cpu().numpy()
        return out

    def predict(self, texts: list[Any]) -> np.ndarray:
        """P(label 1) per text (binary classifiers)."""
        return self.predict_proba(texts)[:, 1]

    def save(self, out_dir: str | Path) -> Path:
        return save_model(self.model, self.tokenizer, out_dir)


class ClassifierTrainer(SequenceClassifier):
    """Fine-tunes a SequenceClassifier with a fresh head of `label_names`: AdamW, warm-up then a
    linear or cosine-with-restarts schedule."""

    def __init__(self, base_model: str, label_names: tuple[str, ...], settings: TrainSettings,
                 train_rows: int) -> None:
        from transformers import (
            get_cosine_with_hard_restarts_schedule_with_warmup,
            get_linear_schedule_with_warmup,
        )

        super().__init__(base_model, settings, label_names)
        total = max(1, (train_rows + settings.batch_size - 1) // settings.batch_size * settings.epochs)
        self.optimizer = self.torch.optim.AdamW(self.model.parameters(), lr=settings.learning_rate,
                                                weight_decay=settings.weight_decay)
        warmup = int(total * settings.warmup_ratio)
        if settings.schedule == "cosine_with_restarts":
            self.scheduler = get_cosine_with_hard_restarts_schedule_with_warmup(self.optimizer, warmup, total,
                                                                                 num_cycles=settings.num_cycles)
        elif settings.schedule == "linear":
            self.scheduler = get_linear_schedule_with_warmup(self.optimizer, warmup, total)
        else:
            raise RedlineError(f"unknown schedule '{settings.schedule}' (linear, cosine_with_restarts)")

    def train_epoch(self, texts: list[Any], labels: list[int], progress: Any = None) -> float:
        self.model.train()
        loss_sum = 0.0
        for chunk, enc in self._batches(texts, shuffle=True):
            target = self.torch.tensor([labels[i] for i in chunk], device=self.device)
            with self._autocast():
                loss = self.model(**enc, labels=target).loss
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            self.scheduler.step()
            loss_sum += loss.item() * len(chunk)
            if progress is not None:
                progress(len(chunk))
        return loss_sum / max(len(texts), 1)


def fine_tune(base_model: str, texts: list[str], labels: list[int], out_dir: str | Path, *,
              label_names: tuple[str, str] = ("negative", "positive"), settings: TrainSettings | None = None,
              progress: Any = None) -> dict[str, Any]:
    """Fine-tune `base_model` (hub id or directory) as a binary classifier on a held-out split; the
    best epoch by held-out F1 is saved; returns its metrics and the per-epoch history."""
    s = settings or TrainSettings()
    if len(texts) != len(labels) or len(texts) < 4:
        raise RedlineError("training needs at least 4 labelled texts")
    if len(set(labels)) < 2:
        raise RedlineError("training needs both classes among the labels")
    train_idx, eval_idx = split_held_out(len(texts), s.eval_fraction, s.seed)
    trainer = ClassifierTrainer(base_model, label_names, s, len(train_idx))
    train_texts, train_labels = [texts[i] for i in train_idx], [labels[i] for i in train_idx]
    eval_texts, eval_y = [texts[i] for i in eval_idx], np.array([labels[i] for i in eval_idx])
    best: dict[str, Any] | None = None
    history = []
    for epoch in range(1, s.epochs + 1):
        loss = trainer.train_epoch(train_texts, train_labels, progress)
        metrics = binary_metrics(eval_y, trainer.predict(eval_texts)) if eval_idx else {}
        metrics.update(epoch=epoch, train_loss=loss)
        history.append(metrics)
        score = metrics.get("f1", -loss)
        if best is None or score > best["score"]:
            best = {"score": score, "metrics": metrics}
            trainer.save(out_dir)
        elif s.patience is not None and epoch - best["metrics"]["epoch"] >= s.patience:
            break
    assert best is not None
    result = {"base_model": base_model, "rows": len(texts), "train_rows": len(train_idx), "held_out_rows": len(eval_idx),
              "best_epoch": best["metrics"]["epoch"], "held_out": best["metrics"], "history": history,
              "labels": list(label_names)}
    (Path(out_dir) / "redline_training.json").write_text(json.dumps(result, indent=2))
    return result
