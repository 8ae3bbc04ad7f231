"""Chat-model providers (OpenAI-compatible, redline Serve, AWS Bedrock, local Hugging Face) behind one
interface, the one `ChatModel` config that names one of them with its own settings, and the
`ChatClient` that adds rate limits, retries, caching and accounting to any of them."""

from redline.actors.providers.base import (
    ChatProvider,
    Completion,
    PromptResult,
    ProviderName,
    Refused,
    SamplingParams,
    Transient,
)
from redline.actors.providers.chat_model import ChatModel
from redline.actors.providers.client import Answer, Failed
from redline.actors.providers.hf import HFGenerator
from redline.actors.providers.registry import providers, register_provider

__all__ = ["Answer", "ChatModel", "ChatProvider", "Completion", "Failed", "HFGenerator", "PromptResult",
           "ProviderName", "Refused", "SamplingParams", "Transient", "providers", "register_provider"]
