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
from typing import TYPE_CHECKING, Annotated, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from redline.cluster.config import Strict
from redline.cluster.protocol import check_sampling
from redline.errors import RedlineError

if TYPE_CHECKING:
    from redline.actors.providers.chat_model import ChatModel

Messages = list[dict[str, str]]


def check_provider(name: str) -> str:
    """A provider name the registry knows: configs are checked against it when they load."""
    from redline.actors.providers.registry import providers

    known = providers()
    if name not in known:
        raise ValueError(f"unknown provider '{name}' (known: {', '.join(known)})")
    return name


ProviderName = Annotated[str, AfterValidator(check_provider)]


class NoOptions(Strict):
    """A provider without settings of its own."""


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
    # A model in this process whose gradients the trigger search can follow.
    has_gradients: ClassVar[bool] = False
    # The provider's own settings, beside a chat model's common fields in a config (`ChatModel`).
    Options: ClassVar[type[BaseModel]] = NoOptions

    def __init__(self, config: "ChatModel", num_gpus: float = 0.0) -> None:
        self.config = config
        self.options = config.options()

    @property
    def endpoint(self) -> str:
        """Where requests go, for error messages."""
        return self.name

    @abstractmethod
    def chat_one(self, messages: Messages, params: SamplingParams) -> PromptResult: ...

    def chat(self, conversations: Sequence[Messages], params: SamplingParams) -> list[PromptResult]:
        """A local model answers a whole batch at once; remote ones go through `ChatClient` per request."""
        return [self.chat_one(m, params) for m in conversations]
