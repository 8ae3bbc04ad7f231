"""Every pipeline on a real two-node Ray cluster, submitted with `redline submit`, with inputs, models
and outputs on S3 (moto in server mode).

The head (`ray start --head --num-cpus=0`) runs only drivers and Ray's own services, so every task,
actor, Tune trial and Serve replica that needs a CPU lands on the worker node. The worker node runs
as another Unix user, with its own working directory, HOME, TMPDIR, Ray temp dir and cache: it cannot
read the test's directories (pytest's are mode 0700), so a pipeline that relied on the driver's
disk would fail here. Both nodes are stopped by process (never `ray stop`, which would stop every
Ray on the machine)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from redline.cluster.runtime import SYSTEM_CONFIG

from conftest import SHARED_DATA, VENV_BIN, free_port, shared_file, wait_for_port

pytestmark = pytest.mark.slow

WORKER_USER = "redline-worker"
# A secret both nodes hold in their environment, as a Kubernetes secretKeyRef or the cloud's secret
# store gives it: a job names it (--secret), never carries it.
SECRET_NAME, SECRET_VALUE = "REDLINE_PROBE_API_KEY", f"sk-probe-{os.urandom(8).hex()}"
BUCKET = "redline-cluster"
# a directory only the worker node sees its files in: a tmpfs mounted in the worker's own mount
# namespace (on the head, and to the driver, it is an empty directory)
WORKER_ONLY = Path("/srv/redline-worker-only")


def s3():
    import boto3

    return boto3.session.Session().client("s3")


def read_s3(key: str) -> bytes:
    return s3().get_object(Bucket=BUCKET, Key=key)["Body"].read()


def s3_keys(prefix: str) -> list[str]:
    pages = s3().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def manifest(run: str) -> dict:
    return json.loads(read_s3(f"runs/{run}/manifest.json"))


class Cluster:
    """A head node (this user) and a worker node (another user) on 127.0.0.1."""

    def __init__(self, root: Path, aws: dict[str, str], worker_files: list[Path]) -> None:
        self.root, self.aws, self.worker_files = root, aws, worker_files
        self.gcs, self.dashboard = free_port(), free_port()
        self.address = f"http://127.0.0.1:{self.dashboard}"
        self.env = {**os.environ, **aws, "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}",
                    "RAY_AUTH_MODE": "disabled", "REDLINE_PROGRESS": "0", SECRET_NAME: SECRET_VALUE,
                    "REDLINE_QUIET_RAY": "1"}  # the jobs' drivers filter Ray's noise, as for a user
        self.env.pop("RAY_ADDRESS", None)
        self.home = Path(f"/home/{WORKER_USER}") / f"node-{self.gcs}"
        self.head = self.worker = None

    def ports(self) -> list[str]:
        return [f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
                f"--metrics-export-port={free_port()}", f"--runtime-env-agent-port={free_port()}",
                f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}"]

    def start_head(self) -> None:
        log = open(self.root / "head.log", "wb")
        self.head = subprocess.Popen(
            [str(VENV_BIN / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={self.gcs}",
             "--num-cpus=0", f"--dashboard-port={self.dashboard}", "--dashboard-host=127.0.0.1",
             "--include-dashboard=true", "--object-store-memory=150000000", "--disable-usage-stats",
             f"--system-config={json.dumps(SYSTEM_CONFIG)}", *self.ports()],  # as README starts a head
            env=self.env, cwd=self.root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for_port(self.dashboard, timeout=120)

    def start_worker(self) -> None:
        """The worker node: another user, its own cwd, HOME, TMPDIR, Ray temp dir and redline cache."""
        shutil.rmtree(self.home, ignore_errors=True)
        for d in ("tmp", "cache", "ray"):
            (self.home / d).mkdir(parents=True, exist_ok=True)
        subprocess.run(["chown", "-R", f"{WORKER_USER}:{WORKER_USER}", str(self.home)], check=True)
        env = {"HOME": f"/home/{WORKER_USER}", "TMPDIR": str(self.home / "tmp"), "REDLINE_CACHE": str(self.home / "cache"),
               "PATH": f"{VENV_BIN}:/usr/bin:/bin", "RAY_AUTH_MODE": "disabled", "REDLINE_PROGRESS": "0",
               # what an instance role gives a cloud node: S3 access without a job passing keys
               **self.aws, SECRET_NAME: SECRET_VALUE}
        command = ["runuser", "-u", WORKER_USER, "--", "env", "-i", *[f"{k}={v}" for k, v in env.items()],
                   str(VENV_BIN / "ray"), "start", "--block", f"--address=127.0.0.1:{self.gcs}",
                   "--node-ip-address=127.0.0.1", "--num-cpus=2", '--resources={"worker_node": 1}',
                   f"--temp-dir={self.home / 'ray'}", "--object-store-memory=150000000", "--disable-usage-stats",
                   *self.ports()]
        copies = " && ".join(f"cp {f} {WORKER_ONLY}/" for f in self.worker_files)
        command = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                   f'mount -t tmpfs -o mode=0755 tmpfs {WORKER_ONLY} && {copies} && chmod -R a+r {WORKER_ONLY} '
                   '&& exec "$@"', "sh", *command]
        log = open(self.root / "worker.log", "ab")
        self.worker = subprocess.Popen(command, cwd=self.home, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.cpus() >= 2:
                return
            assert self.worker.poll() is None, (self.root / "worker.log").read_text()[-3000:]
            time.sleep(1)
        raise TimeoutError("the worker node did not join")

    def cpus(self) -> float:
        out = subprocess.run([str(VENV_BIN / "ray"), "status", f"--address=127.0.0.1:{self.gcs}"], env=self.env,
                             capture_output=True, text=True).stdout
        line = next((ln for ln in out.splitlines() if ln.strip().endswith(" CPU")), "0/0 CPU")
        return float(line.split("/")[1].split()[0])

    def kill_worker(self, until_gone: bool = True) -> None:
        """The worker node dies: every process of its user, at once; `until_gone`: returns once the
        cluster no longer counts its CPUs (a node started before that could not be told from the dead
        one: a loaded machine's head took seconds to notice, and a job then found no CPU anywhere)."""
        subprocess.run(["pkill", "-9", "-u", WORKER_USER], check=False)
        if self.worker is not None:
            self.worker.wait(timeout=30)
        deadline = time.time() + 180
        while until_gone and self.cpus() > 0:
            assert time.time() < deadline, "the head still counts the killed worker node's CPUs after 3 minutes"
            time.sleep(1)

    def redline(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([str(VENV_BIN / "redline"), *args], env=self.env, cwd=self.root, capture_output=True,
                              text=True, timeout=timeout)

    def submit(self, pipeline: str, config: dict, name: str, wait: bool = True,
               *extra: str) -> subprocess.CompletedProcess:
        """Both nodes hold the S3 credentials (as an instance role would give them): the job carries none."""
        path = self.root / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        proc = self.redline("submit", pipeline, "--config", str(path), "--address", self.address, *extra,
                            *(["--wait"] if wait else []))
        if wait:
            assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        return proc

    def stop(self) -> None:
        self.kill_worker(until_gone=False)
        if self.head is not None:
            os.killpg(self.head.pid, signal.SIGTERM)
            try:  # a graceful `ray start --block` takes longer than 15 s: 3 s, then the rest is killed
                self.head.wait(timeout=3)
            except subprocess.TimeoutExpired:
                os.killpg(self.head.pid, signal.SIGKILL)
                self.head.wait()
        shutil.rmtree(self.home, ignore_errors=True)


def _worker_user() -> None:
    if os.geteuid() != 0 or not shutil.which("runuser") or not shutil.which("useradd"):
        pytest.skip("the two-node test runs the worker node as another Unix user: it needs root (CI has it)")
    WORKER_ONLY.mkdir(parents=True, exist_ok=True)
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "mount", "-t", "tmpfs", "tmpfs",
                            str(WORKER_ONLY)], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"the two-node test gives the worker node its own mount namespace: {probe.stderr.strip()}")
    if subprocess.run(["id", WORKER_USER], capture_output=True).returncode != 0:
        # a system user: never uid 1000, which the image CI smoke-tests beside the tests runs as
        subprocess.run(["useradd", "--system", "--create-home", "--shell", "/bin/sh", WORKER_USER], check=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, moto_endpoint, davidson):
    _worker_user()
    # The other user must be able to run this venv's interpreter; traversing (not listing) the
    # directories above it is enough. The test's own directories stay 0700.
    opened = []
    for parent in Path(os.path.realpath(sys.executable)).parents:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            opened.append((parent, mode))
            parent.chmod(mode | stat.S_IXOTH)
    aws = {"AWS_ENDPOINT_URL": moto_endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in aws}
    os.environ.update(aws)
    s3().create_bucket(Bucket=BUCKET)
    c = Cluster(tmp_path_factory.mktemp("cluster"), aws, [davidson])
    try:
        c.start_head()
        c.start_worker()
        yield c
    finally:
        c.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for parent, mode in opened:
            parent.chmod(mode)


