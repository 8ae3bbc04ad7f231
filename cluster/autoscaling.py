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
REPORT_WAIT_S = 15.0


@dataclass(frozen=True)
class Status:
    """One autoscaler update, as the cluster reports it."""

    update: float  # which update: its time (v1) or the autoscaler's state version (v2)
    launching: int  # nodes asked of the cloud and not up yet
    pending: frozenset[str]  # nodes launched and still starting

    def launched_since(self, before: Status) -> bool:
        return self.launching > 0 or bool(self.pending - before.pending)


class Unreported(Exception):
    """The cluster's autoscaler has not reported yet (a cluster that has just started)."""


def status(wait_s: float = REPORT_WAIT_S) -> Status | None:
    """The autoscaler's latest update, or None where the cluster runs none that launches nodes; on a
    cluster that has just started, its first report is awaited for up to `wait_s`."""
    from ray.autoscaler.v2.utils import is_autoscaler_v2

    deadline = time.monotonic() + wait_s
    while True:
        try:
            return _status_v2() if is_autoscaler_v2(fetch_from_server=True) else _status_v1()
        except Unreported:
            if time.monotonic() >= deadline:
                return None
            time.sleep(1.0)


def _status_v1() -> Status | None:
    """Ray's first autoscaler reports each update in the key-value store. A local or plain `ray start`
    cluster runs a read-only one, which names each node's type after the node."""
    from ray._private import ray_constants
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS)
    if not raw:
        raise Unreported
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    report = data.get("autoscaler_report")
    at = float(data.get("time") or 0)
    if time.time() - at > STALE_S:
        return None
    # A monitor that has just started publishes its load metrics a few seconds before its autoscaler's
    # first update (no report), which may come before it has seen a node (no node types yet).
    if report is None or (isinstance(report, dict) and not report.get("node_type_mapping")):
        raise Unreported
    if not isinstance(report, dict):
        return None
    types = report["node_type_mapping"]
    if all(kind == f"node_{node}" for node, kind in types.items()):
        return None
    return Status(update=at, launching=sum((report.get("pending_launches") or {}).values()),
                  pending=frozenset(str(n[0]) for n in report.get("pending_nodes") or []))


def _status_v2() -> Status | None:
    """Ray's second autoscaler reports its state to the cluster's control service; its version counts
    the updates (0: none has reported yet)."""
    from ray._raylet import GcsClient
    from ray.core.generated.autoscaler_pb2 import GetClusterStatusReply
    from ray.experimental.internal_kv import internal_kv_get_gcs_client

    reply = GetClusterStatusReply()
    reply.ParseFromString(GcsClient(internal_kv_get_gcs_client().address).get_cluster_status())
    state = reply.autoscaling_state
    if not state.autoscaler_state_version:
        raise Unreported
    return Status(update=float(state.autoscaler_state_version),
                  launching=sum(r.count for r in state.pending_instance_requests),
                  pending=frozenset(i.instance_id for i in state.pending_instances))


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
    last_said, updates, last_update, launched = 0.0, 0, first.update, False
    try:
        while not fits():
            now = status(wait_s=0)
            if now is not None and now.update != last_update:
                last_update, updates = now.update, updates + 1
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
