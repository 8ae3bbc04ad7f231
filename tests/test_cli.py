"""The command line: help everywhere, one-line errors with exit code 2, and the main job."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from redline.cli import main

from conftest import REPO, write_csv

COMMANDS = [[], ["list"], ["list", "detectors"], ["run"], ["run", "score"], ["train"], ["train", "tiny-classifier"],
            ["quickstart"], ["submit"], ["status"], ["logs"], ["view"], ["eval"]]


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "redline")
def test_every_command_explains_itself(cmd, capsys):
    assert main([*cmd, "--help"]) == 0
    out = capsys.readouterr().out
    assert "Usage: redline" in out and len(out) > 200


def test_list_detectors_shows_kinds_and_their_options(capsys):
    assert main(["list", "detectors"]) == 0
    out = capsys.readouterr().out
    for kind in ("hf", "profanity-check", "keywords"):
        assert kind in out
    assert "toxic_labels?" in out and "patterns?" in out


def write_config(tmp_path, corpus: dict, detectors: list[dict] | None = None) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"corpus": corpus, "output": str(tmp_path / "runs"),
                                    "detectors": detectors or [{"name": "p", "kind": "profanity-check"}]}))
    return str(path)


def csv_corpus(tmp_path) -> dict:
    path = write_csv(tmp_path / "c.csv", ["text", "label"], [["you idiot", 1], ["hello", 0]])
    return {"path": str(path), "text_column": "text", "label_column": "label", "toxic_values": [1]}


def expect_user_error(capsys, argv: list[str], message: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and message in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_missing_config_file(capsys, tmp_path):
    expect_user_error(capsys, ["run", "score", "--config", str(tmp_path / "nope.yaml")], "config file not found")


def test_missing_corpus_file(capsys, tmp_path):
    cfg = write_config(tmp_path, {"path": str(tmp_path / "missing.csv"), "preset": "davidson"})
    expect_user_error(capsys, ["run", "score", "--config", cfg], "file not found")


def test_unknown_column_mapping(capsys, tmp_path):
    cfg = write_config(tmp_path, {**csv_corpus(tmp_path), "text_column": "tweet"})
    expect_user_error(capsys, ["run", "score", "--config", cfg], "no column 'tweet'; columns are: text, label")


def test_unknown_preset_is_a_config_error(capsys, tmp_path):
    cfg = write_config(tmp_path, {**csv_corpus(tmp_path), "preset": "reddit"})
    expect_user_error(capsys, ["run", "score", "--config", cfg], "preset: Input should be 'davidson', 'jigsaw' or 'diasafety'")


def test_empty_corpus(capsys, tmp_path):
    (tmp_path / "e.csv").write_text("text,label\n")
    cfg = write_config(tmp_path, {**csv_corpus(tmp_path), "path": str(tmp_path / "e.csv")})
    expect_user_error(capsys, ["run", "score", "--config", cfg], "the corpus has no rows")


def test_non_utf8_corpus(capsys, tmp_path):
    (tmp_path / "l.csv").write_bytes("text,label\ncaf\xe9,1\n".encode("latin-1"))
    cfg = write_config(tmp_path, {**csv_corpus(tmp_path), "path": str(tmp_path / "l.csv")})
    expect_user_error(capsys, ["run", "score", "--config", cfg], "is not valid utf-8")


def test_unknown_detector_kind(capsys, tmp_path):
    cfg = write_config(tmp_path, csv_corpus(tmp_path), [{"name": "x", "kind": "perspectiv"}])
    expect_user_error(capsys, ["run", "score", "--config", cfg], "unknown detector kind 'perspectiv'")


def test_model_directory_that_does_not_exist(capsys, tmp_path):
    cfg = write_config(tmp_path, csv_corpus(tmp_path), [{"name": "x", "kind": "hf", "model": str(tmp_path / "no-model")}])
    expect_user_error(capsys, ["run", "score", "--config", cfg], "model directory does not exist")


def test_bad_override(capsys, tmp_path):
    cfg = write_config(tmp_path, csv_corpus(tmp_path))
    expect_user_error(capsys, ["run", "score", "--config", cfg, "--set", "shard_size=-5"], "shard_size: Input should be greater than 0")
    expect_user_error(capsys, ["run", "score", "--config", cfg, "--set", "nonsense"], "--set expects key=value")


def test_unreachable_ray_address(capsys, tmp_path, monkeypatch):
    """Only meaningful without a Ray already running in this process: run it in a fresh one."""
    cfg = write_config(tmp_path, csv_corpus(tmp_path))
    env = {"RAY_ADDRESS": "127.0.0.1:9", "RAY_AUTH_MODE": "disabled", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "redline", "run", "score", "--config", cfg], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach the Ray cluster at RAY_ADDRESS=127.0.0.1:9" in lines[0]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("report.html"))


def test_usage_errors_exit_2(capsys):
    assert main(["run", "score"]) == 2
    assert "Missing option '--config'" in capsys.readouterr().err
    assert main(["frobnicate"]) == 2


def test_run_score_with_flag_overrides_and_status(capsys, tmp_path, ray_session, davidson):
    cfg = write_config(tmp_path, {"path": "placeholder.csv", "preset": "davidson"},
                       [{"name": "p", "kind": "profanity-check", "num_cpus": 0.25}])
    assert main(["run", "score", "--config", cfg, "--corpus", str(davidson), "--limit", "120", "--actors", "2",
                 "--run-name", "cli"]) == 0
    out = capsys.readouterr().out
    assert "│ p " in out and "report:" in out
    run = tmp_path / "runs" / "cli"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["counts"]["rows_in"] == 120 and manifest["config"]["detectors"][0]["actors"] == 2
    assert main(["status", str(run)]) == 0
    assert "complete" in capsys.readouterr().out
    expect_user_error(capsys, ["status", str(tmp_path / "nothing")], "no run directory or job id")


@pytest.mark.slow
def test_quickstart_main_job_is_the_taebench_chain(capsys, quickstart_dir, ray_session, wordnet_ready):
    tmp_path = quickstart_dir
    # `quickstart attack` alone first: the chain then reuses that finished run
    assert main(["quickstart", "attack", "--output", str(tmp_path)]) == 0
    assert "deepwordbug" in capsys.readouterr().out
    assert main(["quickstart", "--output", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "config already run in" in captured.err and "quickstart-attack; reusing it" in captured.err
    out = captured.out
    assert "TaeBench:" in out and "transfer attack" in out and "ASR TAE (FNR)" in out
    taebench = json.loads((tmp_path / "quickstart-taebench" / "manifest.json").read_text())
    assert taebench["stages"]["grammar"].startswith("skipped: no LanguageTool server")
    usage = taebench["judge_usage"]
    assert usage["requests"] > 0 and usage["by_verdict"].get("yes") and usage["by_verdict"].get("no")
    assert taebench["counts"]["taebench"] > 0
    transfer = json.loads((tmp_path / "quickstart-transfer" / "manifest.json").read_text())
    victims = {r["victim"]: r for r in transfer["summary"]}
    # the attack's own victim: its TAEs fool it by construction, so they are counted apart, not as transfer
    assert victims["profanity-check"]["tae_rate"] is None and victims["profanity-check"]["own_n"] > 0
    assert victims["tiny-bert"]["tae_n"] > 0 and victims["tiny-bert"]["own_n"] == 0
    # TaeBench was filtered by another classifier: no victim's figure is 0 by construction, and
    # benchmarking the filter's own classifier on it is refused in one line
    assert taebench["config"]["classifier"]["name"] == "tiny-bert-filter" and "tiny-bert-filter" not in victims
    refused = tmp_path / "transfer-the-filter.yaml"
    refused.write_text(json.dumps({"taebench": str(tmp_path / "quickstart-taebench"), "output": str(tmp_path / "no"),
                                   "victims": [taebench["config"]["classifier"]]}))
    expect_user_error(capsys, ["run", "transfer", "--config", str(refused)], "tiny-bert-filter is the label filter's classifier")
    assert str(tmp_path / "quickstart-transfer" / "report.html") in out
    assert "data:image/png;base64," in (tmp_path / "quickstart-transfer" / "report.html").read_text()
    assert f"redline view {tmp_path}" in out  # it ends with the command that opens its runs in a browser
    # run again, every run is reused as it is: no judge is served for quality filters that already ran
    assert main(["quickstart", "--output", str(tmp_path)]) == 0
    again = capsys.readouterr()
    assert "the tiny LLM judge: not needed" in again.err and "serving the tiny LLM judge" not in again.err
    assert "TaeBench: " in again.out and str(tmp_path / "quickstart-transfer" / "report.html") in again.out


def test_quickstart_score(capsys, tmp_path, ray_session):
    assert main(["quickstart", "score", "--output", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for name in ("profanity-check", "tiny-bert", "keywords", "report:"):
        assert name in out
    report = next(tmp_path.glob("quickstart-*/report.html"))
    assert "data:image/png;base64," in report.read_text()
    manifest = json.loads((report.parent / "manifest.json").read_text())
    assert manifest["state"] == "complete" and manifest["counts"]["rejected"] == {"empty text": 2}


def test_train_tiny_classifier_command(capsys, tmp_path, davidson):
    out_dir = tmp_path / "m"
    assert main(["train", "tiny-classifier", "--corpus", str(davidson), "--preset", "davidson", "--limit", "200",
                 "--epochs", "1", "--out", str(out_dir)]) == 0
    assert (out_dir / "config.json").is_file() and (out_dir / "tokenizer.json").is_file()
    from redline.actors.detectors import DetectorConfig
    from redline.actors.detectors.local import HFDetector

    HFDetector.preflight(DetectorConfig(name="t", kind="hf", model=str(out_dir)))


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one():
    lines = [ln.strip() for ln in (REPO / "README.md").read_text().splitlines()]
    commands = [ln for ln in lines[:12] if ln.startswith("./")]
    assert commands[:2] == ["./setup.sh && .venv/bin/redline quickstart",
                            "./setup.sh --test && .venv/bin/python -m pytest -n 2"]
    assert commands[1] in (REPO / ".ci" / "run").read_text()


def test_examples_validate(tmp_path):
    """Every registered pipeline has an example config that validates; so do the other examples."""
    from redline.actors.triggers.training import TriggerModelTrainConfig
    from redline.cluster.config import load_config
    from redline.pipelines import registry
    from redline.serve.config import ServeConfig

    examples = {p.name: p for p in (REPO / "examples").glob("*.yaml")}
    checked = set()
    for entry in registry.entries():
        assert entry.example in examples, f"pipeline {entry.name} has no example {entry.example}"
        load_config(registry.pipeline(entry.name).config, examples[entry.example])
        checked.add(entry.example)
    others = {"serve": ServeConfig, "trigger": TriggerModelTrainConfig}
    for name, path in examples.items():
        if name not in checked:
            load_config(others[name.split("_")[0].removesuffix(".yaml")], path)


def test_ray_cluster_yaml_passes_the_launcher_schema():
    """Ray's own cluster-config schema, and what makes `ray up` boot redline: one pinned image (this
    version's tag, never `latest`), a pinned AMI, an instance profile on every node for S3, and
    nothing installed from a moving branch."""
    import tomllib

    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((REPO / "ray_cluster.yaml").read_text())
    validate_config(prepare_config(config))
    types = config["available_node_types"]
    gpu = [t for t in types.values() if t.get("resources", {}).get("GPU")]
    assert config["provider"]["type"] == "aws" and gpu and config["head_node_type"] in types
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    image = config["docker"]["image"]
    assert image.rsplit(":", 1)[1].startswith(version) and config["docker"]["pull_before_run"] is True
    assert any("--shm-size" in o for o in config["docker"]["run_options"])
    for node_type in types.values():
        assert node_type["node_config"]["ImageId"].startswith("ami-")
        assert node_type["node_config"]["IamInstanceProfile"]["Arn"].startswith("arn:aws:iam::")
    commands = " ".join(config["setup_commands"] + config.get("head_setup_commands", [])
                        + config.get("worker_setup_commands", []))
    assert "pip install" not in commands and "git+" not in commands
    broken = yaml.safe_load((REPO / "ray_cluster.yaml").read_text())
    broken["available_node_types"]["gpu.g5.xlarge"]["min_workers"] = "two"
    with pytest.raises(Exception, match="is not of type 'integer'"):
        validate_config(prepare_config(broken))


def _containers(spec: dict) -> list[tuple[dict, dict]]:
    """(pod spec, its first container) of the head and every worker group."""
    pods = [spec["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in spec["workerGroupSpecs"]]
    return [(pod, pod["containers"][0]) for pod in pods]


def _check_ray_cluster_spec(spec: dict, accounts: set[str]) -> None:
    """What KubeRay's v1 CRDs require of a cluster spec (headGroupSpec.template; every worker group's
    groupName, min/max replicas, rayStartParams and template, string-valued rayStartParams), and what a
    real cluster needs: a service account for workload identity, secrets only by reference (and
    optional, so a pipeline that needs none runs without them), GPU tolerations, a memory-backed
    /dev/shm for the object store, requests equal to limits."""
    from redline.cluster.runtime import SYSTEM_CONFIG

    ray_settings = {f"RAY_{k}": str(v) for k, v in SYSTEM_CONFIG.items()}
    head = spec["headGroupSpec"]
    assert all(isinstance(v, str) for v in head["rayStartParams"].values())
    assert head["rayStartParams"]["num-cpus"] == "0"
    groups = spec["workerGroupSpecs"]
    for g in groups:
        assert isinstance(g["groupName"], str) and isinstance(g["rayStartParams"], dict)
        assert all(isinstance(g[k], int) for k in ("minReplicas", "maxReplicas", "replicas"))
        assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"]
    gpu = [g for g in groups if g["template"]["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu")]
    assert gpu, "a GPU worker group"
    for g in gpu:
        toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        assert toleration in g["template"]["spec"]["tolerations"]
    for pod, c in _containers(spec):
        assert c["image"] and c["name"] and pod["serviceAccountName"] in accounts
        assert c["resources"]["requests"] == c["resources"]["limits"]
        for e in c.get("env", []):  # secrets by reference; a literal only for the embedded Ray's own settings
            if e["name"] in ray_settings:
                assert e["value"] == ray_settings[e["name"]] and "valueFrom" not in e
            else:
                assert "value" not in e and e["valueFrom"]["secretKeyRef"]["optional"] is True
        assert all(e["secretRef"]["optional"] is True for e in c.get("envFrom", []))
        shm = next(m["name"] for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm")
        assert next(v for v in pod["volumes"] if v["name"] == shm)["emptyDir"]["medium"] == "Memory"
        _check_restricted(pod, c)


def _check_restricted(pod: dict, c: dict, cache: bool = True) -> None:
    """Pod Security "restricted": non-root, no privilege escalation, every capability dropped, the
    runtime's seccomp profile; the root filesystem read-only, with bounded writable emptyDirs for
    Ray's /tmp and redline's cache, counted in the container's ephemeral-storage request."""
    pod_sc, sc = pod["securityContext"], c["securityContext"]
    assert pod_sc["runAsNonRoot"] is True and pod_sc["runAsUser"] != 0
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["readOnlyRootFilesystem"] is True and "privileged" not in sc
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for path in ("/tmp", "/home/ray/.cache") if cache else ("/tmp",):
        assert volumes[mounts[path]]["emptyDir"]["sizeLimit"], path
    assert c["resources"]["requests"]["ephemeral-storage"] == c["resources"]["limits"]["ephemeral-storage"]


