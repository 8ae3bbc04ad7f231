"""One run, one driver: a driver holds its run directory's lease (`lease.json`) while it lives,
renewing it every RENEW_S seconds; a second driver on the same run is refused with one line naming
the holder. A driver that died frees the run without a manual unlock: at once when it ran on this
host (its process, told apart by its start time, is gone), else when its lease expires (TTL_S
after its last renewal).

Without conditional writes on every store, two drivers starting in the same instant are told apart
by writing, waiting SETTLE_S and reading back: the last writer holds the run, the other refuses.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from redline.cluster import storage
from redline.errors import RedlineError

LEASE = "lease.json"
RENEW_S = 10.0
TTL_S = 30.0
SETTLE_S = 0.2


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


def _holds(holder: dict[str, Any]) -> bool:
    """Whether the holder still holds its lease: on this host, while its process lives (however late
    its renewal: a stopped or swapped-out driver still owns its run); elsewhere, until it expires."""
    if holder.get("host") == socket.gethostname() and holder.get("started") is not None:
        return _process_start(holder.get("pid", 0)) == holder["started"]
    return float(holder.get("expires", 0)) >= time.time()


def describe(holder: dict[str, Any]) -> str:
    where = f"pid {holder.get('pid')} on {holder.get('host')}"
    return f"job {holder['job']} ({where})" if holder.get("job") else where


@dataclass
class Lease:
    uri: str
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def record(self) -> dict[str, Any]:
        return {"token": self.token, "host": socket.gethostname(), "pid": os.getpid(),
                "started": _process_start(os.getpid()), "job": _job_id(), "expires": time.time() + TTL_S}

    def write(self) -> None:
        storage.write_json(self.uri, self.record())

    def renew_until_released(self) -> None:
        def renew() -> None:
            while not self._stop.wait(RENEW_S):
                try:
                    self.write()
                except RedlineError:  # the store is briefly unreachable: the next renewal may reach it
                    pass

        self._thread = threading.Thread(target=renew, name="redline-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop renewing and remove the lease (if it is still this driver's)."""
        self._stop.set()
        try:
            if (held(self.uri) or {}).get("token") == self.token:
                storage.remove(self.uri)
        except RedlineError:
            pass  # it expires by itself


def held(uri: str) -> dict[str, Any] | None:
    try:
        value = storage.read_json(uri)
    except (RedlineError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def acquire(run_uri: str) -> Lease:
    """This driver's lease on a run directory, renewed until released; refused while another live
    driver holds it."""
    lease = Lease(storage.join(run_uri, LEASE))
    _refuse_if_held(run_uri, held(lease.uri), lease.token)
    lease.write()
    time.sleep(SETTLE_S)
    _refuse_if_held(run_uri, held(lease.uri), lease.token)
    lease.renew_until_released()
    return lease


def _refuse_if_held(run_uri: str, holder: dict[str, Any] | None, token: str) -> None:
    if not holder or holder.get("token") == token or not _holds(holder):
        return
    if holder.get("host") == socket.gethostname():
        freed = "at once"
    else:
        freed = "by " + datetime.fromtimestamp(float(holder.get("expires", 0)), timezone.utc).strftime("%H:%M:%S UTC")
    stop = f"stop it with `redline stop {holder['job']}`" if holder.get("job") else "stop it"
    raise RedlineError(f"run {run_uri} is in use by another driver, {describe(holder)}: wait for it to finish or "
                       f"{stop}; a driver that dies frees the run {freed}")
