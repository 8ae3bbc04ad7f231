"""Detoxify (unitary): the `original`, `unbiased` and `multilingual` Jigsaw models (and the `-small`
ALBERT ones), loaded by the `detoxify` package's own functions from its release checkpoints or a
local `checkpoint:` in Detoxify's format ({config, state_dict}), and scored in redline's batches.

Detoxify reports one sigmoid per class. Only the toxicity classes decide: the `unbiased` model's
identity classes (male, female, muslim, black, ...) say whom a text mentions, not that it is toxic,
and must never make it toxic. A checkpoint is read with `weights_only=True`: a file that would need
to run code to load is refused.
"""

from __future__ import annotations

from typing import Any, Literal

from redline.actors.detectors.base import DecisionRule
from redline.actors.detectors.config import DetectorConfig
from redline.actors.detectors.local import HFDetector
from redline.cluster.artifacts import local_path
from redline.cluster.config import Input, Result, Strict
from redline.cluster.devices import PRECISION_HELP, Precision, placement
from redline.errors import RedlineError, first_line

# Detoxify's class names after its own renaming (toxic -> toxicity, ...); the ones that mean toxic.
TOXIC_CLASSES = ("toxicity", "severe_toxicity", "obscene", "threat", "insult", "identity_attack", "sexual_explicit")


class DetoxifyOptions(Strict):
    model: Literal["original", "unbiased", "multilingual", "original-small", "unbiased-small"] = Input(
        "original", description="Which released Detoxify model (downloaded by the package unless `checkpoint`).")
    checkpoint: str | None = Input(None, description="A local (or s3://) checkpoint in Detoxify's format, for "
                                                     "offline use or a model trained with Detoxify's code.")
    huggingface_config_path: str | None = Result(
        None, description="A directory with the base model's config and tokenizer (Detoxify's offline option).")
    toxic_labels: list[str] | None = Result(None, description="Classes that mean toxic; default: the toxicity classes "
                                                             "(never the identity ones).")
    max_length: int = Result(256, gt=0, le=8192)
    precision: Precision = Result("auto", description=PRECISION_HELP)


def _load(options: DetoxifyOptions, device: str) -> tuple[Any, Any, list[str]]:
    """(model, tokenizer, class names), the way `detoxify.Detoxify` loads them."""
    import torch

    try:
        from detoxify.detoxify import MODEL_URLS, get_model_and_tokenizer
    except ImportError:
        raise RedlineError("detector kind detoxify needs the detoxify package: pip install detoxify") from None
    try:
        if options.checkpoint:
            loaded = torch.load(local_path(options.checkpoint), map_location=device, weights_only=True)
        else:
            loaded = torch.hub.load_state_dict_from_url(MODEL_URLS[options.model], map_location=device,
                                                        weights_only=True)
    except FileNotFoundError:
        raise RedlineError(f"detoxify checkpoint not found: {options.checkpoint}") from None
    except Exception as err:  # noqa: BLE001 - unpickling refused, a truncated file, no network
        raise RedlineError(f"cannot load the detoxify checkpoint {options.checkpoint or options.model}: "
                           f"{first_line(err)}") from None
    if not isinstance(loaded, dict) or "config" not in loaded or "state_dict" not in loaded:
        raise RedlineError(f"{options.checkpoint}: not a Detoxify checkpoint (it needs `config` and `state_dict`)")
    try:
        classes = list(loaded["config"]["dataset"]["args"]["classes"])
        arch = dict(loaded["config"]["arch"]["args"])
    except (KeyError, TypeError):
        raise RedlineError(f"{options.checkpoint}: its config has no dataset classes or arch args") from None
    renamed = {"toxic": "toxicity", "identity_hate": "identity_attack", "severe_toxic": "severe_toxicity"}
    classes = [renamed.get(c, c) for c in classes]
    config_path = local_path(options.huggingface_config_path) if options.huggingface_config_path else None
    try:
        model, tokenizer = get_model_and_tokenizer(**arch, state_dict=loaded["state_dict"],
                                                   huggingface_config_path=config_path)
    except (OSError, ValueError) as err:
        raise RedlineError(f"cannot build the detoxify model: {first_line(err)}") from None
    return model, tokenizer, classes


def detoxify_rule(classes: list[str], config: DetectorConfig, options: DetoxifyOptions) -> DecisionRule:
    wanted = options.toxic_labels or [c for c in classes if c in TOXIC_CLASSES]
    unknown = [t for t in wanted if t not in classes]
    if unknown:
        raise RedlineError(f"toxic_labels {unknown} are not classes of this Detoxify model (classes: {classes})")
    return DecisionRule(labels=tuple(classes), toxic=tuple(c in wanted for c in classes), multi_label=True,
                        threshold=config.threshold)


class DetoxifyDetector(HFDetector):
    kind = "detoxify"
    description = "Detoxify (original / unbiased / multilingual): toxic if a toxicity class reaches its threshold"
    Options = DetoxifyOptions
    uses_gpu = True

    def __init__(self, config: DetectorConfig) -> None:  # noqa: D107 - HFDetector's scoring, Detoxify's loading
        self.config, self.options = config, config.options()
        opts: DetoxifyOptions = self.options  # type: ignore[assignment]
        self.placement = placement(config.num_gpus, opts.precision)
        self.device = self.placement.torch_device
        model, self.tokenizer, classes = _load(opts, "cpu")
        self._rule = detoxify_rule(classes, config, opts)
        self._ready(model, opts.max_length)

    @classmethod
    def preflight(cls, config: DetectorConfig) -> None:
        opts: DetoxifyOptions = config.options()  # type: ignore[assignment]
        if opts.checkpoint and not opts.checkpoint.startswith("s3://"):
            from pathlib import Path

            if not Path(opts.checkpoint).expanduser().is_file():
                raise RedlineError(f"detoxify checkpoint not found: {opts.checkpoint}")
