"""Toxicity detectors behind one interface: `predict_proba(texts)` -> per-label probabilities.

Each kind is one class with a `kind` name, a one-line `description` and an `Options` model for its
own config fields; `DETECTORS` registers it. Heavy libraries are imported inside the classes so that
listing and validating detectors stays instant, and instances are built inside Ray actors.
"""

from __future__ import annotations

import logging
import re
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from redline.actors.hf_loading import device_and_dtype, first_line
from redline.cluster.config import DetectorConfig
from redline.errors import RedlineError
from redline.pipelines.schema import DETECTION_BATCH_SCHEMA

log = logging.getLogger(__name__)

BENIGN_LABEL_NAMES = {"benign", "neither", "non-toxic", "non_toxic", "not_toxic", "nontoxic", "neutral",
                      "safe", "normal", "ok", "clean", "none", "label_0", "0", "false", "not offensive"}


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------------------------
# Decision rule


@dataclass(frozen=True)
class DecisionRule:
    """Turns per-label probabilities into one toxic score and a toxic/benign decision.

    - multi-label (sigmoid) models: score = max over toxic labels; toxic if any toxic label reaches
      its threshold.
    - single-label (softmax) models: score = total probability of the toxic classes; toxic if the
      score reaches the threshold (rule `score`) or the top class is toxic (rule `argmax`, the
      default for more than two classes, e.g. Davidson's hate / offensive / neither).
    """

    labels: tuple[str, ...]
    toxic: tuple[bool, ...]
    multi_label: bool
    threshold: float | dict[str, float] = 0.5
    rule: str = "auto"

    def __post_init__(self) -> None:
        if not any(self.toxic):
            raise RedlineError(f"no toxic label among the detector's labels {list(self.labels)}")
        if isinstance(self.threshold, dict):
            unknown = set(self.threshold) - set(self.labels)
            if unknown:
                raise RedlineError(f"threshold names unknown labels {sorted(unknown)} (labels: {list(self.labels)})")
            if not self.multi_label:
                raise RedlineError("per-label thresholds need a multi-label detector; give one number")

    @property
    def effective_rule(self) -> str:
        if self.rule != "auto":
            return self.rule
        return "argmax" if (not self.multi_label and len(self.labels) > 2) else "score"

    def thresholds(self) -> np.ndarray:
        if isinstance(self.threshold, dict):
            return np.array([self.threshold.get(label, 0.5) for label in self.labels])
        return np.full(len(self.labels), float(self.threshold))

    def decide(self, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """probs (n, n_labels) -> (toxic score (n,), toxic decision (n,))."""
        mask = np.array(self.toxic)
        if probs.shape[0] == 0:
            return np.zeros(0), np.zeros(0, dtype=bool)
        if self.multi_label:
            score = probs[:, mask].max(axis=1)
            toxic = (probs[:, mask] >= self.thresholds()[mask]).any(axis=1)
            return score.astype(np.float64), toxic
        score = probs[:, mask].sum(axis=1) if probs.shape[1] > 1 else probs[:, 0]
        if self.effective_rule == "argmax":
            toxic = mask[probs.argmax(axis=1)] if probs.shape[1] > 1 else probs[:, 0] >= 0.5
        else:
            toxic = score >= float(self.threshold)  # type: ignore[arg-type]
        return score.astype(np.float64), np.asarray(toxic, dtype=bool)


# --------------------------------------------------------------------------------------------
# The interface


class Detector(ABC):
    kind: ClassVar[str]
    description: ClassVar[str]
    Options: ClassVar[type[BaseModel]] = NoOptions
    # A detector behind a remote API: a failed batch is not retried text by text (that would multiply
    # the requests against a service that may just have said 429); its answers can fail per text.
    remote: ClassVar[bool] = False

    def __init__(self, config: DetectorConfig) -> None:
        self.config = config
        self.options = config.options()

    @classmethod
    def preflight(cls, config: DetectorConfig) -> None:
        """Cheap checks run on the driver before any actor starts (missing files, unknown labels)."""

    @property
    @abstractmethod
    def rule(self) -> DecisionRule: ...

    @abstractmethod
    def predict_proba(self, texts: list[str]) -> np.ndarray:
        """Probabilities of shape (len(texts), len(labels)). Float64: near 0 or 1, float32 rounds
        small changes away, and attack search climbs exactly those."""

    def detect(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """texts -> (probs, toxic score, toxic decision)."""
        if not texts:  # no model call, and reshape(0, -1) is ambiguous
            probs = np.zeros((0, len(self.rule.labels)))
        else:
            probs = np.asarray(self.predict_proba(texts), dtype=np.float64).reshape(len(texts), -1)
        score, toxic = self.rule.decide(probs)
        return probs, score, toxic

    def detect_rows(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str | None]]:
        """`detect` plus, per text, the error that kept it from being scored (None when scored).
        Detectors whose service can fail on single texts override this; a row with an error has
        no score and no decision."""
        probs, score, toxic = self.detect(texts)
        return probs, score, toxic, [None] * len(texts)


def _single_label_rule(config: DetectorConfig, label: str) -> DecisionRule:
    return DecisionRule(labels=(label,), toxic=(True,), multi_label=False, threshold=config.threshold,
                        rule="score" if config.rule == "auto" else config.rule)


# --------------------------------------------------------------------------------------------
# profanity-check: an off-the-shelf linear model over character/word n-grams (works offline)


class ProfanityCheckDetector(Detector):
    kind = "profanity-check"
    description = "alt-profanity-check: an off-the-shelf sklearn offensive-language model (offline, fast)"

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        # The package's own predict_prob applies a Python function per row; calling the fitted
        # vectorizer and model directly gives the same numbers several times faster.
        from profanity_check import profanity_check as pc

        self._vectorizer, self._model = pc.vectorizer, pc.model
        self._rule = _single_label_rule(config, "offensive")

    @property
    def rule(self) -> DecisionRule:
        return self._rule

    def predict_proba(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 1))
        return self._model.predict_proba(self._vectorizer.transform(texts))[:, 1:2]


