"""Artifacts by URI: every model, model directory or data file a worker loads may be a local path, a
hub id, or an s3:// URI. An s3:// artifact is fetched into a cache on the node that needs it, keyed
by its content (the objects' ETags), atomically (downloaded beside the cache, then renamed into
place) and once per node: a second process, or a second actor, finds it there or waits while the
first fetches it. The cache is bounded ($REDLINE_CACHE_MAX_GB) and drops the least recently used
artifacts first. Nothing relies on the driver's disk.

Training commands write to s3:// the same way in reverse: into a local directory, then uploaded.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
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
    fetched into this node's cache first (once per node, keyed by content: processes that need it
    at the same time wait on a per-artifact file lock while one of them downloads it)."""
    if not isinstance(uri, str) or not storage.is_s3(uri):
        return uri
    objects = listing(uri)
    if not objects:
        raise RedlineError(f"nothing at {uri} (no object, and no objects under it)")
    name = _bucket_key(uri)[1].rsplit("/", 1)[-1] or "artifact"
    paths.relative_parts(name, f"artifact name in {uri}")
    digest = hashlib.sha256(repr([uri, objects]).encode()).hexdigest()[:24]
    home = cache_root() / digest
    cache_root().mkdir(parents=True, exist_ok=True, mode=0o700)
    with _locked(digest):
        if not (home / ".complete").is_file():
            _fetch(uri, objects, name, home)
        (home / ".complete").touch()  # when it was last used: the cache evicts the least recently used
    evict_beyond(cache_limit_bytes(), keep=digest)
    return str(home / name)


def _fetch(uri: str, objects: list[tuple[str, int, str]], name: str, home: Path) -> None:
    staging = cache_root() / f".{home.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    bucket, key = _bucket_key(uri)
    client = s3_client()
    try:
        os.mkdir(staging, 0o700)
        for rel, _, _ in objects:
            parts = [name, *paths.relative_parts(rel, f"object key {key}/{rel!r}")] if rel else [name]
            with paths.create_below(staging, parts, f"{uri}/{rel}" if rel else uri) as f:
                client.download_fileobj(bucket, f"{key}/{rel}" if rel else key, f)
        (staging / ".complete").write_text(uri)
        shutil.rmtree(home, ignore_errors=True)  # an unfinished copy of a process that died mid-rename
        os.rename(staging, home)  # atomic: readers see the whole artifact or none
    except Exception as err:  # noqa: BLE001 - a failed download leaves nothing behind
        if isinstance(err, RedlineError):
            raise
        raise RedlineError(f"cannot fetch {uri}: {first_line(err)}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextmanager
def _locked(digest: str, wait: bool = True) -> Iterator[bool]:
    """This node's lock on one cached artifact (held while it is fetched or evicted); with `wait`
    False, yields whether it was free instead of waiting for it."""
    import fcntl

    with open(cache_root() / f".{digest}.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


DEFAULT_CACHE_GB = 100.0
IN_USE_S = 60.0  # an artifact used this recently may be loading in another process: never evicted


def cache_limit_bytes() -> int:
    """The artifact cache's bound: $REDLINE_CACHE_MAX_GB (default 100 GB)."""
    raw = os.environ.get("REDLINE_CACHE_MAX_GB", "")
    try:
        gb = float(raw) if raw else DEFAULT_CACHE_GB
    except ValueError:
        raise RedlineError(f"REDLINE_CACHE_MAX_GB={raw!r} is not a number of gigabytes") from None
    if gb <= 0:
        raise RedlineError(f"REDLINE_CACHE_MAX_GB={raw!r} must be above 0")
    return int(gb * 1024**3)


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())


def evict_beyond(limit: int, keep: str) -> list[str]:
    """Remove the least recently used artifacts until the cache holds at most `limit` bytes (never
    `keep`, one used in the last IN_USE_S seconds, nor one another process is fetching); returns
    the digests removed."""
    entries = [(d.joinpath(".complete").stat().st_mtime, d.name, _size(d)) for d in cache_root().iterdir()
               if d.is_dir() and not d.name.startswith(".") and d.joinpath(".complete").is_file()]
    total, removed = sum(size for _, _, size in entries), []
    for used, digest, size in sorted(entries):
        if total <= limit:
            break
        if digest == keep or time.time() - used < IN_USE_S:
            continue
        with _locked(digest, wait=False) as free:
            if free:
                shutil.rmtree(cache_root() / digest, ignore_errors=True)
                total -= size
                removed.append(digest)
    return removed


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
