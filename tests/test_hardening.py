"""Hardening, round 2: every input a user or a bucket controls is bounded, typed and kept inside its
room. Each class is probed with several cases, each asserting the exact outcome (exit code or HTTP
status, the one line, nothing written outside the run directory or cache)."""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from test_bad_inputs import expect_error, files, score, score_config, write

from redline.cli import main

from conftest import write_csv

# --------------------------------------------------------------------------------------------
# Listings turned into paths: S3 object keys, local folders


BAD_KEYS = [
    ("m/../../escaped.txt", "'..' segment"),
    ("m//etc/escaped.txt", "it starts with '/'"),
    ("m/./x.txt", "'.' or '..' segment"),
    ("m/a\\..\\..\\escaped.txt", "backslash or a control character"),
    ("m/tab\there.txt", "backslash or a control character"),
    ("m/" + "d/" * 40 + "deep.txt", "folders deep"),
    ("m/" + "x" * 300, "longer than 255 bytes"),
    ("m/..", "'..' segment"),
]


@pytest.mark.parametrize("key,why", BAD_KEYS, ids=[k[0][:30] for k in BAD_KEYS])
def test_an_object_key_never_leaves_the_artifact_cache(s3_env, tmp_path, monkeypatch, key, why):
    import boto3

    from redline.cluster.artifacts import cache_root, local_path
    from redline.errors import RedlineError

    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path / "cache"))
    s3 = boto3.client("s3", endpoint_url=s3_env)
    bucket = f"keys-{abs(hash(key)) % 10**8}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="m/config.json", Body=b"{}")
    s3.put_object(Bucket=bucket, Key=key, Body=b"planted")
    before = files(tmp_path)
    with pytest.raises(RedlineError) as err:
        local_path(f"s3://{bucket}/m")
    message = str(err.value)
    assert message.startswith("refusing object key") and why in message and "\n" not in message
    assert files(tmp_path) == before  # nothing fetched, nothing left behind, inside the cache or out
    assert not (tmp_path / "escaped.txt").exists() and not list(cache_root().glob("*/m"))


def test_a_clean_prefix_is_fetched_once_and_a_file_folder_clash_is_refused(s3_env, tmp_path, monkeypatch):
    import boto3

    from redline.cluster.artifacts import local_path
    from redline.errors import RedlineError

    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path / "cache"))
    s3 = boto3.client("s3", endpoint_url=s3_env)
    s3.create_bucket(Bucket="clean")
    for key in ("m/config.json", "m/sub/weights.bin", "m/folder/"):
        s3.put_object(Bucket="clean", Key=key, Body=b"" if key.endswith("/") else key.encode())
    home = Path(local_path("s3://clean/m"))
    assert (home / "sub" / "weights.bin").read_bytes() == b"m/sub/weights.bin"
    assert not (home / "folder").exists()  # an empty "folder" marker is not a file
    s3.create_bucket(Bucket="clash")
    s3.put_object(Bucket="clash", Key="m/a", Body=b"file")
    s3.put_object(Bucket="clash", Key="m/a/b", Body=b"under the file")
    with pytest.raises(RedlineError, match="both a file and a folder"):
        local_path("s3://clash/m")


def test_an_upload_never_follows_a_link_or_sends_a_name_that_cannot_come_back(s3_env, tmp_path):
    import boto3

    from redline.cluster.artifacts import upload_dir
    from redline.errors import RedlineError

    s3 = boto3.client("s3", endpoint_url=s3_env)
    s3.create_bucket(Bucket="uploads")
    secret = tmp_path / "secret.txt"
    secret.write_text("private")
    for name, make in [("file link", lambda d: (d / "weights.bin").symlink_to(secret)),
                       ("folder link", lambda d: (d / "sub").symlink_to(tmp_path)),
                       ("backslash", lambda d: (d / "a\\b.txt").write_text("x")),
                       ("control character", lambda d: (d / "a\x07b.txt").write_text("x"))]:
        model = tmp_path / f"model-{name.replace(' ', '-')}"
        model.mkdir()
        (model / "config.json").write_text("{}")
        make(model)
        with pytest.raises(RedlineError, match="refusing"):
            upload_dir(model, f"s3://uploads/{model.name}")
        assert "Contents" not in s3.list_objects_v2(Bucket="uploads", Prefix=model.name), name


@pytest.mark.parametrize("rel", ["", "/abs", "a//b", "a/../b", "..", ".", "a\\b", "a\x00b", "x" * 1025,
                                 "a/" * 33 + "b"])
def test_relative_paths_from_listings_are_checked(rel):
    from redline.cluster.paths import relative_parts
    from redline.errors import RedlineError

    with pytest.raises(RedlineError, match="^refusing"):
        relative_parts(rel, "test path")


def test_reading_below_a_root_never_follows_links(tmp_path):
    from redline.cluster.paths import NotRegular
    from redline.cluster.storage import read_below

    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    (root / "run" / "ok.txt").write_text("ok")
    (tmp_path / "outside.txt").write_text("secret")
    (root / "run" / "link.txt").symlink_to(tmp_path / "outside.txt")
    (root / "linkdir").symlink_to(tmp_path)
    (root / "run" / "folder").mkdir()
    assert read_below(str(root), ["run", "ok.txt"]) == b"ok"
    for parts in (["run", "link.txt"], ["linkdir", "outside.txt"], ["run", "folder"]):
        with pytest.raises(NotRegular):
            read_below(str(root), parts)


# --------------------------------------------------------------------------------------------
# The viewer: only regular files of runs, the Host rule, signed sessions


@pytest.fixture
def view_root(tmp_path):
    """A small runs location with a run, a folder that is not a run, and links planted everywhere."""
    root = tmp_path / "runs"
    run = root / "run-a"
    (run / "plots").mkdir(parents=True)
    (run / "attempts").mkdir()
    (run / "manifest.json").write_text(json.dumps({"pipeline": "score", "run_name": "run-a", "state": "complete"}))
    (run / "report.md").write_text("# report\n")
    (run / "report.html").write_text("<p>report</p>")
    pq.write_table(pa.table({"id": ["1"], "text": ["hello"]}), run / "attempts" / "part-00000.parquet")
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "notes.txt").write_text("TOP SECRET")
    (secret / "report.md").write_text("# TOP SECRET report")
    pq.write_table(pa.table({"id": ["s"], "text": ["TOP SECRET"]}), secret / "part-00000.parquet")
    (secret / "manifest.json").write_text(json.dumps({"pipeline": "score", "run_name": "x", "state": "complete"}))
    (run / "plots" / "leak.txt").symlink_to(secret / "notes.txt")
    (run / "notes.txt").symlink_to(secret / "notes.txt")
    (run / "attempts" / "part-00001.parquet").symlink_to(secret / "part-00000.parquet")
    (run / "linked").symlink_to(secret)
    (root / "linked-run").symlink_to(secret)
    not_a_run = root / "not-a-run"
    not_a_run.mkdir()
    (not_a_run / "notes.txt").write_text("not a run's file")
    link_run = root / "run-b"
    link_run.mkdir()
    (link_run / "manifest.json").symlink_to(secret / "manifest.json")
    return root