# --------------------------------------------------------------------------------------------
# keywords: a word list or regular expressions


class KeywordOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    patterns: list[str] = Field(default_factory=list, description="Words or regexes; a plain word matches whole words.")
    patterns_file: str | None = Field(None, description="A file with one word or regex per line (# comments).")
    case_sensitive: bool = False


class KeywordDetector(Detector):
    kind = "keywords"
    description = "word list / regular expressions: toxic when any pattern matches (score 1.0 or 0.0)"
    Options = KeywordOptions

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        self._pattern = self.compile(self.options)  # type: ignore[arg-type]
        self._rule = _single_label_rule(config, "toxic")

    @classmethod
    def compile(cls, options: KeywordOptions) -> re.Pattern[str]:
        patterns = list(options.patterns)
        if options.patterns_file:
            path = Path(options.patterns_file)
            if not path.is_file():
                raise RedlineError(f"keywords patterns_file not found: {path}")
            lines = path.read_text(encoding="utf-8").splitlines()
            patterns += [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
        if not patterns:
            raise RedlineError("keywords detector needs `patterns` or `patterns_file`")
        parts = []
        for p in patterns:
            if re.fullmatch(r"[\w' -]+", p):
                parts.append(r"\b" + re.escape(p) + r"\b")
            else:
                try:
                    re.compile(p)
                except re.error as err:
                    raise RedlineError(f"keywords: invalid regular expression {p!r}: {err}") from None
                parts.append(f"(?:{p})")
        return re.compile("|".join(parts), 0 if options.case_sensitive else re.IGNORECASE)

    @classmethod
    def preflight(cls, config: DetectorConfig) -> None:
        cls.compile(config.options())  # type: ignore[arg-type]

    @property
    def rule(self) -> DecisionRule:
        return self._rule

    def predict_proba(self, texts: list[str]) -> np.ndarray:
        search = self._pattern.search
        return np.array([[1.0 if search(t) else 0.0] for t in texts]).reshape(-1, 1)


# --------------------------------------------------------------------------------------------
# hf: any Hugging Face sequence classifier, from the hub or a local directory


class HFOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(description="Hugging Face hub id or a local directory saved with save_pretrained.")
    toxic_labels: list[str] | None = Field(
        None, description="Labels meaning toxic; default: label 1 of a binary model, or labels named like toxic ones."
    )
    max_length: int = Field(256, gt=0, le=8192)
    revision: str | None = None
    dtype: str = Field("auto", description="auto (float16 on GPU, float32 on CPU), float32, float16, bfloat16.")
    device: str = Field("auto", description="auto (cuda when this actor has a GPU), cpu, cuda, cuda:1 ...")


def _looks_like_path(model: str) -> bool:
    # Hub ids are `name` or `namespace/name`; anything with more slashes can only be a directory.
    return (model.startswith(("/", "./", "../", "~")) or model.count("/") > 1
            or Path(model).expanduser().exists())


def _load_hf_config(options: HFOptions) -> Any:
    from transformers import AutoConfig

    if _looks_like_path(options.model):
        path = Path(options.model).expanduser()
        if not path.is_dir():
            raise RedlineError(f"model directory does not exist: {options.model}")
        if not (path / "config.json").is_file():
            raise RedlineError(f"model directory has no config.json (not saved with save_pretrained?): {options.model}")
    try:
        return AutoConfig.from_pretrained(options.model, revision=options.revision)
    except (OSError, ValueError) as err:
        raise RedlineError(f"cannot load model '{options.model}': {first_line(err)}") from None


def hf_decision_rule(hf_config: Any, config: DetectorConfig, options: HFOptions) -> DecisionRule:
    id2label = getattr(hf_config, "id2label", None) or {}
    n = int(getattr(hf_config, "num_labels", len(id2label) or 2))
    labels = tuple(str(id2label.get(i, id2label.get(str(i), f"LABEL_{i}"))) for i in range(n))
    multi_label = getattr(hf_config, "problem_type", None) == "multi_label_classification"
    if options.toxic_labels:
        unknown = [t for t in options.toxic_labels if t not in labels]
        if unknown:
            raise RedlineError(f"toxic_labels {unknown} are not labels of {options.model} (labels: {list(labels)})")
        toxic = tuple(label in options.toxic_labels for label in labels)
    elif n == 1:
        toxic = (True,)
    elif n == 2 and not multi_label:
        toxic = (False, True)
    else:
        toxic = tuple(label.lower() not in BENIGN_LABEL_NAMES for label in labels)
        if all(toxic) and not multi_label:  # a softmax model needs a benign class
            raise RedlineError(
                f"cannot tell which labels of {options.model} mean toxic (labels: {list(labels)}); set toxic_labels"
            )
    return DecisionRule(labels=labels, toxic=toxic, multi_label=multi_label or n == 1,
                        threshold=config.threshold, rule=config.rule)


class HFDetector(Detector):
    kind = "hf"
    description = "Hugging Face sequence classifier (hub id or local dir): binary, multi-label or multi-class"
    Options = HFOptions

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        opts: HFOptions = self.options  # type: ignore[assignment]
        hf_config = _load_hf_config(opts)
        self._rule = hf_decision_rule(hf_config, config, opts)
        self.device, dtype = device_and_dtype(opts.device, opts.dtype, config.num_gpus)
        self.tokenizer = AutoTokenizer.from_pretrained(opts.model, revision=opts.revision)
        self.model = AutoModelForSequenceClassification.from_pretrained(
            opts.model, revision=opts.revision, dtype=dtype
        ).to(self.device).eval()
        self.max_length = min(opts.max_length, getattr(self.tokenizer, "model_max_length", opts.max_length) or opts.max_length)
        self._torch = torch

    @classmethod
    def preflight(cls, config: DetectorConfig) -> None:
        opts: HFOptions = config.options()  # type: ignore[assignment]
        hf_decision_rule(_load_hf_config(opts), config, opts)

    @property
    def rule(self) -> DecisionRule:
        return self._rule

    def predict_proba(self, texts: list[str]) -> np.ndarray:
        torch = self._torch
        n_labels = len(self._rule.labels)
        out = np.zeros((len(texts), n_labels))
        if not texts:
            return out
        # Sort by length so each model batch pads to a similar length (dynamic padding).
        order = np.argsort([len(t) for t in texts], kind="stable")
        step = self.config.batch_size
        with torch.inference_mode():
            for start in range(0, len(texts), step):
                idx = order[start:start + step]
                enc = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                     max_length=self.max_length, return_tensors="pt").to(self.device)
                logits = self.model(**enc).logits.double()
                probs = torch.sigmoid(logits) if self._rule.multi_label else torch.softmax(logits, dim=-1)
                out[idx] = probs.cpu().numpy()
        return out


