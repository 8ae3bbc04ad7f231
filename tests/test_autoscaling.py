"""A request no node up now can hold, on a cluster with an autoscaler (Ray's fake multi-node provider:
nodes start on demand on this machine): it waits, saying so, while the autoscaler adds a node, and is
refused at once when no node type can ever hold it. The cluster is stopped by process group, never
`ray stop` (which would stop every Ray on the machine)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from conftest import VENV_BIN, free_port, wait_for_port

pytestmark = pytest.mark.slow

SAMPLE = Path(__file__).resolve().parents[1] / "pipelines" / "samples" / "toxic_sample_train.csv"


def fake_cluster_config(gcs: int) -> dict:
    """An autoscaling config for Ray's fake provider: a head with no CPU, and node types for CPU work
    and for one GPU (never more)."""
    return {
        "cluster_name": "redline-fake", "max_workers": 2, "upscaling_speed": 1.0, "idle_timeout_minutes": 5,
        "provider": {"type": "fake_multinode", "gcs_address": f"127.0.0.1:{gcs}", "disable_launch_config_check": True,
                     "disable_node_updaters": True},
        "docker": {}, "auth": {"ssh_user": "ubuntu"},
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0},
            "cpu": {"resources": {"CPU": 2, "object_store_memory": 100_000_000}, "node_config": {},
                    "min_workers": 0, "max_workers": 1},
            "gpu": {"resources": {"CPU": 1, "GPU": 1, "object_store_memory": 100_000_000}, "node_config": {},
                    "min_workers": 0, "max_workers": 1},
        },
        "head_node_type": "ray.head.default", "file_mounts": {}, "cluster_synced_files": [],
        "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": [], "initialization_commands": [],
        "setup_commands": [], "head_setup_commands": [], "worker_setup_commands": [], "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


@pytest.fixture(scope="module")
def autoscaling_cluster():
    root = Path(tempfile.mkdtemp(prefix="rl-as-"))  # short: Ray's socket paths live under it
    gcs = free_port()
    (root / "autoscaling.json").write_text(json.dumps(fake_cluster_config(gcs)))
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}", "RAY_AUTH_MODE": "disabled",
           "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"}
    env.pop("RAY_ADDRESS", None)
    ports = [f"--{name}={free_port()}" for name in (
        "dashboard-port", "ray-client-server-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
        "metrics-export-port", "runtime-env-agent-port", "node-manager-port", "object-manager-port")]
    log = open(root / "head.log", "wb")
    head = subprocess.Popen(
        [str(VENV_BIN / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={gcs}",
         "--num-cpus=0", f"--autoscaling-config={root / 'autoscaling.json'}", f"--temp-dir={root / 'ray'}",
         "--include-dashboard=false", "--object-store-memory=100000000", "--disable-usage-stats", *ports],
        env=env, cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_port(gcs, timeout=120)
        yield {"root": root, "env": {**env, "RAY_ADDRESS": f"127.0.0.1:{gcs}", "REDLINE_PROGRESS": "0",
                                     "REDLINE_PROGRESS_INTERVAL": "2"}}
    finally:
        # the fake nodes are the autoscaler's children, in the head's process group
        # `ray start --block` takes longer than 20 s to stop gracefully: 3 s, then whatever is left is killed
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=3)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        time.sleep(1)
        try:
            os.killpg(head.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        shutil.rmtree(root, ignore_errors=True)


def run_score(cluster: dict, name: str, detector: dict, timeout: float = 240) -> subprocess.CompletedProcess:
    root = cluster["root"]
    config = {"corpus": {"path": str(SAMPLE), "text_column": "text", "label_column": "label",
                         "toxic_values": ["toxic"], "dataset": "sample"},
              "detectors": [detector], "output": str(root / "runs"), "run_name": name}
    (root / f"{name}.yaml").write_text(yaml.safe_dump(config))
    return subprocess.run([str(VENV_BIN / "redline"), "run", "score", "--config", str(root / f"{name}.yaml")],
                          env=cluster["env"], cwd=root, capture_output=True, text=True, timeout=timeout)


def test_a_request_waits_for_the_autoscaler_and_one_no_node_type_holds_is_refused(autoscaling_cluster):
    # The head has no CPU: the run waits while the autoscaler starts a CPU node, then completes.
    done = run_score(autoscaling_cluster, "waits", {"name": "p", "kind": "profanity-check", "num_cpus": 1})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "waiting for the autoscaler to add a node for the task reading the inputs (num_cpus 1" in done.stderr
    assert " since " in done.stderr and "joined after" in done.stderr
    manifest = json.loads((autoscaling_cluster["root"] / "runs" / "waits" / "manifest.json").read_text())
    assert manifest["state"] == "complete" and manifest["counts"]["rows_out"] > 0

    # No node type has 8 CPUs: refused with one line once the autoscaler has launched nothing for it.
    started = time.monotonic()
    refused = run_score(autoscaling_cluster, "refused", {"name": "p", "kind": "profanity-check", "num_cpus": 8})
    assert refused.returncode == 2, refused.stdout[-3000:] + refused.stderr[-3000:]
    error = [ln for ln in refused.stderr.splitlines() if ln.startswith("error:")]
    assert len(error) == 1 and "num_cpus 8" in error[0] and "autoscaler adds no node for it" in error[0], refused.stderr
    assert "Traceback" not in refused.stderr
    assert time.monotonic() - started < 90


def test_the_second_autoscalers_state_is_read_from_the_control_service(monkeypatch):
    """Ray's second autoscaler (RAY_enable_autoscaler_v2) reports to the cluster's control service,
    not the key-value store. Its fake provider cannot start from Ray's wheel (the provider's default
    config is not shipped), so its reply is built here, with Ray's own message type."""
    import ray._raylet
    import ray.experimental.internal_kv as kv
    from ray.core.generated.autoscaler_pb2 import GetClusterStatusReply

    from redline.cluster import autoscaling

    reply = GetClusterStatusReply()
    reply.autoscaling_state.autoscaler_state_version = 7
    reply.autoscaling_state.pending_instance_requests.add(ray_node_type_name="gpu", count=2)
    reply.autoscaling_state.pending_instances.add(instance_id="i-1", ray_node_type_name="gpu")

    class Gcs:
        address = "127.0.0.1:1"

        def __init__(self, address: str = "") -> None:
            pass

        def get_cluster_status(self) -> bytes:
            return reply.SerializeToString()

    monkeypatch.setattr(ray._raylet, "GcsClient", Gcs)
    monkeypatch.setattr(kv, "internal_kv_get_gcs_client", lambda: Gcs())
    seen = autoscaling._status_v2()
    assert seen == autoscaling.Status(update=7.0, launching=2, pending=frozenset({"i-1"}))
    assert seen.launched_since(autoscaling.Status(update=6.0, launching=0, pending=frozenset()))
    reply.autoscaling_state.autoscaler_state_version = 0  # none has reported yet: awaited, then none
    with pytest.raises(autoscaling.Unreported):
        autoscaling._status_v2()