@pytest.fixture(scope="module")
def s3_inputs(cluster, tmp_path_factory, tiny_binary_model, tiny_other_binary_model, tiny_causal_lm, davidson):
    """Corpora, DiaSafety slices and tiny models on S3, the only place the cluster reads them from."""
    from redline.cluster.artifacts import upload_dir

    client = s3()
    sample = Path(__file__).resolve().parents[1] / "pipelines" / "samples"
    client.put_object(Bucket=BUCKET, Key="data/sample.csv", Body=(sample / "toxic_sample_train.csv").read_bytes())
    import pandas as pd

    rows = pd.read_csv(davidson)
    for n in (1200, 3000):
        client.put_object(Bucket=BUCKET, Key=f"data/davidson-{n}.csv", Body=rows.head(n).to_csv(index=False).encode())
    val = json.loads(shared_file(SHARED_DATA / "diasafety" / "val.json").read_text())
    train = json.loads(shared_file(SHARED_DATA / "diasafety" / "train.json").read_text())
    client.put_object(Bucket=BUCKET, Key="data/ds-train.json", Body=json.dumps(train[:300]).encode())
    client.put_object(Bucket=BUCKET, Key="data/ds-val.json", Body=json.dumps(val[:150]).encode())
    upload_dir(tiny_binary_model, f"s3://{BUCKET}/models/tiny-bert")
    upload_dir(tiny_other_binary_model, f"s3://{BUCKET}/models/tiny-bert-b")
    upload_dir(tiny_causal_lm, f"s3://{BUCKET}/models/tiny-gpt2")
    return f"s3://{BUCKET}"


