"""Run directories: one per (pipeline, config), with `manifest.json` saying where the run stands.

`open_run` finds or creates a run's directory (reusing a finished run, resuming an interrupted one,
refusing anything else); `lifecycle` marks it failed with a one-line error when the work raises;
`complete` marks it done. Local paths and s3:// URIs alike.
"""

from __future__ import annotations

import os
import shutil
import time
import traceback
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from redline.cluster import fingerprints, leases, storage
from redline.cluster.config import config_hash, input_uris
from redline.cluster.leases import Lease
from redline.errors import RedlineError, cause_line, first_line, unwrap_user_error

ERROR_LOG = "error.log"  # a failed run's full traceback, beside its manifest


@dataclass
class RunDir:
    """One run's directory: `manifest.json`, Parquet shards, and the report.

    The manifest's `state` is `running` until every shard and the report are written, then
    `complete`; a crashed run says `running` or `failed`, so partial output is never mistaken for
    a finished run.
    """

    uri: str

    @property
    def manifest_uri(self) -> str:
        return storage.join(self.uri, "manifest.json")

    def path(self, *parts: str) -> str:
        return storage.join(self.uri, *parts)

    def manifest(self) -> dict[str, Any] | None:
        if not storage.exists(self.manifest_uri):
            return None
        try:
            manifest = storage.read_json(self.manifest_uri)
        except ValueError:
            raise RedlineError(f"{self.manifest_uri} is not valid JSON (a damaged run directory)") from None
        if not isinstance(manifest, dict):
            raise RedlineError(f"{self.manifest_uri} is not a redline manifest")
        return manifest

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        leases.check(self.uri)  # a driver that lost the run to another stops before it writes
        manifest["updated_at"] = storage.now_iso()
        storage.write_json(self.manifest_uri, manifest)

    def is_complete(self) -> bool:
        m = self.manifest()
        return bool(m and m.get("state") == "complete")


class Stopwatch:
    """Named wall-clock timings for the manifest."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._t0 = time.perf_counter()

    def lap(self, name: str) -> float:
        now = time.perf_counter()
        self.timings[name] = round(now - self._t0, 3)
        self._t0 = now
        return self.timings[name]


def clear(uri: str) -> None:
    """Remove a run directory's contents; a clear that fails (or leaves anything behind) is an error,
    never a run that goes on with the old files."""
    try:
        if storage.is_s3(uri):
            fs, path = storage.resolve(uri)
            fs.delete_dir_contents(path, missing_dir_ok=True)
        elif os.path.lexists(uri):
            shutil.rmtree(uri)
    except OSError as err:
        raise RedlineError(f"--force could not clear {uri}: {first_line(err)}") from None
    if storage.has_files(uri):
        raise RedlineError(f"--force could not clear {uri}: files are still there")


def check_not_link(uri: str) -> None:
    """A local run directory (or its manifest) that is a symbolic link is refused: --force would clear
    or resume whatever it points to."""
    if storage.is_s3(uri):
        return
    for path in (Path(uri), Path(uri, "manifest.json")):
        if path.is_symlink():
            raise RedlineError(f"{path} is a symbolic link (to {os.readlink(path)}); redline writes runs only into "
                               "real directories: remove the link or choose another run_name")


@dataclass
class Run:
    dir: RunDir
    manifest: dict[str, Any]
    reused: bool
    lease: Lease | None = None  # this driver's hold on the run directory (cluster/leases.py)

    @property
    def uri(self) -> str:
        return self.dir.uri


@dataclass
class RunResult:
    """What a pipeline run returns: where it is, its manifest, and its headline table (score:
    per-detector metrics; attack: per-recipe summary)."""

    run_uri: str
    manifest: dict[str, Any]
    summary: list[dict[str, Any]]
    reused: bool = False

    @property
    def report_html(self) -> str:
        return storage.join(self.run_uri, "report.html")


def owns(manifest: dict[str, Any], pipeline: str, name: str) -> bool:
    """Whether `manifest` is redline's own manifest of the run `name` of `pipeline`."""
    recorded = manifest.get("run_name") or str(manifest.get("run_uri", "")).rstrip("/").rsplit("/", 1)[-1]
    return manifest.get("pipeline") == pipeline and recorded == name


def finished_run(pipeline: str, config: BaseModel, output: str, run_name: str | None) -> bool:
    """Whether `open_run` would reuse a finished run of this config as it is: a caller can then skip
    what only a fresh run needs (a server to answer it, say)."""
    key = config_hash(config)
    name = run_name or f"{pipeline}-{key}"
    previous = RunDir(storage.join(output, name)).manifest()
    return (previous is not None and owns(previous, pipeline, name) and previous.get("state") == "complete"
            and previous.get("config_hash") == key
            and not fingerprints.changed_inputs(previous.get("inputs") or {}, fingerprints.of(input_uris(config))))


