"""The chat-model provider registry (in the spirit of inspect_ai's model providers). Judges, the
LLM-based detectors and generators all reach models through it; adding a provider is one class and
one line here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from redline.cluster.plugins import Registry

if TYPE_CHECKING:
    from redline.actors.providers.base import ChatProvider


def _built_in() -> tuple[type["ChatProvider"], ...]:
    from redline.actors.providers import bedrock, hf, openai

    return (openai.OpenAIProvider, openai.RedlineServeProvider, bedrock.BedrockProvider, hf.HFProvider)


PROVIDERS: Registry[type["ChatProvider"]] = Registry("provider", lambda cls: cls.name, _built_in)
register_provider = PROVIDERS.register  # a provider from outside this package (a class decorator)


def providers() -> dict[str, type["ChatProvider"]]:
    """Every provider by name: the only list of them (configs validate against it)."""
    return PROVIDERS.all()