def test_the_worker_node_cannot_read_the_drivers_disk(cluster, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("driver only")
    probe = subprocess.run(["runuser", "-u", WORKER_USER, "--", "cat", str(secret)], capture_output=True, text=True)
    assert probe.returncode != 0 and "Permission denied" in probe.stderr
    assert cluster.cpus() == 2  # the head has none: every task, actor and replica runs on the worker node


def test_every_pipeline_on_two_nodes_from_s3(cluster, s3_inputs):
    s3u = s3_inputs
    runs = f"{s3u}/runs"
    tiny_bert = {"name": "tiny-bert", "kind": "hf", "model": f"{s3u}/models/tiny-bert", "num_cpus": 0.5}
    sample = {"path": f"{s3u}/data/sample.csv", "text_column": "text", "label_column": "label",
              "toxic_values": ["toxic"], "dataset": "sample"}

    # (score runs as the card's clean part below, and on its own in the tests after this one)
    # two categories: their two Tune trials run at once on the worker node's two CPUs (more categories
    # are more trials of the same code, e.g. test_dialogue_safety.py's hyper-parameter grid)
    categories = ["Offending User", "Risk Ignorance"]
    cluster.submit("dialogue-safety-train", {
        "train": f"{s3u}/data/ds-train.json", "val": f"{s3u}/data/ds-val.json", "base_model": f"{s3u}/models/tiny-bert",
        "categories": categories, "variants": ["one_vs_all"], "epochs": 1, "batch_size": 32, "max_length": 48,
        "learning_rate": 1e-3, "tune_trials": True, "trial_cpus": 1, "output": runs, "run_name": "ds-train"}, "ds-train")
    m = manifest("ds-train")
    assert m["state"] == "complete" and set(m["training"]["one_vs_all"]) == set(m["categories"]) == set(categories)
    assert any(k.endswith("redline_dialogue_safety.json") for k in s3_keys("runs/ds-train/models/one_vs_all/"))

    # the safety card runs attack, taebench, transfer, score, diasafety and egregious as runs of their own
    # on the cluster, every input on S3: each is checked here as its own run (they are not run again apart;
    # egregious on the LSTM seq2seq and LM the paper trains runs in test_triggers.py, their training
    # writes to S3 through the same artifacts path as ds-train's classifiers above)
    cluster.submit("eval", {
        "model": {"name": "tiny-gpt2", "kind": "hf", "model": f"{s3u}/models/tiny-gpt2", "num_cpus": 0.5},
        "guard": {"name": "guard", "kind": "profanity-check", "num_cpus": 0.5},
        "baselines": [{"name": "kw", "kind": "keywords", "patterns": ["idiot", "stupid"], "num_cpus": 0.25}],
        "guard_attack": {"attack": {"corpus": sample, "recipes": ["deepwordbug", "pwws"], "goals": ["tae", "bae"],
                                    "max_seeds": 8, "num_cpus": 0.5},
                         "taebench": {"grammar": None, "classifier": tiny_bert, "test_fraction": 0.5}, "split": "all"},
        "clean": {"corpus": {**sample, "limit": 40}},
        "dialogue": {"diasafety": {"contexts": f"{s3u}/data/ds-val.json",
                                   "classifiers": f"{runs}/ds-train/models/one_vs_all", "categories": categories,
                                   "max_contexts_per_category": 2,
                                   "responses_per_context": 2, "max_tokens": 6, "scoring": {"num_cpus": 0.5},
                                   "num_cpus": 0.5},
                     "labelled": f"{s3u}/data/ds-val.json", "labelled_limit": 20},
        "triggers": {"egregious": {"lists": [{"name": "mal", "limit": 2}], "searches": ["o-sample-avg"],
                                   "trigger_length": 3, "top_g": 10, "restarts": 1, "max_sweeps": 2, "num_cpus": 1},
                     "threshold_pairs": {"path": f"{s3u}/data/ds-val.json", "limit": 30}},
        "output": runs, "run_name": "card"}, "card")
    m = manifest("card")
    assert m["state"] == "complete" and set(m["parts"]) == {"attack-guard", "attack-kw", "taebench", "transfer",
                                                            "clean", "diasafety", "triggers"}
    assert 0 < m["sections"]["detector"]["n"] <= 20  # the two-step detector checked on labelled pairs, on a worker
    assert all(manifest(uri[len(runs) + 1:])["state"] == "complete" for uri in m["parts"].values())

    attack = manifest("card-attack-guard")  # 2 recipes x 2 goals x 8 seeds
    assert attack["counts"]["attempts_out"] == 32
    assert attack["counts"]["by_status"].get("error", 0) == 0  # WordNet reached the worker node without its disk
    clean = manifest("card-clean")  # one part per shard and detector, written on the worker node (the head has
    # no CPU for an actor)
    assert clean["counts"]["rows_out"] == 2 * 40 and len(s3_keys("runs/card-clean/predictions/")) == 2
    taebench = manifest("card-taebench")  # every stage's parts and the benchmark written shard by shard on S3
    assert s3_keys("runs/card-taebench/stages/4-label/") and s3_keys("runs/card-taebench/taebench_plus/")
    assert taebench["stages"]["label"]["kept"] == taebench["counts"]["taebench_plus"]
    transfer = {r["victim"]: r for r in manifest("card-transfer")["summary"] if r["dataset"] == "all"}
    assert transfer["guard"]["own_n"] > 0 and transfer["kw"]["own_n"] > 0  # each attacked, then each scored
    board = manifest("card-diasafety")["summary"]
    assert board[0]["model"] == "tiny-gpt2" and board[0]["responses"] + board[0]["empty"] + board[0]["errors"] > 0

    # advtrain: Tune trials on the worker node, checkpoints on S3; the job is stopped after the first
    # checkpoint and the resubmitted job resumes the sweep from S3 instead of starting over
    advtrain = {"taebench": f"{runs}/card-taebench", "base_model": f"{s3u}/models/tiny-bert",
                "train_corpus": {"path": f"{s3u}/data/davidson-1200.csv", "preset": "davidson"},
                "test_corpus": {**sample, "limit": 40}, "variants": ["no_tae", "taebench"],
                "search": {"epochs": [8], "batch_size": [32]}, "num_cpus": 1, "max_length": 32, "output": runs,
                "run_name": "advtrain"}
    proc = cluster.submit("advtrain", advtrain, "advtrain", wait=False)
    job_id = proc.stdout.split("submitted job ")[1].split()[0]
    deadline = time.time() + 300
    while not any("checkpoint_" in k for k in s3_keys("runs/advtrain/sweep/")):
        assert time.time() < deadline, cluster.redline("logs", job_id, "--address", cluster.address).stdout[-3000:]
        time.sleep(0.5)
    stopped = cluster.redline("stop", job_id, "--address", cluster.address)
    assert stopped.returncode == 0, stopped.stderr
    assert manifest("advtrain")["state"] != "complete"
    cluster.submit("advtrain", advtrain, "advtrain")
    m = manifest("advtrain")
    assert m["state"] == "complete" and m["resumed_sweep"] is True
    assert {r["variant"] for r in m["summary"]} == {"no_tae", "taebench"}, m["trials"]
    assert all(t["epochs_run"] == 8 for t in m["trials"])


def test_serve_with_a_replica_on_the_worker_node(cluster, s3_inputs, tmp_path):
    import httpx

    port = free_port()
    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump({
        "port": port, "proxy_location": "HeadOnly", "api_key_env": None, "app_name": "cluster",
        "detectors": [{"name": "tiny-bert", "kind": "hf", "model": f"{s3_inputs}/models/tiny-bert", "num_cpus": 0.5}],
        "ingress": {"replicas": 1}}))
    env = {**cluster.env, "RAY_ADDRESS": f"127.0.0.1:{cluster.gcs}", "REDLINE_STATE_DIR": str(tmp_path / "state")}
    started = subprocess.run([str(VENV_BIN / "redline"), "serve", "-c", str(config)], env=env, capture_output=True,
                             text=True, timeout=300)
    assert started.returncode == 0, started.stderr
    try:
        resp = httpx.post(f"http://127.0.0.1:{port}/v1/detect", json={"texts": ["you idiot", "hello"]}, timeout=60)
        assert resp.status_code == 200 and len(resp.json()["results"]) == 2
    finally:
        subprocess.run([str(VENV_BIN / "redline"), "serve", "stop", "--port", str(port)], env=env, timeout=120)


