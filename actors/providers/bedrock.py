"""Models on AWS Bedrock through boto3's Converse API (credentials from boto3's usual chain:
environment, profile, SSO, instance role). Converse returns one completion per request, so each of
the n samples is its own request."""

from __future__ import annotations

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
from redline.cluster.config import Result, Strict
from redline.errors import first_line

FINISH = {"max_tokens": "length", "stop_sequence": "stop", "end_turn": "stop"}
TRANSIENT_CODES = {"ThrottlingException", "ServiceUnavailableException", "InternalServerException",
                   "ModelNotReadyException", "ModelTimeoutException", "TooManyRequestsException"}


class BedrockOptions(Strict):
    region: str | None = Result(None, description="AWS region; default: the AWS configuration's.")
    endpoint_url: str | None = Result(None, description="A VPC endpoint or a compatible stand-in.")
    additional_fields: dict[str, Any] = Result(
        default_factory=dict, description="Model-specific request fields (additionalModelRequestFields); top_k is "
                                          "sent as {top_k: K} here, the name Anthropic and Mistral models use.")


class BedrockProvider(ChatProvider):
    name = "bedrock"
    description = "a model on AWS Bedrock (Converse API via boto3; `region`, `endpoint_url`, `additional_fields`)"
    Options = BedrockOptions

    def __init__(self, config: Any, num_gpus: float = 0.0) -> None:
        super().__init__(config)
        settings = self.options
        import boto3
        from botocore.config import Config

        # Retries are the ChatClient's; botocore only gets the timeouts.
        config = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=config.timeout_s,
                        read_timeout=config.timeout_s)
        try:
            self.client = boto3.session.Session().client("bedrock-runtime", region_name=settings.region,
                                       endpoint_url=settings.endpoint_url, config=config)
        except Exception as err:  # noqa: BLE001 - botocore raises several types for a bad region/endpoint
            raise Refused(f"cannot create a Bedrock client: {first_line(err)}") from None

    @property
    def endpoint(self) -> str:
        return self.options.endpoint_url or self.client.meta.endpoint_url

    def request(self, messages: Messages, params: SamplingParams) -> dict[str, Any]:
        inference: dict[str, Any] = {"maxTokens": params.max_tokens, "temperature": params.temperature,
                                     "topP": params.top_p}
        if params.stop:
            inference["stopSequences"] = list(params.stop)
        extra = dict(self.options.additional_fields)
        if params.top_k is not None:
            extra.setdefault("top_k", params.top_k)  # the name Anthropic and Mistral models use
        system = [{"text": m["content"]} for m in messages if m["role"] == "system"]
        request: dict[str, Any] = {
            "modelId": self.config.model, "inferenceConfig": inference,
            "messages": [{"role": m["role"], "content": [{"text": m["content"]}]} for m in messages
                         if m["role"] != "system"]}
        if system:
            request["system"] = system
        if extra:
            request["additionalModelRequestFields"] = extra
        return request

    def converse(self, request: dict[str, Any]) -> Completion:
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            EndpointConnectionError,
        )

        try:
            resp = self.client.converse(**request)
        except EndpointConnectionError:
            raise Transient(f"cannot reach Bedrock at {self.endpoint}", unreachable=True) from None
        except ClientError as err:
            error = err.response.get("Error", {})
            code = error.get("Code", "an error")
            if code in TRANSIENT_CODES or err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) >= 500:
                raise Transient(f"Bedrock answered {code}") from None
            raise Refused(f"Bedrock answered {code}: {error.get('Message', err)}") from None
        except BotoCoreError as err:
            raise Transient(first_line(err)) from None
        text = "".join(part.get("text", "") for part in resp.get("output", {}).get("message", {}).get("content", []))
        return Completion(text, FINISH.get(resp.get("stopReason", ""), "stop"),
                          int(resp.get("usage", {}).get("outputTokens", 0)))

    def chat_one(self, messages: Messages, params: SamplingParams) -> PromptResult:
        request = self.request(messages, params)
        return PromptResult(0, [self.converse(request) for _ in range(params.n)])
