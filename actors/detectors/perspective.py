"""Google's Perspective API (`comments:analyze`) as a detector: one request per text asking for the
configured attributes (TOXICITY, SEVERE_TOXICITY, INSULT, ...), each a probability; toxic when any
attribute reaches its threshold. The default quota is 1 query per second per project, so every actor
of a run shares one rate limiter (a named Ray actor); 429 and 5xx answers are retried with back-off
(never sooner than `Retry-After`), and a text the API will not score (e.g. a language an attribute
does not support) becomes an error row. The key travels in the `X-Goog-Api-Key` header, never in a
URL that could reach a log.
"""

from __future__ import annotations

import hashlib
import os
import random

import numpy as np

from redline.actors.detectors.base import DecisionRule, Detector, rows_with_errors
from redline.actors.detectors.config import DetectorConfig
from redline.cluster.config import Execution, RemoteApi, Result
from redline.cluster.net import Backoff, check_key_transport, retry_after_s, shared_rate_limiter
from redline.errors import RedlineError

ATTRIBUTES = ("TOXICITY", "SEVERE_TOXICITY", "IDENTITY_ATTACK", "INSULT", "PROFANITY", "THREAT",
              "SEXUALLY_EXPLICIT", "FLIRTATION")


class PerspectiveOptions(RemoteApi):
    base_url: str = Execution("https://commentanalyzer.googleapis.com/v1alpha1",
                          description="The API root; `/comments:analyze` is appended.")
    api_key_env: str = Execution("PERSPECTIVE_API_KEY", description="Environment variable holding the API key.")
    attributes: list[str] = Result(["TOXICITY"], min_length=1,
                                  description="requestedAttributes; toxic when any reaches its threshold.")
    languages: list[str] | None = Result(None, description="ISO 639-1 codes; default: the API detects the language.")
    requests_per_second: float = Execution(1.0, gt=0, description="Shared by every actor (the default quota is 1).")
    max_retries: int = Execution(5, ge=0, description="Retries on 429, 5xx and timeouts.")
    backoff_s: float = Execution(1.0, gt=0, description="First retry delay; doubles each retry.")
    timeout_s: float = Execution(30.0, gt=0)
    do_not_store: bool = Result(True, description="Ask Google not to store the texts (doNotStore).")


class PerspectiveDetector(Detector):
    kind = "perspective"
    description = "Google Perspective API: a probability per requested attribute (TOXICITY by default)"
    Options = PerspectiveOptions
    remote = True

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        import httpx

        o: PerspectiveOptions = self.options  # type: ignore[assignment]
        self.key = os.environ.get(o.api_key_env) or ""
        if not self.key:
            raise RedlineError(f"detector '{config.name}' (perspective): set the API key in ${o.api_key_env}")
        check_key_transport(o.base_url, True, o.allow_insecure_http, f"detector '{config.name}'")
        self.url = o.base_url.rstrip("/") + "/comments:analyze"
        self.client = httpx.Client(timeout=o.timeout_s)
        # one limit per API key (a project's quota), whichever actor or run asks
        self.limiter = shared_rate_limiter(
            "perspective-" + hashlib.sha256(f"{self.url}|{self.key}".encode()).hexdigest()[:16]
            + f"-{o.requests_per_second:g}", o.requests_per_second)
        self.waits = Backoff(f"the Perspective API at {o.base_url}", o.max_retry_after_s)
        self._rule = DecisionRule(labels=tuple(o.attributes), toxic=(True,) * len(o.attributes), multi_label=True,
                                  threshold=config.threshold)

    @classmethod
    def preflight(cls, config: DetectorConfig) -> None:
        o = config.options()
        if not os.environ.get(o.api_key_env):
            raise RedlineError(f"detector '{config.name}' (perspective): set the API key in ${o.api_key_env}")
        unknown = [a for a in o.attributes if a not in ATTRIBUTES and not a.endswith("_EXPERIMENTAL")]
        if unknown:
            raise RedlineError(f"detector '{config.name}' (perspective): unknown attributes {unknown} "
                               f"(known: {', '.join(ATTRIBUTES)})")

    @property
    def rule(self) -> DecisionRule:
        return self._rule

    def predict_proba(self, texts: list[str]) -> np.ndarray:
        probs, _, _, errors = self.detect_rows(texts)
        failed = next(((i, e) for i, e in enumerate(errors) if e), None)
        if failed is not None:
            raise RedlineError(f"{self.config.name} could not score text {failed[0]}: {failed[1]}")
        return probs

    def detect(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        probs = self.predict_proba(texts) if texts else np.zeros((0, len(self._rule.labels)))
        return (probs, *self._rule.decide(probs))

    def detect_rows(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str | None]]:
        probs = np.full((len(texts), len(self._rule.labels)), np.nan)
        errors: list[str | None] = [None] * len(texts)
        for i, text in enumerate(texts):
            scores, errors[i] = self._analyze(text)
            if scores is not None:
                probs[i] = scores
        return rows_with_errors(self._rule, probs, errors)

    def _analyze(self, text: str) -> tuple[list[float] | None, str | None]:
        """(one probability per attribute, None) or (None, why this text has no score)."""
        import httpx

        o: PerspectiveOptions = self.options  # type: ignore[assignment]
        body = {"comment": {"text": text}, "requestedAttributes": {a: {} for a in o.attributes},
                "doNotStore": o.do_not_store}
        if o.languages:
            body["languages"] = o.languages
        cause, wait = "", None
        for attempt in range(o.max_retries + 1):
            if attempt:
                delay = o.backoff_s * 2 ** (attempt - 1) * (1 + random.random() / 4)
                asked = f"{cause}, Retry-After {wait:g} s" if wait else cause
                self.limiter.pause(self.waits.seconds(max(delay, wait or 0.0), asked))
            self.limiter.acquire()
            wait = None
            try:
                resp = self.client.post(self.url, json=body, headers={"X-Goog-Api-Key": self.key})
            except httpx.ConnectError:
                raise RedlineError(f"cannot reach the Perspective API at {o.base_url}") from None
            except httpx.TimeoutException:
                cause = f"timed out after {o.timeout_s:g} s"
                continue
            if resp.status_code == 429 or resp.status_code >= 500:
                cause, wait = f"HTTP {resp.status_code}", retry_after_s(resp.headers)
                continue
            if resp.status_code in (401, 403) or (resp.status_code == 400 and "api key" in _message(resp).lower()):
                raise RedlineError(f"the Perspective API at {o.base_url} refused the key in ${o.api_key_env} "
                                   f"(HTTP {resp.status_code}: {_message(resp)})")
            if resp.status_code >= 400:  # this text: an unsupported language, an empty or too long comment
                return None, f"Perspective API: HTTP {resp.status_code}: {_message(resp)}"
            try:
                scores = resp.json()["attributeScores"]
                return [float(scores[a]["summaryScore"]["value"]) for a in o.attributes], None
            except (ValueError, KeyError, TypeError):
                return None, "Perspective API: the answer has no summaryScore for every requested attribute"
        return None, f"Perspective API: {cause} after {o.max_retries} retries"


def _message(resp) -> str:  # noqa: ANN001 - an httpx.Response
    try:
        return str(resp.json()["error"]["message"])[:200]
    except (ValueError, KeyError, TypeError):
        return resp.text[:200]