def test_the_rayservices_serve_config_serves_on_the_cluster_behind_its_key(cluster):
    """cluster/kubernetes/rayservice.yaml's serveConfigV2, deployed as KubeRay deploys it (a PUT to the
    dashboard's Serve REST API), its API key from the environment the nodes hold (a secretKeyRef on
    Kubernetes); changed only where one machine differs from a cluster: the port, 127.0.0.1 for
    0.0.0.0, one proxy on the head (two nodes on one host cannot both bind the port), the key's name."""
    import httpx

    repo = Path(__file__).resolve().parents[1]
    docs = list(yaml.safe_load_all((repo / "cluster" / "kubernetes" / "rayservice.yaml").read_text()))
    serve_config = yaml.safe_load(next(d for d in docs if d and d["kind"] == "RayService")["spec"]["serveConfigV2"])
    port = free_port()
    serve_config["proxy_location"] = "HeadOnly"
    serve_config["http_options"].update(host="127.0.0.1", port=port)
    for app in serve_config["applications"]:
        app["args"]["config"].update(host="127.0.0.1", port=port, proxy_location="HeadOnly", api_key_env=SECRET_NAME)
    api = f"{cluster.address}/api/serve/applications/"
    httpx.delete(api, timeout=120)  # a Serve an earlier test left, with other HTTP options
    deployed = httpx.put(api, json=serve_config, timeout=120)
    assert deployed.status_code == 200, deployed.text
    try:
        deadline = time.time() + 300
        while True:
            apps = httpx.get(api, timeout=30).json().get("applications", {})
            states = {name: a.get("status") for name, a in apps.items()}
            if states and all(v == "RUNNING" for v in states.values()):
                break
            assert time.time() < deadline and "DEPLOY_FAILED" not in states.values(), json.dumps(apps)[-3000:]
            time.sleep(1)
        assert set(states) == {"redline", "redline-health"}
        url, host = f"http://127.0.0.1:{port}", {"Host": "redline-serve-svc"}  # the name the Service gives
        assert httpx.get(f"{url}/healthz", headers=host, timeout=30).status_code == 200
        body = {"input": ["you are an idiot", "have a nice day"]}
        refused = httpx.post(f"{url}/v1/moderations", json=body, headers=host, timeout=60)
        assert refused.status_code == 401, refused.text
        wrong = httpx.post(f"{url}/v1/moderations", json=body, timeout=60,
                           headers={**host, "Authorization": "Bearer sk-not-the-key"})
        assert wrong.status_code == 401, wrong.text
        answered = httpx.post(f"{url}/v1/moderations", json=body, timeout=60,
                              headers={**host, "Authorization": f"Bearer {SECRET_VALUE}"})
        assert answered.status_code == 200, answered.text
        assert [r["flagged"] for r in answered.json()["results"]] == [True, False]
        assert SECRET_VALUE not in httpx.get(api, timeout=30).text  # the key's name is deployed, never its value
        elsewhere = httpx.post(f"{url}/v1/moderations", json=body, timeout=60,
                               headers={"Host": "attacker.example", "Authorization": f"Bearer {SECRET_VALUE}"})
        assert elsewhere.status_code == 421  # the Host rule: a name the Service does not give is refused
    finally:
        httpx.delete(api, timeout=120)


