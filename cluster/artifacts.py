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
import json
import os
import shutil
import stat
import tempfile
import time
import uuid
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

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
        single = None
        try:
            head = client.head_object(Bucket=bucket, Key=key)
            single = ("", int(head["ContentLength"]), head["ETag"])
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
                raise
        below = client.list_objects_v2(Bucket=bucket, Prefix=key + "/", MaxKeys=1).get("KeyCount", 0) if single else 1
        if single and not below:
            return [single]
        if single and single[1] > 0:
            raise RedlineError(f"{uri} is both an object ({single[1]:,} bytes) and a folder of objects ({key}/...); "
                               "remove one or name the one you mean")
        # else an empty object beside the folder of the same name: a tool's folder marker, so the folder
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


def _ready_root() -> Path:
    """The cache folder, made if missing; it and $REDLINE_CACHE must be real folders of this user that
    nobody else may write (a link or another user's folder could turn every write into one outside)."""
    base = storage.user_cache_dir()
    base.parent.mkdir(parents=True, exist_ok=True)
    for folder in (base, cache_root()):
        storage.private_dir(folder, "artifact cache")
    return cache_root()

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
    root = _ready_root()
    home = root / digest
    with _locked(digest):
        if not _verified(home, uri, objects, name):
            _remove(home)
            _fetch(uri, objects, name, home)
        _touch(home / ".complete")  # when it was last used: the cache evicts the least recently used
    evict_beyond(cache_limit_bytes(), keep=digest)
    return str(home / name)


def _record(uri: str, objects: list[tuple[str, int, str]]) -> dict[str, object]:
    return {"uri": uri, "objects": [[rel, size, etag] for rel, size, etag in objects]}


def _verified(home: Path, uri: str, objects: list[tuple[str, int, str]], name: str) -> bool:
    """Whether `home` holds exactly the artifact `objects` describe: a real folder (never a link),
    its `.complete` record naming the same URI and ETags, and every file a regular file (no link
    anywhere below) of the recorded size. Anything else is fetched again."""
    try:
        if not stat.S_ISDIR(os.lstat(home).st_mode):
            return False
        record = json.loads(paths.read_local_below(home, [".complete"], 64 << 20))
    except (OSError, RedlineError, ValueError):
        return False
    if record != _record(uri, objects):
        return False
    wanted = {"/".join([name, rel]) if rel else name: size for rel, size, _ in objects}
    found: dict[str, int] = {}
    for folder, dirs, files in os.walk(home, followlinks=False):
        for entry in [*dirs, *files]:
            st = os.lstat(os.path.join(folder, entry))
            if stat.S_ISLNK(st.st_mode):
                return False
            if stat.S_ISREG(st.st_mode):
                found[Path(folder, entry).relative_to(home).as_posix()] = st.st_size
    found.pop(".complete", None)
    return found == wanted


def _remove(entry: Path) -> None:
    """Whatever is at `entry` (a folder, a file, a link: the link itself, never what it points to)."""
    try:
        mode = os.lstat(entry).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(entry, ignore_errors=True)
    else:
        os.unlink(entry)


