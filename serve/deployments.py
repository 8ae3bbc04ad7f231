"""Serve deployments of the same worker classes the pipelines run: `DetectionWorker`,
`GenerationWorker` and `TwoStepWorker`.

Each replica loads its model once. With batching on, `@serve.batch` merges the requests that reach
a replica within `wait_timeout_s` (up to `max_batch_size` requests) into one model call; with it
off, every request is its own call. Model calls run in a thread so the replica keeps accepting
requests while the model works.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ray import serve

from redline.actors.detectors.worker import DetectionWorker
from redline.actors.dialogue_safety.two_step import TwoStepWorker
from redline.actors.generators import GenerationWorker, PromptResult, SamplingParams
from redline.errors import RedlineError
from redline.serve.config import (
    BatchSettings,
    ServedDetectorConfig,
    ServedDialogueSafety,
    ServedGeneratorConfig,
)


def _configure_batching(method: Any, settings: BatchSettings) -> None:
    method.set_max_batch_size(settings.max_batch_size)
    method.set_batch_wait_timeout_s(settings.wait_timeout_s)


def _split(flat: list[Any], sizes: list[int]) -> list[list[Any]]:
    out, start = [], 0
    for n in sizes:
        out.append(flat[start:start + n])
        start += n
    return out


@serve.deployment
class DetectorDeployment:
    """One detector. `detect(texts)` returns, per text, its probabilities, toxic score and decision,
    or the error that row hit (`DetectionWorker.score` isolates failing rows)."""

    def __init__(self, config: ServedDetectorConfig) -> None:
        self.worker = DetectionWorker(config)
        self.batch = config.serve.batch
        self.counts = {"requests": 0, "model_calls": 0, "items": 0}
        _configure_batching(self.detect_batched, self.batch)

    def stats(self) -> dict[str, int]:
        """This replica's counters: requests answered, model calls made, texts scored."""
        return dict(self.counts)

    def info(self) -> dict[str, Any]:
        det, cfg = self.worker.detector, self.worker.config
        rule = det.rule
        return {"name": cfg.name, "kind": cfg.kind, "labels": list(rule.labels),
                "toxic_labels": [lab for lab, t in zip(rule.labels, rule.toxic) if t],
                "multi_label": rule.multi_label, "threshold": rule.threshold, "rule": rule.effective_rule,
                "label_thresholds": dict(zip(rule.labels, rule.thresholds().tolist()))}  # the rule's own, per label

    def score(self, texts: list[str]) -> list[dict[str, Any]]:
        self.counts["model_calls"] += 1
        self.counts["items"] += len(texts)
        probs, score, toxic, status, reason = self.worker.score(texts)
        rows = []
        for i in range(len(texts)):
            if status[i] != "ok":
                rows.append({"error": reason[i]})
            else:
                rows.append({"toxic": bool(toxic[i]), "toxic_score": float(score[i]),
                             "probs": [float(p) for p in probs[i]]})
        return rows

    async def detect(self, texts: list[str]) -> list[dict[str, Any]]:
        self.counts["requests"] += 1
        if self.batch.enabled:
            return await self.detect_batched(texts)
        return await asyncio.to_thread(self.score, texts)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
    async def detect_batched(self, requests: list[list[str]]) -> list[list[dict[str, Any]]]:
        flat = [t for texts in requests for t in texts]
        rows = await asyncio.to_thread(self.score, flat)
        return _split(rows, [len(texts) for texts in requests])


@serve.deployment
class GeneratorDeployment:
    """One Hugging Face generation model. Requests merged into a batch are grouped by their sampling
    settings, one `generate` call per group; a request with a `seed` runs alone so that its output
    does not depend on what it was batched with."""

    def __init__(self, config: ServedGeneratorConfig) -> None:
        self.worker = GenerationWorker(config)
        self.generator = self.worker.generator
        self.batch = config.serve.batch
        self.counts = {"requests": 0, "model_calls": 0, "items": 0}
        _configure_batching(self.generate_batched, self.batch)

    def stats(self) -> dict[str, int]:
        return dict(self.counts)

    def run(self, items: list[tuple[list[str], SamplingParams]]) -> list[list[PromptResult] | Exception]:
        """Each item's results, or the exception its group raised (re-raised to that request only)."""
        groups: dict[Any, list[int]] = {}
        for k, (_, params) in enumerate(items):
            key = ("seeded", k) if params.seed is not None else params
            groups.setdefault(key, []).append(k)
        out: list[list[PromptResult] | Exception] = [[] for _ in items]
        for members in groups.values():
            params = items[members[0]][1]
            flat = [p for k in members for p in items[k][0]]
            self.counts["model_calls"] += 1
            self.counts["items"] += len(flat)
            try:
                results = self.worker.generate(flat, params)
            except Exception as err:  # noqa: BLE001 - fail the requests of this group, not the batch
                for k in members:
                    out[k] = err
                continue
            for k, part in zip(members, _split(results, [len(items[k][0]) for k in members])):
                out[k] = part
        return out

    async def generate(self, prompts: list[str], params: SamplingParams) -> list[PromptResult]:
        self.counts["requests"] += 1
        self.generator.check_prompts(prompts)  # a too-long prompt fails its own request only
        if self.batch.enabled:
            result = await self.generate_batched((prompts, params))
        else:
            result = (await asyncio.to_thread(self.run, [(prompts, params)]))[0]
        if isinstance(result, Exception):
            raise result
        return result

    async def chat(self, messages: list[dict[str, str]], params: SamplingParams) -> list[PromptResult]:
        return await self.generate([self.generator.prompt_from_messages(messages)], params)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005)
    async def generate_batched(self, items: list[tuple[list[str], SamplingParams]]) -> list[list[PromptResult] | Exception]:
        return await asyncio.to_thread(self.run, items)


@serve.deployment
class DialogueSafetyDeployment:
    """The two-step detector (`TwoStepWorker`): utterance-level, then the context classifiers."""

    def __init__(self, config: ServedDialogueSafety) -> None:
        self.worker = TwoStepWorker(config.utterance, config.classifiers, num_gpus=config.num_gpus)
        self.batch = config.serve.batch
        _configure_batching(self.check_batched, self.batch)

    def run(self, pairs: list[tuple[str, str, str | None]]) -> list[dict[str, Any]]:
        return [{"verdict": v.verdict, "category": v.category, "utterance_score": v.utterance_score,
                 "confidence": v.confidence} for v in self.worker.detect(pairs)]

    async def check(self, pairs: list[tuple[str, str, str | None]]) -> list[dict[str, Any]]:
        known = self.worker.categories
        unknown = [p[2] for p in pairs if p[2] is not None and p[2] not in known]
        if unknown:  # refused here, so it cannot fail the other requests of a batch
            raise RedlineError(f"no classifier for category '{unknown[0]}' (trained: {', '.join(known)})")
        if self.batch.enabled:
            return await self.check_batched(pairs)
        return await asyncio.to_thread(self.run, pairs)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
    async def check_batched(self, requests: list[list[tuple[str, str, str | None]]]) -> list[list[dict[str, Any]]]:
        flat = [p for pairs in requests for p in pairs]
        rows = await asyncio.to_thread(self.run, flat)
        return _split(rows, [len(pairs) for pairs in requests])