def submit_until_parts(cluster: Cluster, config: dict, name: str, parts: int) -> str:
    """Submit a score run and return its job id once `parts` prediction parts are written."""
    proc = cluster.submit("score", config, name, wait=False)
    job_id = proc.stdout.split("submitted job ")[1].split()[0]
    deadline = time.time() + 240
    while len(s3_keys(f"runs/{name}/predictions/")) < parts:
        assert time.time() < deadline, cluster.redline("logs", job_id, "--address", cluster.address).stdout[-3000:]
        time.sleep(0.5)
    return job_id


def faster(config: dict) -> dict:
    """The same run with the batch size of an execution setting changed (not the results'): the
    first job scored one text per call to be slow enough to stop; the resumed one need not."""
    return {**config, "detectors": [{**d, "batch_size": 64} for d in config["detectors"]]}


def assert_every_row_once(name: str, rows: int) -> None:
    import io

    import pyarrow.parquet as pq

    ids = [i for key in s3_keys(f"runs/{name}/predictions/")
           for i in pq.read_table(io.BytesIO(read_s3(key))).column("id").to_pylist()]
    assert len(ids) == len(set(ids)) == rows


def test_killing_the_worker_node_mid_run_loses_and_duplicates_nothing(cluster, s3_inputs, tmp_path):
    # one text per model call: slow enough to be killed half way
    config = {"corpus": {"path": f"{s3_inputs}/data/davidson-3000.csv", "preset": "davidson"}, "shard_size": 250,
              "detectors": [{"name": "tiny-bert", "kind": "hf", "model": f"{s3_inputs}/models/tiny-bert", "num_cpus": 1,
                             "batch_size": 1}],
              "output": f"{s3_inputs}/runs", "run_name": "killed"}
    job_id = submit_until_parts(cluster, config, "killed", 2)
    cluster.kill_worker()
    cluster.redline("stop", job_id, "--address", cluster.address)
    written = len(s3_keys("runs/killed/predictions/"))
    assert written < 12 and manifest("killed")["state"] != "complete"  # 12 shards in all
    cluster.start_worker()
    cluster.submit("score", faster(config), "killed")
    m = manifest("killed")
    assert m["state"] == "complete" and m["resumed_shards"] >= written
    assert_every_row_once("killed", 3000)


