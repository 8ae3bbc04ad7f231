"""Config validation: clear one-line errors, overrides, and the run key."""

from __future__ import annotations

import pytest

from redline.cluster.config import config_hash, load_config, validate_config
from redline.errors import RedlineError
from redline.pipelines.score import ScoreConfig

BASE = {"corpus": {"path": "x.csv", "text_column": "t", "label_column": "l", "toxic_values": [1]},
        "detectors": [{"name": "p", "kind": "profanity-check"}]}


def test_valid_config_round_trips():
    cfg = validate_config(ScoreConfig, BASE)
    assert cfg.corpora[0].path == "x.csv"
    assert cfg.detectors[0].batch_size == 64


@pytest.mark.parametrize(
    "patch, message",
    [
        ({"detectors": [{"name": "p", "kind": "nope"}]}, "unknown detector kind 'nope'"),
        ({"detectors": [{"name": "p", "kind": "hf"}]}, "detector 'p' (hf): model: Field required"),
        ({"detectors": [{"name": "p", "kind": "keywords", "pattern": ["x"]}]}, "pattern: Extra inputs"),
        ({"detectors": [{"name": "a", "kind": "profanity-check"}, {"name": "a", "kind": "keywords", "patterns": ["x"]}]},
         "detector names must be unique; repeated: a"),
        ({"detectors": []}, "detectors: List should have at least 1 item"),
        ({"shard_size": 0}, "shard_size: Input should be greater than 0"),
        ({"corpus": {"path": "x.csv", "colum": "t"}}, "corpus.colum: Extra inputs are not permitted"),
    ],
)
def test_invalid_configs_name_the_problem_in_one_line(patch, message):
    with pytest.raises(RedlineError) as err:
        validate_config(ScoreConfig, {**BASE, **patch}, source="c.yaml")
    text = str(err.value)
    assert message in text
    assert "\n" not in text and text.startswith("c.yaml: ")


def test_yaml_errors_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("corpus: [unclosed\n")
    with pytest.raises(RedlineError, match=r"bad.yaml: invalid YAML at line \d"):
        load_config(ScoreConfig, bad)
    with pytest.raises(RedlineError, match="config file not found"):
        load_config(ScoreConfig, tmp_path / "missing.yaml")
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(RedlineError, match="expected a mapping"):
        load_config(ScoreConfig, listy)


def test_overrides_apply_dotted_paths(tmp_path):
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(BASE))
    cfg = load_config(ScoreConfig, path, {"corpus.limit": 7, "detectors.0.actors": 3, "output": "s3://b/runs"})
    assert cfg.corpora[0].limit == 7 and cfg.detectors[0].actors == 3 and cfg.output == "s3://b/runs"


def test_run_key_ignores_execution_settings_but_not_results():
    a = validate_config(ScoreConfig, BASE)
    more_actors = validate_config(ScoreConfig, {**BASE, "output": "elsewhere",
                                                "detectors": [{"name": "p", "kind": "profanity-check", "actors": 4}]})
    other_threshold = validate_config(ScoreConfig, {**BASE, "detectors": [{"name": "p", "kind": "profanity-check",
                                                                           "threshold": 0.7}]})
    assert config_hash(a) == config_hash(more_actors)
    assert config_hash(a) != config_hash(other_threshold)


def _every_config_model() -> list[type]:
    import importlib
    import pkgutil

    import redline
    from redline.cluster.config import Strict

    for module in pkgutil.walk_packages(redline.__path__, "redline."):
        if not module.name.startswith(("redline.tests", "redline.bench")) and not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    found, todo = set(), [Strict]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found and sub.__module__.startswith("redline."):
                found.add(sub)
                todo.append(sub)
    return sorted(found, key=lambda c: f"{c.__module__}.{c.__qualname__}")


