"""Dialogue response generators: prompts (or chat messages) in, n completions out.

A generator is a chat model (`ChatModel`): a local Hugging Face model (the `hf` provider's
`HFGenerator`, in padded batches on the worker's device) or any other provider (an OpenAI-compatible
server, redline's own Serve app, AWS Bedrock) reached through its `ChatClient`.
`GenerationWorker` is the one worker both Ray Data (chatbot evaluation) and Ray Serve (the
OpenAI-compatible generation service) host.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar

import pyarrow as pa
from pydantic import AliasChoices

from redline.actors.providers import (
    ChatModel,
    Completion,
    Failed,
    HFGenerator,
    PromptResult,
    ProviderName,
    SamplingParams,
)
from redline.cluster.config import Execution, Result
from redline.errors import RedlineError

log = logging.getLogger(__name__)

__all__ = ["Completion", "GenerationWorker", "GeneratorConfig", "HFGenerator", "PromptResult", "SamplingParams",
           "build_generator"]


class GeneratorConfig(ChatModel):
    """A dialogue response generator: a chat model (a local HF model by default; any provider of
    `redline list providers`), its name in outputs, and the actor's resources."""

    name: str = Result(pattern=r"^[A-Za-z0-9_.\-]+$", description="Name used in outputs and as the served model id.")
    provider: ProviderName = Result(
        "hf", validation_alias=AliasChoices("provider", "kind"),
        description="A provider of the registry (`redline list providers`): hf, a local HF model (the default); "
                    "openai, an OpenAI-compatible API; redline, redline Serve; bedrock, AWS Bedrock. (`kind`, its "
                    "earlier name, is read too.)")
    num_cpus: float = Execution(1.0, ge=0)
    num_gpus: float = Execution(0.0, ge=0, description="provider hf: the GPU the model runs on (the actor's).")
    what: ClassVar[str] = "generator"


class RemoteGenerator:
    """A generator behind a provider's API: conversations go out concurrently under the rate limit,
    each retried on its own; a conversation whose retries ran out is that conversation's error."""

    def __init__(self, config: GeneratorConfig) -> None:
        self.config, self.name = config, config.name
        try:
            self.client = config.client()
        except RedlineError as err:
            raise RedlineError(f"generator '{config.name}': {err}") from None

    def chat_results(self, conversations: Sequence[list[dict[str, str]]],
                     params: SamplingParams) -> list[PromptResult | str]:
        """Per conversation: its result, or why it has none."""
        try:
            answers = self.client.ask_many(list(conversations), params)
        except RedlineError as err:
            raise RedlineError(f"generator '{self.name}': {err}") from None
        return [f"request failed after {a.retries} retries: {a.cause}" if isinstance(a, Failed) else a.result
                for a in answers]

    def chat(self, conversations: Sequence[list[dict[str, str]]], params: SamplingParams) -> list[PromptResult]:
        results = self.chat_results(conversations, params)
        failed = next((r for r in results if isinstance(r, str)), None)
        if failed is not None:
            raise RedlineError(f"generator '{self.name}': {failed}")
        return results  # type: ignore[return-value]

    def generate(self, prompts: list[str], params: SamplingParams) -> list[PromptResult]:
        return self.chat([[{"role": "user", "content": p}] for p in prompts], params)


def build_generator(config: GeneratorConfig) -> HFGenerator | RemoteGenerator:
    """A local model runs in this process (Serve hosts these), any other provider behind its client."""
    return HFGenerator(config, config.num_gpus) if config.provider == "hf" else RemoteGenerator(config)


class GenerationWorker:
    """One generator loaded once. As a batch worker (an actor of the pipelines' pools): each context of a batch gets `n` responses (a
    context given as a single user turn); failures become an `error` per row, never a lost batch. As
    a Serve replica's model: `generate` / `chat` with per-request sampling settings."""

    input_columns: ClassVar[list[str]] = ["id", "context"]
    output_schema: ClassVar[pa.Schema] = pa.schema([("id", pa.string()), ("responses", pa.list_(pa.string())),
                                                    ("gen_error", pa.string())])

    def __init__(self, config: GeneratorConfig, sampling: SamplingParams | None = None) -> None:
        self.config = config
        self.generator = build_generator(config)
        self.params = sampling or SamplingParams()

    def generate(self, prompts: list[str], params: SamplingParams) -> list[PromptResult]:
        return self.generator.generate(prompts, params)

    def chat(self, conversations: list[list[dict[str, str]]], params: SamplingParams) -> list[PromptResult]:
        return self.generator.chat(conversations, params)

    def _contexts(self, convs: list[list[dict[str, str]]]) -> tuple[list[Any], list[str | None]]:
        if isinstance(self.generator, RemoteGenerator):  # per-request errors already; no second round of calls
            results = self.generator.chat_results(convs, self.params)
            return [None if isinstance(r, str) else r for r in results], \
                [r if isinstance(r, str) else None for r in results]
        try:
            return list(self.generator.chat(convs, self.params)), [None] * len(convs)
        except RedlineError:
            raise
        except Exception as err:  # noqa: BLE001 - a local model: retry one by one to isolate the failing contexts
            log.warning("generator %s failed on a batch (%s); retried per context", self.config.name, err)
        results: list[Any] = []
        errors: list[str | None] = []
        for conv in convs:
            try:
                results.append(self.generator.chat([conv], self.params)[0])
                errors.append(None)
            except Exception as one:  # noqa: BLE001
                results.append(None)
                errors.append(f"{type(one).__name__}: {one}"[:300])
        return results, errors

    def __call__(self, batch: dict[str, Any]) -> pa.Table:
        contexts = [str(c) for c in batch["context"]]
        results, errors = self._contexts([[{"role": "user", "content": c}] for c in contexts])
        return pa.table({
            "id": pa.array([str(i) for i in batch["id"]], pa.string()),
            "responses": pa.array([[c.text for c in r.completions] if r else [] for r in results],
                                  pa.list_(pa.string())),
            "gen_error": pa.array(errors, pa.string()),
        }, schema=self.output_schema)
