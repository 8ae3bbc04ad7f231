"""Plugins are declared by kind name and looked up here (`redline list ...` reads the same tables)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from redline.errors import RedlineError

if TYPE_CHECKING:
    from redline.actors.detectors import Detector


def detector_kinds() -> dict[str, type["Detector"]]:
    from redline.actors.api_detectors import API_DETECTORS
    from redline.actors.detectors import DETECTORS

    return {**DETECTORS, **{cls.kind: cls for cls in API_DETECTORS}}


def detector_class(kind: str) -> type["Detector"]:
    kinds = detector_kinds()
    if kind not in kinds:
        raise RedlineError(f"unknown detector kind '{kind}' (known: {', '.join(sorted(kinds))})")
    return kinds[kind]
