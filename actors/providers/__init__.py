"""Chat-model providers (OpenAI-compatible, redline Serve, AWS Bedrock, local Hugging Face) behind one
interface, and the `ChatClient` that adds rate limits, retries, caching and accounting to any of them."""

from redline.actors.providers.base import (
                                           ChatProvider,
                                           Completion,
                                           PromptResult,
                                           ProviderName,
                                           ProviderSettings,
                                           Refused,
                                           SamplingParams,
                                           Transient,
)
from redline.actors.providers.client import Answer, ChatClient, Failed
from redline.actors.providers.registry import build_provider, providers, register_provider

__all__ = ["Answer", "ChatClient", "ChatProvider", "Completion", "Failed", "PromptResult",
           "ProviderName", "ProviderSettings", "Refused", "SamplingParams", "Transient", "build_provider", "providers",
           "register_provider"]