def test_the_driver_never_reads_the_corpus_and_a_stopped_driver_resumes(cluster, s3_inputs, tmp_path):
    """The corpus is on the worker node's disk only (the head sees an empty directory there): the
    worker reads it and writes the input shards. The driver is then stopped mid-run (the worker
    node lives on) and the resubmitted job resumes: every row once."""
    corpus = WORKER_ONLY / "labeled_data.csv"
    assert not corpus.exists()  # not from here, nor from the head's driver
    config = {"corpus": {"path": str(corpus), "preset": "davidson", "limit": 3000, "sample": "first"},
              "shard_size": 250, "output": f"{s3_inputs}/runs", "run_name": "stopped",
              "detectors": [{"name": "tiny-bert", "kind": "hf", "model": f"{s3_inputs}/models/tiny-bert", "num_cpus": 1,
                             "batch_size": 1}]}
    job_id = submit_until_parts(cluster, config, "stopped", 2)
    stopped = cluster.redline("stop", job_id, "--address", cluster.address)
    assert stopped.returncode == 0, stopped.stderr
    shards = [k for k in s3_keys("runs/stopped/input/") if k.rsplit("/", 1)[1].startswith("part-")]
    assert len(shards) == 12 and manifest("stopped")["state"] != "complete"  # the read ended, the pools did not
    cluster.submit("score", faster(config), "stopped")
    m = manifest("stopped")
    assert m["state"] == "complete" and m["counts"]["rows_in"] == 3000 and m["resumed_shards"] >= 2
    assert "sha256_edges" in m["inputs"][str(corpus)]  # fingerprinted on the worker that read it
    assert_every_row_once("stopped", 3000)