# --------------------------------------------------------------------------------------------
# http: a detector served by `redline serve` (or any server speaking its /v1/detect API)


class HTTPOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(description="The server's /v1/detect URL (or its root), e.g. http://127.0.0.1:8000/v1/detect.")
    detector: str | None = Field(None, description="Name of the served detector; default: this detector's name.")
    api_key_env: str = Field("REDLINE_API_KEY", description="Environment variable holding the server's API key.")
    timeout_s: float = Field(60.0, gt=0)
    max_texts: int = Field(256, gt=0, description="Texts per HTTP request (the server's limit).")
    allow_insecure_http: bool = Field(False, description="Allow sending the API key over plain http:// to a "
                                                         "non-loopback host.")


class HTTPDetector(Detector):
    kind = "http"
    description = "a detector served over HTTP by `redline serve` (its /v1/detect endpoint)"
    Options = HTTPOptions
    remote = True

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        from redline.serve.client import RedlineClient

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
        from redline.serve.client import RedlineClient

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


def rows_with_errors(rule: DecisionRule, probs: np.ndarray,
                     errors: list[str | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str | None]]:
    """Decisions for the rows without an error; NaN scores and no decision for the others."""
    ok = np.array([e is None for e in errors], dtype=bool)
    score = np.full(len(errors), np.nan)
    toxic = np.zeros(len(errors), dtype=bool)
    if ok.any():
        score[ok], toxic[ok] = rule.decide(probs[ok])
    return probs, score, toxic, errors