def test_a_monitor_that_has_just_started_is_awaited_never_taken_for_no_autoscaler(monkeypatch):
    """Ray's first autoscaler: a monitor publishes its load metrics a few seconds before its first
    update, and that update may name no node yet. A run that asked in that window was told the cluster
    had no autoscaler (seen in a full suite run: the fake cluster's first run refused at once)."""
    import ray.experimental.internal_kv as kv

    from redline.cluster import autoscaling

    now = time.time()
    metrics_only = {"time": now, "load_metrics_report": {}, "monitor_pid": 1}
    no_nodes = {**metrics_only, "autoscaler_report": {"node_type_mapping": {}, "pending_launches": {}}}
    read_only = {**metrics_only, "autoscaler_report": {"node_type_mapping": {"abc": "node_abc"}}}
    launching = {**metrics_only, "autoscaler_report": {"node_type_mapping": {"abc": "ray.head.default"},
                                                       "pending_launches": {"cpu": 1}, "pending_nodes": []}}
    published: list[dict | None] = [None]
    monkeypatch.setattr(kv, "_internal_kv_get", lambda key: None if published[0] is None
                        else json.dumps(published[0]).encode())
    for early in (None, metrics_only, no_nodes):
        published[0] = early
        with pytest.raises(autoscaling.Unreported):
            autoscaling._status_v1()
    published[0] = read_only  # a plain `ray start` cluster's read-only autoscaler: none that launches nodes
    assert autoscaling._status_v1() is None
    published[0] = launching
    assert autoscaling._status_v1() == autoscaling.Status(update=now, launching=1, pending=frozenset())
    published[0] = {**launching, "time": now - autoscaling.STALE_S - 1}  # an autoscaler that stopped reporting
    assert autoscaling._status_v1() is None

    monkeypatch.setattr("ray.autoscaler.v2.utils.is_autoscaler_v2", lambda fetch_from_server=False: False)
    answers = iter([metrics_only, no_nodes, launching])
    monkeypatch.setattr(kv, "_internal_kv_get", lambda key: json.dumps(next(answers)).encode())
    monkeypatch.setattr(autoscaling.time, "sleep", lambda s: None)
    assert autoscaling.status(wait_s=60).launching == 1  # awaited through both early reports
