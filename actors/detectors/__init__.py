"""Toxicity detectors behind one interface (`Detector.detect`), registered by kind.

Each kind is one class with a `kind` name, a one-line `description` and an `Options` model for its
own config fields. Heavy libraries are imported inside the classes so that listing and validating
detectors stays instant, and instances are built inside Ray actors.
"""

from redline.actors.detectors.base import DecisionRule, Detector
from redline.actors.detectors.config import DetectorConfig
from redline.actors.detectors.registry import (
    build_detector,
    detector_class,
    detector_kinds,
    preflight_detector,
    register_detector,
)

__all__ = ["DecisionRule", "Detector", "DetectorConfig", "build_detector", "detector_class", "detector_kinds",
           "preflight_detector", "register_detector", "local", "worker"]  # and two modules: the HF detector, the batch worker
