"""A local Hugging Face chat or seq2seq model as a provider (a judge or a generator that needs no
server): the model loads in this worker, on its GPU when it has one, and answers a batch at once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redline.actors.providers.base import (
    ChatProvider,
    Messages,
    PromptResult,
    SamplingParams,
)


class HFProvider(ChatProvider):
    name = "hf"
    description = "a local Hugging Face causal or seq2seq model (hub id or directory), run in the worker itself"
    remote = False
    needs = {"model": "a hub id or a local directory"}

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        from redline.actors.generators import GeneratorConfig, HFGenerator

        self.generator = HFGenerator(GeneratorConfig.model_validate(
            {"name": settings.model.rstrip("/").rsplit("/", 1)[-1] or "hf", "kind": "hf", "model": settings.model,
             **settings.local}))

    @property
    def endpoint(self) -> str:
        return self.settings.model

    def chat_one(self, messages: Messages, params: SamplingParams) -> PromptResult:
        return self.generator.chat([messages], params)[0]

    def chat(self, conversations: Sequence[Messages], params: SamplingParams) -> list[PromptResult]:
        return self.generator.chat(list(conversations), params)
