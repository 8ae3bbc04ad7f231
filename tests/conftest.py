"""Shared fixtures: one local Ray per session, tiny models built once, a real moto S3 server."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

# One intra-op thread count on every machine: a float reduction is split the same way everywhere, so a
# model the tests train in this process (and every figure drawn from it) does not depend on the core
# count or OMP_NUM_THREADS (two runs of a training could differ only in thread count and find 45 or
# 134 targets). The mutation bench asks for one (REDLINE_TEST_TORCH_THREADS) where it forks a process per
# mutant: a child forked while torch's thread pool runs crashes when it uses the pool.
TORCH_THREADS = int(os.environ.get("REDLINE_TEST_TORCH_THREADS", "2"))
torch.set_num_threads(TORCH_THREADS)

# Before anything imports ray: token auth costs seconds per init and is pointless on loopback.
os.environ["RAY_AUTH_MODE"] = "disabled"
os.environ["REDLINE_PROGRESS"] = "0"
os.environ["REDLINE_QUIET_RAY"] = "0"  # pytest captures file descriptor 2 itself
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The tests' own cache (WordNet tables, judge answers): never the user's, never shared between runs --
# unless REDLINE_TEST_STATE names a folder to keep it and the tiny models in across runs (the mutation
# bench runs the tests once per mutant: it must not retrain every model each time).
TEST_STATE = os.environ.get("REDLINE_TEST_STATE")
if TEST_STATE:
    os.environ["REDLINE_CACHE"] = str(Path(TEST_STATE) / "cache")
else:
    os.environ["REDLINE_CACHE"] = tempfile.mkdtemp(prefix="redline-test-cache-")
    atexit.register(shutil.rmtree, os.environ["REDLINE_CACHE"], ignore_errors=True)

# `pytest -n N` (pytest-xdist, for machines with cores to spare; CI's 2 cores run the suite in one
# process, see README "Order and load"): the workers share the tiny models (built once, by whichever
# worker needs one first, under a lock), and each worker's Ray keeps its own temp directory -- Ray's
# job supervisor finds "its" cluster through <temp dir>/ray_current_cluster, so two clusters sharing
# /tmp/ray send one cluster's jobs to the other.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if not XDIST_WORKER and not TEST_STATE and "REDLINE_TEST_MODELS" not in os.environ:
    os.environ["REDLINE_TEST_MODELS"] = tempfile.mkdtemp(prefix="redline-test-models-")
    atexit.register(shutil.rmtree, os.environ["REDLINE_TEST_MODELS"], ignore_errors=True)
if XDIST_WORKER:
    os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix=f"ray-{XDIST_WORKER}-", dir="/tmp")  # short: socket paths
    atexit.register(shutil.rmtree, os.environ["RAY_TMPDIR"], ignore_errors=True)
SHARED_MODELS = Path(TEST_STATE) / "models" if TEST_STATE else Path(os.environ["REDLINE_TEST_MODELS"])

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("REDLINE_SHARED_DATA", REPO.parent / "shared" / "data"))
DAVIDSON = SHARED_DATA / "offensive_tweet" / "labeled_data.csv"
DIASAFETY_VAL = SHARED_DATA / "diasafety" / "val.json"
VENV_BIN = Path(sys.executable).parent


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI (`CI` set) a skip is a failure: CI is meant to have every tool and data set the suite uses
    (Chromium, root for the cluster tests, ../shared), so a skip there hides a test that did not run.
    Tests marked `reference_env` run a reference implementation from its own environment (TextAttack,
    kept out of the project's dependencies), which CI does not build: they may skip there."""
    outcome = yield
    report = outcome.get_result()
    if (os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail")
            and "reference_env" not in item.keywords):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where it must run: {reason}"


_FILE_SECONDS: dict[str, float] = {}


def _file(nodeid: str) -> str:
    return nodeid.split("::")[0]


