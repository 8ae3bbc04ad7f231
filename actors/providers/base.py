"""What every chat-model provider offers, and how its failures are told apart.

A provider turns conversations into completions. It raises `Refused` when the service says the
request itself is wrong (bad key, unknown model, malformed request: retrying cannot help, so the run
stops and names it) and `Transient` for what may pass (429, 5xx, timeouts, a garbled body), which
the `ChatClient` retries with back-off. Providers know nothing of caching or rate limits.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from redline.cluster.protocol import check_sampling
from redline.errors import RedlineError

Messages = list[dict[str, str]]


def check_provider(name: str) -> str:
    """A provider name the registry knows: configs are checked against it when they load."""
    from redline.actors.providers.registry import providers

    known = providers()
    if name not in known:
        raise ValueError(f"unknown provider '{name}' (known: {', '.join(known)})")
    return name


ProviderName = Annotated[str, AfterValidator(check_provider)]


class SamplingParams(BaseModel):
    """Sampling settings shared by every request merged into one `generate` call."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    n: int = Field(1, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    max_tokens: int = Field(64, ge=1)
    stop: tuple[str, ...] = ()
    seed: int | None = None

    @field_validator("temperature")
    @classmethod
    def _sampling(cls, temperature: float, info: ValidationInfo) -> float:
        check_sampling(info.data.get("n", 1), temperature)
        return temperature


@dataclass
class Completion:
    text: str
    finish_reason: str  # stop | length
    tokens: int


@dataclass
class PromptResult:
    prompt_tokens: int
    completions: list[Completion] = field(default_factory=list)


@dataclass(frozen=True)
class ProviderSettings:
    """How to reach one chat model, whatever the provider (fields a provider does not use are ignored)."""

    provider: str
    model: str
    base_url: str | None = None
    api_key_env: str | None = None
    allow_insecure_http: bool = False
    timeout_s: float = 60.0
    max_answer_bytes: int = 1 << 20
    region: str | None = None
    endpoint_url: str | None = None
    additional_fields: dict[str, Any] = field(default_factory=dict)
    local: dict[str, Any] = field(default_factory=dict)  # hf: the generator config of a local model


class Refused(RedlineError):
    """The service refused the request itself (auth, unknown model, bad request): not worth a retry."""


class Transient(Exception):
    """A failure that may pass (rate limit, server error, timeout, unreadable body)."""

    def __init__(self, cause: str, retry_after: float | None = None, unreachable: bool = False) -> None:
        super().__init__(cause)
        self.cause, self.retry_after, self.unreachable = cause, retry_after, unreachable


class ChatProvider(ABC):
    """One chat-model API. `chat_one` answers one conversation with `params.n` completions."""

    name: ClassVar[str]
    description: ClassVar[str]
    # A remote service: requests run concurrently under a rate limit and are retried on Transient.
    remote: ClassVar[bool] = True
    # What a config must give for this provider: {field: what it is}, checked when the config loads.
    needs: ClassVar[dict[str, str]] = {"model": "the model to use"}

    @classmethod
    def check_config(cls, values: dict[str, Any]) -> None:
        """Raises ValueError naming the first field this provider needs that `values` lacks."""
        for name, what in cls.needs.items():
            value = values.get(name)
            if not value or (name == "base_url" and not str(value).startswith(("http://", "https://"))):
                raise ValueError(f"provider {cls.name} needs {name} ({what})")

    def __init__(self, settings: ProviderSettings) -> None:
        self.settings = settings

    @property
    def endpoint(self) -> str:
        """Where requests go, for error messages."""
        return self.settings.base_url or self.settings.endpoint_url or self.name

    @abstractmethod
    def chat_one(self, messages: Messages, params: SamplingParams) -> PromptResult: ...

    def chat(self, conversations: Sequence[Messages], params: SamplingParams) -> list[PromptResult]:
        """A local model answers a whole batch at once; remote ones go through `ChatClient` per request."""
        return [self.chat_one(m, params) for m in conversations]
