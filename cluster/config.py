"""What every config shares: strict models, safe names, the one loader (YAML in, validated once at
the edge, `--set` overrides, one-line errors out), the run key and the inputs a config names.

Each config model lives beside its domain: a detector's with the detectors, a pipeline's with its
pipeline, the serve config with the Serve app.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from redline.errors import RedlineError

LabelValue = str | int | float | bool


class Strict(BaseModel):
    """Unknown keys are mistakes (a typo would otherwise be silently ignored)."""

    model_config = ConfigDict(extra="forbid")


SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")


def check_safe_name(value: str | None) -> str | None:
    """A name that becomes one path component: no separators, no `..`, not hidden, not absolute."""
    if value is not None and (not SAFE_NAME.fullmatch(value) or ".." in value):
        raise ValueError(f"{value!r} is not a safe name: use 1-128 letters, digits, '.', '_' or '-', starting with a "
                         "letter or digit (no '/', no '..')")
    return value


# Run directory names (`run_name`, `--run-name`) and model directory names: joined onto an output
# directory, so they must never climb out of it.
SafeName = Annotated[str | None, AfterValidator(check_safe_name)]


class RunConfig(Strict):
    """What every pipeline config has: where its run directory goes and what it is called."""

    output: str = Field("redline-runs", description="Local directory or s3:// URI holding run directories.")
    run_name: SafeName = Field(None, description="Run directory name; default: <pipeline>-<config hash>.")


def unique_names(items: list[Any], what: str) -> list[Any]:
    names = [i.name for i in items]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"{what} names must be unique; repeated: {', '.join(dupes)}")
    return items


# Fields that change where or how fast work runs but not what it computes: left out of the run key
# so that, e.g., a rerun with more actors resumes the same run directory.
EXECUTION_FIELDS = {"output", "run_name", "batch_size", "actors", "num_cpus", "num_gpus", "tune_trials", "trial_cpus",
                    "trial_gpus",
                    # where and how politely an API is called, not what it answers (a failed call fails the
                    # run, so a run finished against a wrong endpoint cannot exist to be reused)
                    "base_url", "api_key_env", "concurrency", "requests_per_second", "timeout_s", "max_retries",
                    "backoff_s", "cache_dir", "allow_insecure_http"}


def config_hash(config: BaseModel) -> str:
    """A short stable hash of the result-affecting part of a config: the run directory key."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in EXECUTION_FIELDS}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    canonical = json.dumps(strip(config.model_dump(mode="json")), sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


# Config fields that name files, directories or models a run reads: their fingerprints are recorded
# in the manifest, and a run refuses to be reused or resumed once one of them has changed.
INPUT_FIELDS = {"path", "model", "patterns_file", "checkpoint", "classifiers", "contexts", "train", "val", "test",
                "taebench", "attacks", "base_model", "lm", "embeddings_file", "mlm_model", "sentence_encoder",
                "embedding_model", "template_file"}


def input_uris(config: BaseModel) -> list[str]:
    """Every s3:// URI or existing local path a config names in an input field (hub ids and model
    names of remote APIs are not files and are left out)."""
    found: list[str] = []

    def walk(value: Any, key: str | None = None) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, k)
        elif isinstance(value, list):
            for v in value:
                walk(v, key)
        elif key in INPUT_FIELDS and isinstance(value, str) and value:
            if value.startswith("s3://"):
                found.append(value)
            elif Path(value).expanduser().exists():
                found.append(str(Path(value).expanduser().absolute()))

    walk(config.model_dump(mode="json"))
    return list(dict.fromkeys(found))


# --------------------------------------------------------------------------------------------
# Loading


def _type_tag(part: Any) -> bool:
    """Pydantic names the member of a union it tried (`CorpusConfig`, `list[...]`, `str`) in an
    error's location; users wrote field names, not those."""
    return isinstance(part, str) and (part[:1].isupper() or "[" in part or part in {"str", "int", "float", "bool"})


def first_error(err: ValidationError) -> str:
    """The errors as one line: union members' type tags dropped, and where a value was of the right
    type but wrong (say `limit: -5` against `int | list`), only that complaint, not the mismatches."""
    errors = err.errors()
    specific = [e for e in errors if not str(e["type"]).endswith("_type")]
    parts: dict[str, str] = {}
    for e in specific or errors:
        loc = ".".join(str(p) for p in e["loc"] if not _type_tag(p))
        msg = e["msg"].removeprefix("Value error, ")
        parts.setdefault(loc, f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts.values())


def validate_config(model: type[BaseModel], data: Any, source: str = "config") -> BaseModel:
    """Validate a parsed config, turning pydantic's report into one readable line."""
    if not isinstance(data, dict):
        raise RedlineError(f"{source}: expected a mapping of settings, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise RedlineError(f"{source}: {first_error(err)}") from None


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise RedlineError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise RedlineError(f"{path}: config is not valid UTF-8 text") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise RedlineError(f"{path}: invalid YAML{where}: {problem}") from None
    return data if data is not None else {}


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Apply a CLI override like `corpus.limit=100` to a parsed config."""
    keys = dotted.split(".")
    node: Any = data
    for key in keys[:-1]:
        if isinstance(node, list):
            node = node[int(key)]
        else:
            node = node.setdefault(key, {})
    if isinstance(node, list):
        node[int(keys[-1])] = value
    else:
        node[keys[-1]] = value


def parse_overrides(sets: list[str] | None) -> dict[str, Any]:
    """`--set key=value` flags -> {dotted key: YAML-parsed value}."""
    out: dict[str, Any] = {}
    for item in sets or []:
        if "=" not in item:
            raise RedlineError(f"--set expects key=value, got {item!r}")
        key, raw = item.split("=", 1)
        try:
            out[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any], source: str) -> dict[str, Any]:
    for dotted, value in overrides.items():
        if value is not None:
            try:
                set_path(data, dotted, value)
            except (ValueError, IndexError, TypeError, AttributeError):
                raise RedlineError(f"cannot apply override {dotted}={value!r} to {source}") from None
    return data


def load_config(model: type[BaseModel], path: str | Path, overrides: dict[str, Any] | None = None) -> BaseModel:
    data = apply_overrides(load_yaml(path), overrides or {}, str(path))
    return validate_config(model, data, source=str(path))


