"""Request and response bodies of redline's HTTP API, shared by the server and the client.

`/v1/detect` and `/v1/detectors` are redline's own; `/v1/moderations`, `/v1/chat/completions`,
`/v1/completions` and `/v1/models` follow OpenAI's API so that existing clients work unchanged.
Unknown fields are ignored (OpenAI clients send informational fields such as `user`); declared ones
are type-checked and bounded, and an OpenAI parameter the models cannot honour (`logit_bias`,
`logprobs`, penalties, tools ...) is refused with the field named, never silently ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

# Below this a temperature is no longer sampling but arithmetic overflow (logits / 1e-300 = inf);
# 0 means greedy decoding.
MIN_TEMPERATURE = 0.01


def _no_lone_surrogates(value: str) -> str:
    """JSON can carry "\\ud800" (half of a UTF-16 pair): valid JSON, but not text any tokenizer can read."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"holds a lone surrogate (U+{ord(value[err.start]):04X} at character {err.start}); "
                         "send valid Unicode text") from None
    return value


Text = Annotated[StrictStr, AfterValidator(_no_lone_surrogates)]


def check_sampling(n: int, temperature: float) -> None:
    """What every generation request must satisfy beyond each field's own range."""
    if 0 < temperature < MIN_TEMPERATURE:
        raise ValueError(f"temperature {temperature:g} is too small to sample with; use 0 (greedy) or at least "
                         f"{MIN_TEMPERATURE:g}")
    if temperature == 0 and n > 1:
        raise ValueError(f"n={n} needs temperature > 0: greedy decoding (temperature 0) gives one answer")


class Body(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


# --------------------------------------------------------------------------------------------
# Detection


class DetectRequest(Body):
    texts: list[Text] = Field(description="Texts to score.")
    detectors: list[StrictStr] | None = Field(None, description="Detector names; default: every served detector.")


class DetectorInfo(BaseModel):
    name: str
    kind: str
    labels: list[str]
    toxic_labels: list[str]
    multi_label: bool
    threshold: float | dict[str, float]
    rule: str
    label_thresholds: dict[str, float] = {}  # the threshold each label is flagged at (the rule's, per label)


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
    input: Text | list[Text]
    model: StrictStr | None = None


class DialoguePair(Body):
    context: Text
    response: Text
    category: StrictStr | None = Field(None, description="The context's category: judge with that classifier only.")


class DialogueSafetyRequest(Body):
    pairs: list[DialoguePair]


# --------------------------------------------------------------------------------------------
# Generation (OpenAI-compatible)


MAX_STOPS = 4  # OpenAI's own bound on `stop`
MAX_STOP_CHARS = 256
MAX_MESSAGES = 1024
# OpenAI parameters these models cannot honour, with the value that asks nothing of them.
UNHONOURED = {"logit_bias": (None, {}), "logprobs": (None, False, 0), "top_logprobs": (None, 0),
              "frequency_penalty": (None, 0, 0.0), "presence_penalty": (None, 0, 0.0), "repetition_penalty": (None, 1, 1.0),
              "tools": (None, []), "tool_choice": (None, "none", "auto"), "functions": (None, []),
              "function_call": (None, "none", "auto"), "best_of": (None, 1), "echo": (None, False), "suffix": (None, ""),
              "response_format": (None, {"type": "text"}), "logprobs_count": (None, 0), "min_tokens": (None, 0),
              "stream_options": (None,), "prediction": (None,), "audio": (None,), "modalities": (None, ["text"])}


def _stops(value: Any) -> Any:
    stops = [value] if isinstance(value, str) else value
    if isinstance(stops, list):
        if len(stops) > MAX_STOPS:
            raise ValueError(f"{len(stops)} stop sequences; at most {MAX_STOPS}")
        if any(isinstance(s, str) and len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"a stop sequence is longer than {MAX_STOP_CHARS} characters")
    return value


class Sampling(Body):
    model: StrictStr
    n: int = Field(1, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, description="Extra (not in OpenAI's API): sample from the k most likely tokens.")
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: Annotated[Text | list[Text] | None, AfterValidator(_stops)] = None
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stream: bool = False

    @model_validator(mode="before")
    @classmethod
    def _honoured(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, harmless in UNHONOURED.items():
                value = data.get(name)
                if name in data and not any(value == h and type(value) is type(h) or value is h for h in harmless):
                    raise ValueError(f"{name}: this server cannot honour it (its models take no {name}); leave it "
                                     "out rather than have it ignored")
        return data

    @field_validator("temperature")
    @classmethod
    def _sampling(cls, temperature: float, info: ValidationInfo) -> float:
        check_sampling(info.data.get("n", 1), temperature)
        return temperature

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class ChatMessage(Body):
    role: Literal["system", "user", "assistant", "developer"]
    content: Text


class ChatCompletionRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)


class CompletionRequest(Sampling):
    prompt: Text | list[Text]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def error_body(message: str, kind: str = "invalid_request_error", code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
