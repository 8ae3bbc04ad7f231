"""Bad input at the command line: every mistake is exit code 2 and one line naming it, with no
traceback, nothing written outside the run directory, and no partial run mistaken for a finished
one. (HTTP probes of the same kind live in test_serve.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from redline.cli import main

from conftest import write_csv


def corpus_csv(tmp_path: Path) -> Path:
    return write_csv(tmp_path / "c.csv", ["text", "label"], [["you idiot", 1], ["hello there", 0], ["shut up", 1]])


def score_config(tmp_path: Path, **over) -> dict:
    cfg = {"corpus": {"path": str(corpus_csv(tmp_path)), "text_column": "text", "label_column": "label",
                      "toxic_values": [1]},
           "detectors": [{"name": "p", "kind": "profanity-check", "num_cpus": 0.25}],
           "output": str(tmp_path / "runs")}
    cfg.update(over)
    return cfg


def write(tmp_path: Path, data, name: str = "c.yaml") -> str:
    path = tmp_path / name
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return str(path)


def files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


def expect_error(capsys, tmp_path: Path, argv: list[str], fragment: str) -> str:
    """Exit 2 with one line that names the problem; nothing new outside runs/, no finished run."""
    before = files(tmp_path)
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("error:") and fragment in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err + captured.out
    new = files(tmp_path) - before
    assert all((tmp_path / "runs") in p.parents for p in new), sorted(new)
    for manifest in (tmp_path / "runs").rglob("manifest.json"):
        assert manifest in before or json.loads(manifest.read_text()).get("state") != "complete"
    return err


def score(tmp_path: Path, cfg: dict, *extra: str) -> list[str]:
    return ["run", "score", "--config", write(tmp_path, cfg), *extra]


# Each case builds its argv in a fresh tmp_path; the fragment is what the one line must say.
CONFIG_CASES = [
    ("missing config file", lambda t: ["run", "score", "-c", str(t / "nope.yaml")], "config file not found"),
    ("invalid YAML", lambda t: ["run", "score", "-c", write(t, "corpus: [unclosed\n")], "invalid YAML at line"),
    ("YAML that is not a mapping", lambda t: ["run", "score", "-c", write(t, "- a\n- b\n")],
     "expected a mapping of settings, got list"),
    ("config not UTF-8", lambda t: ["run", "score", "-c", write(t, b"corpus: caf\xe9\n")], "not valid UTF-8"),
    ("unknown key", lambda t: score(t, score_config(t, shards=3)), "shards: Extra inputs are not permitted"),
    ("wrong type", lambda t: score(t, score_config(t, shard_size="many")), "shard_size: Input should be a valid integer"),
    ("detectors empty", lambda t: score(t, score_config(t, detectors=[])), "detectors: List should have at least 1 item"),
    ("duplicate detector names", lambda t: score(t, score_config(t, detectors=[{"name": "p", "kind": "keywords",
                                                                                 "patterns": ["x"]}] * 2)),
     "detector names must be unique; repeated: p"),
    ("unknown detector kind", lambda t: score(t, score_config(t, detectors=[{"name": "x", "kind": "perspectiv"}])),
     "unknown detector kind 'perspectiv'"),
    ("detector option of another kind", lambda t: score(t, score_config(t, detectors=[
        {"name": "x", "kind": "profanity-check", "model": "bert"}])), "model: Extra inputs are not permitted"),
    ("invalid regex", lambda t: score(t, score_config(t, detectors=[{"name": "k", "kind": "keywords",
                                                                     "patterns": ["(unclosed"]}])),
     "invalid regular expression"),
    ("missing model directory", lambda t: score(t, score_config(t, detectors=[
        {"name": "x", "kind": "hf", "model": str(t / "no-model")}])), "model directory does not exist"),
    ("negative --limit", lambda t: score(t, score_config(t), "--limit", "-5"), "corpus.limit: Input should be greater than 0"),
    ("non-number --limit", lambda t: score(t, score_config(t), "--limit", "abc"), "Invalid value for '--limit'"),
    ("--set without =", lambda t: score(t, score_config(t), "--set", "nonsense"), "--set expects key=value"),
    ("--set past a list's end", lambda t: score(t, score_config(t), "--set", "detectors.9.name=x"),
     "cannot apply override detectors.9.name='x'"),
    ("missing corpus file", lambda t: score(t, score_config(t, corpus={"path": str(t / "x.csv"), "preset": "davidson"})),
     "file not found"),
    ("unknown column", lambda t: score(t, score_config(t, corpus={"path": str(corpus_csv(t)), "text_column": "tweet",
                                                                   "label_column": "label", "toxic_values": [1]})),
     "no column 'tweet'; columns are: text, label"),
    ("no toxic_values", lambda t: score(t, score_config(t, corpus={"path": str(corpus_csv(t)), "text_column": "text",
                                                                    "label_column": "label"})), "set corpus.toxic_values"),
    ("unknown format", lambda t: score(t, score_config(t, corpus={"path": str(write(t, "a", "c.txt")),
                                                                   "text_column": "text"})),
     "cannot tell the format"),
    ("output is a file", lambda t: score(t, score_config(t, output=write(t, "x", "out.txt"))), "is a file, not a directory"),
    ("unknown pipeline for submit", lambda t: ["submit", "frobnicate", "-c", write(t, score_config(t))],
     "unknown pipeline 'frobnicate'"),
    ("--env that is not a variable name", lambda t: ["submit", "score", "-c", write(t, score_config(t)), "--env",
                                                     "A=B", "--address", "http://127.0.0.1:9"],
     "--env expects an environment variable name"),
    ("status of a directory that is not a run", lambda t: ["status", str(t)], "is not a run directory"),
    ("unknown quickstart", lambda t: ["quickstart", "everything", "--output", str(t / "runs")], "unknown quickstart"),
    ("unknown recipe", lambda t: ["run", "attack", "-c", write(t, {
        "corpus": score_config(t)["corpus"], "victim": {"name": "p", "kind": "profanity-check"},
        "recipes": ["deepwordbugz"], "output": str(t / "runs")})], "unknown recipe 'deepwordbugz'"),
    ("a GPU reserved for a detector without a model", lambda t: score(t, score_config(t, detectors=[
        {"name": "p", "kind": "profanity-check", "num_gpus": 1}])), "detector 'p' (profanity-check) runs no model on a GPU"),
    ("an attack's GPU that nothing would use", lambda t: ["run", "attack", "-c", write(t, {
        "corpus": score_config(t)["corpus"], "victim": {"name": "p", "kind": "profanity-check"},
        "recipes": ["deepwordbug"], "num_gpus": 1, "output": str(t / "runs")})],
     "num_gpus 1 reserves a GPU that nothing would use"),
    ("a GPU on the attack's victim instead of the attack", lambda t: ["run", "attack", "-c", write(t, {
        "corpus": score_config(t)["corpus"], "victim": {"name": "p", "kind": "hf", "model": "x/y", "num_gpus": 1},
        "recipes": ["deepwordbug"], "output": str(t / "runs")})], "victim.num_gpus has no effect"),
    ("taebench of a directory that is not an attack run", lambda t: ["run", "taebench", "-c", write(t, {
        "attacks": str(t), "grammar": None, "classifier": {"name": "p", "kind": "profanity-check"},
        "output": str(t / "runs")})], "is not a run directory of the attack pipeline"),
    ("serve on all interfaces without a key", lambda t: ["serve", "-c", write(t, {
        "host": "0.0.0.0", "api_key_env": "REDLINE_NO_SUCH_KEY",
        "detectors": [{"name": "p", "kind": "profanity-check"}]})],
     "exposes the models to the network without an API key"),
    ("API key over plain http to another host", lambda t: ["detect", "hi", "--url", "http://10.255.0.1:8000"],
     "refusing to send an API key over plain http to 10.255.0.1"),
]


@pytest.mark.parametrize("case,argv,fragment", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_config_and_flag_mistakes(case, argv, fragment, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("REDLINE_API_KEY", "secret")
    monkeypatch.delenv("REDLINE_NO_SUCH_KEY", raising=False)
    expect_error(capsys, tmp_path, argv(tmp_path), fragment)


@pytest.mark.parametrize("request_,fragment", [
    ({"num_cpus": 64}, "asks for num_cpus 64, but the largest node has"),
    ({"num_gpus": 1}, "asks for num_gpus 1, but no node has a GPU"),
], ids=["more CPUs than a node has", "a GPU on a cluster without one"])
def test_requests_no_node_can_hold_are_refused_at_start(request_, fragment, capsys, tmp_path, ray_session,
                                                        tiny_binary_model):
    """Ray would queue such actors and wait forever, silently."""
    cfg = score_config(tmp_path, detectors=[{"name": "t", "kind": "hf", "model": str(tiny_binary_model), **request_}])
    err = expect_error(capsys, tmp_path, score(tmp_path, cfg), fragment)
    assert "detector 't'" in err


RUN_NAMES = ["../escaped", "/tmp/redline-absolute-run", ".hidden", "a/b", "two words", "x" * 129, ".."]


@pytest.mark.parametrize("name", RUN_NAMES)
def test_run_names_never_escape_the_output_directory(name, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = expect_error(capsys, tmp_path, score(tmp_path, score_config(tmp_path), "--run-name", name, "--force"),
                       "is not a safe name")
    assert "run_name" in err
    assert not (tmp_path / "escaped").exists() and not Path("/tmp/redline-absolute-run").exists()


def test_trigger_model_names_are_safe_too(capsys, tmp_path):
    cfg = {"pairs": {"path": str(tmp_path / "p.csv")}, "output": str(tmp_path / "models"), "name": "../../evil"}
    expect_error(capsys, tmp_path, ["train", "seq2seq", "-c", write(tmp_path, cfg)], "name: '../../evil' is not a safe name")


def test_force_clears_only_this_pipelines_own_run(capsys, tmp_path, ray_session):
    """--force on a directory that holds another pipeline's run, or files redline did not write,
    or a damaged manifest, is refused and the directory is left exactly as it was."""
    runs = tmp_path / "runs"
    foreign = runs / "models"
    foreign.mkdir(parents=True)
    (foreign / "weights.bin").write_bytes(b"precious")
    expect_error(capsys, tmp_path, score(tmp_path, score_config(tmp_path), "--run-name", "models", "--force"),
                 "is not a redline run directory (no manifest.json)")
    assert (foreign / "weights.bin").read_bytes() == b"precious"
    other = runs / "an-attack"
    other.mkdir()
    (other / "manifest.json").write_text(json.dumps({"pipeline": "attack", "run_name": "an-attack", "state": "complete"}))
    (other / "attempts.parquet").write_bytes(b"data")
    expect_error(capsys, tmp_path, score(tmp_path, score_config(tmp_path), "--run-name", "an-attack", "--force"),
                 "holds a run of the attack pipeline, not the score run 'an-attack'")
    assert (other / "attempts.parquet").exists()
    damaged = runs / "damaged"
    damaged.mkdir()
    (damaged / "manifest.json").write_text("{not json")
    expect_error(capsys, tmp_path, score(tmp_path, score_config(tmp_path), "--run-name", "damaged", "--force"),
                 "is not valid JSON (a damaged run directory)")
    # its own run: --force redoes it
    assert main(score(tmp_path, score_config(tmp_path), "--run-name", "mine")) == 0
    assert main(score(tmp_path, score_config(tmp_path), "--run-name", "mine", "--force")) == 0
    assert json.loads((runs / "mine" / "manifest.json").read_text())["attempts"] == 1


def test_a_changed_input_is_never_reused_silently(capsys, tmp_path, ray_session):
    cfg = score_config(tmp_path)
    argv = score(tmp_path, cfg, "--run-name", "r")
    assert main(argv) == 0
    manifest = json.loads((tmp_path / "runs" / "r" / "manifest.json").read_text())
    assert cfg["corpus"]["path"] in manifest["inputs"]
    capsys.readouterr()
    assert main(argv) == 0 and "reusing it" in capsys.readouterr().err  # unchanged: reused
    write_csv(tmp_path / "c.csv", ["text", "label"], [["you idiot", 1], ["hello there", 0], ["new row", 0]])
    os.utime(tmp_path / "c.csv", ns=(1, 1))
    expect_error(capsys, tmp_path, argv, f"input {cfg['corpus']['path']} changed since run")
    assert main([*argv, "--force"]) == 0
    manifest = json.loads((tmp_path / "runs" / "r" / "manifest.json").read_text())
    assert manifest["counts"]["rows_in"] == 3 and manifest["state"] == "complete"


@pytest.mark.parametrize("content", [b"{", b"[1, 2]", b'{"id2label": ["toxic"]}', b"\xff\xfe{}"],
                         ids=["not JSON", "not an object", "labels not a mapping", "not UTF-8"])
def test_a_model_directory_with_a_broken_config_is_one_line_before_anything_runs(content, capsys, tmp_path):
    """The driver reads a local model's config.json itself (no transformers import): whatever is wrong
    with it is one line naming the model and the file, exit 2."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_bytes(content)
    cfg = score_config(tmp_path, detectors=[{"name": "t", "kind": "hf", "model": str(model)}])
    err = expect_error(capsys, tmp_path, score(tmp_path, cfg), f"cannot load model '{model}'")
    assert "config.json" in err
