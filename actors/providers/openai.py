"""OpenAI-compatible chat APIs through the official `openai` client: OpenAI itself, vLLM, TGI,
LiteLLM, Ollama ... and redline's own Serve app (provider `redline`, key from $REDLINE_API_KEY)."""

from __future__ import annotations

import json
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
from redline.cluster.config import Execution, Strict
from redline.cluster.net import check_key_transport, retry_after_s
from redline.errors import first_line

RETRYABLE_STATUS = {408, 409, 429, 500, 502, 503, 504}


def api_message(err: Any) -> str:
    """The message inside an OpenAI-style error body, else the exception's first line."""
    body = getattr(err, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return " ".join(str(inner["message"]).split())[:200]
    return first_line(err)[:200]


class OpenAIOptions(Strict):
    base_url: str = Execution(pattern=r"^https?://", description="The server's base URL, e.g. "
                                                                  "http://127.0.0.1:8000/v1.")
    api_key_env: str | None = Execution(None, description="Environment variable holding the key (default "
                                                          "OPENAI_API_KEY; REDLINE_API_KEY for provider redline).")


class OpenAIProvider(ChatProvider):
    name = "openai"
    description = "any OpenAI-compatible chat API (OpenAI, vLLM, TGI, LiteLLM, Ollama ...), `base_url` + key from the env"
    default_key_env = "OPENAI_API_KEY"
    Options = OpenAIOptions

    def __init__(self, config: Any, num_gpus: float = 0.0) -> None:
        super().__init__(config)
        from openai import OpenAI

        self.base_url = self.options.base_url
        key = os.environ.get(self.options.api_key_env or self.default_key_env, "")
        check_key_transport(self.base_url, bool(key), config.allow_insecure_http, f"model at {self.base_url}")
        # Retries are the ChatClient's: they share its rate limiter and are counted.
        self.client = OpenAI(base_url=self.base_url, api_key=key or "not-needed", timeout=config.timeout_s,
                             max_retries=0)

    @property
    def endpoint(self) -> str:
        return self.base_url

    def sampling(self, params: SamplingParams) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model": self.config.model, "n": params.n, "temperature": params.temperature,
                                  "top_p": params.top_p, "max_tokens": params.max_tokens}
        if params.stop:
            kwargs["stop"] = list(params.stop)
        if params.seed is not None:
            kwargs["seed"] = params.seed
        if params.top_k is not None:
            kwargs["extra_body"] = {"top_k": params.top_k}
        return kwargs

    def call(self, create: Any, **kwargs: Any) -> dict[str, Any]:
        """One request, its body read up to `max_answer_bytes` (decoded, so a compressed bomb is cut off
        too) and parsed as a JSON object; Refused or Transient on failure."""
        import openai

        limit = self.config.max_answer_bytes
        try:
            with create(**kwargs) as response:
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > limit:
                    raise Transient(f"the answer is {int(declared):,} bytes, over max_answer_bytes ({limit:,})")
                body = bytearray()
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > limit:
                        raise Transient(f"the answer is over max_answer_bytes ({limit:,} bytes)")
        except openai.APITimeoutError as err:
            raise Transient(f"{type(err).__name__}: {first_line(err)}") from None
        except openai.APIConnectionError as err:
            raise Transient(f"{type(err).__name__}: {first_line(err)}", unreachable=True) from None
        except openai.APIStatusError as err:
            if err.status_code not in RETRYABLE_STATUS:
                raise Refused(f"{self.base_url} answered HTTP {err.status_code} ({api_message(err)}); fix the "
                              "model settings (model, key, base_url)") from None
            headers = err.response.headers if err.response is not None else None
            raise Transient(f"HTTP {err.status_code}", retry_after_s(headers)) from None
        except openai.APIError as err:
            raise Transient(f"unreadable response ({first_line(err)})") from None
        try:
            data = json.loads(bytes(body))
        except (ValueError, RecursionError) as err:
            raise Transient(f"the answer's body is not JSON ({first_line(err)[:120]})") from None
        if not isinstance(data, dict):
            raise Transient("the answer's body is not JSON object")
        return data

    def chat_one(self, messages: Messages, params: SamplingParams) -> PromptResult:
        data = self.call(self.client.chat.completions.with_streaming_response.create, messages=messages,
                         **self.sampling(params))
        choices = data.get("choices")
        if not isinstance(choices, list):
            raise Transient("the response is not a chat completion (no list of choices)")
        if not choices:
            raise Transient("the response has no choices")
        completions = []
        for c in choices:
            message = c.get("message") if isinstance(c, dict) else None
            content = message.get("content") if isinstance(message, dict) else None
            if not isinstance(content, (str, type(None))):
                raise Transient("a choice of the response has no text")
            completions.append(Completion(content or "", _text(c.get("finish_reason")) or "stop", 0))
        prompt_tokens, completion_tokens = _usage(data)
        for c in completions:
            c.tokens = completion_tokens // len(completions)
        return PromptResult(prompt_tokens, completions)

    def complete(self, prompts: list[str], params: SamplingParams) -> list[PromptResult]:
        """The completions API: every prompt in one request."""
        data = self.call(self.client.completions.with_streaming_response.create, prompt=list(prompts),
                         **self.sampling(params))
        by_prompt: list[list[Completion]] = [[] for _ in prompts]
        choices = data.get("choices")
        for c in choices if isinstance(choices, list) else []:
            index = c.get("index") if isinstance(c, dict) else None
            if not isinstance(index, int) or not 0 <= index // params.n < len(prompts) or not isinstance(c.get("text"), str):
                raise Transient("a choice of the response has no text or no valid index")
            by_prompt[index // params.n].append(Completion(c["text"], _text(c.get("finish_reason")) or "stop", 0))
        prompt_tokens = _usage(data)[0] // max(len(prompts), 1)
        return [PromptResult(prompt_tokens, comps) for comps in by_prompt]


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _usage(data: dict[str, Any]) -> tuple[int, int]:
    """(prompt tokens, completion tokens) of an answer; 0 where the server gave no whole count."""
    usage = data.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    counts = [usage.get(k) for k in ("prompt_tokens", "completion_tokens")]
    return tuple(c if isinstance(c, int) and not isinstance(c, bool) and c >= 0 else 0 for c in counts)  # type: ignore[return-value]


class RedlineServeProvider(OpenAIProvider):
    name = "redline"
    description = "a generator served by `redline serve` (OpenAI-compatible; key from $REDLINE_API_KEY)"
    default_key_env = "REDLINE_API_KEY"
