"""The detector interface: `predict_proba(texts)` -> per-label probabilities, and the decision rule
that turns them into a toxic score and a toxic/benign decision."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from pydantic import BaseModel

from redline.actors.detectors.config import DetectorConfig
from redline.cluster.config import Strict
from redline.errors import RedlineError


class NoOptions(Strict):
    """A kind that takes no options of its own."""


@dataclass(frozen=True)
class DecisionRule:
    """Turns per-label probabilities into one toxic score and a toxic/benign decision.

    - multi-label (sigmoid) models: score = max over toxic labels; toxic if any toxic label reaches
      its threshold.
    - single-label (softmax) models: score = total probability of the toxic classes; toxic if the
      score reaches the threshold (rule `score`) or the top class is toxic (rule `argmax`, the
      default for more than two classes, e.g. Davidson's hate / offensive / neither).
    """

    labels: tuple[str, ...]
    toxic: tuple[bool, ...]
    multi_label: bool
    threshold: float | dict[str, float] = 0.5
    rule: str = "auto"

    def __post_init__(self) -> None:
        if not any(self.toxic):
            raise RedlineError(f"no toxic label among the detector's labels {list(self.labels)}")
        if isinstance(self.threshold, dict):
            unknown = set(self.threshold) - set(self.labels)
            if unknown:
                raise RedlineError(f"threshold names unknown labels {sorted(unknown)} (labels: {list(self.labels)})")
            if not self.multi_label:
                raise RedlineError("per-label thresholds need a multi-label detector; give one number")

    @property
    def effective_rule(self) -> str:
        if self.rule != "auto":
            return self.rule
        return "argmax" if (not self.multi_label and len(self.labels) > 2) else "score"

    def thresholds(self) -> np.ndarray:
        if isinstance(self.threshold, dict):
            return np.array([self.threshold.get(label, 0.5) for label in self.labels])
        return np.full(len(self.labels), float(self.threshold))

    def decide(self, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """probs (n, n_labels) -> (toxic score (n,), toxic decision (n,))."""
        mask = np.array(self.toxic)
        if probs.shape[0] == 0:
            return np.zeros(0), np.zeros(0, dtype=bool)
        if self.multi_label:
            score = probs[:, mask].max(axis=1)
            toxic = (probs[:, mask] >= self.thresholds()[mask]).any(axis=1)
            return score.astype(np.float64), toxic
        score = probs[:, mask].sum(axis=1) if probs.shape[1] > 1 else probs[:, 0]
        if self.effective_rule == "argmax":
            toxic = mask[probs.argmax(axis=1)] if probs.shape[1] > 1 else probs[:, 0] >= 0.5
        else:
            toxic = score >= float(self.threshold)  # type: ignore[arg-type]
        return score.astype(np.float64), np.asarray(toxic, dtype=bool)


class Detector(ABC):
    kind: ClassVar[str]
    description: ClassVar[str]
    Options: ClassVar[type[BaseModel]] = NoOptions
    # A detector behind a remote API: a failed batch is not retried text by text (that would multiply
    # the requests against a service that may just have said 429); its answers can fail per text.
    remote: ClassVar[bool] = False
    uses_gpu: ClassVar[bool] = False  # runs a model on the actor's GPU when it has one
    has_gradients: ClassVar[bool] = False  # exposes its input embeddings' gradients (white-box attacks)
    takes_text_pairs: ClassVar[bool] = False  # scores (context, response) as the model's own text pair

    def __init__(self, config: DetectorConfig) -> None:
        self.config = config
        self.options = config.options()

    @classmethod
    def preflight(cls, config: DetectorConfig) -> None:
        """Cheap checks run on the driver before any actor starts (missing files, unknown labels)."""

    @property
    @abstractmethod
    def rule(self) -> DecisionRule: ...

    @abstractmethod
    def predict_proba(self, texts: list[str]) -> np.ndarray:
        """Probabilities of shape (len(texts), len(labels)). Float64: near 0 or 1, float32 rounds
        small changes away, and attack search climbs exactly those."""

    def detect(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """texts -> (probs, toxic score, toxic decision)."""
        if not texts:  # no model call, and reshape(0, -1) is ambiguous
            probs = np.zeros((0, len(self.rule.labels)))
        else:
            probs = np.asarray(self.predict_proba(texts), dtype=np.float64).reshape(len(texts), -1)
        score, toxic = self.rule.decide(probs)
        return probs, score, toxic

    def detect_rows(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str | None]]:
        """`detect` plus, per text, the error that kept it from being scored (None when scored).
        Detectors whose service can fail on single texts override this; a row with an error has
        no score and no decision."""
        probs, score, toxic = self.detect(texts)
        return probs, score, toxic, [None] * len(texts)


def single_label_rule(config: DetectorConfig, label: str) -> DecisionRule:
    return DecisionRule(labels=(label,), toxic=(True,), multi_label=False, threshold=config.threshold,
                        rule="score" if config.rule == "auto" else config.rule)


def rows_with_errors(rule: DecisionRule, probs: np.ndarray,
                     errors: list[str | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str | None]]:
    """Decisions for the rows without an error; NaN scores and no decision for the others."""
    ok = np.array([e is None for e in errors], dtype=bool)
    score = np.full(len(errors), np.nan)
    toxic = np.zeros(len(errors), dtype=bool)
    if ok.any():
        score[ok], toxic[ok] = rule.decide(probs[ok])
    return probs, score, toxic, errors
