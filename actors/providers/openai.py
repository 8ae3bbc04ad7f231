"""OpenAI-compatible chat APIs through the official `openai` client: OpenAI itself, vLLM, TGI,
LiteLLM, Ollama ... and redline's own Serve app (provider `redline`, key from $REDLINE_API_KEY)."""

from __future__ import annotations

import os
from typing import Any

from redline.actors.providers.base import (
    ChatProvider,
    Completion,
    Messages,
    PromptResult,
    Refused,
    SamplingParams,
    Transient,
)
from redline.cluster.net import check_key_transport, retry_after_s
from redline.errors import RedlineError, first_line

RETRYABLE_STATUS = {408, 409, 429, 500, 502, 503, 504}


def api_message(err: Any) -> str:
    """The message inside an OpenAI-style error body, else the exception's first line."""
    body = getattr(err, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return " ".join(str(inner["message"]).split())[:200]
    return first_line(err)[:200]


class OpenAIProvider(ChatProvider):
    name = "openai"
    description = "any OpenAI-compatible chat API (OpenAI, vLLM, TGI, LiteLLM, Ollama ...), `base_url` + key from the env"
    default_key_env = "OPENAI_API_KEY"
    needs = {"base_url": "http://... or https://...", "model": "the name the server knows"}

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)
        from openai import OpenAI

        if not settings.base_url or not settings.base_url.startswith(("http://", "https://")):
            raise RedlineError(f"provider {self.name} needs base_url (http://... or https://...)")
        key = os.environ.get(settings.api_key_env or self.default_key_env, "")
        check_key_transport(settings.base_url, bool(key), settings.allow_insecure_http, f"model at {settings.base_url}")
        # Retries are the ChatClient's: they share its rate limiter and are counted.
        self.client = OpenAI(base_url=settings.base_url, api_key=key or "not-needed", timeout=settings.timeout_s,
                             max_retries=0)

    def sampling(self, params: SamplingParams) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model": self.settings.model, "n": params.n, "temperature": params.temperature,
                                  "top_p": params.top_p, "max_tokens": params.max_tokens}
        if params.stop:
            kwargs["stop"] = list(params.stop)
        if params.seed is not None:
            kwargs["seed"] = params.seed
        if params.top_k is not None:
            kwargs["extra_body"] = {"top_k": params.top_k}
        return kwargs

    def call(self, create: Any, **kwargs: Any) -> Any:
        """One request; Refused or Transient on failure."""
        import openai

        try:
            return create(**kwargs)
        except openai.APITimeoutError as err:
            raise Transient(f"{type(err).__name__}: {first_line(err)}") from None
        except openai.APIConnectionError as err:
            raise Transient(f"{type(err).__name__}: {first_line(err)}", unreachable=True) from None
        except openai.APIStatusError as err:
            if err.status_code not in RETRYABLE_STATUS:
                raise Refused(f"{self.settings.base_url} answered HTTP {err.status_code} ({api_message(err)}); fix the "
                              "model settings (model, key, base_url)") from None
            headers = err.response.headers if err.response is not None else None
            raise Transient(f"HTTP {err.status_code}", retry_after_s(headers)) from None
        except openai.APIError as err:  # a body that is not a completion (HTML, invalid JSON)
            raise Transient(f"unreadable response ({first_line(err)})") from None
        except ValueError as err:  # the client's own JSON parse of a 200 whose body is not JSON
            raise Transient(f"the answer's body is not JSON ({first_line(err)})") from None

    def chat_one(self, messages: Messages, params: SamplingParams) -> PromptResult:
        resp = self.call(self.client.chat.completions.create, messages=messages, **self.sampling(params))
        choices = getattr(resp, "choices", None)
        if not isinstance(choices, list):
            raise Transient("the response is not a chat completion (not JSON?)")
        if not choices:
            raise Transient("the response has no choices")
        usage = getattr(resp, "usage", None)
        per = (usage.completion_tokens // len(choices)) if usage else 0
        return PromptResult(usage.prompt_tokens if usage else 0,
                            [Completion(c.message.content or "", c.finish_reason or "stop", per) for c in choices])

    def complete(self, prompts: list[str], params: SamplingParams) -> list[PromptResult]:
        """The completions API: every prompt in one request."""
        resp = self.call(self.client.completions.create, prompt=list(prompts), **self.sampling(params))
        by_prompt: list[list[Completion]] = [[] for _ in prompts]
        for c in getattr(resp, "choices", None) or []:
            by_prompt[c.index // params.n].append(Completion(c.text, c.finish_reason or "stop", 0))
        prompt_tokens = (resp.usage.prompt_tokens // max(len(prompts), 1)) if getattr(resp, "usage", None) else 0
        return [PromptResult(prompt_tokens, comps) for comps in by_prompt]


class RedlineServeProvider(OpenAIProvider):
    name = "redline"
    description = "a generator served by `redline serve` (OpenAI-compatible; key from $REDLINE_API_KEY)"
    default_key_env = "REDLINE_API_KEY"
