"""Request and response bodies of redline's HTTP API, shared by the server and the client.

`/v1/detect` and `/v1/detectors` are redline's own; `/v1/moderations`, `/v1/chat/completions`,
`/v1/completions` and `/v1/models` follow OpenAI's API so that existing clients work unchanged.
Unknown fields are ignored (OpenAI clients send fields we do not use); declared ones are type-checked.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr


class Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


# --------------------------------------------------------------------------------------------
# Detection


class DetectRequest(Body):
    texts: list[StrictStr] = Field(description="Texts to score.")
    detectors: list[StrictStr] | None = Field(None, description="Detector names; default: every served detector.")


class DetectorInfo(BaseModel):
    name: str
    kind: str
    labels: list[str]
    toxic_labels: list[str]
    multi_label: bool
    threshold: float | dict[str, float]
    rule: str


class Detection(BaseModel):
    """One detector's verdict on one text (or the error that prevented it)."""

    toxic: bool | None = None
    label: Literal["toxic", "benign"] | None = None
    toxic_score: float | None = None
    probs: dict[str, float] | None = None
    error: str | None = None


class DetectResult(BaseModel):
    index: int
    detections: dict[str, Detection]


class DetectResponse(BaseModel):
    object: Literal["detection"] = "detection"
    detectors: list[str]
    results: list[DetectResult]


class ModerationRequest(Body):
    input: StrictStr | list[StrictStr]
    model: StrictStr | None = None


class DialoguePair(Body):
    context: StrictStr
    response: StrictStr
    category: StrictStr | None = Field(None, description="The context's category: judge with that classifier only.")


class DialogueSafetyRequest(Body):
    pairs: list[DialoguePair]


# --------------------------------------------------------------------------------------------
# Generation (OpenAI-compatible)


class Sampling(Body):
    model: StrictStr
    n: int = Field(1, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, description="Extra (not in OpenAI's API): sample from the k most likely tokens.")
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: StrictStr | list[StrictStr] | None = None
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stream: bool = False

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class ChatMessage(Body):
    role: Literal["system", "user", "assistant", "developer"]
    content: StrictStr


class ChatCompletionRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1)


class CompletionRequest(Sampling):
    prompt: StrictStr | list[StrictStr]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def error_body(message: str, kind: str = "invalid_request_error", code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
