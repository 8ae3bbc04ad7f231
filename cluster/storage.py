"""Local paths and s3:// URIs behind one set of helpers; atomic writes; run directories and manifests.

S3 goes through `pyarrow.fs.S3FileSystem` (the same filesystem Ray Data reads), one per process and
S3 settings. It follows the AWS default credential chain itself (environment, profiles with
`credential_process`, SSO, web identity, container and instance roles) and refreshes temporary
credentials when they expire, so a run outlives them; the region comes from boto3's configuration
and `AWS_ENDPOINT_URL` (e.g. a MinIO or moto server) is honoured.
"""

from __future__ import annotations

import io
import json
import os
import platform
import stat
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from redline.cluster import paths
from redline.cluster.paths import NotFound
from redline.errors import RedlineError, first_line


def user_cache_dir() -> Path:
    """This user's redline cache: $REDLINE_CACHE, else $XDG_CACHE_HOME/redline, else ~/.cache/redline."""
    explicit = os.environ.get("REDLINE_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "redline"


def private_dir(folder: Path, what: str) -> Path:
    """`folder`, made (mode 0700) if missing, checked to be a real folder (not a link) of this user
    that neither its group nor others may write: else one line naming it and why."""
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError as err:
        raise RedlineError(f"cannot make the {what} folder {folder}: {err.strerror}") from None
    st = os.lstat(folder)
    why = None
    if stat.S_ISLNK(st.st_mode):
        why = "it is a symbolic link"
    elif not stat.S_ISDIR(st.st_mode):
        why = "it is not a folder"
    elif st.st_uid != os.getuid():
        why = f"it belongs to another user (uid {st.st_uid})"
    elif st.st_mode & 0o022:
        why = f"others may write to it (mode {stat.S_IMODE(st.st_mode):o})"
    if why:
        raise RedlineError(f"refusing the {what} at {folder}: {why}; point $REDLINE_CACHE at a folder of your own")
    return folder


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


# What an S3 connection is made of: a change in any of these (a test's second endpoint, a new key)
# makes a new one; otherwise each process reuses its connection instead of resolving credentials per call.
S3_SETTINGS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE",
               "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
               "AWS_SESSION_TOKEN")
_s3_cache: dict[tuple[Any, ...], Any] = {}


def s3_cached(kind: str, make: Callable[[], Any]) -> Any:
    """One `kind` of S3 connection per process and S3 settings, made by `make`. Each refreshes its
    own credentials, so none is ever made again for that."""
    key = (kind, os.getpid(), *(os.environ.get(k) for k in S3_SETTINGS))
    if key not in _s3_cache:
        _s3_cache[key] = make()
    return _s3_cache[key]


def s3_filesystem() -> pafs.S3FileSystem:
    """This process's S3 filesystem (pyarrow)."""
    return s3_cached("filesystem", _new_s3_filesystem)


def _new_s3_filesystem() -> pafs.S3FileSystem:
    import boto3

    # No keys handed over: frozen copies of temporary credentials (instance roles, SSO, web identity,
    # credential_process) would expire hours into a run. The AWS SDK inside pyarrow resolves and
    # refreshes them itself, on whichever node the filesystem is used (a pickled one included).
    region = boto3.Session().region_name or os.environ.get("AWS_REGION", "us-east-1")
    kwargs: dict[str, Any] = {"region": region}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        parsed = urlparse(endpoint)
        kwargs.update(endpoint_override=parsed.netloc or parsed.path, scheme=parsed.scheme or "https")
    # Fail fast on an unreachable endpoint instead of retrying for minutes.
    kwargs.update(connect_timeout=5, request_timeout=30,
                  retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=3))
    return pafs.S3FileSystem(**kwargs)


def read_below(root: str, parts: list[str], max_bytes: int | None = None) -> bytes:
    """The bytes of the regular file root/parts, read without following a symbolic link anywhere
    below `root` (each folder opened with O_NOFOLLOW relative to the one before), so a link planted
    inside a directory never serves a file outside it. S3 has no links: a plain read."""
    uri = join(root, *parts)
    if is_s3(root):
        fs, path = resolve(uri)
        try:  # one request: open and read (at most one byte over the limit)
            with fs.open_input_stream(path) as f:
                data = f.read() if max_bytes is None else f.read(max_bytes + 1)
        except FileNotFoundError:
            raise NotFound(f"file not found: {uri}") from None
        except OSError as err:
            text = str(err).lower()
            if "not found" in text or "does not exist" in text or "is a directory" in text:
                raise NotFound(f"file not found: {uri}") from None
            raise RedlineError(f"cannot read {uri}: {first_line(err)}") from None
        if max_bytes is not None and len(data) > max_bytes:
            raise RedlineError(f"{uri} is over the limit of {max_bytes:,} bytes")
        return data
    return paths.read_local_below(Path(root).expanduser(), parts, max_bytes)


def open_below(root: str, parts: list[str]) -> Any:
    """The regular file root/parts opened for random access (a seekable file), by the same rules as
    `read_below`: locally no symbolic link below `root` is followed."""
    uri = join(root, *parts)
    if is_s3(root):
        fs, path = resolve(uri)
        try:
            return fs.open_input_file(path)
        except FileNotFoundError:
            raise NotFound(f"file not found: {uri}") from None
        except OSError as err:
            raise RedlineError(f"cannot read {uri}: {first_line(err)}") from None
    return paths.open_local_below(Path(root).expanduser(), parts)


def resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    """A URI or local path -> (filesystem, path inside it)."""
    if is_s3(uri):
        return s3_filesystem(), uri.removeprefix("s3://").rstrip("/")
    return pafs.LocalFileSystem(), str(Path(uri).expanduser().absolute())


def join(uri: str, *parts: str) -> str:
    if is_s3(uri):
        return "/".join([uri.rstrip("/"), *[p.strip("/") for p in parts]])
    return str(Path(uri, *parts))


def exists(uri: str) -> bool:
    fs, path = resolve(uri)
    try:
        return fs.get_file_info(path).type != pafs.FileType.NotFound
    except OSError as err:
        raise RedlineError(f"cannot reach {uri}: {first_line(err)}") from None


def read_bytes(uri: str) -> bytes:
    fs, path = resolve(uri)
    try:
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise NotFound(f"file not found: {uri}")
        if info.type == pafs.FileType.Directory:
            raise RedlineError(f"expected a file but found a directory: {uri}")
        with fs.open_input_stream(path) as f:
            return f.read()
    except OSError as err:
        raise RedlineError(f"cannot read {uri}: {first_line(err)}") from None


def remove(uri: str) -> None:
    """Delete a file (one already gone is not an error)."""
    fs, path = resolve(uri)
    try:
        fs.delete_file(path)
    except FileNotFoundError:
        pass
    except OSError as err:
        raise RedlineError(f"cannot delete {uri}: {first_line(err)}") from None


def write_bytes(uri: str, data: bytes) -> None:
    """Atomic: readers see the old file or the whole new one, never a partial write.

    Locally: write a temporary sibling, then rename. On S3 an object appears only once its upload
    completes, so writing the final key directly is already atomic.
    """
    fs, path = resolve(uri)
    try:
        if is_s3(uri):
            with fs.open_output_stream(path) as f:
                f.write(data)
            return
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex[:8]}")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as err:
        raise RedlineError(f"cannot write {uri}: {first_line(err)}") from None


def write_text(uri: str, text: str) -> None:
    write_bytes(uri, text.encode("utf-8"))


LONG_JSON = 4096  # characters: a top-level value longer than this is written on one line


def write_json(uri: str, obj: Any) -> None:
    write_text(uri, readable_json(obj) + "\n")


def readable_json(obj: Any) -> str:
    """Indented JSON, except that a long top-level value (a manifest's running totals, rewritten
    every few seconds) goes on one line: encoding it indented takes Python's slow encoder, ~10x the
    time of the compact one."""
    if not isinstance(obj, dict) or not obj:
        return json.dumps(obj, indent=2, default=str)
    items = []
    for key, value in obj.items():
        text = json.dumps(value, default=str)
        if len(text) <= LONG_JSON:
            text = json.dumps(value, indent=2, default=str).replace("\n", "\n  ")
        items.append(f"  {json.dumps(key if isinstance(key, str) else str(key))}: {text}")
    return "{\n" + ",\n".join(items) + "\n}"


def read_json(uri: str) -> Any:
    return json.loads(read_bytes(uri))


def write_parquet(table: pa.Table, uri: str) -> None:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    write_bytes(uri, buf.getvalue())


def read_parquet(uri: str, columns: list[str] | None = None, filters: Any = None) -> pa.Table:
    """A Parquet file, or only `columns` of the rows `filters` keep (pyarrow's filter form)."""
    return pq.read_table(io.BytesIO(read_bytes(uri)), columns=columns, filters=filters)


def read_parts(parts: list[str], columns: list[str] | None = None, filters: Any = None,
               limit: int | None = None) -> pa.Table:
    """Parquet parts as one table, in order (`columns` of the rows `filters` keep); with `limit`, only
    the first `limit` rows, reading no further part than needed."""
    tables: list[pa.Table] = []
    for part in parts:
        tables.append(read_parquet(part, columns, filters))
        if limit is not None and sum(t.num_rows for t in tables) >= limit:
            break
    table = pa.concat_tables(tables, promote_options="permissive")
    return table if limit is None else table.slice(0, limit)


def list_files(uri: str, suffix: str = "") -> list[str]:
    """Final files directly under a directory (temporary files of interrupted writes are skipped)."""
    fs, path = resolve(uri)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except OSError as err:
        raise RedlineError(f"cannot list {uri}: {first_line(err)}") from None
    names = sorted(i.base_name for i in infos if i.type == pafs.FileType.File)
    return [join(uri, n) for n in names if n.endswith(suffix) and not n.startswith(".")]


def check_directory(uri: str, what: str) -> None:
    """`uri` is a directory or does not exist yet (a file there is a mistake to name)."""
    fs, path = resolve(uri)
    try:
        kind = fs.get_file_info(path).type
    except OSError as err:
        raise RedlineError(f"cannot reach {uri}: {first_line(err)}") from None
    if kind == pafs.FileType.File:
        raise RedlineError(f"{what} {uri} is a file, not a directory")


def has_files(uri: str) -> bool:
    """Whether a directory exists and holds anything (an S3 prefix: any object under it)."""
    fs, path = resolve(uri)
    try:
        if fs.get_file_info(path).type == pafs.FileType.File:
            return True
        return bool(fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)))
    except OSError as err:
        raise RedlineError(f"cannot list {uri}: {first_line(err)}") from None


# --------------------------------------------------------------------------------------------
# What a manifest records


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for dist in ("redline", "ray", "torch", "transformers", "tokenizers", "pyarrow", "scikit-learn",
                 "alt-profanity-check", "numpy", "openai", "boto3"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return versions


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