def pytest_runtest_logreport(report):
    name = _file(report.nodeid)
    _FILE_SECONDS[name] = _FILE_SECONDS.get(name, 0.0) + report.duration


_LEFT_BUSY: list[str] = []


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """After a file's last test (its module fixtures gone) the session's Ray must have every CPU back,
    or the next file's tests wait on what this one left. A failed Ray Data plan's actors live until
    their handles are collected (the failed tasks' callbacks and the error's frames hold them in a
    cycle), so garbage is collected first; each file that still left CPUs held is named at the end."""
    name = _file(item.nodeid)
    if nextitem is not None and _file(nextitem.nodeid) == name:
        return
    import ray

    if not ray.is_initialized():
        return
    try:
        _left_busy(ray, name)
    except Exception as err:  # noqa: BLE001 - a report, never a test's failure
        _LEFT_BUSY.append(f"{name}: not checked ({type(err).__name__}: {err})")


def _left_busy(ray, name: str) -> None:
    total = ray.cluster_resources().get("CPU", 0)
    if ray.available_resources().get("CPU", 0) >= total:
        return
    import gc

    gc.collect()
    start = time.monotonic()
    while time.monotonic() - start < 10:
        if ray.available_resources().get("CPU", 0) >= total:
            return
        time.sleep(0.2)
    alive = sorted({a["ActorClassName"] for a in ray._private.state.actors().values() if a["State"] != "DEAD"})
    _LEFT_BUSY.append(f"{name}: {ray.available_resources().get('CPU', 0)} of {total} CPUs free 10 s after its "
                      f"last test; actors alive: {', '.join(alive) or 'none'}")


def pytest_terminal_summary(terminalreporter):
    """Seconds per test file (setup, call and teardown), the slowest first: where CI's minutes go; and
    any file that left the session's Ray busy after it."""
    if _FILE_SECONDS:
        terminalreporter.section("seconds per test file")
        for name, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1]):
            if seconds >= 1:
                terminalreporter.write_line(f"{seconds:8.1f}s {name}")
    if _LEFT_BUSY:
        terminalreporter.section("files that left the session's Ray busy")
        for line in _LEFT_BUSY:
            terminalreporter.write_line(line)


# How `pytest -n N` shares the suite out: a file's tests stay on one worker (its module fixtures are
# built once), files that share a costly session fixture go together, and the longest groups start
# first so that no worker is left alone with one at the end (seconds from CI's `--durations`).
# (xdist's own `--dist loadgroup` cannot do this on pytest 9.2: pytest-dev/pytest-xdist#1386.)
XDIST_GROUPS = {"test_view.py": "test_cli.py"}  # the quickstart chain's runs (`quickstart_dir`)
LONGEST_FIRST = ("test_cluster.py", "test_dialogue_safety.py", "test_cli.py", "test_hardening.py",
                 "test_quality.py", "test_score_pipeline.py", "test_attack_pipeline.py", "test_docs.py",
                 "test_serve.py")


def _group(nodeid: str) -> str:
    name = _file(nodeid).rsplit("/", 1)[-1]
    return XDIST_GROUPS.get(name, name)


def pytest_collection_modifyitems(config, items):
    if not XDIST_WORKER:  # one process: the files' own order
        return
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_group(item.nodeid), len(rank)))  # stable: file order within a group


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):  # the scheduler keeps the collection's order (--no-loadscope-reorder)
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return ByGroup(config, log)


def free_port() -> int:
    from redline.cluster.net import free_port as pick

    return pick()


def wait_for_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


@pytest.fixture(scope="session")
def davidson() -> Path:
    return shared_file(DAVIDSON)


def shared_file(path: Path) -> Path:
    """Real data beside the checkout; in CI its absence is a failure, not a quiet skip."""
    if not path.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"shared data not found: {path} (set REDLINE_SHARED_DATA)")
        pytest.skip(f"shared data not found: {path} (set REDLINE_SHARED_DATA)")
    return path


