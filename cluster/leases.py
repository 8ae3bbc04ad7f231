"""One run, one driver: a driver holds its run directory's lease (`lease.json`) while it lives,
renewing it every RENEW_S seconds; a second driver on the same run is refused with one line naming
the holder. A driver that died frees the run without a manual unlock: at once when it ran on this
host (its process, told apart by its start time, is gone), else when its lease is TTL_S old.

Every change to the lease is a compare-and-swap, so two drivers can never both hold it however slow
their writes: on S3 a conditional write (`If-None-Match: *` to take a free lease, `If-Match: <ETag>`
to renew or take over a stale one); on a local path the same under an exclusive lock on a sidecar
file. A lease's age is the store's (S3: its `Last-Modified` against the answer's `Date`), so a
reader whose clock runs ahead never takes over a live lease. A driver whose renewal is refused
(another driver took over) or cannot reach the store for TTL_S has lost the run: its next manifest
write stops it with one line.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

from redline.cluster import storage
from redline.errors import RedlineError, first_line

LEASE = "lease.json"
RENEW_S = 10.0
TTL_S = 30.0


def _job_id() -> str | None:
    """The Ray job submission this driver runs as, if any (`redline stop` takes it)."""
    try:
        config = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR", "") or "{}")
    except ValueError:
        return None
    job = config.get("metadata", {}).get("job_submission_id") if isinstance(config, dict) else None
    return str(job) if job else None


def _process_start(pid: int) -> str | None:
    """When process `pid` of this host started (Linux), so a pid reused by another process is told apart."""
    try:
        return Path(f"/proc/{int(pid)}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError, ValueError):
        return None


def _holds(holder: dict[str, Any], age_s: float | None) -> bool:
    """Whether the holder still holds its lease: on this host, while its process lives (however late
    its renewal: a stopped or swapped-out driver still owns its run); elsewhere, until the lease is
    TTL_S old by the store's clock."""
    if holder.get("host") == socket.gethostname() and holder.get("started") is not None:
        return _process_start(holder.get("pid", 0)) == holder["started"]
    return age_s is None or age_s < TTL_S  # an age the store did not say: held, never taken over


def describe(holder: dict[str, Any]) -> str:
    where = f"pid {holder.get('pid')} on {holder.get('host')}"
    return f"job {holder['job']} ({where})" if holder.get("job") else where


Version = str  # what a compare-and-swap compares: an S3 ETag, a local file's content digest