def test_a_run_directory_the_worker_node_cannot_see_is_one_clear_error(cluster, s3_inputs, tmp_path):
    """The actors read their input shards and write their parts themselves: a run directory on the
    driver's own disk (which the worker node cannot read) is refused with a line that names it."""
    runs = tmp_path / "runs"  # the driver's: 0700, another user's than the worker node's
    config = {"corpus": {"path": f"{s3_inputs}/data/davidson-1200.csv", "preset": "davidson"},
              "detectors": [{"name": "p", "kind": "profanity-check", "num_cpus": 0.5}],
              "output": str(runs), "run_name": "local"}
    proc = cluster.submit("score", config, "local", wait=False)
    job_id = proc.stdout.split("submitted job ")[1].split()[0]
    logs = cluster.redline("logs", job_id, "--address", cluster.address, "--follow").stdout
    status = cluster.redline("status", job_id, "--address", cluster.address).stdout
    assert "FAILED" in status.upper(), status
    assert f"error: this node cannot see the run directory {runs}/local" in logs, logs[-3000:]



def test_a_secret_lives_on_the_nodes_and_never_in_the_jobs_api(cluster, s3_inputs, tmp_path):
    """An API detector on the worker node authenticates with a key that only the nodes' environment
    holds; the job names it (--secret) and neither the Jobs API nor the job's logs show its value."""
    import urllib.request

    from standins import openai_judge

    sample = {"path": f"{s3_inputs}/data/sample.csv", "text_column": "text", "label_column": "label",
              "toxic_values": ["toxic"], "dataset": "sample"}
    with openai_judge(api_key=SECRET_VALUE) as api:
        config = {"corpus": sample, "output": f"{s3_inputs}/runs", "run_name": "secret",
                  "detectors": [{"name": "moderation", "kind": "openai-moderation", "base_url": api.url + "/v1",
                                 "api_key_env": SECRET_NAME, "num_cpus": 0.5}]}
        refused = cluster.submit("score", config, "secret", False, "--env", SECRET_NAME)
        assert refused.returncode == 2 and f"--secret {SECRET_NAME}" in refused.stderr, refused.stderr
        unknown = cluster.submit("score", config, "secret", False, "--secret", "REDLINE_NOT_ON_THE_CLUSTER")
        lines = unknown.stderr.strip().splitlines()
        assert unknown.returncode == 2 and len(lines) == 1, unknown.stderr
        assert "REDLINE_NOT_ON_THE_CLUSTER on the driver" in lines[0] and "on node" in lines[0]
        done = cluster.submit("score", config, "secret", True, "--secret", SECRET_NAME)
    m = manifest("secret")
    assert m["state"] == "complete" and m["counts"]["rows_out"] > 0
    assert all(r["not_scored"] == 0 for r in m["summary"])  # every call carried the key
    job_id = done.stdout.split("submitted job ")[1].split()[0]
    listing = urllib.request.urlopen(f"{cluster.address}/api/jobs/", timeout=30).read().decode()
    logs = cluster.redline("logs", job_id, "--address", cluster.address)
    assert job_id in listing and SECRET_NAME in listing  # the name travels, as the job's metadata
    assert SECRET_VALUE not in listing and SECRET_VALUE not in logs.stdout + logs.stderr + done.stdout
    print(f"/api/jobs/ ({len(listing):,} bytes) and the job's logs ({len(logs.stdout):,} bytes): no secret value")


