"""`redline serve` start / status / stop and `redline detect`, each a real process, as a user runs them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
import yaml

from conftest import free_port

pytestmark = pytest.mark.slow


def redline(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "redline", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def test_serve_start_status_detect_stop(tmp_path):
    port = free_port()
    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump({"port": port, "detectors": [
        {"name": "profanity-check", "kind": "profanity-check", "num_cpus": 0.25},
        {"name": "slurs", "kind": "keywords", "patterns": ["idiot"], "num_cpus": 0.25}]}))
    env = {**os.environ, "REDLINE_STATE_DIR": str(tmp_path / "state"), "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    env.pop("REDLINE_API_KEY", None)
    server = subprocess.Popen([sys.executable, "-m", "redline", "serve", "--config", str(config)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 180
        # the state file is written before the applications deploy (so `serve stop` always finds the
        # server); the health route answers 200 once every model is serving
        while time.time() < deadline:
            assert server.poll() is None, server.stdout.read()
            if list((tmp_path / "state").glob("serve-*.json")) and _healthy(url):
                break
            time.sleep(0.5)
        else:
            pytest.fail("server did not come up")

        status = redline("serve", "status", env=env)
        assert status.returncode == 0, status.stderr
        assert url in status.stdout and "healthy" in status.stdout
        assert "detector-profanity-check" in status.stdout and "running 1" in status.stdout

        detect = redline("detect", "--url", url, "you are an idiot", "have a nice day", env=env)
        assert detect.returncode == 0, detect.stderr
        lines = [ln for ln in detect.stdout.splitlines() if "idiot" in ln or "nice day" in ln]
        assert "toxic" in lines[0] and "benign" in lines[1]
        as_json = redline("detect", "--url", url + "/v1/detect", "--detector", "slurs", "--json", "idiot", env=env)
        assert '"toxic": true' in as_json.stdout

        second = redline("serve", "--config", str(config), env=env)
        assert second.returncode == 2 and "already runs on port" in second.stderr

        stop = redline("serve", "stop", env=env)
        assert stop.returncode == 0 and f"stopped {url}" in stop.stdout
        out, _ = server.communicate(timeout=60)
        assert server.returncode == 0, out
        assert f"redline serving at {url}" in out
        with pytest.raises(httpx.HTTPError):
            httpx.get(url + "/healthz", timeout=2)
        after = redline("serve", "status", env=env)
        assert after.returncode == 1 and "no redline server" in after.stdout
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=60)


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