def _client(root, **kwargs):
    from starlette.testclient import TestClient

    from redline.view.app import build_app

    return TestClient(build_app(str(root), **kwargs), base_url="http://127.0.0.1:8765")


def test_the_viewer_serves_only_regular_files_of_runs(view_root):
    with _client(view_root) as c:
        assert c.get("/file", params={"id": "run-a", "name": "report.html"}).status_code == 200
        for params in ({"id": "run-a", "name": "plots/leak.txt"}, {"id": "run-a", "name": "notes.txt"},
                       {"id": "linked-run", "name": "notes.txt"}, {"id": "not-a-run", "name": "notes.txt"},
                       {"id": "run-b", "name": "report.md"}, {"id": "run-a", "name": "linked/notes.txt"}):
            resp = c.get("/file", params=params)
            assert resp.status_code in (400, 404) and "TOP SECRET" not in resp.text and "not a run's" not in resp.text, \
                (params, resp.status_code, resp.text)
        runs = {r["id"] for r in c.get("/api/runs").json()["runs"]}
        assert runs == {"run-a"}  # a linked run folder and a linked manifest are not runs of this location
        page = c.get("/run", params={"id": "run-a"})
        assert page.status_code == 200 and "TOP SECRET" not in page.text
        assert ">linked<" not in page.text  # a linked folder's Parquet is not one of the run's tables
        rows = c.get("/run", params={"id": "run-a", "table": "attempts"})
        assert "hello" in rows.text and "TOP SECRET" not in rows.text
        assert c.get("/run", params={"id": "linked-run"}).status_code == 404


@pytest.mark.parametrize("host,status", [("127.0.0.1:8765", 200), ("localhost:8765", 200), ("[::1]:8765", 200),
                                         ("evil.example.com:8765", 421), ("127.0.0.1.nip.io", 421),
                                         ("localhost.evil.example", 421), ("runs.example.org", 200)])
def test_the_viewer_answers_only_its_own_host_names(view_root, host, status):
    with _client(view_root, allowed_hosts=("runs.example.org",)) as c:
        for path in ("/", "/api/runs", "/healthz", "/file?id=run-a&name=report.html"):
            assert c.get(path, headers={"Host": host}).status_code == status, (host, path)


def test_the_session_cookie_is_signed_and_expires_never_the_key(view_root, monkeypatch):
    import hashlib

    from redline.view import app as view_app

    with _client(view_root, key="s3cret") as c:
        opened = c.get("/api/runs", params={"key": "s3cret"}, follow_redirects=False)
        cookie = opened.cookies.get(view_app.COOKIE)
        assert cookie and hashlib.sha256(b"s3cret").hexdigest() not in cookie and "s3cret" not in cookie
        assert c.get("/api/runs").status_code == 200
        c.cookies.clear()
        c.cookies.set(view_app.COOKIE, hashlib.sha256(b"s3cret").hexdigest())  # the old, guessable cookie
        assert c.get("/api/runs").status_code == 401
        expires, mac = cookie.split(".")
        c.cookies.clear()
        c.cookies.set(view_app.COOKIE, f"{int(expires) + 3600}.{mac}")  # a longer life it was not signed for
        assert c.get("/api/runs").status_code == 401
    with _client(view_root, key="s3cret") as other:  # another process's secret: yesterday's cookie is void
        other.cookies.set(view_app.COOKIE, cookie)
        assert other.get("/api/runs").status_code == 401
    monkeypatch.setattr(view_app, "SESSION_S", -1.0)
    with _client(view_root, key="s3cret") as c:
        c.get("/api/runs", params={"key": "s3cret"}, follow_redirects=False)
        assert c.get("/api/runs").status_code == 401  # expired at once


def test_the_word_diff_is_bounded_and_escapes_every_word():
    from redline.view.diff import MAX_DIFF_CELLS, word_diff

    before, after = word_diff("keep <script>alert(1)</script> this", "keep <b onmouseover=x>bold</b> this")
    assert "<script>" not in before + after and "&lt;script&gt;" in before and "&lt;b" in after
    assert before.startswith("keep <del>") and after.endswith("</mark> this")
    a = " ".join(f"w{i}" for i in range(4000))
    b = " ".join(f"v{i}" for i in range(4000))
    assert 4000 * 4000 > MAX_DIFF_CELLS
    started = time.perf_counter()
    left, right = word_diff(f"same start {a} same end", f"same start {b} same end")
    assert time.perf_counter() - started < 5  # linear: a quadratic diff of these took minutes
    assert left.startswith("same start <del>w0") and left.endswith("w3999</del> same end")
    assert right.startswith("same start <mark>v0") and right.endswith("v3999</mark> same end")


# --------------------------------------------------------------------------------------------
# Configs that are not what they claim: alias bombs, types, degenerate values


BOMB = "\n".join(["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
                 + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 7)])


def bomb_in(field_yaml: str) -> str:
    return field_yaml.replace("BOMB", "*a6")


YAML_CASES = [
    ("alias bomb in a provider's free-form fields", lambda t: BOMB + "\n" + yaml.safe_dump(score_config(t)) + bomb_in(
        "judge_extra: BOMB\n"), "config expands to over 100,000 values"),
    ("alias bomb as a detector option", lambda t: BOMB + "\n" + yaml.safe_dump({**score_config(t), "detectors": []})
     .replace("detectors: []", "detectors:\n- name: b\n  kind: bedrock\n  additional_fields: {x: *a6}"),
     "config expands to over 100,000 values"),
    ("recursive alias", lambda t: "corpus: &c {path: *c}\n", "an alias refers to the node that holds it"),
    ("nesting deeper than the parser holds", lambda t: "corpus: " + "[" * 3000 + "]" * 3000 + "\n",
     "nested too deeply"),
    ("a config larger than 1 MB", lambda t: yaml.safe_dump(score_config(t)) + "# " + "x" * (1 << 20) + "\n",
     "over the limit of 1,048,576"),
]


