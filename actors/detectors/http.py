"""A detector served over HTTP by `redline serve` (or any server speaking its /v1/detect API)."""

from __future__ import annotations

from typing import Any

import numpy as np

from redline.actors.detectors.base import DecisionRule, Detector, rows_with_errors
from redline.actors.detectors.config import DetectorConfig
from redline.cluster.client import RedlineClient
from redline.cluster.config import Execution, RemoteApi, Result
from redline.errors import RedlineError


class HTTPOptions(RemoteApi):
    url: str = Result(description="The server's /v1/detect URL (or its root), e.g. http://127.0.0.1:8000/v1/detect.")
    detector: str | None = Result(None, description="Name of the served detector; default: this detector's name.")
    api_key_env: str = Execution("REDLINE_API_KEY", description="Environment variable holding the server's API key.")
    timeout_s: float = Execution(60.0, gt=0)
    max_texts: int = Result(256, gt=0, description="Texts per HTTP request (the server's limit).")


class HTTPDetector(Detector):
    kind = "http"
    description = "a detector served over HTTP by `redline serve` (its /v1/detect endpoint)"
    Options = HTTPOptions
    remote = True

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        opts: HTTPOptions = self.options  # type: ignore[assignment]
        self.remote_name = opts.detector or config.name
        self.client = RedlineClient(opts.url, api_key_env=opts.api_key_env, timeout=opts.timeout_s,
                                    allow_insecure_http=opts.allow_insecure_http)
        self._rule = self.remote_rule(self.client, self.remote_name, config)

    @staticmethod
    def remote_rule(client: Any, remote: str, config: DetectorConfig) -> DecisionRule:
        """The served detector's labels and decision rule; this config's threshold when set explicitly."""
        infos = {d.name: d for d in client.detectors()}
        if remote not in infos:
            raise RedlineError(f"{client.url} serves no detector '{remote}' (served: {', '.join(infos) or 'none'})")
        info = infos[remote]
        threshold = config.threshold if "threshold" in config.model_fields_set else info.threshold
        rule = config.rule if "rule" in config.model_fields_set else info.rule
        return DecisionRule(labels=tuple(info.labels), toxic=tuple(lab in info.toxic_labels for lab in info.labels),
                            multi_label=info.multi_label, threshold=threshold, rule=rule)

    @classmethod
    def preflight(cls, config: DetectorConfig) -> None:
        opts: HTTPOptions = config.options()  # type: ignore[assignment]
        with RedlineClient(opts.url, api_key_env=opts.api_key_env, timeout=opts.timeout_s, retries=0,
                           allow_insecure_http=opts.allow_insecure_http) as client:
            cls.remote_rule(client, opts.detector or config.name, config)

    @property
    def rule(self) -> DecisionRule:
        return self._rule

    def predict_proba(self, texts: list[str]) -> np.ndarray:
        probs, _, _, errors = self.detect_rows(texts)
        failed = next((e for e in errors if e), None)
        if failed:
            raise RedlineError(f"served detector '{self.remote_name}' failed on a text: {failed}")
        return probs

    def detect_rows(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str | None]]:
        """One request per `max_texts`; a text the server did not answer, answered with an error or
        answered without every label's probability is an error row, never a score."""
        labels = self._rule.labels
        probs = np.full((len(texts), len(labels)), np.nan)
        errors: list[str | None] = ["the server returned no result for this text"] * len(texts)
        step = self.options.max_texts  # type: ignore[attr-defined]
        for start in range(0, len(texts), step):
            chunk = texts[start:start + step]
            resp = self.client.detect(chunk, detectors=[self.remote_name])
            for r in resp.results:
                if not 0 <= r.index < len(chunk):
                    continue
                d = r.detections.get(self.remote_name)
                if d is None or d.error is not None:
                    errors[start + r.index] = f"served detector error: {d.error if d else 'no detection'}"
                elif d.probs is None or any(lab not in d.probs for lab in labels):
                    errors[start + r.index] = "the server's result lacks a label's probability"
                else:
                    probs[start + r.index] = [d.probs[lab] for lab in labels]
                    errors[start + r.index] = None
        return rows_with_errors(self._rule, probs, errors)
