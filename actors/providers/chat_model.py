"""The one declaration of a chat model, whoever uses it (a judge, an LLM-based detector, a generator,
the card's model, a Serve generator): the provider, the model, the call policy every provider shares,
and beside them the provider's own settings, validated against that provider's `Options` model (as a
detector's kind options are). A provider with a setting of its own declares it in its own module."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import AliasChoices, BaseModel, ConfigDict, ValidationError, model_validator
from pydantic.fields import FieldInfo

from redline.actors.providers.base import ProviderName
from redline.cluster.config import Execution, Input, RemoteApi, Result, first_error

if TYPE_CHECKING:
    from redline.actors.providers.base import ChatProvider
    from redline.actors.providers.client import ChatClient


class ChatModel(RemoteApi):
    """A chat model and how to call it. The provider's own settings (`base_url` for openai,
    `region` for bedrock, `precision` for hf ...) sit beside these fields: `redline list providers`."""

    model_config = ConfigDict(extra="allow")

    provider: ProviderName = Result(
        "openai", validation_alias=AliasChoices("provider", "kind"),
        description="A provider of the registry (`redline list providers`): openai, an OpenAI-compatible API; "
                    "redline, redline's Serve app; bedrock, AWS Bedrock; hf, a local HF model. (`kind`, its "
                    "earlier name for generators, is read too.)")
    model: str = Input(description="The model name the server knows (openai, redline), a Bedrock model id or ARN "
                                   "(bedrock), or an HF hub id / local directory (hf).")
    timeout_s: float = Execution(60.0, gt=0, description="Remote providers: seconds one request may take.")
    max_retries: int = Execution(2, ge=0, description="Retries of a request on 429, 5xx, timeouts and connection "
                                                      "errors.")
    backoff_s: float = Execution(0.5, gt=0, description="First retry delay; doubles each retry.")
    concurrency: int = Execution(8, gt=0, description="Remote providers: requests in flight at once, per actor.")
    requests_per_second: float = Execution(20.0, gt=0, description="Remote providers: rate limit per actor.")

    what: ClassVar[str] = "chat model"  # what its errors call it: a generator, a judge

    @model_validator(mode="before")
    @classmethod
    def _needs_model(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("model"):
            named = f" '{data['name']}'" if isinstance(data.get("name"), str) else ""
            raise ValueError(f"{cls.what}{named} needs model (a hub id or directory for hf, the name the server "
                             "knows, or a Bedrock model id)")
        return data

    @model_validator(mode="after")
    def _check_provider_options(self) -> "ChatModel":
        try:
            self.provider_class().Options.model_validate(dict(self.model_extra or {}))
        except ValidationError as err:
            named = f" '{self.name}'" if isinstance(getattr(self, "name", None), str) else ""
            raise ValueError(f"{self.what}{named}: provider {self.provider}: {first_error(err)}") from None
        return self

    def provider_class(self) -> type["ChatProvider"]:
        from redline.actors.providers.registry import providers

        return providers()[self.provider]

    def extra_fields(self) -> dict[str, FieldInfo]:
        """The provider's own fields, with their roles in the run key."""
        return self.provider_class().Options.model_fields

    def options(self) -> BaseModel:
        """The provider's own settings, validated."""
        return self.provider_class().Options.model_validate(dict(self.model_extra or {}))

    def where(self) -> str:
        """Where its requests go, for messages: the server's URL where the provider has one, else the model."""
        return str(getattr(self.options(), "base_url", None) or self.model)

    def build_provider(self, num_gpus: float = 0.0) -> "ChatProvider":
        """The provider, connected (a local model loads here, on the GPU `num_gpus` gives it)."""
        return self.provider_class()(self, num_gpus)

    def client(self, provider: "ChatProvider | None" = None, cache_dir: str | None = None) -> "ChatClient":
        """The provider behind this model's call policy: rate limit, retries, failures in a row, cache."""
        from redline.actors.providers.client import ChatClient

        return ChatClient(provider or self.build_provider(), requests_per_second=self.requests_per_second,
                          max_retries=self.max_retries, backoff_s=self.backoff_s, concurrency=self.concurrency,
                          cache_dir=cache_dir, max_retry_after_s=self.max_retry_after_s,
                          max_failed_in_row=self.max_failed_in_row)