@pytest.mark.parametrize("case,text,fragment", YAML_CASES, ids=[c[0] for c in YAML_CASES])
def test_configs_are_bounded_before_they_are_expanded(case, text, fragment, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = expect_error(capsys, tmp_path, ["run", "score", "-c", write(tmp_path, text(tmp_path))], fragment)
    assert len(err) < 500
    assert not (tmp_path / "runs").exists()


def _corpus(t: Path, name: str, rows: list[dict], **mapping) -> dict:
    path = t / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"path": str(path), "text_column": "text", "label_column": "label", "toxic_values": [1], **mapping}


COLUMN_CASES = [
    ("label holding lists", lambda t: _corpus(t, "c.jsonl", [{"text": "a", "label": [1, 0]}, {"text": "b", "label": [0]}]),
     "column 'label' (label_column) holds list<item: int64> values (row 0: '[1, 0]')"),
    ("label holding objects", lambda t: _corpus(t, "c.jsonl", [{"text": "a", "label": {"toxic": 1}}]),
     "column 'label' (label_column) holds struct"),
    ("label of mixed types", lambda t: _corpus(t, "c.jsonl", [{"text": "a", "label": 1}, {"text": "b", "label": [0]}]),
     "column 'label' (label_column) holds values of mixed types"),
    ("text of numbers", lambda t: {"path": str(write_csv(t / "n.csv", ["text", "label"], [[1, 1], [2, 0]])),
                                   "text_column": "text", "label_column": "label", "toxic_values": [1]},
     "column 'text' (text_column) holds int64 values (row 0: '1'), not text"),
    ("text of nulls", lambda t: _corpus(t, "c.jsonl", [{"text": None, "label": 1}, {"text": None, "label": 0}]),
     "column 'text' (text_column) holds no values (every row is empty)"),
    ("text of booleans", lambda t: _corpus(t, "c.jsonl", [{"text": True, "label": 1}]), "holds bool values"),
    ("context of numbers", lambda t: _corpus(t, "c.jsonl", [{"text": "a", "ctx": 3, "label": 1}], context_column="ctx"),
     "column 'ctx' (context_column) holds int64 values"),
    ("several label columns holding text", lambda t: _corpus(t, "c.jsonl", [{"text": "a", "x": "yes", "y": 1}],
                                                             label_column=["x", "y"], toxic_values=None),
     "column 'x' (label_column) holds string values (row 0: 'yes'), not 0/1 numbers"),
]


@pytest.mark.parametrize("case,corpus,fragment", COLUMN_CASES, ids=[c[0] for c in COLUMN_CASES])
def test_every_corpus_column_is_checked_against_its_role(case, corpus, fragment, capsys, tmp_path, monkeypatch,
                                                        ray_session):  # the corpus is read on a worker
    monkeypatch.chdir(tmp_path)
    expect_error(capsys, tmp_path, score(tmp_path, score_config(tmp_path, corpus=corpus(tmp_path))), fragment)


DEGENERATE_CASES = [
    ("empty keyword pattern", {"detectors": [{"name": "k", "kind": "keywords", "patterns": [""]}]},
     "patterns.0: String should have at least 1 character"),
    ("a pattern that matches the empty string", {"detectors": [{"name": "k", "kind": "keywords", "patterns": ["a*"]}]},
     "matches the empty string, so every text would be toxic"),
    ("an alternation with an empty branch", {"detectors": [{"name": "k", "kind": "keywords", "patterns": ["idiot|"]}]},
     "matches the empty string"),
    ("empty detector name", {"detectors": [{"name": "", "kind": "profanity-check"}]}, "name"),
    ("empty text column", {"corpus": {"path": "c.csv", "text_column": "", "label_column": "label"}},
     "corpus.text_column: String should have at least 1 character"),
    ("empty label column list", {"corpus": {"path": "c.csv", "text_column": "text", "label_column": []}},
     "corpus.label_column: List should have at least 1 item"),
    ("empty toxic values", {"corpus": {"path": "c.csv", "text_column": "text", "label_column": "label",
                                       "toxic_values": []}}, "corpus.toxic_values: List should have at least 1 item"),
    ("empty corpus path", {"corpus": {"path": "", "text_column": "text"}}, "corpus.path"),
    ("zero shard size", {"shard_size": 0}, "shard_size: Input should be greater than 0"),
    ("zero batch size", {"detectors": [{"name": "p", "kind": "profanity-check", "batch_size": 0}]}, "batch_size"),
    ("empty output", {"output": ""}, "output: String should have at least 1 character"),
]