@pytest.fixture(scope="session")
def ray_session():
    import ray

    from redline.cluster.runtime import SYSTEM_CONFIG, quiet_data_context

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=256 * 1024**2,
                 logging_level="WARNING", log_to_driver=False, _system_config=dict(SYSTEM_CONFIG))
    quiet_data_context()
    yield ray
    ray.shutdown()


def model_dir(name: str, build) -> Path:
    """Where a tiny model fixture lives: built once per test run (shared by xdist's workers) or once
    per REDLINE_TEST_STATE, whichever process needs it first building it while others wait."""
    from filelock import FileLock

    out = SHARED_MODELS / name
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out.parent / f".{name}.lock")):
        if not (out / "config.json").exists():
            staged = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{name}-"))
            build(staged)
            staged.rename(out)
    return out


@pytest.fixture(scope="session")
def sample_rows() -> list[dict]:
    from redline.pipelines.plane.corpora import CorpusConfig, read_corpus
    from redline.pipelines.quickstart import sample_path

    table = read_corpus(CorpusConfig(path=str(sample_path("toxic_sample_train.csv")), text_column="text",
                                     label_column="label", toxic_values=["toxic"], split="train"))
    return [r for r in table.to_pylist() if r["status"] == "ok"]


@pytest.fixture(scope="session")
def tiny_binary_model(sample_rows) -> Path:
    """A binary benign/toxic tiny BERT, built by the same builder the quickstart uses."""
    from redline.actors.tiny_models import TinyBert, build_tiny_classifier

    return model_dir("tiny-binary", lambda out: build_tiny_classifier(
        [r["text"] for r in sample_rows], [r["label"] for r in sample_rows], out,
        spec=TinyBert(epochs=25, hidden_size=32, num_layers=1, vocab_size=600)))


@pytest.fixture(scope="session")
def tiny_other_binary_model(sample_rows) -> Path:
    """A second binary tiny BERT (another seed): a transfer victim of a TaeBench that `tiny_binary_model`
    filtered (a filter's own classifier is refused as a victim)."""
    from redline.actors.tiny_models import TinyBert, build_tiny_classifier

    return model_dir("tiny-binary-filter-seed1", lambda out: build_tiny_classifier(
        [r["text"] for r in sample_rows], [r["label"] for r in sample_rows], out,
        spec=TinyBert(epochs=25, hidden_size=32, num_layers=1, vocab_size=600, seed=1)))


@pytest.fixture(scope="session")
def tiny_multiclass_model(sample_rows) -> Path:
    """Three Davidson-style classes: hate / offensive / neither."""
    from redline.actors.tiny_models import TinyBert, build_tiny_classifier

    labels = [(1 if "idiot" in r["text"] else 0) if r["label"] == 1 else 2 for r in sample_rows]
    return model_dir("tiny-multiclass", lambda out: build_tiny_classifier(
        [r["text"] for r in sample_rows], labels, out, label_names=("hate", "offensive", "neither"),
        spec=TinyBert(epochs=3, hidden_size=32, num_layers=1)))


@pytest.fixture(scope="session")
def tiny_multilabel_model(sample_rows) -> Path:
    """Jigsaw-style sigmoid labels: toxic, insult."""
    from redline.actors.tiny_models import TinyBert, build_tiny_classifier

    labels = [[r["label"], int(r["label"] == 1 and "you" in r["text"])] for r in sample_rows]
    return model_dir("tiny-multilabel", lambda out: build_tiny_classifier(
        [r["text"] for r in sample_rows], labels, out, label_names=("toxic", "insult"), multi_label=True,
        spec=TinyBert(epochs=3, hidden_size=32, num_layers=1)))


