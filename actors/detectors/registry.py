"""The detector registry: every kind, by name (`redline list detectors` reads the same table).

Adding a detector kind is one class (with `kind`, `description` and an `Options` model) and one line here
(or `@register_detector` on a class outside this package).
Classes are imported when the registry is first used, so validating a config stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from redline.cluster.plugins import Registry
from redline.errors import RedlineError

if TYPE_CHECKING:
    from redline.actors.detectors.base import Detector
    from redline.actors.detectors.config import DetectorConfig


def _built_in() -> tuple[type["Detector"], ...]:
    from redline.actors.detectors import api, detoxify, http, local, perspective

    return (local.HFDetector, local.ProfanityCheckDetector, local.KeywordDetector, detoxify.DetoxifyDetector,
            http.HTTPDetector, api.OpenAIModerationDetector, api.LLMJudgeDetector, api.SelfCheckDetector,
            api.LlamaGuardDetector, api.BedrockGuardrailDetector, perspective.PerspectiveDetector)


DETECTORS: Registry[type["Detector"]] = Registry("detector kind", lambda cls: cls.kind, _built_in)
register_detector = DETECTORS.register  # a detector kind from outside this package (a class decorator)


def detector_kinds() -> dict[str, type["Detector"]]:
    return DETECTORS.all()


def detector_class(kind: str) -> type["Detector"]:
    return DETECTORS.get(kind)


def build_detector(config: "DetectorConfig") -> "Detector":
    return detector_class(config.kind)(config)


def preflight_detector(config: "DetectorConfig", gpus_from: str | None = None) -> None:
    """The detector's own checks on the driver, and its GPU reservation: a GPU reserved for a detector
    that runs no model on it would sit idle while the scheduler waits for one. `gpus_from` names the
    setting that places it when not the detector's own `num_gpus` (an attack actor's)."""
    cls = detector_class(config.kind)
    if config.num_gpus > 0 and not cls.uses_gpu and gpus_from is None:
        raise RedlineError(f"detector '{config.name}' ({config.kind}) runs no model on a GPU, but reserves "
                           f"num_gpus {config.num_gpus:g}; remove num_gpus (only model-backed kinds such as hf use one)")
    cls.preflight(config)
