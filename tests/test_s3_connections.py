"""Each process keeps one S3 connection per S3 settings instead of resolving credentials on every call."""

from __future__ import annotations

from redline.cluster import artifacts, storage


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
    monkeypatch.setattr(storage, "S3_FILESYSTEM_TTL_S", 0.0)  # frozen credentials are fetched again in time
    again = storage.s3_filesystem()
    assert storage.s3_filesystem() is not again