def test_every_field_of_every_config_says_its_role_in_the_run_key():
    from redline.cluster.config import KeyRole, holds_models, key_role

    models = _every_config_model()
    fields = {(m.__qualname__, name): field for m in models for name, field in m.model_fields.items()}
    roles = {where: key_role(field) for where, field in fields.items()}
    assert len(models) > 40 and len(fields) > 400  # every pipeline's, detector's, provider's and serve's configs
    # a field holding nested configs may go unmarked: each of theirs says its own
    assert [where for where, role in roles.items() if role is None and not holds_models(fields[where].annotation)] == []
    assert {r for r in roles.values() if r} == set(KeyRole)
    # the settings a rerun with a bigger cluster changes stay out of the key wherever they are declared
    for (model, name), role in roles.items():
        if name in {"actors", "num_cpus", "num_gpus", "batch_size", "output", "run_name", "api_key_env"}:
            assert role is KeyRole.EXECUTION, (model, name)


def test_a_config_field_without_a_role_is_refused_where_it_is_declared():
    from pydantic import Field

    from redline.cluster.config import Execution, Strict

    with pytest.raises(TypeError, match=r"Sneaky: mark workers with Result\(...\), Execution\(...\) or Input"):
        class Sneaky(Strict):
            threads: int = Execution(1)
            workers: int = Field(2)
    with pytest.raises(TypeError, match="mark plain"):
        class Bare(Strict):
            plain: int = 3


def test_roles_decide_the_key_and_the_recorded_inputs(tmp_path):
    from redline.cluster.config import input_uris, map_inputs

    model = tmp_path / "tiny-model"
    model.mkdir()
    base = {**BASE, "corpus": {**BASE["corpus"], "path": str(tmp_path / "c.csv")},
            "detectors": [{"name": "h", "kind": "hf", "model": str(model), "max_length": 128}]}
    (tmp_path / "c.csv").write_text("t,l\nx,1\n")
    cfg = validate_config(ScoreConfig, base)
    # a kind's own options (beside the common detector fields) are classified by the kind's Options
    assert input_uris(cfg) == [str(tmp_path / "c.csv"), str(model)]
    assert config_hash(cfg) != config_hash(validate_config(ScoreConfig, {
        **base, "detectors": [{**base["detectors"][0], "max_length": 64}]}))
    assert config_hash(cfg) == config_hash(validate_config(ScoreConfig, {
        **base, "detectors": [{**base["detectors"][0], "batch_size": 8, "num_cpus": 0.5}]}))
    # a user's free-form mapping is data, not settings: a key named like an execution field stays in it
    keywords = {**BASE, "detectors": [{"name": "k", "kind": "keywords", "patterns": ["x"]}]}
    assert config_hash(validate_config(ScoreConfig, keywords)) != config_hash(validate_config(ScoreConfig, {
        **keywords, "detectors": [{"name": "k", "kind": "keywords", "patterns": ["y"]}]}))
    moved = map_inputs(cfg, lambda v: v.replace(str(tmp_path), "/data"))
    assert moved.corpora[0].path == "/data/c.csv" and moved.detectors[0].model_extra["model"] == "/data/tiny-model"
    assert moved.output == cfg.output and cfg.corpora[0].path == str(tmp_path / "c.csv")  # a copy


def test_every_file_an_example_names_is_a_recorded_input():
    """An example's string that names an existing file or directory sits in an input field: a path
    field marked Result would let a rerun reuse a run whose input has changed."""
    from pathlib import Path

    from redline.cluster.config import input_uris, load_config
    from redline.pipelines import registry

    repo = Path(__file__).resolve().parents[1]
    checked = 0
    for entry in registry.entries():
        cfg = load_config(registry.pipeline(entry.name).config, repo / "examples" / entry.example)
        configs = [cfg, *(cfg.sub_configs() if hasattr(cfg, "sub_configs") else [])]
        named = {str(Path(v).absolute()) for c in configs for v in _strings(c.model_dump(mode="json"))
                 if v not in {".", cfg.output} and "/" in v and Path(v).exists()}
        assert named <= set(input_uris(cfg)), entry.name
        checked += len(named)
    assert checked or not (repo.parent / "shared" / "data").exists()


def _strings(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, str):
        yield value