@contextlib.contextmanager
def moto_server(env: dict[str, str] | None = None) -> Iterator[str]:
    """A real S3-compatible server (moto in server mode) on 127.0.0.1; `env` for its settings."""
    exe = shutil.which("moto_server", path=str(VENV_BIN)) or shutil.which("moto_server")
    if exe is None:
        pytest.fail("moto_server not installed (pip install 'moto[server]')")
    port = free_port()
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=None if env is None else {**os.environ, **env})
    try:
        wait_for_port(port, timeout=30)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def moto_endpoint():
    with moto_server() as url:
        yield url


@pytest.fixture
def s3_env(moto_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return moto_endpoint


def write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    import csv

    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


@pytest.fixture(scope="session")
def tiny_mlm(sample_rows) -> Path:
    from redline.actors.tiny_models import build_tiny_mlm

    return model_dir("tiny-mlm", lambda out: build_tiny_mlm(
        [r["text"] for r in sample_rows] * 2, out, epochs=1, hidden_size=32, num_layers=1))


@pytest.fixture(scope="session")
def wordnet_ready():
    from redline.actors.attack.resources import wordnet_available

    if not wordnet_available():
        pytest.fail("WordNet missing: apt-get install wordnet-base wordnet-sense-index (setup.sh --test does this)")


def kill_after_parts(cmd: list[str], env: dict[str, str], parts: Path, n: int, timeout: float = 240) -> int:
    """Run `cmd`, kill -9 it once `n` output shards exist in `parts`; returns how many were written."""
    import signal

    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + timeout
    while time.time() < deadline and len(list(parts.glob("part-*.parquet"))) < n:
        assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
        time.sleep(0.1)
    written = len(list(parts.glob("part-*.parquet")))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    forget_dead_drivers_requests()
    return written


def forget_dead_drivers_requests() -> None:
    """After a test kills a driver of the session's Ray: Ray Data's shared autoscaling coordinator (a
    detached actor) keeps the dead driver's resource requests for up to 180 s
    (RAY_DATA_AUTOSCALING_REQUEST_EXPIRE_TIME_S), and a later run's pool cannot grow into them; the
    coordinator restarted holds none. A no-op where no run has made one."""
    import ray

    if not ray.is_initialized():
        return
    try:
        coordinator = ray.get_actor("AutoscalingCoordinator", namespace="AutoscalingCoordinator")
    except ValueError:
        return
    ray.kill(coordinator, no_restart=False)


@pytest.fixture(scope="session")
def tiny_causal_lm(sample_rows) -> Path:
    """A tiny GPT-2 (DialoGPT-style, no chat template), built by the same builder users get."""
    from redline.actors.tiny_models import build_tiny_causal_lm

    return model_dir("tiny-gpt2", lambda out: build_tiny_causal_lm(
        [r["text"] for r in sample_rows], out, epochs=1, hidden_size=32, num_layers=1, vocab_size=500))


@pytest.fixture(scope="session")
def tiny_seq2seq(sample_rows) -> Path:
    """A tiny BART (Blenderbot-style encoder-decoder) trained on consecutive sample lines."""
    from redline.actors.tiny_models import build_tiny_seq2seq

    texts = [r["text"] for r in sample_rows]
    return model_dir("tiny-bart", lambda out: build_tiny_seq2seq(
        list(zip(texts, texts[1:])), out, epochs=1, hidden_size=32, num_layers=1, vocab_size=500))


@pytest.fixture(scope="session")
def quickstart_dir(tmp_path_factory) -> Path:
    """Where `redline quickstart` writes in tests: the CLI test runs the chain there, and the viewer's
    browser test shows those runs (rerunning the chain there reuses them)."""
    return tmp_path_factory.mktemp("quickstart")


def status_and_report(run_uri: str, expect: str) -> None:
    """`redline status` summarises a finished run of any pipeline, and `redline report` renders its
    report again from the run directory alone."""
    import contextlib
    import io

    from redline.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["status", run_uri]) == 0
    assert "complete" in out.getvalue() and expect in out.getvalue(), out.getvalue()
    html = Path(run_uri) / "report.html"
    html.unlink()
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["report", run_uri]) == 0
    assert "<table>" in html.read_text()
