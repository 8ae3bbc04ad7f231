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
