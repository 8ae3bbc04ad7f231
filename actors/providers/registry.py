"""The chat-model provider registry (in the spirit of inspect_ai's model providers). Judges, the
LLM-based detectors and generators all reach models through it; adding a provider is one class and
one line here."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from redline.errors import RedlineError

if TYPE_CHECKING:
    from redline.actors.providers.base import ChatProvider, ProviderSettings


@functools.cache
def _built_in() -> dict[str, type["ChatProvider"]]:
    from redline.actors.providers import bedrock, hf, openai

    classes = (openai.OpenAIProvider, openai.RedlineServeProvider, bedrock.BedrockProvider, hf.HFProvider)
    return {cls.name: cls for cls in classes}


_REGISTERED: dict[str, type["ChatProvider"]] = {}


def register_provider(cls: type["ChatProvider"]) -> type["ChatProvider"]:
    """Adds a provider from outside this package (a class decorator): configs accept its name at once."""
    _REGISTERED[cls.name] = cls
    return cls


def providers() -> dict[str, type["ChatProvider"]]:
    """Every provider by name: the only list of them (configs validate against it)."""
    return {**_built_in(), **_REGISTERED}


def build_provider(settings: "ProviderSettings") -> "ChatProvider":
    known = providers()
    if settings.provider not in known:
        raise RedlineError(f"unknown provider '{settings.provider}' (known: {', '.join(known)})")
    return known[settings.provider](settings)
