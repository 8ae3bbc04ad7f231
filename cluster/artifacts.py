"""Artifacts by URI: every model, model directory or data file a worker loads may be a local path, a
hub id, or an s3:// URI. An s3:// artifact is fetched into a cache on the node that needs it, keyed
by its content (the objects' ETags), atomically (downloaded beside the cache, then renamed into
place) and once per node: a second process, or a second actor, finds it there. Nothing relies on
the driver's disk.

Training commands write to s3:// the same way in reverse: into a local directory, then uploaded.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from redline.cluster import paths, storage
from redline.errors import RedlineError, first_line


def s3_client():  # noqa: ANN201 - a boto3 client
    """This process's boto3 S3 client, one per S3 settings (boto3 refreshes its credentials itself)."""
    return storage.s3_cached("client", _new_s3_client)


def _new_s3_client():  # noqa: ANN202
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client("s3", config=Config(connect_timeout=5, read_timeout=60,
                                                              retries={"max_attempts": 3}))


def _bucket_key(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key.rstrip("/")


def listing(uri: str) -> list[tuple[str, int, str]]:
    """(path below the URI, size, ETag) of the object at `uri`, or of every object under it. Every
    path below the URI is checked by `paths.relative_parts`: a key that would climb out of the
    directory it is fetched into (`..`, a leading `/`, a backslash, a NUL) is refused, naming it;
    empty "folder" markers (keys ending in `/`) are skipped."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = _bucket_key(uri)
    client = s3_client()
    try:
        try:
            head = client.head_object(Bucket=bucket, Key=key)
            return [("", int(head["ContentLength"]), head["ETag"])]
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
                raise
        out = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key + "/"):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(key) + 1:]
                if rel.endswith("/") and int(obj["Size"]) == 0:
                    continue  # a console-made "folder": nothing to fetch
                paths.relative_parts(rel, f"object key {obj['Key']!r} under {uri}")
                out.append((rel, int(obj["Size"]), obj["ETag"]))
        return sorted(out)
    except (BotoCoreError, ClientError) as err:
        raise RedlineError(f"cannot list {uri}: {first_line(err)}") from None


def cache_root() -> Path:
    return storage.user_cache_dir() / "artifacts"


def local_path(uri: str) -> str:
    """A local path for `uri`: unchanged for local paths and hub ids; an s3:// file or directory is
    fetched into this node's cache first (once, keyed by content)."""
    if not isinstance(uri, str) or not storage.is_s3(uri):
        return uri
    objects = listing(uri)
    if not objects:
        raise RedlineError(f"nothing at {uri} (no object, and no objects under it)")
    name = _bucket_key(uri)[1].rsplit("/", 1)[-1] or "artifact"
    paths.relative_parts(name, f"artifact name in {uri}")
    digest = hashlib.sha256(repr([uri, objects]).encode()).hexdigest()[:24]
    home = cache_root() / digest
    if (home / ".complete").is_file():
        return str(home / name)
    cache_root().mkdir(parents=True, exist_ok=True, mode=0o700)
    staging = cache_root() / f".{digest}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    bucket, key = _bucket_key(uri)
    client = s3_client()
    try:
        os.mkdir(staging, 0o700)
        for rel, _, _ in objects:
            parts = [name, *paths.relative_parts(rel, f"object key {key}/{rel!r}")] if rel else [name]
            with paths.create_below(staging, parts, f"{uri}/{rel}" if rel else uri) as f:
                client.download_fileobj(bucket, f"{key}/{rel}" if rel else key, f)
        (staging / ".complete").write_text(uri)
        try:
            os.rename(staging, home)  # atomic: readers see the whole artifact or none
        except OSError:
            if not (home / ".complete").is_file():  # not another process's finished copy: retry once
                shutil.rmtree(home, ignore_errors=True)
                os.rename(staging, home)
    except Exception as err:  # noqa: BLE001 - a failed download leaves nothing behind
        if isinstance(err, RedlineError):
            raise
        raise RedlineError(f"cannot fetch {uri}: {first_line(err)}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(home / name)


def upload_dir(local: str | Path, uri: str) -> None:
    """Every file under `local` to the same relative keys under `uri` (each object appears whole).
    Symbolic links are refused, never followed (a link could publish any file the user can read),
    and so is a name that would not come back as a safe path."""
    root = Path(local)
    files = []
    for folder, dirs, names in os.walk(root, followlinks=False):
        for entry in [*dirs, *names]:
            path = Path(folder, entry)
            if path.is_symlink():
                raise RedlineError(f"refusing to upload {path}: it is a symbolic link (copy the file it points to)")
        for entry in names:
            path = Path(folder, entry)
            rel = path.relative_to(root).as_posix()
            paths.relative_parts(rel, f"file name {rel!r} in {root}")
            files.append((rel, path))
    for rel, path in sorted(files):
        storage.write_bytes(storage.join(uri, rel), path.read_bytes())


@contextmanager
def local_output(uri: str | Path) -> Iterator[Path]:
    """Where to write a model that belongs at `uri`: the path itself when local; for s3:// a local
    directory whose contents are uploaded when the block succeeds."""
    uri = str(uri)
    if not storage.is_s3(uri):
        Path(uri).mkdir(parents=True, exist_ok=True)
        yield Path(uri)
        return
    with tempfile.TemporaryDirectory(prefix="redline-out-") as tmp:
        yield Path(tmp)
        upload_dir(tmp, uri)


def exists(uri: str) -> bool:
    """Whether a local path or an s3:// object (or prefix) exists."""
    if storage.is_s3(uri):
        return bool(listing(uri))
    return Path(uri).expanduser().exists()