def _check_closed(cluster_spec: dict, docs: list[dict]) -> None:
    """The Jobs API and dashboard need Ray's token (KubeRay's authOptions), and a NetworkPolicy lets
    only redline's own pods (and the KubeRay operator, on the dashboard and Serve ports) reach them."""
    assert cluster_spec["authOptions"] == {"mode": "token"}
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    label = policy["spec"]["podSelector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    pods = [cluster_spec["headGroupSpec"]["template"]] + [g["template"] for g in cluster_spec["workerGroupSpecs"]]
    for pod in pods:
        assert label.items() <= pod["metadata"]["labels"].items()
    own, operator = policy["spec"]["ingress"][:2]
    assert own == {"from": [{"podSelector": {"matchLabels": label}}]}  # any port, but only from redline's pods
    assert operator["from"][0]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "kuberay-operator"}
    assert sorted(p["port"] for p in operator["ports"]) == [8000, 8265]


def _groups_fit(spec: dict, asks: list[tuple[float, float]]) -> None:
    """Every pool's actor fits one worker group's pod (KubeRay gives Ray the pod's limits)."""
    sizes = [(float(c["resources"]["limits"]["cpu"]), float(c["resources"]["limits"].get("nvidia.com/gpu", 0)))
             for _, c in _containers(spec)[1:]]
    for cpus, gpus in asks:
        assert any(cpus <= c and gpus <= g for c, g in sizes), (cpus, gpus, sizes)


