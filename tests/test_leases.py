"""One driver per run, whatever the timing: two drivers racing for a run (a free lease, or a stale one
both want to take over), with writes delayed at random and one driver's clock 40 s ahead, never both
hold it, on a local path and on a real S3 server (moto). A driver that loses its lease stops writing."""

from __future__ import annotations

import json
import os
import random
import socket
import threading
import time

import pytest

from redline.errors import RedlineError

TRIALS = 100


def _slowed(monkeypatch, stores):
    """Every store call waits 0-20 ms first (so the two drivers interleave differently each trial)."""
    for cls in stores:
        for name in ("create", "replace", "read"):
            real = getattr(cls, name)

            def slow(self, *args, _real=real, **kwargs):
                time.sleep(random.uniform(0, 0.02))
                return _real(self, *args, **kwargs)

            monkeypatch.setattr(cls, name, slow)


def _skewed(monkeypatch):
    """The thread named 'ahead' reads a clock 40 s ahead."""
    from redline.cluster import leases

    real, monotonic, sleep = time.time, time.monotonic, time.sleep

    class Clock:
        @staticmethod
        def time() -> float:
            return real() + (40.0 if threading.current_thread().name == "ahead" else 0.0)

    Clock.monotonic, Clock.sleep = staticmethod(monotonic), staticmethod(sleep)

    monkeypatch.setattr(leases, "time", Clock)


def _race(run_uri: str) -> list[object]:
    from redline.cluster import leases

    results: list[object] = []
    start = threading.Barrier(2)

    def driver() -> None:
        start.wait()
        try:
            results.append(leases.acquire(run_uri))
        except RedlineError as err:
            results.append(err)

    threads = [threading.Thread(target=driver, name=name) for name in ("ahead", "behind")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def _stale(host: str = "elsewhere") -> dict:
    return {"token": "old", "host": host, "pid": 1, "started": None, "expires": 0}


@pytest.mark.parametrize("where", ["local", "s3"])
def test_two_racing_drivers_never_both_hold_a_run(where, tmp_path, monkeypatch, request):
    from redline.cluster import leases, storage

    if where == "s3":
        endpoint = request.getfixturevalue("s3_env")
        import boto3

        s3 = boto3.client("s3", endpoint_url=endpoint)
        s3.create_bucket(Bucket="leases")
        base = "s3://leases/runs"
    else:
        base = str(tmp_path / "runs")
    _slowed(monkeypatch, [leases._LocalStore, leases._S3Store])
    _skewed(monkeypatch)
    holders_at_once = []
    for trial in range(TRIALS):
        run_uri = storage.join(base, f"run-{trial}")
        lease_uri = storage.join(run_uri, leases.LEASE)
        if trial % 2:  # a stale lease of a driver that died elsewhere: both try to take it over
            if where == "s3":  # its object is fresh by the store's clock: a driver of this host whose process died
                dead = {**_stale(socket.gethostname()), "pid": 2**22 + 7, "started": "0"}
                s3.put_object(Bucket="leases", Key=f"runs/run-{trial}/{leases.LEASE}", Body=json.dumps(dead))
            else:
                os.makedirs(run_uri, exist_ok=True)
                with open(lease_uri, "w") as f:
                    json.dump(_stale(), f)
                os.utime(lease_uri, (time.time() - 60, time.time() - 60))
        results = _race(run_uri)
        won = [r for r in results if isinstance(r, leases.Lease)]
        refused = [r for r in results if isinstance(r, RedlineError)]
        holders_at_once.append(len(won))
        assert len(won) == 1 and len(refused) == 1, (trial, results)
        assert "is in use by another driver" in str(refused[0])
        assert leases.held(lease_uri)["token"] == won[0].token
        won[0].release()
    assert max(holders_at_once) == 1


def test_a_live_lease_elsewhere_is_never_taken_by_a_clock_that_runs_ahead(s3_env, monkeypatch):
    """Another host's lease renewed a moment ago, its record saying it expired long ago (its writer's
    clock): the store's own clock decides, and it is live."""
    import boto3

    from redline.cluster import leases

    s3 = boto3.client("s3", endpoint_url=s3_env)
    s3.create_bucket(Bucket="skew")
    s3.put_object(Bucket="skew", Key=f"run/{leases.LEASE}", Body=json.dumps(_stale()))
    _skewed(monkeypatch)
    results = _race("s3://skew/run")
    assert all(isinstance(r, RedlineError) for r in results), results


def test_a_driver_that_loses_its_lease_stops_writing(tmp_path, monkeypatch):
    from redline.cluster import leases
    from redline.cluster.runs import RunDir

    monkeypatch.setattr(leases, "RENEW_S", 0.05)
    run = RunDir(str(tmp_path / "run"))
    run.write_manifest({"state": "running"})
    mine = leases.acquire(run.uri)
    other = {**_stale(socket.gethostname()), "token": "thief", "pid": os.getpid(), "started": "elsewhen"}
    (tmp_path / "run" / leases.LEASE).write_text(json.dumps(other))  # another driver took the run over
    deadline = time.time() + 10
    while mine.lost is None and time.time() < deadline:
        time.sleep(0.05)
    assert mine.lost == "another driver took the run over (the lease was replaced)"
    with pytest.raises(RedlineError, match=r"this driver lost its lease \(another driver took the run over"):
        run.write_manifest({"state": "running"})
    mine.release()
    assert json.loads((tmp_path / "run" / leases.LEASE).read_text())["token"] == "thief"  # never removed


def test_a_store_unreachable_for_the_ttl_loses_the_lease(tmp_path, monkeypatch):
    from redline.cluster import leases

    monkeypatch.setattr(leases, "RENEW_S", 0.05)
    monkeypatch.setattr(leases, "TTL_S", 0.3)
    mine = leases.acquire(str(tmp_path / "run"))

    def down(self, *args, **kwargs):
        raise RedlineError("cannot renew the lease: connection timed out")

    monkeypatch.setattr(leases._LocalStore, "replace", down)
    deadline = time.time() + 10
    while mine.lost is None and time.time() < deadline:
        time.sleep(0.05)
    assert mine.lost and mine.lost.startswith("the lease could not be renewed for 0.3 s")
    mine.release()
