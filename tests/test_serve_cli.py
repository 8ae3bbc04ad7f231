"""`redline serve` and `redline detect` as a user runs them, each a real process. Start, status, detect
(plain and --json), a second start refused, stop and status after it run on the shipped example config
in tests/test_docs.py::test_documented_commands_run_as_written."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from conftest import free_port

pytestmark = pytest.mark.slow


def redline(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "redline", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_serve_user_errors_are_one_line(tmp_path):
    env = {**os.environ, "REDLINE_STATE_DIR": str(tmp_path / "state")}
    env.pop("RAY_ADDRESS", None)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"detectors": [{"name": "m", "kind": "hf", "model": str(tmp_path / "missing")}]}))
    cases = [(["serve"], "needs --config"),
             (["serve", "--config", str(bad)], "model directory does not exist"),
             (["serve", "stop"], "no redline server is known"),
             (["detect", "--url", f"http://127.0.0.1:{free_port()}", "hello"], "cannot reach redline server")]
    for args, fragment in cases:
        proc = redline(*args, env=env)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert fragment in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_deploy_config_command_writes_a_serve_file(tmp_path):
    from ray.serve.schema import ServeDeploySchema

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "deploy.yaml"
    proc = redline("serve", "deploy-config", "--config", os.path.join(repo, "examples", "serve.yaml"), "-o", str(out),
                   env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    data = yaml.safe_load(out.read_text())
    ServeDeploySchema.model_validate(data) if hasattr(ServeDeploySchema, "model_validate") else ServeDeploySchema.parse_obj(data)
    assert data["applications"][0]["import_path"] == "redline.serve.app:app_builder"