def _touch(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.utime(fd)
    finally:
        os.close(fd)


def _etag_md5(etag: str) -> str | None:
    """The MD5 an ETag states (a single-part upload's), None for a multipart or encrypted object's."""
    value = etag.strip('"').lower()
    return value if re.fullmatch(r"[0-9a-f]{32}", value) else None


def _check_download(f: BinaryIO, size: int, etag: str, what: str) -> None:
    """A downloaded file is the object listed: its size, and its MD5 where the ETag states one (an
    object replaced between the listing and the download, or a truncated body, is refused)."""
    f.flush()
    f.seek(0)
    digest, got = hashlib.md5(usedforsecurity=False), 0
    for chunk in iter(lambda: f.read(1 << 20), b""):
        digest.update(chunk)
        got += len(chunk)
    expected = _etag_md5(etag)
    if got != size or (expected is not None and digest.hexdigest() != expected):
        raise RedlineError(f"cannot fetch {what}: the object changed while it was fetched (listed {size:,} bytes, "
                           f"ETag {etag}; got {got:,} bytes); fetch again")


def _fetch(uri: str, objects: list[tuple[str, int, str]], name: str, home: Path) -> None:
    staging = cache_root() / f".{home.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    bucket, key = _bucket_key(uri)
    client = s3_client()
    try:
        os.mkdir(staging, 0o700)
        for rel, size, etag in objects:
            parts = [name, *paths.relative_parts(rel, f"object key {key}/{rel!r}")] if rel else [name]
            what = f"{uri}/{rel}" if rel else uri
            with paths.create_below(staging, parts, what, mode="w+b") as f:
                client.download_fileobj(bucket, f"{key}/{rel}" if rel else key, f)
                _check_download(f, size, etag, what)
        with paths.create_below(staging, [".complete"], f"{uri} (its record)") as f:
            f.write(json.dumps(_record(uri, objects)).encode())
        _remove(home)  # an unfinished copy of a process that died mid-rename, or something planted
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

    path = cache_root() / f".{digest}.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        raise RedlineError(f"refusing the artifact cache's lock {path}: {err.strerror} (a symbolic link or not "
                           "a file; remove it)") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RedlineError(f"refusing the artifact cache's lock {path}: it is not a regular file (remove it)")
    with os.fdopen(fd, "r+b") as handle:
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
    """Bytes of the regular files below `folder` (files deleted meanwhile by another process: 0)."""
    total = 0
    for parent, _, names in os.walk(folder, followlinks=False):
        for name in names:
            try:
                st = os.lstat(os.path.join(parent, name))
            except OSError:
                continue
            total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total


STAGING = re.compile(r"^\.([0-9a-f]{24})\.(\d+)\.[0-9a-f]{8}$")
STALE_STAGING_S = 24 * 3600.0  # a staging folder this old is left over, whoever's PID it names now


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_staging() -> list[str]:
    """Remove staging folders a killed download left (its process is gone, or it is a day old)."""
    removed = []
    for entry in cache_root().iterdir():
        m = STAGING.match(entry.name)
        if not m:
            continue
        try:
            st = os.lstat(entry)
        except OSError:
            continue
        if _alive(int(m.group(2))) and time.time() - st.st_mtime < STALE_STAGING_S:
            continue
        _remove(entry)
        removed.append(entry.name)
    return removed


def evict_beyond(limit: int, keep: str) -> list[str]:
    """Remove the least recently used artifacts until the cache holds at most `limit` bytes (never
    `keep`, one used in the last IN_USE_S seconds, nor one another process is fetching or using,
    each checked again under its lock), and the staging folders of killed downloads; returns the
    digests removed."""
    remove_stale_staging()
    entries = []
    for d in cache_root().iterdir():
        try:
            if d.name.startswith(".") or not stat.S_ISDIR(os.lstat(d).st_mode):
                continue
            complete = os.lstat(d / ".complete")
        except OSError:
            continue
        if stat.S_ISREG(complete.st_mode):
            entries.append((complete.st_mtime, d.name, _size(d)))
    total, removed = sum(size for _, _, size in entries), []
    for used, digest, size in sorted(entries):
        if total <= limit:
            break
        if digest == keep or time.time() - used < IN_USE_S:
            continue
        with _locked(digest, wait=False) as free:
            if not free:
                continue
            try:  # used since it was listed (the listing ran before the lock): keep it
                if time.time() - os.lstat(cache_root() / digest / ".complete").st_mtime < IN_USE_S:
                    continue
            except OSError:
                pass  # deleted meanwhile: nothing left to keep
            _remove(cache_root() / digest)
            total -= size
            removed.append(digest)
    return removed


def upload_dir(local: str | Path, uri: str) -> None:
    """Every file under `local` to the same relative keys under `uri` (each object appears whole).
    Symbolic links are refused, never followed (a link could publish any file the user can read),
    and so is a name that would not come back as a safe path."""
    root = Path(local)
    if root.is_symlink():
        raise RedlineError(f"refusing to upload {root}: it is a symbolic link (name the folder it points to)")
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
