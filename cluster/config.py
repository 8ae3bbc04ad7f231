"""What every config shares: strict models, safe names, the one loader (YAML in, validated once at
the edge, `--set` overrides, one-line errors out), the run key and the inputs a config names.

Each config model lives beside its domain: a detector's with the detectors, a pipeline's with its
pipeline, the serve config with the Serve app.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, get_args

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from redline.errors import RedlineError, first_line

LabelValue = str | int | float | bool


class KeyRole(StrEnum):
    """What a config field is to the run key (the run directory `<pipeline>-<hash>` a rerun resumes).
    Every field says which one it is, where it is declared (`Result(...)`, `Execution(...)`,
    `Input(...)` in place of pydantic's `Field`); a field holding nested configs takes its role from
    theirs. A model with a field that says nothing fails when its class is defined."""

    RESULT = "result"  # changes what a run computes: in the key
    EXECUTION = "execution"  # where, how fast or how politely work runs: out of the key, so that a rerun
    # with more actors (or another endpoint of the same service) resumes the same run
    INPUT = "input"  # names a file, directory or model the run reads: in the key, and its fingerprint is
    # recorded in the manifest (a run refuses reuse once the input has changed)


def _role_field(role: KeyRole) -> Callable[..., Any]:
    def make(default: Any = PydanticUndefined, **kwargs: Any) -> Any:
        extra = kwargs.pop("json_schema_extra", None) or {}
        return Field(default, json_schema_extra={**extra, "run_key": role.value}, **kwargs)

    make.__name__ = role.name.title()
    make.__doc__ = f"pydantic's `Field`, marking the field as a {role.value} field of the run key."
    return make


Result = _role_field(KeyRole.RESULT)
Execution = _role_field(KeyRole.EXECUTION)
Input = _role_field(KeyRole.INPUT)


def holds_models(annotation: Any) -> bool:
    """Whether a field's type is (or contains: a list, union or mapping of) config models."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return any(holds_models(arg) for arg in get_args(annotation))


def key_role(field: FieldInfo) -> KeyRole | None:
    """A field's role in the run key; None for an unmarked field holding nested configs (theirs decide)."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    role = extra.get("run_key")
    return KeyRole(role) if role else None


class Strict(BaseModel):
    """Unknown keys are mistakes (a typo would otherwise be silently ignored), and so is an empty
    string anywhere (a name, a path, a pattern, a list item, a mapping key): `patterns: [""]` would
    match everything. A field where "" means something says so with its own `min_length=0`.

    Every field declares its role in the run key (see KeyRole): one left unmarked is refused here,
    when its class is defined, so a new field is never in or out of the key by accident."""

    model_config = ConfigDict(extra="forbid", str_min_length=1)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        unmarked = [name for name, field in cls.model_fields.items()
                    if key_role(field) is None and not holds_models(field.annotation)]
        if unmarked:
            raise TypeError(f"{cls.__module__}.{cls.__qualname__}: mark {', '.join(unmarked)} with Result(...), "
                            "Execution(...) or Input(...) in place of Field(...) (its role in the run key)")


class ActorPoolSize(Strict):
    """How many actors host a step's worker: `actors` start at once and the pool never shrinks below
    them; it grows up to `max_actors` while shards wait and the cluster has room for another actor, so
    nodes that join mid-run are used."""

    actors: int = Execution(1, gt=0, description="Actors started at once (the pool's least size).")
    max_actors: int | None = Execution(None, gt=0, description=(
        "Grow the pool up to this many actors while work waits and the cluster has room (nodes that join "
        "mid-run too); null: as many as the cluster offers; equal to actors: a fixed pool."))

    @model_validator(mode="after")
    def _max_at_least_actors(self) -> "ActorPoolSize":
        if self.max_actors is not None and self.max_actors < self.actors:
            raise ValueError(f"max_actors ({self.max_actors}) is below actors ({self.actors})")
        return self


class RemoteApi(Strict):
    """What every config of a component that calls a remote API shares (the rest of its call policy,
    such as retries and rates, has defaults that differ by service and stays with the component)."""

    allow_insecure_http: bool = Execution(False, description="Allow sending the API key over plain http:// to a "
                                                         "non-loopback host (refused otherwise).")
    max_retry_after_s: float = Execution(300.0, gt=0, le=86_400, description=(
        "The longest a 429/503's Retry-After may pause the run at a time; a service that asks for more 3 times in a "
        "row fails the stage."))
    max_failed_in_row: int = Execution(10, ge=1, le=10_000, description=(
        "Requests that failed after all their retries, one after another with no success between them, before the "
        "stage stops (the service is down for everyone; a lone failure is that row's error). Every unusable answer "
        "counts: a transport error, an answer without choices, one that is not JSON, one too large to read."))
    max_answer_bytes: int = Execution(1 << 20, ge=1024, le=256 << 20, description=(
        "The most bytes of one answer's body that are read; a larger answer is that request's failure (retried, "
        "never parsed, never cached)."))


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

    output: str = Execution("redline-runs", description="Local directory or s3:// URI holding run directories.")
    run_name: SafeName = Execution(None, description="Run directory name; default: <pipeline>-<config hash>.")


def unique_names(items: list[Any], what: str) -> list[Any]:
    names = [i.name for i in items]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"{what} names must be unique; repeated: {', '.join(dupes)}")
    return items


def _fields(config: BaseModel) -> dict[str, tuple[Any, KeyRole | None]]:
    """Each field of a config instance with its value and role, extra fields included: a model that
    allows them (a detector's kind options) says what they are with `extra_fields()`; an extra field
    it does not describe counts as a result field."""
    fields = {name: (getattr(config, name), key_role(field)) for name, field in type(config).model_fields.items()}
    if config.model_extra:
        described = config.extra_fields() if hasattr(config, "extra_fields") else {}
        for name, value in config.model_extra.items():
            fields[name] = (value, key_role(described[name]) if name in described else KeyRole.RESULT)
    return fields


def _key_view(value: Any, dumped: Any) -> Any:
    """A config's JSON form without its execution fields, at every depth."""
    if isinstance(value, BaseModel):
        return {name: _key_view(v, dumped[name]) for name, (v, role) in _fields(value).items()
                if role is not KeyRole.EXECUTION}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_key_view(v, d) for v, d in zip(value, dumped, strict=True)]
    if isinstance(value, dict):
        return {k: _key_view(v, d) for (k, d), v in zip(dumped.items(), value.values(), strict=True)}
    return dumped


def config_hash(config: BaseModel) -> str:
    """A short stable hash of the result-affecting part of a config: the run directory key."""
    canonical = json.dumps(_key_view(config, config.model_dump(mode="json")), sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def input_values(config: BaseModel) -> list[str]:
    """Every string an input field of the config holds, at every depth (paths, s3:// URIs, model ids),
    and those of the configs it builds from loose settings (`sub_configs()`, as a card does)."""
    found: list[str] = []

    def walk(value: Any, role: KeyRole | None) -> None:
        if isinstance(value, BaseModel):
            for v, field_role in _fields(value).values():
                walk(v, field_role)
            for sub in value.sub_configs() if hasattr(value, "sub_configs") else ():
                walk(sub, None)
        elif isinstance(value, (list, tuple, set, frozenset)):
            for v in value:
                walk(v, role)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v, role)
        elif role is KeyRole.INPUT and isinstance(value, str) and value:
            found.append(value)

    walk(config, None)
    return found


def map_inputs(config: BaseModel, change: Callable[[str], str]) -> BaseModel:
    """A copy of the config with every string of its input fields passed through `change` (as
    submission pins relative paths to absolute ones); what is unchanged is shared, not copied."""

    def walk(value: Any, role: KeyRole | None) -> Any:
        if isinstance(value, BaseModel):
            update = {}
            for name, (v, field_role) in _fields(value).items():
                new = walk(v, field_role)
                if new is not v:
                    update[name] = new
            return value.model_copy(update=update) if update else value
        if isinstance(value, (list, tuple)):
            items = [walk(v, role) for v in value]
            return type(value)(items) if any(a is not b for a, b in zip(items, value, strict=True)) else value
        if isinstance(value, dict):
            items = {k: walk(v, role) for k, v in value.items()}
            return items if any(items[k] is not value[k] for k in value) else value
        if role is KeyRole.INPUT and isinstance(value, str) and value:
            new = change(value)
            return value if new == value else new
        return value

    return walk(config, None)


def input_uris(config: BaseModel) -> list[str]:
    """Every s3:// URI, existing local path or absolute path a config names in an input field (hub ids
    and model names of remote APIs are not files and are left out; an absolute path this node does not
    see may be on the workers' disk, where it is fingerprinted when read)."""
    found: list[str] = []
    for value in input_values(config):
        if value.startswith("s3://"):
            found.append(value)
        elif Path(value).expanduser().exists() or value.startswith(("/", "~")):
            found.append(str(Path(value).expanduser().absolute()))
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


