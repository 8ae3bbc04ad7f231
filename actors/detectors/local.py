"""Detectors that run in the worker's own process: alt-profanity-check, keyword lists, and any
Hugging Face sequence classifier (hub id or local directory)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from pydantic import AliasChoices

from redline.actors.detectors.base import DecisionRule, Detector, single_label_rule
from redline.actors.detectors.config import DetectorConfig
from redline.actors.encoding import TextEncoder, overlapped
from redline.cluster.artifacts import local_path
from redline.cluster.config import Input, Result, Strict
from redline.cluster.devices import PRECISION_HELP, Precision, placement
from redline.errors import RedlineError, first_line

BENIGN_LABEL_NAMES = {"benign", "neither", "non-toxic", "non_toxic", "not_toxic", "nontoxic", "neutral",
                      "safe", "normal", "ok", "clean", "none", "label_0", "0", "false", "not offensive"}


class ProfanityCheckDetector(Detector):
    kind = "profanity-check"
    description = "alt-profanity-check: an off-the-shelf sklearn offensive-language model (offline, fast)"

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        from redline.actors.detectors import profanity_arrays

        # The package's own numbers without importing sklearn in every actor (profanity_arrays.py);
        # sklearn itself only where the package's model is one those arrays do not reproduce.
        self._arrays = profanity_arrays.cached()
        if self._arrays is None:
            from profanity_check import profanity_check as pc

            self._vectorizer, self._model = pc.vectorizer, pc.model
        self._rule = single_label_rule(config, "offensive")

    @property
    def rule(self) -> DecisionRule:
        return self._rule

    def predict_proba(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 1))
        if self._arrays is not None:
            return self._arrays.predict_proba(texts)[:, None]
        return self._model.predict_proba(self._vectorizer.transform(texts))[:, 1:2]


class KeywordOptions(Strict):
    patterns: list[str] = Result(default_factory=list, max_length=100_000,
                                description="Words or regexes; a plain word matches whole words.")
    patterns_file: str | None = Input(None, description="A file with one word or regex per line (# comments).")
    case_sensitive: bool = Result(False)


class KeywordDetector(Detector):
    kind = "keywords"
    description = "word list / regular expressions: toxic when any pattern matches (score 1.0 or 0.0)"
    Options = KeywordOptions

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        self._pattern = self.compile(self.options)  # type: ignore[arg-type]
        self._rule = single_label_rule(config, "toxic")

    @classmethod
    def compile(cls, options: KeywordOptions) -> re.Pattern[str]:
        patterns = list(options.patterns)
        if options.patterns_file:
            path = Path(local_path(options.patterns_file))
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
                    compiled = re.compile(p)
                except re.error as err:
                    raise RedlineError(f"keywords: invalid regular expression {p!r}: {err}") from None
                if compiled.fullmatch(""):
                    raise RedlineError(f"keywords: the pattern {p!r} matches the empty string, so every text would "
                                       "be toxic; make it require at least one character")
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


class HFOptions(Strict):
    model: str = Input(description="Hugging Face hub id or a local directory saved with save_pretrained.")
    toxic_labels: list[str] | None = Result(
        None, description="Labels meaning toxic; default: label 1 of a binary model, or labels named like toxic ones."
    )
    max_length: int = Result(256, gt=0, le=8192)
    revision: str | None = Result(None)
    precision: Precision = Result("auto", validation_alias=AliasChoices("precision", "dtype"),
                                 description=PRECISION_HELP + " The device is the actor's: num_gpus > 0 puts it on "
                                             "the GPU.")


def _looks_like_path(model: str) -> bool:
    # Hub ids are `name` or `namespace/name`; anything with more slashes can only be a directory.
    return (model.startswith(("/", "./", "../", "~")) or model.count("/") > 1
            or Path(model).expanduser().exists())


def _load_hf_config(options: HFOptions) -> Any:
    """The model's labels and problem type: read from a local directory's config.json as it is (the
    driver's preflight then needs no transformers import, seconds of its start-up), else through
    `AutoConfig` from the hub."""
    options = options.model_copy(update={"model": local_path(options.model)})
    if _looks_like_path(options.model):
        path = Path(options.model).expanduser()
        if not path.is_dir():
            raise RedlineError(f"model directory does not exist: {options.model}")
        if not (path / "config.json").is_file():
            raise RedlineError(f"model directory has no config.json (not saved with save_pretrained?): {options.model}")
        try:
            raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as err:
            raise RedlineError(f"cannot load model '{options.model}': config.json: {first_line(err)}") from None
        if not isinstance(raw, dict) or not isinstance(raw.get("id2label", {}), dict):
            raise RedlineError(f"cannot load model '{options.model}': config.json is not a model config")
        return SimpleNamespace(id2label=raw.get("id2label") or None, problem_type=raw.get("problem_type"),
                               num_labels=raw.get("num_labels") or len(raw.get("id2label") or {}) or 2)
    from transformers import AutoConfig

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
    uses_gpu = True
    has_gradients = True
    takes_text_pairs = True

    def __init__(self, config: DetectorConfig) -> None:
        super().__init__(config)
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        opts: HFOptions = self.options  # type: ignore[assignment]
        hf_config = _load_hf_config(opts)
        self._rule = hf_decision_rule(hf_config, config, opts)
        self.placement = placement(config.num_gpus, opts.precision)
        self.device = self.placement.torch_device
        model = local_path(opts.model)  # an s3:// model comes to this node's cache first
        self.tokenizer = AutoTokenizer.from_pretrained(model, revision=opts.revision)
        self._ready(AutoModelForSequenceClassification.from_pretrained(
            model, revision=opts.revision, dtype=self.placement.torch_dtype), opts.max_length)

    def _ready(self, model: Any, max_length: int) -> None:
        """The loaded model on this actor's device, in eval mode, and its batch encoder (subclasses
        that load their models another way, e.g. Detoxify, share this and `predict_proba`)."""
        import torch

        self.model = model.to(self.device, dtype=self.placement.torch_dtype).eval()
        self.max_length = min(max_length, getattr(self.tokenizer, "model_max_length", max_length) or max_length)
        self.encoder = TextEncoder(self.tokenizer, self.max_length, self.device)
        self._torch = torch

    @classmethod
    def preflight(cls, config: DetectorConfig) -> None:
        opts: HFOptions = config.options()  # type: ignore[assignment]
        hf_decision_rule(_load_hf_config(opts), config, opts)

    @property
    def rule(self) -> DecisionRule:
        return self._rule

    def detect_pairs(self, pairs: list[tuple[str, str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`detect` of (context, response) pairs given to the model as its text pairs (a cross-encoder
        such as a context-aware safety classifier), not joined into one string."""
        probs = self.predict_proba(pairs)  # type: ignore[arg-type]
        return (probs, *self._rule.decide(probs))

    def predict_proba(self, texts: list[str]) -> np.ndarray:
        torch, multi_label = self._torch, self._rule.multi_label
        out = np.zeros((len(texts), len(self._rule.labels)))
        if not texts:
            return out
        # Sort by length so each model batch pads to a similar length (dynamic padding).
        order = np.argsort([len(t) if isinstance(t, str) else sum(map(len, t)) for t in texts], kind="stable")
        step = self.config.batch_size
        batches = [order[start:start + step] for start in range(0, len(texts), step)]

        def launch(enc: dict[str, Any]) -> Any:
            logits = self.model(**enc).logits.double()
            return torch.sigmoid(logits) if multi_label else torch.softmax(logits, dim=-1)

        with torch.inference_mode():
            for idx, probs in overlapped(batches, lambda idx: self.encoder([texts[i] for i in idx]), launch,
                                         lambda probs: probs.cpu().numpy()):
                out[idx] = probs
        return out
