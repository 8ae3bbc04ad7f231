"""Every command the README and the shipped configs show is run by a test.

`documented_commands()` reads them from the README's bash blocks and the header comments of
examples/, the Kubernetes manifests and ray_cluster.yaml. Each is either run here as written, in a
sandbox laid out like a checkout (examples/ beside ../shared), or named in HOW with the test that
runs it (and why not here: a GPU, the Hugging Face hub, a LanguageTool server, a Kubernetes or AWS
account). A command added to the docs without a line in HOW fails `test_every_documented_command_has_a_test`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from redline.cluster.runtime import SYSTEM_CONFIG

from conftest import REPO, SHARED_DATA, VENV_BIN, shared_file, wait_for_port

RUN = "run here"  # executed as written by test_documented_commands_run_as_written
COMMAND = re.compile(r"^(?:\.venv/bin/)?(?:redline|curl|ray|kubectl|\./setup\.sh|export|REDLINE_\w+=\S+ redline)\b")

RENDERED_RAYJOB = "tests/test_cluster.py::test_the_rayjob_runs_as_rendered_and_logs_plain_progress"
KILLED_WORKER = "tests/test_cluster.py::test_killing_the_worker_node_mid_run_loses_and_duplicates_nothing"
NO_K8S = "no Kubernetes cluster here"
HOW: dict[str, tuple[str, str]] = {
    # (where it runs, why not here when it runs elsewhere)
    "./setup.sh && .venv/bin/redline quickstart": ("tests/test_cli.py::test_quickstart_main_job_is_the_taebench_chain",
                                                   "CI runs setup.sh itself"),
    "./setup.sh --test && .venv/bin/python -m pytest -n 2": (".ci/run", "it is this test suite"),
    "redline train tiny-classifier --corpus ../shared/data/offensive_tweet/labeled_data.csv --preset davidson "
    "--limit 8000 --out redline-runs/models/tiny-davidson": (RUN, ""),
    "redline run score --config examples/score_davidson.yaml": (RUN, ""),
    "redline quickstart attack": ("tests/test_cli.py::test_quickstart_main_job_is_the_taebench_chain", "same command"),
    "redline list recipes": (RUN, ""),
    "redline list categories": (RUN, ""),
    "redline run attack --config examples/attack_quick.yaml": (
        "tests/test_attack_pipeline.py::test_toxictrap_composite_with_the_genetic_search_fools_profanity_check",
        "1,200 attempts on Davidson take minutes; the pipeline runs on the same corpus and victim there"),
    "redline run taebench --config examples/taebench.yaml": (
        "tests/test_quality.py::test_taebench_pipeline_end_to_end", "needs a LanguageTool server and an LLM endpoint"),
    "redline run transfer --config examples/transfer.yaml": (
        "tests/test_cli.py::test_quickstart_main_job_is_the_taebench_chain", "needs hub models"),
    "redline run advtrain --config examples/advtrain.yaml": (
        "tests/test_cluster.py::test_every_pipeline_on_two_nodes_from_s3", "fine-tunes a hub model"),
    "redline train dialogue-safety --config examples/dialoguesafety_train.yaml": (
        "tests/test_dialogue_safety.py::test_quickstart_diasafety_and_card", "fine-tunes a hub model"),
    "redline run diasafety --config examples/diasafety.yaml": (
        "tests/test_dialogue_safety.py::test_quickstart_diasafety_and_card", "needs hub chat models"),
    "REDLINE_DIASAFETY_DIR=../shared/data/diasafety redline quickstart diasafety": (
        "tests/test_dialogue_safety.py::test_quickstart_diasafety_and_card", "same command"),
    "redline train seq2seq --config examples/trigger_models.yaml": (
        "tests/test_triggers.py::test_training_saves_models_with_thresholds", "hours on 2 cores at the paper's size"),
    "redline train seq2seq --config examples/trigger_models.yaml --set context=last-h": (
        "tests/test_triggers.py::test_training_saves_models_with_thresholds", "hours on 2 cores at the paper's size"),
    "redline train seq2seq --config examples/trigger_models.yaml --set context_feed=input": (
        "tests/test_triggers.py::test_the_papers_context_feed_trains_saves_and_finds_the_planted_trigger",
        "hours on 2 cores at the paper's size"),
    "redline train lm --config examples/trigger_models.yaml": (
        "tests/test_triggers.py::test_training_saves_models_with_thresholds", "hours on 2 cores at the paper's size"),
    "redline run egregious --config examples/egregious.yaml": (
        "tests/test_triggers.py::test_egregious_pipeline_on_lstm_and_causal_lm", "needs the trained paper-size models; "
        "the same pipeline on tiny LSTM and causal LMs there, and on two nodes as the card's triggers part"),
    "REDLINE_DIASAFETY_DIR=../shared/data/diasafety redline quickstart egregious": (
        "tests/test_triggers.py::test_the_pipeline_reports_each_list_with_its_hit_type_and_the_known_triggers",
        "~2.5 min; the same pipeline on DiaSafety dialogue models there"),
    "redline eval --config examples/card.yaml": (
        "tests/test_dialogue_safety.py::test_quickstart_diasafety_and_card", "needs hub models; the quickstart card "
        "runs every part of it on tiny models"),
    "REDLINE_DIASAFETY_DIR=../shared/data/diasafety redline quickstart card": (
        "tests/test_dialogue_safety.py::test_quickstart_diasafety_and_card", "same command"),
    "redline serve --config examples/serve.yaml": (RUN, ""),
    'redline detect "you are an idiot" "have a nice day"': (RUN, ""),
    "redline serve status": (RUN, ""),
    "redline serve stop": (RUN, ""),
    "curl -s http://127.0.0.1:8000/v1/moderations -H 'content-type: application/json' -d "
    "'{\"input\": \"you are an idiot\"}'": (RUN, ""),
    "redline serve --config examples/serve_dialogue.yaml": (
        "tests/test_serve.py::test_openai_client_chat_and_completions_on_tiny_models", "needs hub chat models"),
    "redline view redline-runs": (RUN, ""),
    # README's head carries the embedded Ray's own system config (a change to one shows here)
    "ray start --head --port=6379 --num-cpus=0 --dashboard-host=0.0.0.0 "
    f"--system-config='{json.dumps(SYSTEM_CONFIG)}'": (
        "tests/test_cluster.py::test_every_pipeline_on_two_nodes_from_s3", "the cluster test starts its own head"),
    "ray start --address=HEAD:6379 --resources='{\"worker_node\": 1}'": (
        "tests/test_cluster.py::test_every_pipeline_on_two_nodes_from_s3", "HEAD is the user's head node"),
    "export AWS_ENDPOINT_URL=...": ("tests/test_cluster.py::test_every_pipeline_on_two_nodes_from_s3", "a placeholder"),
    "redline submit score --config examples/score_davidson.yaml --address http://HEAD:8265 --wait": (
        KILLED_WORKER, "HEAD is the user's head node"),
    "redline submit taebench --config examples/taebench.yaml --address http://HEAD:8265 --secret OPENAI_API_KEY": (
        "tests/test_cluster.py::test_a_secret_lives_on_the_nodes_and_never_in_the_jobs_api",
        "HEAD is the user's head node"),
    "redline logs JOB_ID --address http://HEAD:8265 --follow": (
        "tests/test_cluster.py::test_every_pipeline_on_two_nodes_from_s3", "HEAD is the user's head node"),
    "redline stop JOB_ID --address http://HEAD:8265": (
        "tests/test_cluster.py::test_every_pipeline_on_two_nodes_from_s3", "HEAD is the user's head node"),
    "redline submit score --config examples/score_davidson.yaml --address http://HEAD:8265": (
        KILLED_WORKER, "HEAD is the user's head node"),
    "redline eval --config examples/card.yaml --fail-if 'guard.transfer.asr_tae > 0.3' --fail-if "
    "'triggers.hit_rate.high >= 0.5'": ("tests/test_dialogue_safety.py::test_quickstart_diasafety_and_card",
                                        "needs hub chat models; the gate runs there on the quickstart card"),
    "kubectl create secret generic redline-api-keys --from-literal=OPENAI_API_KEY=...": (RENDERED_RAYJOB, NO_K8S),
    "kubectl logs -f -l job-name=redline-score": (RENDERED_RAYJOB, NO_K8S),
    "kubectl apply -f cluster/kubernetes/rayjob.yaml": (
        "tests/test_cli.py::test_kuberay_manifests_have_what_the_crds_require", "no Kubernetes cluster here"),
    "kubectl get rayjob redline-score -w": (
        "tests/test_cli.py::test_kuberay_manifests_have_what_the_crds_require", "no Kubernetes cluster here"),
    "kubectl apply -f cluster/kubernetes/raycluster.yaml": (
        "tests/test_cli.py::test_kuberay_manifests_have_what_the_crds_require", "no Kubernetes cluster here"),
    "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=$(kubectl get secret redline -o jsonpath='{.data.auth_token}' | base64 -d)": (
        "tests/test_cli.py::test_kuberay_manifests_have_what_the_crds_require", "no Kubernetes cluster here"),
    "redline submit score --config examples/score_davidson.yaml --address http://127.0.0.1:8265": (
        KILLED_WORKER, "the token-guarded Jobs API of KubeRay"),
    "redline serve deploy-config --config examples/serve_kubernetes.yaml": (
        "tests/test_cli.py::test_the_rayservice_serves_the_example_config_behind_its_key", "rendered, compared"),
    "kubectl port-forward service/redline-serve-svc 8000:8000 &": (
        "tests/test_cli.py::test_the_rayservice_serves_the_example_config_behind_its_key", "no Kubernetes cluster here"),
    'curl -s http://127.0.0.1:8000/v1/moderations -H "Authorization: Bearer $KEY" -d \'{"input": "you idiot"}\'': (
        "tests/test_serve.py::test_moderations_work_with_the_openai_client", "no Kubernetes cluster here"),
    "kubectl kustomize cluster/kubernetes | kubectl apply -f -": (
        "tests/test_cli.py::test_the_kustomization_is_the_one_place_to_edit", "no Kubernetes cluster here"),
    "kubectl create secret generic redline-api-keys --from-literal=REDLINE_API_KEY=$(openssl rand -hex 24)": (
        "tests/test_cli.py::test_the_rayservice_serves_the_example_config_behind_its_key", "no Kubernetes cluster here"),
    "kubectl apply -f cluster/kubernetes/rayservice.yaml": (
        "tests/test_cli.py::test_the_rayservice_serves_the_example_config_behind_its_key", "no Kubernetes cluster here"),
    "kubectl port-forward service/redline-head-svc 8265:8265 &": (
        "tests/test_cli.py::test_kuberay_manifests_have_what_the_crds_require", "no Kubernetes cluster here"),
    "redline submit attack --config examples/attack_quick.yaml --address http://127.0.0.1:8265 --wait": (
        "tests/test_cluster.py::test_every_pipeline_on_two_nodes_from_s3", "the Jobs API of a Kubernetes cluster"),
    "redline submit score --config examples/score_davidson.yaml": (KILLED_WORKER, "the Jobs API of a `ray up` cluster"),
    "ray up ray_cluster.yaml": ("tests/test_cli.py::test_ray_cluster_yaml_passes_the_launcher_schema", "needs AWS"),
    "ray dashboard ray_cluster.yaml": ("tests/test_cli.py::test_ray_cluster_yaml_passes_the_launcher_schema", "needs AWS"),
    "ray down ray_cluster.yaml": ("tests/test_cli.py::test_ray_cluster_yaml_passes_the_launcher_schema", "needs AWS"),
}


def _normal(command: str) -> str:
    command = re.sub(r"\s+#\s.*$", "", command.strip())  # a trailing comment
    command = re.sub(r"\s+", " ", command).strip()
    return command.removeprefix(".venv/bin/") if not command.startswith(".venv/bin/python") else command


def _joined(lines: list[str]) -> list[str]:
    out, pending = [], ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    return out


def documented_commands() -> dict[str, str]:
    """Every command shown in the docs -> where it is shown."""
    found: dict[str, str] = {}
    readme = (REPO / "README.md").read_text().splitlines()
    block: list[str] | None = None
    for number, line in enumerate(readme, 1):
        if line.startswith("```bash"):
            block = []
        elif line.startswith("```") and block is not None:
            for command in _joined(block):
                if COMMAND.match(command.strip()):
                    found.setdefault(_normal(command), f"README.md:{number}")
            block = None
        elif block is not None:
            block.append(line)
    for path in [*sorted((REPO / "examples").glob("*.yaml")), *sorted((REPO / "cluster" / "kubernetes").glob("*.yaml")),
                 REPO / "ray_cluster.yaml"]:
        header = []
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            header.append(line.lstrip("#").strip())
        for command in _joined(header):
            command = re.split(r"\s{2,}\(", command)[0]  # "(needs ...)" after the command
            if COMMAND.match(command):
                found.setdefault(_normal(command), str(path.relative_to(REPO)))
    return found


def test_every_documented_command_has_a_test():
    commands = documented_commands()
    assert len(commands) > 30, commands
    missing = {c: where for c, where in commands.items() if c not in HOW}
    assert not missing, f"documented commands no test runs (add them to HOW): {missing}"
    stale = [c for c in HOW if c not in commands]
    assert not stale, f"HOW names commands the docs no longer show: {stale}"
    for command, (where, why) in HOW.items():
        if where in (RUN, ".ci/run"):
            continue
        file, _, name = where.partition("::")
        assert why, f"{command}: say why it runs in {where} and not here"
        assert f"def {name}(" in (REPO / file).read_text(), f"{command}: no test {where}"


@pytest.fixture
def sandbox(tmp_path):
    """A checkout's layout: the repository's examples and venv, ../shared beside it."""
    shared_file(SHARED_DATA / "offensive_tweet" / "labeled_data.csv")
    root = tmp_path / "redline"
    root.mkdir()
    shutil.copytree(REPO / "examples", root / "examples")
    (root / ".venv").symlink_to(VENV_BIN.parent)
    (tmp_path / "shared").symlink_to(SHARED_DATA.parent)
    return root


def _shell(command: str, cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_documented_commands_run_as_written(sandbox, tmp_path):
    ran: set[str] = set()
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "REDLINE_PROGRESS": "0",
           "REDLINE_STATE_DIR": str(tmp_path / "serve-state")}
    env.pop("REDLINE_API_KEY", None)
    by_text = {_normal(c): c for c in HOW}

    def run(command: str, timeout: float = 300) -> str:
        proc = _shell(command, sandbox, env, timeout)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        ran.add(_normal(command))
        return proc.stdout

    assert "deepwordbug" in run("redline list recipes")
    assert "Offending User" in run("redline list categories")
    run(by_text["redline train tiny-classifier --corpus ../shared/data/offensive_tweet/labeled_data.csv --preset davidson "
                "--limit 8000 --out redline-runs/models/tiny-davidson"])
    run("redline run score --config examples/score_davidson.yaml")
    assert list((sandbox / "redline-runs").glob("score-*/report.html"))

    server = subprocess.Popen(["bash", "-c", "redline serve --config examples/serve.yaml"], cwd=sandbox, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_port(8000, timeout=180)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get("http://127.0.0.1:8000/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        ran.add("redline serve --config examples/serve.yaml")
        # the state file is written before the applications deploy, so `serve stop` always finds the server
        assert list((tmp_path / "serve-state").glob("serve-*.json"))
        url = "http://127.0.0.1:8000"
        detected = [ln for ln in run('redline detect "you are an idiot" "have a nice day"').splitlines()
                    if "idiot" in ln or "nice day" in ln]
        assert "toxic" in detected[0] and "benign" in detected[1]
        as_json = _shell(f"redline detect --url {url}/v1/detect --detector slurs --json idiot", sandbox, env)
        assert as_json.returncode == 0 and '"toxic": true' in as_json.stdout, as_json.stderr
        curl = [c for c in HOW if c.startswith("curl ")][0]
        assert '"flagged":true' in run(curl).replace(" ", "")
        status = run("redline serve status")
        assert url in status and "healthy" in status
        assert "detector-profanity-check" in status and "running 1" in status
        second = _shell("redline serve --config examples/serve.yaml", sandbox, env)
        assert second.returncode == 2 and "already runs on port" in second.stderr, second.stderr
        assert f"stopped {url}" in run("redline serve stop", timeout=120)
        out, _ = server.communicate(timeout=60)
        assert server.returncode == 0 and f"redline serving at {url}" in out, out[-2000:]
        with pytest.raises(httpx.HTTPError):
            httpx.get(url + "/healthz", timeout=2)
        after = _shell("redline serve status", sandbox, env)
        assert after.returncode == 1 and "no redline server" in after.stdout
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()

    viewer = subprocess.Popen(["bash", "-c", "exec redline view redline-runs"], cwd=sandbox, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_port(8765, timeout=60)
        page = httpx.get("http://127.0.0.1:8765/", timeout=10)
        assert page.status_code == 200 and "score-" in page.text
        ran.add("redline view redline-runs")
    finally:
        viewer.terminate()
        viewer.wait(timeout=30)
    assert ran == {c for c, (where, _) in HOW.items() if where == RUN}