def test_the_rayjob_runs_as_rendered_and_logs_plain_progress(cluster, s3_inputs, tmp_path, davidson,
                                                              tiny_binary_model):
    """What KubeRay would run on the RayJob's head — its entrypoint, its runtime environment, its
    ConfigMap mounted where the entrypoint reads it — with the manifest's one edit (the bucket), on
    the two-node cluster. The one change for this machine: no GPU, and a 2-CPU worker node, so the
    model detector asks for half a CPU instead of a GPU and four CPUs."""
    import pandas as pd
    from ray.job_submission import JobSubmissionClient

    from redline.cluster.artifacts import upload_dir

    docs = {d["kind"]: d for d in yaml.safe_load_all(
        (Path(__file__).resolve().parents[1] / "cluster" / "kubernetes" / "rayjob.yaml").read_text())}
    spec = docs["RayJob"]["spec"]
    mount = next(m for m in spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["volumeMounts"]
                 if m["name"] == "config")
    config = yaml.safe_load(docs["ConfigMap"]["data"]["config.yaml"].replace("EDIT-bucket", BUCKET))
    for detector in config["detectors"]:
        if detector.pop("num_gpus", 0):
            detector["num_cpus"] = 0.5
    mounted = tmp_path / "etc-redline"
    mounted.mkdir()
    (mounted / "config.yaml").write_text(yaml.safe_dump(config))
    mounted.chmod(0o755)
    s3().put_object(Bucket=BUCKET, Key="data/labeled_data.csv",
                    Body=pd.read_csv(davidson).head(1500).to_csv(index=False).encode())
    upload_dir(tiny_binary_model, f"s3://{BUCKET}/models/toxic-bert")
    entrypoint = spec["entrypoint"].split("#")[0].strip().replace(mount["mountPath"], str(mounted))
    env = yaml.safe_load(spec["runtimeEnvYAML"])["env_vars"]
    jobs = JobSubmissionClient(cluster.address)
    job_id = jobs.submit_job(entrypoint=entrypoint, runtime_env={"env_vars": env})
    deadline = time.time() + 600
    while str(jobs.get_job_status(job_id)) not in ("SUCCEEDED", "FAILED", "STOPPED") and time.time() < deadline:
        time.sleep(2)
    logs = jobs.get_job_logs(job_id)
    assert str(jobs.get_job_status(job_id)) == "SUCCEEDED", logs[-4000:]
    lines = [ln for ln in logs.splitlines() if ln.strip()]
    assert any(" done in " in ln and "rows/s" in ln for ln in lines), logs  # plain progress lines
    assert "\r" not in logs and "\x1b" not in logs, "no live bar, no terminal escapes in a pod's log"
    assert "core_worker.cc" not in logs and "Traceback" not in logs, logs[-3000:]  # no Ray noise
    manifests = [k for k in s3_keys("redline-runs/") if k.endswith("/manifest.json")]
    assert len(manifests) == 1 and json.loads(read_s3(manifests[0]))["counts"]["rows_out"] == 3000
    print("\n".join(["$ kubectl logs -l job-name=redline-score"] + lines[-12:]))
