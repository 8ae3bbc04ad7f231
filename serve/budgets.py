"""What one request may ask of the models: texts, detectors and generation settings checked against
`ServeLimits`, each refusal an `ApiError` (a 4xx naming the field and the limit). Pure functions of
the request and the limits, so the ingress and the tests share them."""

from __future__ import annotations

from redline.actors.generators import SamplingParams
from redline.cluster.protocol import Sampling
from redline.serve.config import ServeLimits


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.param = status, message, kind, code, param


def check_texts(texts: list[str], field: str, limits: ServeLimits) -> None:
    """At least one text, at most `max_texts`, none blank, none over `max_text_chars`."""
    if not texts:
        raise ApiError(400, f"{field} is empty: send at least one text", param=field)
    if len(texts) > limits.max_texts:
        raise ApiError(413, f"{len(texts)} texts in one request; the limit is {limits.max_texts}",
                       code="too_many_texts", param=field)
    for i, t in enumerate(texts):
        if not t.strip():
            raise ApiError(400, f"{field}[{i}] is empty", param=field)
        if len(t) > limits.max_text_chars:
            raise ApiError(413, f"{field}[{i}] has {len(t)} characters; the limit is {limits.max_text_chars}",
                           code="text_too_long", param=field)


def detector_names(names: list[str] | None, served: list[str], texts: int, limits: ServeLimits) -> list[str]:
    """The detectors a request names (each once), or every served one when it names none; the
    request's work (texts x detectors) must fit `max_detections`."""
    if not served:
        raise ApiError(404, "this server hosts no detectors", "not_found_error")
    if names is not None and not names:
        raise ApiError(400, "detectors is empty: name at least one detector, or leave the field out for all",
                       param="detectors")
    chosen = list(dict.fromkeys(names)) if names else list(served)
    unknown = [n for n in chosen if n not in served]
    if unknown:
        raise ApiError(404, f"unknown detector '{unknown[0]}' (served: {', '.join(served)})",
                       "not_found_error", "model_not_found", "detectors")
    work = texts * len(chosen)
    if work > limits.max_detections:
        raise ApiError(413, f"{texts} texts x {len(chosen)} detectors = {work} detections in one request; the "
                            f"limit is {limits.max_detections}", code="too_much_work", param="detectors")
    return chosen


def generator(body: Sampling, served: list[str]) -> str:
    """The served generation model a request names (streaming is not offered)."""
    if body.stream:
        raise ApiError(400, "streaming is not supported; send stream=false", param="stream")
    if body.model not in served:
        raise ApiError(404, f"unknown model '{body.model}' (served generators: {', '.join(served) or 'none'})",
                       "not_found_error", "model_not_found", "model")
    return body.model


def sampling_params(body: Sampling, prompts: int, limits: ServeLimits) -> SamplingParams:
    """The request's sampling settings within `max_n`, `max_tokens` and the request's total token
    budget `max_generated_tokens` (n x prompts x max_tokens)."""
    if body.n > limits.max_n:
        raise ApiError(400, f"n={body.n} exceeds the limit of {limits.max_n}", param="n")
    max_tokens = body.max_completion_tokens or body.max_tokens or limits.default_max_tokens
    if max_tokens > limits.max_tokens:
        raise ApiError(400, f"max_tokens={max_tokens} exceeds the limit of {limits.max_tokens}", param="max_tokens")
    budget = body.n * prompts * max_tokens
    if budget > limits.max_generated_tokens:
        raise ApiError(413, f"n={body.n} x {prompts} prompt(s) x max_tokens={max_tokens} = {budget} tokens in one "
                            f"request; the limit is {limits.max_generated_tokens}", code="too_much_work")
    return SamplingParams(n=body.n, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                          max_tokens=max_tokens, stop=body.stops(), seed=body.seed)
