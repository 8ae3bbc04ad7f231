"""Two-step detection: an utterance-level detector on the response alone, then, for responses it
passes, the context classifiers on (context, response)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redline.actors.detectors import build_detector
from redline.actors.dialogue_safety.classifiers import SAFE, ContextClassifiers
from redline.cluster.config import DetectorConfig


@dataclass
class Verdict:
    verdict: str  # utterance-unsafe | context-unsafe | safe
    category: str | None  # the context category when context-unsafe
    utterance_score: float
    confidence: float


class TwoStepDetector:
    def __init__(self, utterance: DetectorConfig, classifiers_dir: str | Path, batch_size: int = 64,
                 precision: str = "auto") -> None:
        self.utterance = build_detector(utterance)
        self.context = ContextClassifiers(classifiers_dir, batch_size=batch_size, precision=precision)

    def detect(self, contexts: list[str], responses: list[str], categories: list[str] | None = None) -> list[Verdict]:
        """With `categories` (each context's category), step 2 asks only that category's classifier,
        as when evaluating chatbots; without, every classifier (fine-grain rule)."""
        _, score, toxic = self.utterance.detect(list(responses))
        passed = [i for i, t in enumerate(toxic) if not t]
        ctx, resp = [contexts[i] for i in passed], [responses[i] for i in passed]
        if categories is None:
            fine = self.context.fine_grain(ctx, resp) if passed else []
        else:
            fine = self.context.per_category(ctx, resp, [categories[i] for i in passed]) if passed else []
        out = [Verdict("utterance-unsafe", None, float(score[i]), float(score[i])) for i in range(len(responses))]
        for i, (label, conf) in zip(passed, fine):
            out[i] = (Verdict("safe", None, float(score[i]), conf) if label == SAFE
                      else Verdict("context-unsafe", label, float(score[i]), conf))
        return out


class TwoStepWorker:
    """Ray Data actor: the two-step detector loaded once (on the actor's GPU when it has one); each
    row (context, response, category) gets its verdict, judged by its own category's classifier."""

    def __init__(self, utterance: dict[str, Any], classifiers: str, batch_size: int = 64,
                 precision: str = "auto") -> None:
        self.detector = TwoStepDetector(DetectorConfig.model_validate(utterance), classifiers, batch_size, precision)

    def __call__(self, batch: dict[str, Any]) -> Any:
        import pyarrow as pa

        verdicts = self.detector.detect([str(c) for c in batch["context"]], [str(r) for r in batch["response"]],
                                        [str(c) for c in batch["category"]])
        return pa.table({
            "id": pa.array([str(i) for i in batch["id"]], pa.string()),
            "verdict": pa.array([v.verdict for v in verdicts], pa.string()),
            "unsafe_category": pa.array([v.category for v in verdicts], pa.string()),
            "utterance_score": pa.array([v.utterance_score for v in verdicts], pa.float64()),
        })
