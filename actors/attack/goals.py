"""Goal functions and the victim they query.

TAE: a toxic seed succeeds when the victim's decision becomes benign; search climbs 1 - toxic score.
BAE: a benign seed succeeds when the decision becomes toxic; search climbs the toxic score.
The decision is the detector's own rule (binary threshold, every toxic label of a multi-label
model below its threshold, or the top class of a multi-class model being benign).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from redline.actors.detectors import Detector
from redline.actors.detectors.local import HFDetector
from redline.errors import RedlineError


@dataclass(frozen=True)
class Goal:
    name: str
    seed_label: int  # the label of the seeds this goal attacks
    description: str

    def score(self, toxic_score: float) -> float:
        return 1.0 - toxic_score if self.name == "tae" else toxic_score

    def success(self, pred_toxic: bool) -> bool:
        return (not pred_toxic) if self.name == "tae" else bool(pred_toxic)

    def verdict(self, score: float, success: bool) -> "Verdict":
        """The victim's verdict back from this goal's (score, success) pair."""
        if self.name == "tae":
            return Verdict(1.0 - score, not success)
        return Verdict(score, success)


GOALS = {
    "tae": Goal("tae", 1, "toxic seed -> victim predicts benign (toxic adversarial example)"),
    "bae": Goal("bae", 0, "benign seed -> victim predicts toxic (benign adversarial example)"),
}


def goal(name: str) -> Goal:
    if name not in GOALS:
        raise RedlineError(f"unknown goal '{name}' (known: tae, bae)")
    return GOALS[name]


@dataclass(frozen=True)
class Verdict:
    toxic_score: float
    pred_toxic: bool


class Victim:
    """A detector with a text -> verdict cache shared by every example an actor attacks."""

    def __init__(self, detector: Detector, cache_size: int = 500_000) -> None:
        self.detector = detector
        self.cache: dict[str, Verdict] = {}
        self.cache_size = cache_size
        self.model_calls = 0
        self.texts_scored = 0

    def query(self, texts: list[str]) -> list[Verdict]:
        missing = [t for t in dict.fromkeys(texts) if t not in self.cache]
        if missing:
            if len(self.cache) + len(missing) > self.cache_size:
                self.cache.clear()
            _, score, toxic = self.detector.detect(missing)
            self.model_calls += 1
            self.texts_scored += len(missing)
            for t, s, p in zip(missing, score, toxic):
                self.cache[t] = Verdict(float(s), bool(p))
        return [self.cache[t] for t in texts]

    def word_importance_by_gradient(self, text: str, spans: list[tuple[int, int]], goal: Goal) -> np.ndarray:
        """White-box word importance: |d toxic score / d input embeddings|, summed over each word's
        tokens; NaN for a word past the victim's max length (truncated away: the model never sees it).
        Only Hugging Face victims have gradients."""
        if not isinstance(self.detector, HFDetector):
            raise RedlineError("gradient word importance needs an `hf` victim (white-box)")
        det: Any = self.detector
        torch = det._torch
        enc = det.tokenizer([text], truncation=True, max_length=det.max_length, return_tensors="pt",
                            return_offsets_mapping=True)
        offsets = enc.pop("offset_mapping")[0].tolist()
        enc = enc.to(det.device)
        embeds = det.model.get_input_embeddings()(enc["input_ids"]).detach().requires_grad_(True)
        with torch.enable_grad():
            logits = det.model(inputs_embeds=embeds, attention_mask=enc["attention_mask"]).logits.float()
            probs = torch.sigmoid(logits) if det.rule.multi_label else torch.softmax(logits, dim=-1)
            mask = torch.tensor(det.rule.toxic, device=probs.device)
            toxic = probs[0, mask].max() if det.rule.multi_label else probs[0, mask].sum()
            toxic.backward()
        grads = embeds.grad[0].abs().sum(-1).cpu().numpy()
        out = np.zeros(len(spans))
        seen = max((b for a, b in offsets if b > a), default=0)  # where the truncated input ends
        out[[k for k, (s, _) in enumerate(spans) if s >= seen]] = np.nan
        for (a, b), g in zip(offsets, grads):
            if b <= a:
                continue
            for k, (s, e) in enumerate(spans):
                if a < e and b > s:
                    out[k] += g
                    break
        return out