DETECTORS: dict[str, type[Detector]] = {
    cls.kind: cls for cls in (HFDetector, ProfanityCheckDetector, KeywordDetector, HTTPDetector)
}


def build_detector(config: DetectorConfig) -> Detector:
    from redline.actors.registry import detector_class

    return detector_class(config.kind)(config)


# --------------------------------------------------------------------------------------------
# The batch worker: what a Ray Data actor pool runs, and what a Serve deployment wraps.


class DetectionWorker:
    """Loads one detector once, then scores batches; a batch that fails is retried row by row so
    one bad row is reported as an error on that row instead of sinking its neighbours."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = DetectorConfig.model_validate(config)
        self.detector = build_detector(self.config)

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        texts = [str(t) for t in batch["text"]]
        started = time.perf_counter()
        probs, score, toxic, status, reason = self.score(texts)
        per_row = (time.perf_counter() - started) / max(len(texts), 1)
        return pa.table(
            {
                "id": pa.array(batch["id"].tolist(), pa.string()),
                "shard": pa.array(batch["shard"], pa.int32()),
                "detector": pa.array([self.config.name] * len(texts), pa.string()),
                "toxic_score": pa.array(score, pa.float64()),
                "pred_toxic": pa.array(toxic, pa.bool_()),
                "probs": pa.array([None if p is None else np.asarray(p, np.float32) for p in probs],
                                  pa.list_(pa.float32())),
                "seconds": pa.array(np.full(len(texts), per_row), pa.float64()),
                "det_status": pa.array(status.tolist(), pa.string()),
                "det_reason": pa.array(reason.tolist(), pa.string()),
            },
            schema=DETECTION_BATCH_SCHEMA,
        )

    def score(self, texts: list[str]) -> tuple[list[Any], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        n = len(texts)
        status = np.full(n, "ok", dtype=object)
        reason = np.full(n, None, dtype=object)
        try:
            probs, score, toxic, errors = self.detector.detect_rows(texts)
        except RedlineError:
            raise  # the user must fix something (unreachable endpoint, bad key): retrying rows cannot
        except Exception as err:  # noqa: BLE001 - isolate the failing rows below
            if self.detector.remote:
                # One failure for the batch, not one request per text against a struggling service.
                cause = f"{type(err).__name__}: {err}"[:300]
                return [None] * n, np.full(n, np.nan), np.zeros(n, dtype=bool), np.full(n, "error", dtype=object), \
                    np.full(n, cause, dtype=object)
            log.warning("detector %s failed on a batch of %d (%s); retrying row by row", self.config.name, n, err)
        else:
            rows: list[Any] = list(probs)
            for i, e in enumerate(errors):
                if e is not None:
                    status[i], reason[i], rows[i] = "error", str(e)[:300], None
            return rows, score, toxic, status, reason
        probs_rows: list[Any] = [None] * n
        score = np.full(n, np.nan)
        toxic = np.zeros(n, dtype=bool)
        for i, text in enumerate(texts):
            try:
                p, s, t = self.detector.detect([text])
                probs_rows[i], score[i], toxic[i] = p[0], s[0], t[0]
            except Exception as err:  # noqa: BLE001
                status[i], reason[i] = "error", f"{type(err).__name__}: {err}"[:300]
        return probs_rows, score, toxic, status, reason
