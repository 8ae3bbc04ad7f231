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

from redline.errors import RedlineError, first_line

LabelValue = str | int | float | bool


class Strict(BaseModel):
    """Unknown keys are mistakes (a typo would otherwise be silently ignored), and so is an empty
    string anywhere (a name, a path, a pattern, a list item, a mapping key): `patterns: [""]` would
    match everything. A field where "" means something says so with its own `min_length=0`."""

    model_config = ConfigDict(extra="forbid", str_min_length=1)


class RemoteApi(Strict):
    """What every config of a component that calls a remote API shares (the rest of its call policy,
    such as retries and rates, has defaults that differ by service and stays with the component)."""

    allow_insecure_http: bool = Field(False, description="Allow sending the API key over plain http:// to a "
                                                         "non-loopback host (refused otherwise).")
    max_retry_after_s: float = Field(300.0, gt=0, le=86_400, description=(
        "The longest a 429/503's Retry-After may pause the run at a time; a service that asks for more 3 times in a "
        "row fails the stage."))
    max_failed_in_row: int = Field(10, ge=1, le=10_000, description=(
        "Requests that failed after all their retries, one after another with no success between them, before the "
        "stage stops (the service is down for everyone; a lone failure is that row's error)."))


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
                    "backoff_s", "cache_dir", "allow_insecure_http", "max_retry_after_s",
                    "max_failed_in_row"}


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


def type_tag(part: Any) -> bool:
    """Pydantic names the member of a union it tried (`CorpusConfig`, `list[...]`, `str`) in an
    error's location; users wrote field names, not those."""
    return isinstance(part, str) and (part[:1].isupper() or "[" in part or part.startswith("constrained-")
                                      or part in {"str", "int", "float", "bool"})


def telling_errors(errors: list[Any]) -> list[Any]:
    """Where a value was of the right type but wrong (say `limit: -5` against `int | list`), only
    those complaints, not the union members it did not match."""
    specific = [e for e in errors if not str(e["type"]).endswith("_type")]
    return specific or errors


def first_error(err: ValidationError) -> str:
    """The errors as one line: union members' type tags dropped, and where a value was of the right
    type but wrong (say `limit: -5` against `int | list`), only that complaint, not the mismatches."""
    errors = err.errors()
    parts: dict[str, str] = {}
    for e in telling_errors(errors):
        loc = ".".join(str(p) for p in e["loc"] if not type_tag(p))
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


MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_NODES = 100_000  # scalars, lists and mappings once every alias is expanded


def _expanded_nodes(root: yaml.Node, limit: int) -> int:
    """How many nodes the document has once its aliases are expanded, counted without expanding
    them (an alias is the same node object: its size is counted once and reused)."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    open_nodes: set[int] = set()
    while stack:
        node, done = stack.pop()
        if id(node) in sizes and not done:
            continue
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        if not done:
            if id(node) in open_nodes:
                raise RedlineError("recursive alias")
            open_nodes.add(id(node))
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
            continue
        open_nodes.discard(id(node))
        sizes[id(node)] = 1 + sum(sizes[id(c)] for c in children)
        if sizes[id(node)] > limit:
            return sizes[id(node)]
    return sizes[id(root)]


def parse_yaml(text: str, source: str) -> Any:
    """YAML text -> plain data (safe types only), bounded: at most MAX_CONFIG_BYTES of text and
    MAX_CONFIG_NODES nodes with aliases expanded (a few lines of nested aliases can otherwise expand
    into gigabytes), and not nested beyond what the parser can hold."""
    if len(text) > MAX_CONFIG_BYTES:
        raise RedlineError(f"{source}: config is {len(text):,} characters, over the limit of {MAX_CONFIG_BYTES:,}")
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        count = _expanded_nodes(node, MAX_CONFIG_NODES)
        if count > MAX_CONFIG_NODES:
            raise RedlineError(f"{source}: config expands to over {MAX_CONFIG_NODES:,} values (aliases nested "
                               "inside aliases?); write it out plainly")
        return loader.construct_document(node)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise RedlineError(f"{source}: invalid YAML{where}: {first_line(problem)}") from None
    except RecursionError:
        raise RedlineError(f"{source}: config is nested too deeply") from None
    except RedlineError as err:
        if str(err) == "recursive alias":
            raise RedlineError(f"{source}: invalid YAML: an alias refers to the node that holds it") from None
        raise
    finally:
        loader.dispose()


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise RedlineError(f"config file not found: {path}")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise RedlineError(f"{path}: config is {path.stat().st_size:,} bytes, over the limit of {MAX_CONFIG_BYTES:,}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise RedlineError(f"{path}: config is not valid UTF-8 text") from None
    data = parse_yaml(text, str(path))
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
            out[key.strip()] = parse_yaml(raw, f"--set {key.strip()}")
        except RedlineError:
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


