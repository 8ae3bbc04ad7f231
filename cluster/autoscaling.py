"""The cluster's autoscaler, read from the cluster itself: whether one runs, and whether it adds a node
for a request that no node up now can hold. A request waits for the node (saying what it waits for,
and since when) while the autoscaler launches one; it is refused once the autoscaler has seen it and
launched nothing for it over several of its updates (no node type has the resource, or the cluster
is at its max_workers)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from redline.errors import RedlineError

UPDATES_BEFORE_REFUSING = 3
STALE_S = 120.0  # a status older than this is from an autoscaler that no longer runs


@dataclass(frozen=True)
class Status:
    """One autoscaler update, as it reports it in the cluster's key-value store."""

    time: float
    launching: int  # nodes asked of the cloud and not up yet
    pending: frozenset[str]  # nodes launched and still starting

    def launched_since(self, before: Status) -> bool:
        return self.launching > 0 or bool(self.pending - before.pending)


def status() -> Status | None:
    """The autoscaler's latest update, or None where the cluster runs none that launches nodes: a local
    or plain `ray start` cluster runs a read-only one, which names each node's type after the node."""
    from ray._private import ray_constants
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS)
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    report = data.get("autoscaler_report")
    at = float(data.get("time") or 0)
    if not isinstance(report, dict) or time.time() - at > STALE_S:
        return None
    types = report.get("node_type_mapping") or {}
    if not types or all(kind == f"node_{node}" for node, kind in types.items()):
        return None
    return Status(time=at, launching=sum((report.get("pending_launches") or {}).values()),
                  pending=frozenset(str(n[0]) for n in report.get("pending_nodes") or []))


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def wait_for_node(what: str, short: str, bundle: dict[str, float], fits: Callable[[], bool],
                  first: Status, say: Callable[[str], None] = _say) -> None:
    """Ask the autoscaler for `bundle` and wait until `fits()`; refuse (one line naming `short`, what
    is asked) when the autoscaler launches nothing for it, or when no such node joins within
    REDLINE_SCALE_UP_WAIT_S (30 minutes by default)."""
    from ray.autoscaler.sdk import request_resources

    limit = float(os.environ.get("REDLINE_SCALE_UP_WAIT_S", "1800"))
    interval = float(os.environ.get("REDLINE_PROGRESS_INTERVAL", "10"))
    since = time.time()
    stamp = datetime.fromtimestamp(since).strftime("%H:%M:%S")
    request_resources(bundles=[{k: v for k, v in bundle.items() if v}])
    last_said, updates, last_time, launched = 0.0, 0, first.time, False
    try:
        while not fits():
            now = status()
            if now is not None and now.time != last_time and now.time > since:
                last_time, updates = now.time, updates + 1
                launched = launched or now.launched_since(first)
            if updates >= UPDATES_BEFORE_REFUSING and not launched:
                raise RedlineError(f"{what} asks for {short}, and the cluster's autoscaler adds no node for it "
                                   "(no node type has that much, or the cluster is at max_workers): lower it")
            if time.time() - since > limit:
                raise RedlineError(f"{what} asks for {short}: no such node joined the cluster in {limit:g} s "
                                   "(REDLINE_SCALE_UP_WAIT_S); see `ray status` for the autoscaler's view")
            if time.time() - last_said >= interval:
                last_said = time.time()
                say(f"waiting for the autoscaler to add a node for {what} ({short}) since {stamp} "
                    f"({time.time() - since:.0f} s)")
            time.sleep(1.0)
    finally:
        request_resources(bundles=[])
    say(f"a node for {what} joined after {time.time() - since:.0f} s")
