"""`redline submit` / `status` / `logs` against a real Ray head started with `ray start --head`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from redline.cli import main

from conftest import VENV_BIN, free_port, wait_for_port, write_csv


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """A separate single-node cluster; stopped by its own process id (`ray stop` would kill every Ray)."""
    gcs, dashboard = free_port(), free_port()
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    log = open(tmp_path_factory.mktemp("head") / "head.log", "wb")
    proc = subprocess.Popen(
        [str(VENV_BIN / "ray"), "start", "--head", f"--port={gcs}", f"--dashboard-port={dashboard}",
         "--dashboard-host=127.0.0.1", "--include-dashboard=true", "--num-cpus=2",
         "--object-store-memory=200000000", "--disable-usage-stats", "--block",
         # Own agent ports: the session's Ray in this process already holds the defaults.
         f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
         f"--metrics-export-port={free_port()}", f"--runtime-env-agent-port={free_port()}"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        wait_for_port(dashboard, timeout=120)
        yield f"http://127.0.0.1:{dashboard}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of the cluster is still shutting down
        except ProcessLookupError:
            pass
        proc.wait()
        log.close()


@pytest.mark.slow
def test_submit_runs_the_pipeline_on_the_cluster(ray_head, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    corpus = write_csv(tmp_path / "c.csv", ["text", "label"],
                       [["you stupid idiot", 1], ["have a nice day", 0], ["fuck off", 1], ["see you soon", 0]])
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "corpus": {"path": str(corpus), "text_column": "text", "label_column": "label", "toxic_values": [1]},
        "detectors": [{"name": "p", "kind": "profanity-check", "num_cpus": 0.5}],
        "output": str(tmp_path / "runs"), "run_name": "submitted",
    }))
    # an apostrophe in a --set value used to break the job's shell command
    assert main(["submit", "score", "--config", str(config), "--address", ray_head, "--wait",
                 "--set", "corpus.dataset=o'brien"]) == 0
    out = capsys.readouterr().out
    job_id = out.split("submitted job ")[1].split()[0]
    assert f"job {job_id}: SUCCEEDED" in out
    manifest = json.loads((tmp_path / "runs" / "submitted" / "manifest.json").read_text())
    assert manifest["state"] == "complete" and manifest["counts"]["rows_out"] == 4
    assert manifest["config"]["corpus"]["dataset"] == "o'brien"

    assert main(["status", job_id, "--address", ray_head]) == 0
    assert "SUCCEEDED" in capsys.readouterr().out
    assert main(["logs", job_id, "--address", ray_head]) == 0
    assert "report:" in capsys.readouterr().out


def test_submit_to_an_unreachable_cluster_is_one_clear_error(tmp_path, capsys):
    corpus = write_csv(tmp_path / "c.csv", ["text", "label"], [["x", 1]])
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "corpus": {"path": str(corpus), "text_column": "text", "label_column": "label", "toxic_values": [1]},
        "detectors": [{"name": "p", "kind": "profanity-check"}]}))
    started = time.time()
    assert main(["submit", "score", "--config", str(config), "--address", f"http://127.0.0.1:{free_port()}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot reach the Ray Jobs API at http://127.0.0.1:") and len(err.splitlines()) == 1
    assert time.time() - started < 60


def test_status_of_an_unknown_job(ray_head, capsys):
    assert main(["status", "redline-score-000000000000", "--address", ray_head]) == 2
    assert "no job redline-score-000000000000" in capsys.readouterr().err


def test_submitted_overrides_never_reach_the_jobs_shell(tmp_path, monkeypatch):
    """The job supervisor runs the entrypoint through a shell: --set values travel validated in
    config.yaml, never as words of that command, and relative inputs are pinned to absolute paths
    (the job runs in a temporary working directory)."""
    import shlex

    from redline.cluster import jobs

    monkeypatch.chdir(tmp_path)
    write_csv(tmp_path / "c.csv", ["text", "label"], [["x", 1]])
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "corpus": {"path": "c.csv", "text_column": "text", "label_column": "label", "toxic_values": [1]},
        "detectors": [{"name": "p", "kind": "profanity-check"}], "output": "runs"}))
    marker = tmp_path / "PWNED"
    evil = f"x'; touch {marker}; echo '$(touch {marker})`id`"
    sent: dict = {}

    class Jobs:
        def submit_job(self, **kwargs):
            sent.update(kwargs, config=yaml.safe_load(Path(kwargs["runtime_env"]["working_dir"], "config.yaml")
                                                      .read_text()))
            return kwargs["submission_id"]

    monkeypatch.setattr(jobs, "client", lambda address: Jobs())
    from redline.pipelines.score import ScoreConfig

    jobs.submit("score", "run score", ScoreConfig, config, "http://127.0.0.1:1", [f"corpus.dataset={evil}"])
    assert shlex.split(sent["entrypoint"]) == ["redline", "run", "score", "--config", "config.yaml"]
    assert sent["config"]["corpus"]["dataset"] == evil
    assert sent["config"]["corpus"]["path"] == str(tmp_path / "c.csv")
    assert sent["config"]["output"] == str(tmp_path / "runs")
    assert "batch_size" not in sent["config"]["detectors"][0]  # what the user set; the cluster's defaults apply
    assert not marker.exists()


def test_a_job_carries_settings_never_secrets(monkeypatch):
    """A job's environment is shown by the Jobs API: it carries S3/hub settings and the variables named
    with --env, and a name that looks like a secret is refused (secrets live on the nodes: --secret)."""
    from redline.cluster.jobs import job_env
    from redline.errors import RedlineError

    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("REDLINE_DATASET_TAG", "nightly")
    env = job_env([])
    assert env["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000" and env["HF_HUB_OFFLINE"] == "1"
    assert "HF_TOKEN" not in env and "OPENAI_API_KEY" not in env
    assert job_env(["REDLINE_DATASET_TAG"])["REDLINE_DATASET_TAG"] == "nightly"
    for name in ("HF_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD"):
        with pytest.raises(RedlineError, match=f"looks like a secret.*--secret {name}"):
            job_env([name])
    with pytest.raises(RedlineError, match="no such variable"):
        job_env(["NOT_SET_ANYWHERE_123"])


def test_secret_names_are_variable_names_never_shell_words(tmp_path):
    """--secret names travel to the cluster as words of the check job's command: each must be a
    plain variable name, bounded, or the submit stops with one line before anything is sent."""
    from redline.cluster.jobs import variable_name
    from redline.errors import RedlineError

    assert variable_name("OPENAI_API_KEY", "--secret") == "OPENAI_API_KEY"
    for bad in ("KEY; rm -rf /", "$(id)", "A B", "1KEY", "", "K" * 129, "KEY=value", "../KEY"):
        with pytest.raises(RedlineError, match="--secret expects an environment variable name"):
            variable_name(bad, "--secret")
