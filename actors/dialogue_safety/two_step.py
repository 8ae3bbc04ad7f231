"""Two-step detection: an utterance-level detector on the response alone, then, for responses it
passes, the context classifiers on (context, response)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa

from redline.actors.detectors import DetectorConfig, build_detector
from redline.actors.dialogue_safety.classifiers import SAFE, ContextClassifiers


@dataclass
class Verdict:
    verdict: str  # utterance-unsafe | context-unsafe | safe
    category: str | None  # the context category when context-unsafe
    utterance_score: float
    confidence: float


class TwoStepDetector:
    def __init__(self, utterance: DetectorConfig, classifiers_dir: str | Path, batch_size: int = 64,
                 precision: str = "auto", num_gpus: float = 0.0) -> None:
        # Both steps run where the worker runs: on its GPU when it has one (one device policy).
        self.utterance = build_detector(utterance.model_copy(update={"num_gpus": num_gpus}))
        self.context = ContextClassifiers(classifiers_dir, batch_size=batch_size, precision=precision,
                                          num_gpus=num_gpus)

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
    """The two-step detector loaded once (on the actor's GPU when it has one). As a batch worker,
    each row (context, response, category) gets its verdict from its own category's classifier; as
    a Serve replica's model, `detect` judges pairs with or without a category."""

    input_columns: ClassVar[list[str]] = ["id", "context", "response", "category"]
    output_schema: ClassVar[pa.Schema] = pa.schema([("id", pa.string()), ("verdict", pa.string()),
                                                    ("unsafe_category", pa.string()), ("utterance_score", pa.float64())])

    def __init__(self, utterance: DetectorConfig, classifiers: str, batch_size: int = 64,
                 precision: str = "auto", num_gpus: float = 0.0) -> None:
        self.detector = TwoStepDetector(utterance, classifiers, batch_size, precision, num_gpus)

    @property
    def categories(self) -> list[str]:
        return self.detector.context.categories

    def detect(self, pairs: list[tuple[str, str, str | None]]) -> list[Verdict]:
        """Pairs with a category are judged by that category's classifier, the others by every one."""
        out: list[Verdict | None] = [None] * len(pairs)
        for with_cat in (True, False):
            idx = [i for i, p in enumerate(pairs) if (p[2] is not None) == with_cat]
            if idx:
                verdicts = self.detector.detect([pairs[i][0] for i in idx], [pairs[i][1] for i in idx],
                                                [str(pairs[i][2]) for i in idx] if with_cat else None)
                for i, v in zip(idx, verdicts):
                    out[i] = v
        return out  # type: ignore[return-value]

    def __call__(self, batch: dict[str, Any]) -> pa.Table:
        verdicts = self.detector.detect([str(c) for c in batch["context"]], [str(r) for r in batch["response"]],
                                        [str(c) for c in batch["category"]])
        return pa.table({
            "id": pa.array([str(i) for i in batch["id"]], pa.string()),
            "verdict": pa.array([v.verdict for v in verdicts], pa.string()),
            "unsafe_category": pa.array([v.category for v in verdicts], pa.string()),
            "utterance_score": pa.array([v.utterance_score for v in verdicts], pa.float64()),
        }, schema=self.output_schema)


def labelled_counts(utterance: DetectorConfig, classifiers: str, path: str, limit: int | None, seed: int,
                    batch_size: int = 64) -> dict[str, int]:
    """The two-step detector's confusion counts on labelled DiaSafety pairs (unsafe the positive class),
    each pair judged as a chatbot's response is: step 1, then its context category's classifier. Pairs
    of categories the classifiers do not know are left out (counted as `unknown_category`)."""
    import random

    from redline.actors.dialogue_safety.classifiers import check_classifiers, load_rows

    meta = check_classifiers(classifiers)
    known = set(meta["categories"] if meta.get("kind") == "one-vs-all" else meta.get("labels", [])[1:])
    rows = load_rows(path)
    usable = [r for r in rows if r["category"] in known]
    unknown = len(rows) - len(usable)
    if limit is not None and len(usable) > limit:
        usable = random.Random(seed).sample(usable, limit)
    detector = TwoStepDetector(utterance, classifiers, batch_size=batch_size)
    counts = {"tp": 0, "fp": 0, "fn": 0, "tn": 0, "n": len(usable), "unknown_category": unknown}
    for start in range(0, len(usable), batch_size):
        part = usable[start:start + batch_size]
        verdicts = detector.detect([r["context"] for r in part], [r["response"] for r in part],
                                   [r["category"] for r in part])
        for r, v in zip(part, verdicts):
            unsafe, gold = v.verdict != "safe", r["label"] != SAFE
            counts[("t" if unsafe == gold else "f") + ("p" if unsafe else "n")] += 1
    return counts