def test_kuberay_manifests_have_what_the_crds_require():
    import shlex

    from redline.cluster.config import validate_config
    from redline.pipelines import registry

    docs = {d["kind"]: d for d in yaml.safe_load_all((REPO / "cluster" / "kubernetes" / "rayjob.yaml").read_text())}
    config_map, job, account = docs["ConfigMap"], docs["RayJob"], docs["ServiceAccount"]
    assert job["apiVersion"] == "ray.io/v1" and job["metadata"]["name"] and isinstance(
        job["spec"]["shutdownAfterJobFinishes"], bool)
    spec = job["spec"]["rayClusterSpec"]
    assert spec["enableInTreeAutoscaling"] is True
    _check_ray_cluster_spec(spec, {account["metadata"]["name"]})
    job_docs = list(yaml.safe_load_all((REPO / "cluster" / "kubernetes" / "rayjob.yaml").read_text()))
    _check_closed(spec, job_docs)
    submitter = job["spec"]["submitterPodTemplate"]  # the submitting pod passes the policy and "restricted" too
    assert next(d for d in job_docs if d["kind"] == "NetworkPolicy")["spec"]["podSelector"]["matchLabels"].items() \
        <= submitter["metadata"]["labels"].items()
    _check_restricted(submitter["spec"], submitter["spec"]["containers"][0], cache=False)
    for group in spec["workerGroupSpecs"]:  # a CPU group never pulls the CUDA image
        container = group["template"]["spec"]["containers"][0]
        assert container["image"].endswith("-gpu") == bool(container["resources"]["limits"].get("nvidia.com/gpu"))
    argv = shlex.split(job["spec"]["entrypoint"])  # a registered pipeline, with a config that validates
    entry = next(e for e in registry.entries() if list(e.command) == argv[1:3])
    mount = next(m for m in spec["headGroupSpec"]["template"]["spec"]["containers"][0]["volumeMounts"]
                 if m["name"] == "config")
    assert argv[argv.index("--config") + 1] == f"{mount['mountPath']}/config.yaml"
    config = validate_config(registry.pipeline(entry.name).config, yaml.safe_load(config_map["data"]["config.yaml"]))
    _groups_fit(spec, [(d.num_cpus, d.num_gpus) for d in config.detectors])
    env = yaml.safe_load(job["spec"]["runtimeEnvYAML"])["env_vars"]
    assert env["REDLINE_PROGRESS"] == "lines"  # a job's log gets plain lines, never a live bar that prints nothing
    assert not any(jobs_secret_like(k) for k in env)
    cluster_list = list(yaml.safe_load_all((REPO / "cluster" / "kubernetes" / "raycluster.yaml").read_text()))
    assert [d["kind"] for d in cluster_list][:2] == ["ServiceAccount", "RayCluster"]  # what it needs comes first
    cluster_docs = {d["kind"]: d for d in cluster_list}
    _check_closed(cluster_docs["RayCluster"]["spec"], cluster_list)
    cluster = cluster_docs["RayCluster"]
    assert cluster["apiVersion"] == "ray.io/v1"
    _check_ray_cluster_spec(cluster["spec"], {cluster_docs["ServiceAccount"]["metadata"]["name"]})