@pytest.mark.parametrize("case,over,fragment", DEGENERATE_CASES, ids=[c[0] for c in DEGENERATE_CASES])
def test_empty_and_degenerate_settings_are_refused_at_load(case, over, fragment, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    expect_error(capsys, tmp_path, score(tmp_path, score_config(tmp_path, **over)), fragment)


@pytest.mark.parametrize("config,fragment", [
    ({"lists": []}, "lists: List should have at least 1 item"),
    ({"lists": [{"name": "mal", "searches": []}]}, "searches: List should have at least 1 item"),
    ({"trigger_length": 0}, "trigger_length: Input should be greater than 0"),
    ({"top_g": -1}, "top_g"),
])
def test_degenerate_search_settings_are_refused(config, fragment):
    from redline.cluster.config import validate_config
    from redline.errors import RedlineError
    from redline.pipelines.egregious import EgregiousConfig

    with pytest.raises(RedlineError, match=fragment.replace("(", r"\(")):
        validate_config(EgregiousConfig, {"models": [{"name": "m", "path": "x"}], **config})


def test_force_never_clears_through_a_link_and_never_reports_a_failed_clear_complete(capsys, tmp_path, ray_session,
                                                                                     monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = score_config(tmp_path)
    assert main(score(tmp_path, cfg, "--run-name", "real")) == 0
    real = tmp_path / "runs" / "real"
    kept = sorted(p.name for p in real.rglob("*"))
    (tmp_path / "runs" / "linked").symlink_to(real)
    expect_error(capsys, tmp_path, score(tmp_path, cfg, "--run-name", "linked", "--force"),
                 f"{tmp_path / 'runs' / 'linked'} is a symbolic link (to {real})")
    assert sorted(p.name for p in real.rglob("*")) == kept  # the target is untouched
    (tmp_path / "runs" / "m").mkdir()
    (tmp_path / "runs" / "m" / "manifest.json").symlink_to(real / "manifest.json")
    expect_error(capsys, tmp_path, score(tmp_path, cfg, "--run-name", "m", "--force"), "manifest.json is a symbolic link")
    # a clear that cannot finish is an error; the old run is not reported complete
    locked = tmp_path / "runs" / "real" / "predictions"
    if os.geteuid() != 0:  # root ignores directory permissions
        locked.chmod(0o500)
        try:
            assert main(score(tmp_path, cfg, "--run-name", "real", "--force")) == 2
            assert "--force could not clear" in capsys.readouterr().err
        finally:
            locked.chmod(0o700)


def test_a_huge_csv_field_names_the_setting_that_lifts_it(capsys, tmp_path, ray_session, monkeypatch):
    monkeypatch.chdir(tmp_path)
    huge = tmp_path / "huge.csv"
    write_csv(huge, ["text", "label"], [["x" * (3 << 20), 1], ["hello", 0], ["you idiot", 1]])
    corpus = {"path": str(huge), "text_column": "text", "label_column": "label", "toxic_values": [1], "max_field_mb": 1}
    expect_error(capsys, tmp_path, score(tmp_path, score_config(tmp_path, corpus=corpus)),
                 "a CSV value is longer than 1 MB, the most the reader takes in one field; set corpus.max_field_mb")
    assert main(score(tmp_path, score_config(tmp_path, corpus={**corpus, "max_field_mb": 8}))) == 0
    manifests = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*/manifest.json")]
    counts = next(m for m in manifests if m["state"] == "complete")["counts"]
    assert counts["rows_in"] == 3 and counts["rejected"] == {"text longer than corpus.max_chars=20000": 1}


# --------------------------------------------------------------------------------------------
# The service lifecycle: a stale state file never signals someone else's process


def test_serve_stop_and_status_with_a_stale_state_and_a_reused_pid(tmp_path, monkeypatch, capsys):

    monkeypatch.setenv("REDLINE_STATE_DIR", str(tmp_path))
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        # the server crashed; its PID now belongs to an unrelated process (the bystander)
        state = {"port": 18765, "host": "127.0.0.1", "url": "http://127.0.0.1:18765", "app_name": "redline",
                 "pid": bystander.pid, "process": "12345 redline serve --config old.yaml", "mode": "local",
                 "ray_address": "127.0.0.1:1"}
        (tmp_path / "serve-18765-redline.json").write_text(json.dumps(state))
        # and a cluster-mode server on a cluster that is gone
        gone = {**state, "port": 18766, "pid": None, "process": None, "mode": "cluster", "url": "http://127.0.0.1:18766"}
        (tmp_path / "serve-18766-redline.json").write_text(json.dumps(gone))
        started = time.time()
        assert main(["serve", "status"]) == 0
        out = capsys.readouterr().out
        assert time.time() - started < 20
        assert "not running (stale state file removed)" in out and "unreachable" in out
        (tmp_path / "serve-18765-redline.json").write_text(json.dumps(state))
        capsys.readouterr()
        assert main(["serve", "stop", "--port", "18765"]) == 2  # nothing was stopped: never "stopped", exit 0
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: the state file for http://127.0.0.1:18765 was stale") and "nothing was stopped" in err
        assert len(err.splitlines()) == 1
        assert bystander.poll() is None  # never signalled
        assert not (tmp_path / "serve-18765-redline.json").exists()
    finally:
        bystander.kill()
        bystander.wait()


def test_process_identity_tells_a_reused_pid_apart():
    from redline.serve.runner import _ours, process_identity

    me = process_identity(os.getpid())
    assert me and str(Path(sys.executable).name) in me
    assert _ours({"pid": os.getpid(), "process": me})
    assert not _ours({"pid": os.getpid(), "process": me.replace(me.split()[0], "1")})  # another start time
    assert process_identity(2**22 + 12345) is None and not _ours({"pid": None, "process": None})


# --------------------------------------------------------------------------------------------
# Remote services that ask for long waits, or answer nonsense


class _Service(http.server.ThreadingHTTPServer):
    """A tiny OpenAI-like endpoint: `mode` says how every POST is answered."""

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that hangs up mid-answer (redline cutting an oversize one) is what these tests
        make happen; the server's own traceback for it would land in the CLI's captured stderr."""

    def __init__(self, mode: str) -> None:
        self.mode, self.requests = mode, 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("content-length", 0)))
                outer.requests += 1
                headers = {"content-type": "application/json"}
                mode, _, arg = outer.mode.partition(":")
                if mode == "401":
                    status, body = 401, b'{"error": {"message": "Incorrect API key provided"}}'
                elif mode == "html":
                    status, body = 200, b"<html>not json</html>"
                elif mode == "crash":
                    status, body = 200, json.dumps({"choices": "not a list"}).encode()
                elif mode == "empty":
                    status, body = 200, b'{"choices": []}'
                elif mode == "say":  # a well-formed completion saying `arg`
                    status, body = 200, _completion(arg)
                elif mode == "big":  # a well-formed "Yes" padded to `arg` bytes
                    status, body = 200, _completion("Yes " + "x" * int(arg))
                elif mode == "gzip":  # `arg` bytes of completion, gzip-compressed to a small body
                    import gzip

                    status, body = 200, gzip.compress(_completion("Yes" + " " * int(arg)))
                    headers["content-encoding"] = "gzip"
                else:
                    status, body = 429, b'{"error": {"message": "slow down"}}'
                    headers["retry-after"] = arg
                self.send_response(status)
                for k, v in {**headers, "content-length": str(len(body))}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


def _completion(text: str) -> bytes:
    return json.dumps({"id": "c", "object": "chat.completion", "created": 0, "model": "judge",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}).encode()


def _chat_client(service: _Service, **kwargs):
    from redline.actors.providers import ChatModel
    from redline.actors.providers.client import ChatClient

    provider = ChatModel(provider="openai", model="m", base_url=service.url).build_provider()
    return ChatClient(provider, **kwargs)


def test_retry_after_is_capped_and_a_service_that_keeps_asking_fails_in_one_line(monkeypatch):
    from redline.actors.providers.base import SamplingParams
    from redline.cluster.net import WaitTooLong

    monkeypatch.setenv("OPENAI_API_KEY", "x")
    service = _Service("429:100000")
    client = _chat_client(service, max_retries=5, backoff_s=0.01, max_retry_after_s=0.2, concurrency=1)
    started = time.time()
    with pytest.raises(WaitTooLong) as err:
        client.ask([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=2))
    assert time.time() - started < 5  # three capped waits of 0.2 s, not 28 hours
    assert "asked to wait 100,000 s (HTTP 429, Retry-After 100000 s) 3 times in a row, over the cap of 0.2 s" in str(err.value)
    assert service.requests == 3
    service.shutdown()


def test_a_pause_reaches_threads_already_waiting_for_their_slot():
    from redline.cluster.net import RateLimiter

    limiter = RateLimiter(rate=2.0)  # slots every 0.5 s
    limiter.acquire()
    woke: list[float] = []
    started = time.monotonic()
    waiter = threading.Thread(target=lambda: (limiter.acquire(), woke.append(time.monotonic() - started)))
    waiter.start()
    time.sleep(0.1)  # the waiter now sleeps until its slot at ~0.5 s
    limiter.pause(1.5)  # a 429 seen by another thread: everyone waits until ~1.6 s
    waiter.join()
    assert woke[0] >= 1.5, woke


@pytest.mark.parametrize("mode,last", [("html", r"the answer's body is not JSON .*"), ("crash", r".+")])
def test_a_service_that_answers_garbage_stops_the_client_after_a_few_requests(mode, last, monkeypatch):
    from redline.actors.providers.base import SamplingParams
    from redline.errors import RedlineError

    monkeypatch.setenv("OPENAI_API_KEY", "x")
    service = _Service(mode)
    client = _chat_client(service, max_retries=1, backoff_s=0.01, concurrency=2, max_failed_in_row=3)
    with pytest.raises(RedlineError, match=rf"failed \d+ requests in a row \(last: {last}, after 1 retries\)"):
        client.ask_many([[{"role": "user", "content": f"t{i}"}] for i in range(40)], SamplingParams(max_tokens=2))
    assert service.requests < 20  # it stopped; it did not grind through all 40 texts twice
    service.shutdown()


@pytest.fixture(scope="module")
def attack_run(quickstart_dir, ray_session):
    """A finished attack run for the judge stages to read (only read): the quickstart's, which the CLI's
    quickstart test runs too (whichever runs second reuses it)."""
    assert main(["quickstart", "attack", "--output", str(quickstart_dir)]) == 0
    return quickstart_dir / "quickstart-attack"


@pytest.mark.parametrize("mode,code,fragment", [
    ("401", 2, "answered HTTP 401 (Incorrect API key provided); fix the model settings"),
    ("html", 2, "failed 3 requests in a row"),
])
def test_a_failing_judge_is_one_line_never_a_traceback(mode, code, fragment, attack_run, ray_session, tmp_path,
                                                      monkeypatch):
    """Run as a real command, so what the user sees is exactly what is asserted: one line on stderr
    (on the session's Ray, as a command run on a cluster). A judge refused at once, and one that fails
    in a row; the other ways a client gives up (a server that drops the connection, a Retry-After over
    the cap) raise the same error from the client, tested above in-process."""
    service = _Service(mode)
    config = {"attacks": [str(attack_run)], "grammar": None, "naturalness": None,
              "judge": {"base_url": service.url, "model": "judge", "cache_dir": None, "max_retries": 1,
                        "backoff_s": 0.01, "concurrency": 2, "max_retry_after_s": 0.2,
                        "max_failed_in_row": 3},
              "classifier": {"name": "c", "kind": "profanity-check", "num_cpus": 0.25},
              "output": str(tmp_path / "runs")}
    path = tmp_path / "tb.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "OPENAI_API_KEY": "x", "REDLINE_PROGRESS": "0",
           "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    env.pop("REDLINE_QUIET_RAY", None)
    proc = subprocess.run([str(Path(sys.executable).parent / "redline"), "run", "taebench", "-c", str(path)],
                          capture_output=True, text=True, env=env, timeout=300)
    service.shutdown()
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == code, proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout


def test_a_crash_is_one_line_with_its_cause_and_the_trace_in_the_runs_log(tmp_path, capsys, monkeypatch,
                                                                          ray_session):
    """A bug (not a user mistake): exit 1, the cause in one line, the full traceback in the run's error.log;
    with --verbose the traceback is printed too."""
    from redline.pipelines import score as score_pipeline

    def planted(*args):
        raise ZeroDivisionError("planted crash")

    monkeypatch.setattr(score_pipeline, "output_counts", planted)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("REDLINE_VERBOSE", "0")
    assert main(score(tmp_path, score_config(tmp_path))) == 1
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ZeroDivisionError: planted crash (full traceback: "), lines
    log = Path(lines[0].split("full traceback: ")[1].rstrip(")"))
    assert log.parent.parent == tmp_path / "runs" and "in planted" in log.read_text()
    manifest = json.loads((log.parent / "manifest.json").read_text())
    assert manifest["state"] == "failed" and manifest["error_log"] == str(log)
    assert manifest["error"] == "ZeroDivisionError: planted crash"
    monkeypatch.setenv("REDLINE_VERBOSE", "1")
    assert main(score(tmp_path, score_config(tmp_path), "--force")) == 1
    assert "Traceback (most recent call last)" in capsys.readouterr().err


# ============================================================================================
# Round 3: links anywhere a path is opened, answers that never succeed, unbounded bodies,
# duplicate and over-long fields


def _digest(uri: str) -> str:
    import hashlib

    from redline.cluster.artifacts import listing

    return hashlib.sha256(repr([uri, listing(uri)]).encode()).hexdigest()[:24]


@pytest.fixture
def model_bucket(s3_env):
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_env)
    bucket = f"links-{os.urandom(4).hex()}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="m/config.json", Body=b'{"a": 1}')
    s3.put_object(Bucket=bucket, Key="m/sub/weights.bin", Body=b"weights")
    return s3, f"s3://{bucket}/m"


def _plant_lock_link(root: Path, uri: str, outside: Path) -> None:
    root.mkdir(parents=True, mode=0o700)
    (root / f".{_digest(uri)}.lock").symlink_to(outside / "lock-target")


def _plant_root_link(root: Path, uri: str, outside: Path) -> None:
    (outside / "elsewhere").mkdir()
    root.symlink_to(outside / "elsewhere")


def _plant_base_link(root: Path, uri: str, outside: Path) -> None:
    (outside / "base").mkdir(mode=0o700)
    root.parent.rmdir()
    root.parent.symlink_to(outside / "base")


def _plant_shared_root(root: Path, uri: str, outside: Path) -> None:
    root.mkdir(parents=True)
    root.chmod(0o777)


@pytest.mark.parametrize("plant,fragment", [
    (_plant_lock_link, "refusing the artifact cache's lock"),
    (_plant_root_link, "it is a symbolic link"),
    (_plant_base_link, "it is a symbolic link"),
    (_plant_shared_root, "others may write to it (mode 777)"),
])
def test_the_artifact_cache_never_writes_through_a_planted_link(model_bucket, tmp_path, monkeypatch, plant, fragment):
    from redline.cluster.artifacts import local_path
    from redline.errors import RedlineError

    _, uri = model_bucket
    cache, outside = tmp_path / "cache", tmp_path / "outside"
    cache.mkdir(mode=0o700)
    outside.mkdir()
    monkeypatch.setenv("REDLINE_CACHE", str(cache))
    plant(cache / "artifacts", uri, outside)
    before = files(outside)
    with pytest.raises(RedlineError) as err:
        local_path(uri)
    assert fragment in str(err.value) and "\n" not in str(err.value)
    assert files(outside) == before  # nothing created outside the cache


def test_a_planted_artifact_folder_is_never_trusted(model_bucket, tmp_path, monkeypatch):
    """A link at artifacts/<digest> to a folder holding `.complete`, and a real folder whose files do
    not match the record (a link inside, a file of another size): each is fetched again, and what
    the link pointed to is neither used nor touched."""
    from redline.cluster.artifacts import cache_root, local_path

    s3, uri = model_bucket
    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path / "cache"))
    digest = _digest(uri)
    decoy = tmp_path / "decoy"
    (decoy / "m").mkdir(parents=True)
    (decoy / "m" / "config.json").write_text('{"evil": true}')
    (decoy / ".complete").write_text(uri)
    os.utime(decoy / ".complete", (1, 1))
    cache_root().mkdir(parents=True, mode=0o700)
    (cache_root() / digest).symlink_to(decoy)
    home = Path(local_path(uri))
    assert json.loads((home / "config.json").read_text()) == {"a": 1} and not home.parent.is_symlink()
    assert (decoy / ".complete").stat().st_mtime == 1  # never touched
    (home / "sub" / "weights.bin").write_bytes(b"tampered, another size")
    assert Path(local_path(uri), "sub", "weights.bin").read_bytes() == b"weights"
    (home / "sub" / "weights.bin").unlink()
    (home / "sub" / "weights.bin").symlink_to(tmp_path / "decoy" / "m" / "config.json")
    again = Path(local_path(uri), "sub", "weights.bin")
    assert not again.is_symlink() and again.read_bytes() == b"weights"


def test_an_object_beside_a_folder_of_the_same_name(model_bucket):
    """An empty object `m` beside `m/...` is a tool's folder marker: the folder is fetched; a non-empty
    one is ambiguous and refused in one line."""
    from redline.cluster.artifacts import local_path
    from redline.errors import RedlineError

    s3, uri = model_bucket
    bucket = uri.split("/")[2]
    s3.put_object(Bucket=bucket, Key="m", Body=b"")
    assert json.loads(Path(local_path(uri), "config.json").read_text()) == {"a": 1}
    s3.put_object(Bucket=bucket, Key="m", Body=b"not empty")
    with pytest.raises(RedlineError, match="is both an object .* and a folder of objects"):
        local_path(uri)


@pytest.mark.parametrize("make", ["root link", "root link to a file", "inner link"])
def test_an_upload_refuses_a_linked_root_as_it_refuses_inner_links(s3_env, tmp_path, make):
    import boto3

    from redline.cluster.artifacts import upload_dir
    from redline.errors import RedlineError

    s3 = boto3.client("s3", endpoint_url=s3_env)
    s3.create_bucket(Bucket="root-links")
    private = tmp_path / "home" / ".ssh"
    private.mkdir(parents=True)
    (private / "id_rsa").write_text("PRIVATE KEY")
    model = tmp_path / "model"
    if make == "root link":
        model.symlink_to(private)
    elif make == "root link to a file":
        model.symlink_to(private / "id_rsa")
    else:
        model.mkdir()
        (model / "config.json").write_text("{}")
        (model / "id_rsa").symlink_to(private / "id_rsa")
    with pytest.raises(RedlineError, match="refusing to upload .*symbolic link"):
        upload_dir(model, "s3://root-links/model")
    assert "Contents" not in s3.list_objects_v2(Bucket="root-links")


@pytest.mark.parametrize("plant,fragment", [
    (lambda c, o: (c / "judge").symlink_to(o), "it is a symbolic link"),
    (lambda c, o: ((c / "judge").mkdir(), (c / "judge" / "answers.sqlite").symlink_to(o / "db")), "symbolic link"),
    (lambda c, o: ((c / "judge").mkdir(), (c / "judge").chmod(0o777)), "others may write to it"),
])
def test_the_answer_cache_never_opens_through_a_link(tmp_path, monkeypatch, plant, fragment):
    from redline.actors.providers.client import AnswerCache
    from redline.errors import RedlineError

    cache, outside = tmp_path / "cache", tmp_path / "outside"
    cache.mkdir(mode=0o700)
    outside.mkdir()
    monkeypatch.setenv("REDLINE_CACHE", str(cache))
    plant(cache, outside)
    with pytest.raises(RedlineError, match=fragment):
        AnswerCache("auto")
    assert files(outside) == set()


# --------------------------------------------------------------------------------------------
# Answers that never succeed: never a "complete" run


def _judge(service: _Service, **over) -> dict:
    return {"name": "j", "kind": "llm-judge", "model": "judge", "base_url": service.url, "cache_dir": None,
            "max_retries": 1, "backoff_s": 0.01, "concurrency": 2, "max_retry_after_s": 0.2, "num_cpus": 0.25,
            "max_failed_in_row": 100, **over}


def _judge_score(tmp_path: Path, service: _Service, **over) -> list[str]:
    return score(tmp_path, score_config(tmp_path, detectors=[_judge(service, **over)]))


UNUSABLE = [
    ("empty", "the response has no choices"),
    ("html", "the answer's body is not JSON"),
    ("429:soon-ish", "HTTP 429"),
    ("429:Wed, 21 Oct 2015 07:28:00 GMT", "HTTP 429"),
    ("say:Maybe, hard to tell", "unparseable answer: 'Maybe, hard to tell'"),
    ("big:2000000", "over max_answer_bytes"),
]


@pytest.mark.parametrize("mode,fragment", UNUSABLE)
def test_an_answer_never_usable_is_every_rows_error_with_its_cause(mode, fragment, monkeypatch):
    """Each way an answer can be unusable is an error on the row, with its cause: never a score, a
    verdict or a row marked done (the run below fails on such rows, whatever their cause)."""
    import numpy as np

    from redline.actors.detectors import DetectorConfig, build_detector

    monkeypatch.setenv("OPENAI_API_KEY", "x")
    service = _Service(mode)
    try:
        detector = build_detector(DetectorConfig.model_validate(_judge(service)))
        _, score_, toxic, errors = detector.detect_rows(["a", "b", "c"])
        assert all(e and fragment in e for e in errors), errors
        assert np.isnan(score_).all() and not toxic.any()
    finally:
        service.shutdown()


@pytest.mark.parametrize("mode,fragment", [UNUSABLE[1]])
def test_a_detector_that_never_answers_usably_fails_the_run(mode, fragment, capsys, tmp_path, monkeypatch,
                                                           ray_session):
    monkeypatch.setenv("OPENAI_API_KEY", "x")
    service = _Service(mode)
    try:
        argv = _judge_score(tmp_path, service)
        err = expect_error(capsys, tmp_path, argv, "detector 'j' failed on every one of its 3 rows")
        assert fragment in err, err
        manifest = json.loads(next((tmp_path / "runs").rglob("manifest.json")).read_text())
        assert manifest["state"] == "failed"
        service.mode = "say:Yes"  # the service is fixed: a rerun asks every row again and scores them
        assert main(argv) == 0
        manifest = json.loads(next((tmp_path / "runs").rglob("manifest.json")).read_text())
        assert manifest["state"] == "complete" and manifest["counts"]["per_detector"]["j"]["scored"] == 3
    finally:
        service.shutdown()


def test_unusable_answers_count_toward_max_failed_in_row(capsys, tmp_path, monkeypatch, ray_session):
    monkeypatch.setenv("OPENAI_API_KEY", "x")
    service = _Service("say:I would rather not say")
    try:
        expect_error(capsys, tmp_path, _judge_score(tmp_path, service, max_failed_in_row=2, concurrency=1),
                     "failed 2 requests in a row (last: an answer it could not use ('I would rather not say'))")
        assert service.requests <= 3  # a well-formed answer is never retried
    finally:
        service.shutdown()


# --------------------------------------------------------------------------------------------
# Unbounded bodies


@pytest.mark.parametrize("mode", ["big:5000000", "gzip:50000000", "big:1100000"])
def test_an_oversize_answer_is_never_parsed_nor_cached(mode, tmp_path, monkeypatch):
    from redline.actors.providers.base import SamplingParams
    from redline.actors.providers.client import Failed

    monkeypatch.setenv("OPENAI_API_KEY", "x")
    service = _Service(mode)
    client = _chat_client(service, max_retries=1, backoff_s=0.01, cache_dir=str(tmp_path / "cache"))
    answer = client.ask([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=2), usable=lambda a: True)
    service.shutdown()
    assert isinstance(answer, Failed) and "over max_answer_bytes (1,048,576" in answer.cause, answer
    assert service.requests == 2
    assert client.cache.get(client.key([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=2))) is None
    assert sum(p.stat().st_size for p in (tmp_path / "cache").rglob("*") if p.is_file()) < 1 << 20


def test_a_huge_manifest_renders_a_bounded_page(tmp_path):
    """1M counts and 100k summary rows: the run page, the run list and /api/runs show a bounded part."""
    from starlette.testclient import TestClient

    from redline.view.app import build_app

    run = tmp_path / "runs" / "huge"
    run.mkdir(parents=True)
    manifest = {"pipeline": "score", "run_name": "huge", "state": "complete",
                "counts": {f"c{i}": i for i in range(1_000_000)},
                "summary": [{"detector": f"d{i}", "dataset": "all", "f1_macro": 0.5} for i in range(100_000)],
                "config": {"notes": "x" * 100_000}}
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert (run / "manifest.json").stat().st_size > 20 << 20
    with TestClient(build_app(str(tmp_path / "runs")), base_url="http://127.0.0.1") as client:
        page = client.get("/run", params={"id": "huge"})
        assert page.status_code == 200 and len(page.content) < 1 << 20, len(page.content)
        assert "999,800 more entries (see manifest.json)" in page.text
        runs = client.get("/api/runs")
        assert runs.status_code == 200 and len(runs.content) < 256 << 10, len(runs.content)
        assert len(runs.json()["runs"][0]["counts"]) == 64
        listing = client.get("/")
        assert listing.status_code == 200 and len(listing.content) < 256 << 10


# --------------------------------------------------------------------------------------------
# Duplicate and over-long fields


@pytest.mark.parametrize("body,repeated", [
    (b'{"model": "m", "model": "n"}', "model"),
    (b'{"messages": [{"role": "user", "content": "a", "content": "b"}]}', "content"),
    (b'[{"a": 1}, {"b": 1, "b": 2}]', "b"),
    (b'{"a": 1, "b": {"a": 2}}', None),  # the same key in two objects is fine
    (b'not json {"a": 1, "a": 2}', None),  # left to the route, which refuses it
])
def test_duplicate_json_keys_are_found(body, repeated):
    from redline.serve.gate import repeated_key

    assert repeated_key(body) == repeated


@pytest.mark.parametrize("extra,fragment", [
    ({"stop": ["x"] * 10_000}, "10000 stop sequences; at most 4"),
    ({"stop": ["x" * 300]}, "longer than 256 characters"),
    ({"logit_bias": {str(i): 1 for i in range(300_000)}}, "logit_bias: this server cannot honour it"),
    ({"frequency_penalty": 0.5}, "frequency_penalty: this server cannot honour it"),
    ({"tools": [{"type": "function"}]}, "tools: this server cannot honour it"),
    ({"messages": [{"role": "user", "content": "hi"}] * 2000}, "messages"),
])
def test_over_long_and_unhonoured_fields_are_refused(extra, fragment):
    from pydantic import ValidationError

    from redline.cluster.protocol import ChatCompletionRequest

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    with pytest.raises(ValidationError, match=re.escape(fragment)):
        ChatCompletionRequest.model_validate(body)
    ok = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "logit_bias": {}, "frequency_penalty": 0,
          "logprobs": False, "user": "someone", "stop": ["a", "b", "c", "d"]}
    ChatCompletionRequest.model_validate(ok)


def _repeated_csv(t: Path) -> Path:
    path = t / "rep.csv"
    path.write_text("text,text,label\nyou idiot,hi,1\nhello,there,0\n")
    return path


def _deep_jsonl(t: Path) -> Path:
    path = t / "deep.jsonl"
    path.write_text('{"text": "hi", "label": 1, "extra": ' + "[" * 10_000 + "]" * 10_000 + "}\n")
    return path


def _repeated_parquet(t: Path) -> Path:
    path = t / "rep.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array(["a"]), pa.array(["b"]), pa.array([1])], ["text", "text", "label"]),
                   path)
    return path


@pytest.mark.parametrize("make,fragment", [
    (_repeated_csv, "the column 'text' appears 2 times in its header"),
    (_repeated_parquet, "the column 'text' appears 2 times in its header"),
    (_deep_jsonl, "a value is nested too deeply to read"),
])
def test_a_corpus_with_repeated_columns_or_deep_nesting_is_one_line(make, fragment, capsys, tmp_path, monkeypatch):
    cfg = score_config(tmp_path)
    cfg["corpus"]["path"] = str(make(tmp_path))
    expect_error(capsys, tmp_path, score(tmp_path, cfg), fragment)


def test_a_dictionary_encoded_text_column_is_text(capsys, tmp_path, ray_session):
    path = tmp_path / "dict.parquet"
    pq.write_table(pa.table({"text": pa.array(["you idiot", "hello there", "you idiot"]).dictionary_encode(),
                             "label": [1, 0, 1]}), path)
    cfg = score_config(tmp_path)
    cfg["corpus"]["path"] = str(path)
    assert main(score(tmp_path, cfg)) == 0, capsys.readouterr().err
    manifest = json.loads(next((tmp_path / "runs").rglob("manifest.json")).read_text())
    assert manifest["counts"]["rows_in"] == 3


# --------------------------------------------------------------------------------------------
# Secrets by name and by value, through the real CLI


@pytest.mark.parametrize("name,value,refused", [
    ("DB_PASS", "hunter2-probe-secret", True), ("GITHUB_PAT", "x", True), ("MYSQL_PWD", "x", True),
    ("TLS_CERT", "x", True), ("SSH_PRIVATE_KEY", "x", True), ("FLASK_SESSION", "x", True), ("APIKEY", "x", True),
    ("DB_PASSWORD", "x", True), ("AUTH_COOKIE", "x", True), ("SENTRY_DSN", "x", True),
    ("JUDGE_SETTINGS", "sk-proj-abcdefghijklmnopqrstuvwx", True), ("PROXY", "http://user:pw@proxy:3128", True),
    ("BLOB", "Zx8Qm2LpR7vN4kT9wY3bC6dF1gH5jK0aSeUo", True),
    ("TOKENIZERS_PARALLELISM", "false", False), ("REDLINE_DATASET_TAG", "nightly", False),
    ("PROXY_URL", "http://proxy:3128", False), ("OMP_NUM_THREADS", "4", False),
])
def test_env_refuses_secrets_by_name_and_by_value(name, value, refused, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    argv = ["submit", "score", "-c", write(tmp_path, score_config(tmp_path)), "--address", "http://127.0.0.1:9",
            "--env", name]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and value not in err
    if refused:
        assert f"--env {name} looks like a secret" in err, err
    else:
        assert "cannot reach the Ray Jobs API" in err, err  # past the check: only the address is wrong


def test_a_forwarded_setting_with_credentials_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://admin:s3cr3t@127.0.0.1:9000")
    argv = ["submit", "score", "-c", write(tmp_path, score_config(tmp_path)), "--address", "http://127.0.0.1:9"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "AWS_ENDPOINT_URL (forwarded to every job) looks like a secret" in err and "s3cr3t" not in err


# --------------------------------------------------------------------------------------------
# Serve's start on a loaded machine


def test_serve_start_tries_again_when_a_serve_actor_dies_starting(monkeypatch):
    from ray import serve
    from ray.exceptions import ActorDiedError

    from redline.errors import RedlineError
    from redline.serve import runner
    from redline.serve.config import ServeConfig

    calls: list[int] = []

    def dying(**kwargs):
        calls.append(1)
        raise ActorDiedError()

    monkeypatch.setattr(serve, "start", dying)
    monkeypatch.setattr(serve, "shutdown", lambda: None)
    monkeypatch.setattr(runner.time, "sleep", lambda s: None)
    config = ServeConfig.model_validate({"detectors": [{"name": "k", "kind": "keywords", "patterns": ["x"]}]})
    with pytest.raises(RedlineError, match=r"Ray Serve's controller or HTTP proxy died while starting, 3 times "
                                           r"\(ActorDiedError\); the machine is short of CPU or memory"):
        runner._start_serve(config, verbose=False)
    assert len(calls) == 3
    calls.clear()
    monkeypatch.setattr(serve, "start", lambda **kw: calls.append(1) if len(calls) else dying())
    runner._start_serve(config, verbose=False)  # died once, started the second time
    assert len(calls) == 2


# --------------------------------------------------------------------------------------------
# The artifact cache after a killed download, a concurrent delete, a replaced object


def test_a_killed_download_leaves_nothing_for_long(model_bucket, tmp_path, monkeypatch):
    """SIGKILL mid-download leaves a staging folder; the next fetch on the node removes it (its process
    is gone), while a live download's staging folder is kept."""
    import signal

    from redline.cluster.artifacts import cache_root, local_path

    _, uri = model_bucket
    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path / "cache"))
    script = (
        "import time, redline.cluster.artifacts as a\n"
        "a.s3_client().download_fileobj = lambda *args, **kw: time.sleep(600)\n"
        f"a.local_path({uri!r})\n")
    child = subprocess.Popen([sys.executable, "-c", script], env=dict(os.environ))
    try:
        def staging() -> list[Path]:
            return [p for p in cache_root().iterdir() if p.is_dir() and p.name.startswith(".")] \
                if cache_root().exists() else []

        deadline = time.time() + 60
        while time.time() < deadline and not staging():
            time.sleep(0.1)
        staged = staging()
        assert staged, "the child never started its download"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    live = cache_root() / f".{'0' * 24}.{os.getpid()}.deadbeef"  # this process is alive: never removed
    live.mkdir()
    assert json.loads(Path(local_path(uri), "config.json").read_text()) == {"a": 1}
    assert not any(p.exists() for p in staged) and live.exists()


def test_eviction_survives_a_concurrent_delete_and_keeps_what_was_used_meanwhile(tmp_path, monkeypatch):
    from redline.cluster import artifacts

    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path / "cache"))
    root = artifacts._ready_root()
    old = time.time() - 3600
    for digest in ("a" * 24, "b" * 24, "c" * 24):
        (root / digest / "m").mkdir(parents=True)
        (root / digest / "m" / "w.bin").write_bytes(b"x" * 1000)
        (root / digest / ".complete").write_text("{}")
        os.utime(root / digest / ".complete", (old, old))
    real_locked = artifacts._locked

    def racing(digest, wait=True):
        if digest == "a" * 24:
            import shutil

            shutil.rmtree(root / digest)  # another process removed it after the listing
        if digest == "b" * 24:
            os.utime(root / digest / ".complete")  # another process used it after the listing
        return real_locked(digest, wait)

    monkeypatch.setattr(artifacts, "_locked", racing)
    removed = artifacts.evict_beyond(0, keep="none")
    assert removed == ["a" * 24, "c" * 24] and (root / ("b" * 24) / "m" / "w.bin").exists()


def test_an_object_replaced_after_its_listing_is_never_cached(model_bucket, tmp_path, monkeypatch):
    from redline.cluster import artifacts
    from redline.errors import RedlineError

    s3, uri = model_bucket
    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path / "cache"))
    listed = artifacts.listing(uri)
    s3.put_object(Bucket=uri.split("/")[2], Key="m/config.json", Body=b'{"a": 2, "replaced": true}')
    monkeypatch.setattr(artifacts, "listing", lambda u: listed)
    with pytest.raises(RedlineError, match="the object changed while it was fetched"):
        artifacts.local_path(uri)
    assert not [p for p in artifacts.cache_root().iterdir() if not p.name.endswith(".lock")]
