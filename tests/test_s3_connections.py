"""Each process keeps one S3 connection per S3 settings instead of resolving credentials on every call."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from redline.cluster import artifacts, storage

from conftest import moto_server

CREDENTIAL_PROCESS = """
import json, pathlib, sys
current = json.loads(pathlib.Path(sys.argv[1]).read_text())
print(json.dumps({"Version": 1, "AccessKeyId": current["id"], "SecretAccessKey": current["secret"],
                  "Expiration": current["expires"]}))
"""


def test_one_connection_per_process_and_settings(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "b")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    fs, client = storage.s3_filesystem(), artifacts.s3_client()
    assert storage.s3_filesystem() is fs and artifacts.s3_client() is client
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:2")  # another endpoint: another connection
    assert storage.s3_filesystem() is not fs and artifacts.s3_client() is not client
    assert artifacts.s3_client().meta.endpoint_url == "http://127.0.0.1:2"


@pytest.fixture
def moto_with_auth():
    """A moto S3 server that checks every request's credentials (after the three calls that make a
    user, its policy and its first key)."""
    with moto_server({"INITIAL_NO_AUTH_ACTION_COUNT": "3"}) as url:
        yield url


def test_a_run_outlives_its_short_lived_credentials(moto_with_auth, tmp_path, monkeypatch):
    """Temporary credentials (here from a profile's credential_process, as SSO or an instance role
    give them) are replaced while the process runs and the old key stops working: the process's
    cached S3 connections keep working, because each follows the credential chain itself instead of
    holding a frozen copy (which is refused once its key is gone)."""
    import boto3
    import pyarrow.fs as pafs

    url = moto_with_auth
    admin = dict(endpoint_url=url, region_name="us-east-1", aws_access_key_id="bootstrap",
                 aws_secret_access_key="bootstrap")
    iam = boto3.session.Session().client("iam", **admin)
    iam.create_user(UserName="runner")
    iam.put_user_policy(UserName="runner", PolicyName="all", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    first = iam.create_access_key(UserName="runner")["AccessKey"]

    current = tmp_path / "current.json"

    def hand_out(key: dict) -> None:
        expires = (datetime.now(timezone.utc) + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        current.write_text(json.dumps({"id": key["AccessKeyId"], "secret": key["SecretAccessKey"],
                                       "expires": expires}))

    hand_out(first)
    (tmp_path / "issue.py").write_text(CREDENTIAL_PROCESS)
    (tmp_path / "config").write_text(f"[profile run]\nregion = us-east-1\ncredential_process = {sys.executable} "
                                     f"{tmp_path / 'issue.py'} {current}\n")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_PROFILE", "run")
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)

    artifacts.s3_client().create_bucket(Bucket="runs")
    storage.write_bytes("s3://runs/r/manifest.json", b'{"state": "running"}')
    storage.write_parquet(pa.table({"id": ["a", "b"]}), "s3://runs/r/part-0.parquet")
    fs, client = storage.s3_filesystem(), artifacts.s3_client()
    frozen = pafs.S3FileSystem(access_key=first["AccessKeyId"], secret_key=first["SecretAccessKey"],
                               endpoint_override=url.removeprefix("http://"), scheme="http", region="us-east-1")
    assert frozen.get_file_info("runs/r/manifest.json").size > 0

    # hours later: the credentials were renewed and the first key no longer exists
    second = boto3.session.Session().client("iam", endpoint_url=url).create_access_key(UserName="runner")["AccessKey"]
    hand_out(second)
    boto3.session.Session().client("iam", endpoint_url=url).delete_access_key(UserName="runner",
                                                                            AccessKeyId=first["AccessKeyId"])
    with pytest.raises(OSError):
        frozen.get_file_info("runs/r/manifest.json")  # what a cached frozen copy would run into

    storage.write_bytes("s3://runs/r/manifest.json", b'{"state": "complete"}')
    storage.write_parquet(pa.table({"id": ["c"]}), "s3://runs/r/part-1.parquet")
    assert json.loads(storage.read_bytes("s3://runs/r/manifest.json")) == {"state": "complete"}
    assert storage.read_parquet("s3://runs/r/part-0.parquet").column("id").to_pylist() == ["a", "b"]
    assert {entry[0] for entry in artifacts.listing("s3://runs/r")} >= {"manifest.json", "part-0.parquet", "part-1.parquet"}
    assert storage.s3_filesystem() is fs and artifacts.s3_client() is client  # the same connections throughout


def _fetch_in_a_child(uri: str, log: str, start) -> None:  # noqa: ANN001 - a multiprocessing barrier
    """A process on the same node asking for the same artifact; each object it downloads is logged."""
    client = artifacts.s3_client()
    real = client.download_fileobj

    def logged(bucket, key, f):  # noqa: ANN001, ANN202
        with open(log, "a") as out:
            out.write(key + "\n")
        return real(bucket, key, f)

    client.download_fileobj = logged
    start.wait()
    artifacts.local_path(uri)


def test_an_artifact_several_processes_need_at_once_is_fetched_once(s3_env, tmp_path, monkeypatch):
    import multiprocessing

    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path / "cache"))
    client = artifacts.s3_client()
    client.create_bucket(Bucket="models")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        client.put_object(Bucket="models", Key=f"m/{name}", Body=b"x" * 300_000)
    log = tmp_path / "downloads.log"
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(4)
    children = [ctx.Process(target=_fetch_in_a_child, args=("s3://models/m", str(log), start)) for _ in range(4)]
    for c in children:
        c.start()
    for c in children:
        c.join(60)
    assert [c.exitcode for c in children] == [0] * 4
    assert sorted(log.read_text().splitlines()) == ["m/config.json", "m/model.safetensors", "m/tokenizer.json"]
    assert (tmp_path / "cache" / "artifacts").is_dir() and not [
        p for p in (tmp_path / "cache" / "artifacts").iterdir() if p.is_dir() and p.name.startswith(".")]


def test_the_artifact_cache_drops_the_least_recently_used_beyond_its_bound(s3_env, tmp_path, monkeypatch):
    import os

    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(artifacts, "IN_USE_S", 0.0)
    client = artifacts.s3_client()
    client.create_bucket(Bucket="files")
    for name in "abc":
        client.put_object(Bucket="files", Key=f"{name}.bin", Body=b"x" * 400_000)
    monkeypatch.setenv("REDLINE_CACHE_MAX_GB", str(1_000_000 / 1024**3))  # room for two of the three
    a = artifacts.local_path("s3://files/a.bin")
    b = artifacts.local_path("s3://files/b.bin")
    os.utime(os.path.join(os.path.dirname(b), ".complete"), (1, 1))  # b: used long ago, a: more recently
    os.utime(os.path.join(os.path.dirname(a), ".complete"), (2, 2))
    c = artifacts.local_path("s3://files/c.bin")
    assert os.path.exists(a) and os.path.exists(c) and not os.path.exists(b)
    assert artifacts.local_path("s3://files/b.bin") == b and os.path.exists(b)  # fetched again when asked
    monkeypatch.setenv("REDLINE_CACHE_MAX_GB", "lots")
    with pytest.raises(Exception, match="REDLINE_CACHE_MAX_GB='lots' is not a number of gigabytes"):
        artifacts.local_path("s3://files/a.bin")