def jobs_secret_like(name: str) -> bool:
    from redline.cluster.jobs import secret_like

    return secret_like(name)


def test_the_eta_leaves_the_start_up_out(monkeypatch):
    """A minute of actors loading models, then 50 rows/s: the ETA is the rows to come at 50/s."""
    from redline.cluster import progress

    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    lines: list[str] = []
    plain = progress.PlainProgress("scoring", 200, "rows", 0, lines.append)
    now[0] = 60.0
    plain.advance(50)
    now[0] = 61.0
    plain.advance(50)
    assert lines == ["scoring: 50/200 (25%) rows, 0.8 rows/s", "scoring: 100/200 (50%) rows, 50.0 rows/s, ETA 0m02s"]


def test_the_rate_is_the_recent_one_and_every_view_of_it_is_the_same(monkeypatch):
    """A fast start then a slow stretch: the rate is the last minute's, not the run's average, and the
    log line, the bar and the manifest (what `redline view` shows) all read it from one `Pace`."""
    from redline.cluster import progress

    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    pace = progress.Pace(10_000)
    for t in range(30, 150):  # after 30 s of start-up, 50 rows/s for two minutes
        now[0] = float(t)
        pace.add(50)
    assert pace.rate() == pytest.approx(50.0)
    for t in range(150, 270):  # then 10 rows/s
        now[0] = float(t)
        pace.add(10)
    assert pace.rate() == pytest.approx(10.0, rel=0.05)  # the last minute's, not the run's average (~27/s)
    assert pace.eta_s() == pytest.approx((10_000 - pace.done) / pace.rate())
    lines: list[str] = []
    plain = progress.PlainProgress("scoring", 0, "rows", 0, lines.append, pace)
    plain.report()
    assert f"{pace.rate():,.1f} rows/s, ETA {progress._eta(pace.eta_s())}" in lines[-1]
    assert pace.figures() == {"done": pace.done, "total": 10_000, "rate": round(pace.rate(), 3),
                              "eta_s": round(pace.eta_s(), 1)}


