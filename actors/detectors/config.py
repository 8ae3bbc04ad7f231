"""Detector configs: the common fields (name, kind, decision rule, resources) and, beside them, the
kind's own options, validated against that kind's `Options` model."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic.fields import FieldInfo

from redline.cluster.config import ActorPoolSize, Execution, Result, first_error
from redline.errors import RedlineError


class DetectorConfig(ActorPoolSize):
    """One detector: its kind (a registry name), decision rule, resources, and kind-specific options.

    Kind-specific fields (e.g. `model` for `hf`, `patterns` for `keywords`) sit beside the common
    ones and are validated against the detector class's own `Options` model.
    """

    model_config = ConfigDict(extra="allow")

    name: str = Result(pattern=r"^[A-Za-z0-9_.\-]+$", description="Unique name used in outputs.")
    kind: str = Result()
    threshold: float | dict[str, float] = Result(
        0.5, description="Toxic if the toxic score reaches it; per-label thresholds for multi-label models."
    )
    rule: Literal["auto", "score", "argmax"] = Result(
        "auto", description="score: toxic score >= threshold; argmax: the top class is a toxic one."
    )
    batch_size: int = Execution(64, gt=0, le=65_536)
    num_cpus: float = Execution(1.0, ge=0)
    num_gpus: float = Execution(0.0, ge=0, description="GPUs per actor; a model-backed detector runs on it.")

    @model_validator(mode="before")
    @classmethod
    def _endpoint_shorthand(cls, data: Any) -> Any:
        """A detector given only as a served endpoint (`url: http://.../v1/detect`) is kind `http`."""
        if isinstance(data, dict) and "kind" not in data and str(data.get("url", "")).startswith(("http://", "https://")):
            return {**data, "kind": "http"}
        return data

    @model_validator(mode="after")
    def _check_kind_options(self) -> "DetectorConfig":
        from redline.actors.detectors.registry import detector_class

        try:
            cls = detector_class(self.kind)
        except RedlineError as err:
            raise ValueError(str(err)) from None
        extra = dict(self.model_extra or {})
        try:
            cls.Options.model_validate(extra)
        except ValidationError as err:
            raise ValueError(f"detector '{self.name}' ({self.kind}): {first_error(err)}") from None
        return self

    def extra_fields(self) -> dict[str, FieldInfo]:
        """The kind's own fields (its `Options`), with their roles in the run key; where those options
        hold extra fields of their own (an LLM detector's chat model: its provider's settings), theirs too."""
        options = self.options()
        nested = options.extra_fields() if hasattr(options, "extra_fields") else {}
        return {**type(options).model_fields, **nested}

    def options(self) -> BaseModel:
        from redline.actors.detectors.registry import detector_class

        return detector_class(self.kind).Options.model_validate(dict(self.model_extra or {}))