def open_run(pipeline: str, config: BaseModel, output: str, run_name: str | None, force: bool,
             inputs: Iterable[str] | None = None) -> Run:
    """The run directory for this config: a finished run is reused unless `force`; an interrupted
    one is resumed; a directory holding anything else (another pipeline's or config's run, files
    redline did not write, inputs that changed since) is refused. `force` clears only a directory
    whose manifest says it is this very run."""
    key = config_hash(config)
    name = run_name or f"{pipeline}-{key}"
    storage.check_directory(output, "output")
    run = RunDir(storage.join(output, name))
    check_not_link(run.uri)
    previous = run.manifest()
    if previous is None and storage.has_files(run.uri):
        raise RedlineError(f"{run.uri} exists and is not a redline run directory (no manifest.json); "
                           "choose another run_name or output")
    if previous is not None and not owns(previous, pipeline, name):
        raise RedlineError(f"{run.uri} holds a run of the {previous.get('pipeline') or 'unknown'} pipeline, not the "
                           f"{pipeline} run '{name}'; choose another run_name")
    inputs_now = fingerprints.of(input_uris(config) if inputs is None else inputs)
    # held before --force clears the directory or a resume writes into it (a reused finished run needs none)
    resumes = previous is not None and (force or previous.get("state") != "complete")
    lease = leases.acquire(run.uri) if resumes else None
    try:
        return _open(run, previous, pipeline, config, name, key, force, inputs_now, lease)
    except BaseException:
        if lease is not None:
            lease.release()
        raise


def _open(run: RunDir, previous: dict[str, Any] | None, pipeline: str, config: BaseModel, name: str, key: str,
          force: bool, inputs_now: dict[str, Any], lease: Lease | None) -> Run:
    if force and previous:
        clear(run.uri)
        previous = None
        if lease is not None:
            lease.write()
    if previous and previous.get("config_hash") not in (None, key):
        raise RedlineError(f"{run.uri} holds a run of a different config; choose another run_name or pass --force")
    if previous:
        changed = fingerprints.changed_inputs(previous.get("inputs") or {}, inputs_now)
        if changed:
            raise RedlineError(f"input {changed[0]} changed since run {run.uri} read it; pass --force to redo the run "
                               "(or restore the input)")
    if previous and previous.get("state") == "complete":
        if lease is not None:
            lease.release()
        return Run(run, previous, reused=True)
    manifest: dict[str, Any] = previous or {}
    manifest.update(pipeline=pipeline, run_name=name, state="running", run_uri=run.uri,
                    config=config.model_dump(mode="json"), config_hash=key,
                    inputs=fingerprints.merged((previous or {}).get("inputs") or {}, inputs_now),
                    versions=storage.package_versions(), started_at=manifest.get("started_at") or storage.now_iso(),
                    attempts=int(manifest.get("attempts", 0)) + 1)
    manifest.pop("error", None)
    run.write_manifest(manifest)
    return Run(run, manifest, reused=False, lease=lease or leases.acquire(run.uri))


@contextmanager
def lifecycle(run: Run) -> Iterator[None]:
    """Marks the manifest `failed` (with a one-line error) if the body raises; re-raises a user
    error found inside Ray's wrappers as itself."""
    try:
        yield
    except BaseException as err:
        user = unwrap_user_error(err)
        run.manifest["state"] = "failed"
        run.manifest["error"] = stop_reason(err) or cause_line(err)
        if user is None and isinstance(err, Exception):  # a failure, not a user mistake: keep the whole trace
            log_uri = run.dir.path(ERROR_LOG)
            try:
                storage.write_text(log_uri, "".join(traceback.format_exception(err)))
                run.manifest["error_log"] = log_uri
                err.redline_log = log_uri  # type: ignore[attr-defined]  # the CLI names it in its one line
            except RedlineError:
                pass
        try:
            run.dir.write_manifest(run.manifest)
        except RedlineError:
            pass
        if user is not None and user is not err:
            raise user from None
        raise
    finally:
        if run.lease is not None:  # after the manifest says how the run ended
            run.lease.release()


def stop_reason(err: BaseException) -> str | None:
    """What stopped a run that did not fail by itself (Ctrl-C, a signal, an exit), in words."""
    if isinstance(err, KeyboardInterrupt):
        return "interrupted (Ctrl-C or SIGINT); rerun the same command to resume"
    if isinstance(err, SystemExit):
        code = err.code
        if isinstance(code, int) and 0 < code < 64:
            import signal

            try:
                return f"stopped by {signal.Signals(code).name}; rerun the same command to resume"
            except ValueError:
                pass
        return f"stopped ({code if isinstance(code, str) else f'exit {code}'}); rerun the same command to resume"
    return None


def complete(run: Run) -> None:
    run.manifest["state"] = "complete"
    run.manifest["finished_at"] = storage.now_iso()
    run.dir.write_manifest(run.manifest)
    if run.lease is not None:
        run.lease.release()


def require_finished(uri: str, pipeline: str) -> dict[str, Any]:
    """The manifest of a finished run of `pipeline` at `uri` (a run another pipeline builds on)."""
    run = RunDir(uri)
    manifest = run.manifest()
    if manifest is None or manifest.get("pipeline") != pipeline:
        raise RedlineError(f"{uri} is not a run directory of the {pipeline} pipeline (no manifest.json of one)")
    if not run.is_complete():
        raise RedlineError(f"{pipeline} run {uri} is {manifest.get('state')}; finish it first (rerun its command)")
    return manifest