def test_long_work_reports_plain_progress_lines_in_logs(capsys, monkeypatch):
    """Not on a terminal (Ray job logs, CI, `| tee`): a line at most every interval, and one at the end."""
    from redline.cluster import progress

    monkeypatch.setenv("REDLINE_PROGRESS", "")
    monkeypatch.setenv("REDLINE_PROGRESS_INTERVAL", "0")
    assert progress.progress_mode() == "lines"  # pytest's stderr is not a terminal
    with progress.progress_bar("scoring", total=200, unit="rows") as advance:
        advance(50)
        advance(50, note="hits 3")
    # the ticker may print a 0/200 line before the first advance (with interval 0 any tick prints)
    lines = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("scoring: 0/200")]
    # no ETA from the first results alone (their rate is mostly start-up); from the second on, the rate since
    assert lines[0].startswith("scoring: 50/200 (25%) rows, ") and "ETA" not in lines[0]
    assert lines[1].startswith("scoring: 100/200 (50%) rows") and "rows/s, ETA " in lines[1]
    assert lines[1].endswith("hits 3")
    assert "done in" in lines[-1]
    monkeypatch.setenv("REDLINE_PROGRESS_INTERVAL", "3600")
    with progress.progress_bar("quiet", total=10) as advance:
        advance(5)
    assert len(capsys.readouterr().err.strip().splitlines()) == 1  # only the closing line within the interval
    monkeypatch.setenv("REDLINE_PROGRESS", "0")
    with progress.progress_bar("off", total=10) as advance:
        advance(10)
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("REDLINE_PROGRESS", "lines")
    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: True)  # a pod's log may be a terminal
    assert progress.progress_mode() == "lines"
    monkeypatch.setenv("REDLINE_PROGRESS", "1")
    assert progress.progress_mode() == "bar"