class _LocalStore:
    """The lease as a local (or shared-filesystem) file; every change under an exclusive lock."""

    def __init__(self, uri: str) -> None:
        self.path = Path(uri).expanduser()

    @contextmanager
    def _locked(self) -> Iterator[float]:
        """Held exclusively; yields the filesystem's "now" (the lock file touched: on a shared
        filesystem the server's clock, the one that stamps the lease), never this host's clock."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.parent / f".{self.path.name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.utime(fd)
            yield os.fstat(fd).st_mtime
        finally:
            os.close(fd)

    def _read(self, now: float) -> tuple[dict[str, Any] | None, Version | None, float | None]:
        try:
            data, mtime = self.path.read_bytes(), self.path.stat().st_mtime
        except FileNotFoundError:
            return None, None, None
        try:
            record = json.loads(data)
        except ValueError:
            record = {}
        return (record if isinstance(record, dict) else {}), hashlib.sha256(data).hexdigest(), now - mtime

    def read(self) -> tuple[dict[str, Any] | None, Version | None, float | None]:
        with self._locked() as now:
            return self._read(now)

    def _write(self, record: dict[str, Any]) -> Version:
        data = json.dumps(record).encode()
        storage.write_bytes(str(self.path), data)
        return hashlib.sha256(data).hexdigest()

    def create(self, record: dict[str, Any]) -> Version | None:
        with self._locked():
            return None if self.path.exists() else self._write(record)

    def replace(self, record: dict[str, Any], version: Version) -> Version | None:
        with self._locked() as now:
            return self._write(record) if self._read(now)[1] == version else None

    def delete(self, version: Version) -> None:
        with self._locked() as now:
            if self._read(now)[1] == version:
                self.path.unlink(missing_ok=True)


class _S3Store:
    """The lease as an S3 object, changed only by conditional writes (a 412 says someone else won)."""

    def __init__(self, uri: str) -> None:
        self.bucket, _, self.key = uri.removeprefix("s3://").partition("/")

    @staticmethod
    def _client():  # noqa: ANN205 - a boto3 client with short timeouts: a renewal never blocks past the TTL
        def make():  # noqa: ANN202
            import boto3
            from botocore.config import Config

            return boto3.session.Session().client("s3", config=Config(connect_timeout=3, read_timeout=5,
                                                                      retries={"max_attempts": 2}))

        return storage.s3_cached("lease-client", make)

    def _call(self, what: str, call: Any, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return call(Bucket=self.bucket, Key=self.key, **kwargs)
        except ClientError as err:
            code = str(err.response.get("Error", {}).get("Code"))
            status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "404") or status in (409, 412):
                return None
            raise RedlineError(f"cannot {what} the lease s3://{self.bucket}/{self.key}: {first_line(err)}") from None
        except BotoCoreError as err:
            raise RedlineError(f"cannot {what} the lease s3://{self.bucket}/{self.key}: {first_line(err)}") from None

    def read(self) -> tuple[dict[str, Any] | None, Version | None, float | None]:
        answer = self._call("read", self._client().get_object)
        if answer is None:
            return None, None, None
        try:
            record = json.loads(answer["Body"].read())
        except ValueError:
            record = {}
        age = None
        date = answer.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        if date and answer.get("LastModified") is not None:
            age = (parsedate_to_datetime(date) - answer["LastModified"]).total_seconds()
        return (record if isinstance(record, dict) else {}), answer["ETag"], age

    def create(self, record: dict[str, Any]) -> Version | None:
        answer = self._call("take", self._client().put_object, Body=json.dumps(record).encode(), IfNoneMatch="*")
        return None if answer is None else answer["ETag"]

    def replace(self, record: dict[str, Any], version: Version) -> Version | None:
        answer = self._call("renew", self._client().put_object, Body=json.dumps(record).encode(), IfMatch=version)
        return None if answer is None else answer["ETag"]

    def delete(self, version: Version) -> None:
        self._call("release", self._client().delete_object, IfMatch=version)


def _store(uri: str) -> _LocalStore | _S3Store:
    return _S3Store(uri) if storage.is_s3(uri) else _LocalStore(uri)


_HELD: dict[str, "Lease"] = {}  # this process's leases by run directory, for `check`


@dataclass
class Lease:
    uri: str
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    version: Version | None = None
    lost: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def record(self) -> dict[str, Any]:
        return {"token": self.token, "host": socket.gethostname(), "pid": os.getpid(),
                "started": _process_start(os.getpid()), "job": _job_id(), "expires": time.time() + TTL_S}

    def write(self) -> None:
        """Take the lease again after the run directory was cleared (`--force`), or renew it."""
        store = _store(self.uri)
        version = store.replace(self.record(), self.version) if self.version else None
        self.version = version or store.create(self.record())
        if self.version is None:
            self.lost = "another driver took the run over"

    def renew_until_released(self) -> None:
        def renew() -> None:
            store, renewed = _store(self.uri), time.monotonic()
            while not self._stop.wait(RENEW_S):
                try:
                    version = store.replace(self.record(), self.version) if self.version else None
                except RedlineError as err:  # unreachable for now: the next renewal may reach it, within the TTL
                    if time.monotonic() - renewed >= TTL_S - RENEW_S / 2:
                        self.lost = f"the lease could not be renewed for {TTL_S:g} s ({err})"
                        return
                    continue
                if version is None:
                    self.lost = "another driver took the run over (the lease was replaced)"
                    return
                self.version, renewed = version, time.monotonic()

        self._thread = threading.Thread(target=renew, name="redline-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop renewing and remove the lease (if it is still this driver's)."""
        self._stop.set()
        _HELD.pop(self.run_uri, None)
        if self.version is None or self.lost:
            return
        try:
            _store(self.uri).delete(self.version)
        except RedlineError:
            pass  # it expires by itself

    @property
    def run_uri(self) -> str:
        return self.uri.rsplit("/", 1)[0].rstrip("/")


def check(run_uri: str) -> None:
    """Stop a driver that lost its run's lease before it writes again (one line)."""
    lease = _HELD.get(run_uri.rstrip("/"))
    if lease is not None and lease.lost:
        raise RedlineError(f"run {run_uri}: this driver lost its lease ({lease.lost}); it stops writing here. "
                           "Rerun to resume once the other driver is done")


def held(uri: str) -> dict[str, Any] | None:
    try:
        return _store(uri).read()[0]
    except RedlineError:
        return None


def acquire(run_uri: str, tries: int = 5) -> Lease:
    """This driver's lease on a run directory, renewed until released; refused while another live
    driver holds it. A free lease is taken with a create-if-absent, a stale one replaced only if it
    is still the one that was read."""
    lease, store = Lease(storage.join(run_uri, LEASE)), _store(storage.join(run_uri, LEASE))
    holder: dict[str, Any] | None = None
    for _ in range(tries):
        lease.version = store.create(lease.record())
        if lease.version is not None:
            break
        holder, version, age = store.read()
        if holder is None:
            continue  # released meanwhile: take it
        _refuse_if_held(run_uri, holder, age)
        lease.version = store.replace(lease.record(), version)  # type: ignore[arg-type]
        if lease.version is not None:
            break
    else:
        raise RedlineError(f"run {run_uri} is in use by another driver, {describe(holder or {})}: its lease changed "
                           f"hands {tries} times while this driver tried to take it")
    _HELD[lease.run_uri] = lease
    lease.renew_until_released()
    return lease


def _refuse_if_held(run_uri: str, holder: dict[str, Any], age_s: float | None) -> None:
    if not _holds(holder, age_s):
        return
    if holder.get("host") == socket.gethostname():
        freed = "at once"
    else:
        left = max(0.0, TTL_S - (age_s or 0.0))
        freed = f"within {left:.0f} s of its last renewal"
    stop = f"stop it with `redline stop {holder['job']}`" if holder.get("job") else "stop it"
    raise RedlineError(f"run {run_uri} is in use by another driver, {describe(holder)}: wait for it to finish or "
                       f"{stop}; a driver that dies frees the run {freed}")