def test_ray_noise_never_reaches_the_user(tmp_path):
    """A score run in its own process: no C++ core_worker line, no Serve retry notice on stderr."""
    cfg = write_csv(tmp_path / "c.csv", ["text", "label"], [["you idiot", 1], ["hello", 0]])
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"corpus": {"path": str(cfg), "text_column": "text", "label_column": "label",
                                                 "toxic_values": [1]},
                                      "detectors": [{"name": "p", "kind": "profanity-check", "num_cpus": 0.5}],
                                      "output": str(tmp_path / "runs")}))
    env = {k: v for k, v in os.environ.items() if k not in ("REDLINE_QUIET_RAY", "REDLINE_PROGRESS", "RAY_ADDRESS")}
    proc = subprocess.run([sys.executable, "-m", "redline", "run", "score", "--config", str(config)], env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "core_worker.cc" not in proc.stderr and "graceful_shutdown" not in proc.stderr + proc.stdout
    assert "scoring with 1 detector(s): 2/2 (100%) rows" in proc.stderr  # the plain progress line is kept


def test_version_names_redline_ray_and_python(capsys):
    from redline import __version__

    assert main(["--version"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"redline {__version__} (ray 2.") and "python 3." in line


def test_a_stop_signals_stack_dump_is_filtered_and_everything_else_passes():
    """What Ray's C++ failure handler printed when `redline stop` sent SIGTERM (two copies), between
    lines that must pass, and a crash's dump, which must pass too."""
    from redline.cluster import quiet

    dump = ("*** SIGTERM received at time=1795624656 on cpu 1 ***\n"
            "PC: @     0x7f0ad42ed545  (unknown)  clock_nanosleep\n"
            "    @     0x7f0ad425a050  211700360  (unknown)\n"
            "    @ ... and at least 8 more frames\n"
            "[2026-11-25 16:37:36,615 E 1398 1398] logging.cc:474: *** SIGTERM received at time=1795624656 on cpu 1 "
            "***\n[2026-11-25 16:37:36,615 E 1398 1398] logging.cc:474: PC: @     0x7f0ad42ed545  (unknown)  "
            "clock_nanosleep\n[2026-11-25 16:37:36,615 E 1398 1398] logging.cc:474:     @ ... and at least 8 more "
            "frames\n")
    crash = "*** SIGSEGV received at time=1 on cpu 0 ***\nPC: @     0x1  (unknown)  f\n"
    source = ("scoring: 10/20 rows\n" + dump + "stopped by SIGTERM; rerun the same command to resume\n" + crash)
    read_in, write_in = os.pipe()
    read_out, write_out = os.pipe()
    os.write(write_in, source.encode())
    os.close(write_in)
    quiet._pump(read_in, write_out)
    os.close(write_out)
    assert os.read(read_out, 1 << 16).decode() == (
        "scoring: 10/20 rows\nstopped by SIGTERM; rerun the same command to resume\n" + crash)

def test_the_rayservice_serves_the_example_config_behind_its_key():
    """cluster/kubernetes/rayservice.yaml: its serveConfigV2 is `redline serve deploy-config` of
    examples/serve_kubernetes.yaml (so it is never stale) and passes Serve's schema; its pods pass
    "restricted", need Ray's token and the API key (a required secret), and sit behind a
    NetworkPolicy that opens only Serve's port to other pods."""
    from ray.serve.schema import ServeDeploySchema

    from redline.cluster.config import load_config
    from redline.serve.config import ServeConfig
    from redline.serve.runner import deploy_config

    docs = list(yaml.safe_load_all((REPO / "cluster" / "kubernetes" / "rayservice.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["ServiceAccount", "RayService", "NetworkPolicy"]
    service = docs[1]
    assert service["apiVersion"] == "ray.io/v1" and service["spec"]["upgradeStrategy"] == {"type": "NewCluster"}
    rendered = yaml.safe_load(service["spec"]["serveConfigV2"])
    example = load_config(ServeConfig, REPO / "examples" / "serve_kubernetes.yaml")
    assert rendered == deploy_config(example)
    ServeDeploySchema.model_validate(rendered)
    spec = service["spec"]["rayClusterConfig"]
    _check_closed(spec, docs)
    for pod, c in _containers(spec):
        _check_restricted(pod, c)
        assert pod["serviceAccountName"] == docs[0]["metadata"]["name"]
        key = next(e for e in c["env"] if e["name"] == example.api_key_env)
        assert key["valueFrom"]["secretKeyRef"]["optional"] is False  # no key, no service
    _groups_fit(spec, [(d.num_cpus, d.num_gpus) for d in example.detectors])
    open_to_all = docs[2]["spec"]["ingress"][-1]
    assert open_to_all == {"ports": [{"port": 8000}]}  # the rest only for redline's pods and the operator

def test_the_kustomization_is_the_one_place_to_edit():
    """cluster/kubernetes/kustomization.yaml takes the image, namespace, S3 role and the job's config
    (the bucket) and nothing else; rendered by `kubectl kustomize` (where kubectl is installed, as
    on this project's machines), its RayJob passes every check the shipped one does, with no EDIT
    placeholder left but the config's bucket."""
    import shutil
    import subprocess

    from redline.cluster.config import validate_config
    from redline.pipelines import registry

    folder = REPO / "cluster" / "kubernetes"
    kust = yaml.safe_load((folder / "kustomization.yaml").read_text())
    assert set(kust) == {"apiVersion", "kind", "namespace", "resources", "images", "patches", "configMapGenerator",
                         "generatorOptions"}
    config = yaml.safe_load((folder / "score-config.yaml").read_text())
    validate_config(registry.pipeline("score").config, config)
    kubectl = shutil.which("kubectl")
    if kubectl is None:  # the inputs are checked above; rendering needs kubectl's kustomize
        return
    out = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    docs = list(yaml.safe_load_all(out.stdout))
    assert all(d["metadata"]["namespace"] == kust["namespace"] for d in docs)
    by_kind = {d["kind"]: d for d in docs}
    role = kust["patches"][0]["patch"].split("value: ")[1].split()[0]
    assert by_kind["ServiceAccount"]["metadata"]["annotations"]["eks.amazonaws.com/role-arn"] == role
    assert yaml.safe_load(by_kind["ConfigMap"]["data"]["config.yaml"]) == config
    spec = by_kind["RayJob"]["spec"]["rayClusterSpec"]
    _check_ray_cluster_spec(spec, {by_kind["ServiceAccount"]["metadata"]["name"]})
    _check_closed(spec, docs)
    images = [c["image"] for _, c in _containers(spec)] + \
        [by_kind["RayJob"]["spec"]["submitterPodTemplate"]["spec"]["containers"][0]["image"]]
    assert all(i.startswith(kust["images"][0]["newName"] + ":0.1.0-") for i in images), images
    assert "EDIT-registry" not in out.stdout


def test_the_image_installs_the_locked_dependencies_before_the_code():
    """requirements.lock is what this environment holds (setup.sh installs with it as constraints), and
    the Dockerfile installs from it in a layer of its own before the code is copied, keeps tests and
    benches out and declares a HEALTHCHECK (`.ci/image` builds it and checks each inside the image)."""
    check = subprocess.run([sys.executable, str(REPO / ".ci" / "lock.py"), "--check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    lock = (REPO / "requirements.lock").read_text().splitlines()
    assert any(line.startswith("ray==2.") for line in lock) and not any(line.startswith("torch==") for line in lock)
    steps = [line for line in (REPO / "Dockerfile").read_text().splitlines() if line and not line.startswith((" ", "#"))]
    lock_copy = steps.index("COPY --chown=1000:100 requirements.lock /opt/redline/requirements.lock")
    code_copy = steps.index("COPY --chown=1000:100 . /opt/redline/src")
    assert lock_copy < code_copy and "-r /opt/redline/requirements.lock" in "\n".join(
        (REPO / "Dockerfile").read_text().split("COPY --chown=1000:100 . /opt/redline/src")[0].splitlines()[-3:])
    assert any(s.startswith("HEALTHCHECK ") for s in steps)
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {"tests", "bench", ".ci"} <= set(ignored)


def test_every_shipped_cluster_keeps_an_idle_worker_as_the_embedded_ray_does():
    """The KubeRay manifests that run pipelines and `ray up`'s config start every node with the embedded
    Ray's SYSTEM_CONFIG (as environment: each node's raylet reads its own), so a run's last task reuses
    its first one's worker process there too."""
    from redline.cluster.runtime import SYSTEM_CONFIG

    wanted = {f"RAY_{k}": str(v) for k, v in SYSTEM_CONFIG.items()}
    for name in ("rayjob.yaml", "raycluster.yaml"):
        docs = list(yaml.safe_load_all((REPO / "cluster" / "kubernetes" / name).read_text()))
        cluster = next(d for d in docs if d["kind"] in ("RayJob", "RayCluster"))
        spec = cluster["spec"].get("rayClusterSpec", cluster["spec"])
        groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
        for group in groups:
            env = {e["name"]: e.get("value") for e in group["template"]["spec"]["containers"][0]["env"]}
            assert wanted.items() <= env.items(), (name, group.get("groupName", "head"))
    config = yaml.safe_load((REPO / "ray_cluster.yaml").read_text())
    starts = [c for c in config["head_start_ray_commands"] + config["worker_start_ray_commands"] if "ray start" in c]
    assert len(starts) == 2 and all(all(f"{k}={v}" in c for k, v in wanted.items()) for c in starts)
