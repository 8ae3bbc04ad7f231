"""The runs under a location (a local directory or an s3:// prefix), read from their manifests.

A run is a directory holding `manifest.json`; runs sit directly under the location or one level
deeper (a folder of outputs). A run whose manifest cannot be read is listed with its error rather
than hidden, so a half-written or damaged directory shows up where the user looks for it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import stat
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import pyarrow.fs as pafs

from redline.cluster import paths, storage
from redline.cluster.runs import RunDir
from redline.errors import RedlineError, first_line
from redline.pipelines.registry import Entry, entries
from redline.pipelines.reporting.figures import Headline
from redline.pipelines.reporting.report import format_value

SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
MAX_DEPTH = 2
MAX_MANIFEST_BYTES = 32 << 20
# What a page takes from one manifest: a manifest may hold a million counts, a page shows a few.
MAX_COUNTS = 64
MAX_SUMMARY_ROWS = 500


@dataclass
class Figure:
    label: str  # the summary row's name, e.g. "deepwordbug tae"
    heading: str  # the figure's name, e.g. "ASR"
    value: Any
    fmt: str

    @property
    def text(self) -> str:
        return format_value(self.value, self.fmt)


@dataclass
class RunInfo:
    """One row of the run list."""

    id: str  # the run's path below the location, '/'-separated
    uri: str
    pipeline: str = ""
    name: str = ""
    state: str = "unreadable"
    started: str | None = None
    updated: str | None = None
    wall_s: float | None = None
    counts: dict[str, Any] = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)
    error: str | None = None
    manifest: dict[str, Any] | None = None
    progress: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "uri": self.uri, "pipeline": self.pipeline, "name": self.name, "state": self.state,
                "started": self.started, "updated": self.updated, "wall_s": self.wall_s, "counts": self.counts,
                "progress": self.progress,
                "figures": [{"label": f.label, "heading": f.heading, "value": f.value, "text": f.text}
                            for f in self.figures], "error": self.error}


def check_location(root: str) -> None:
    """The location is a directory (or an S3 prefix, which may still be empty)."""
    storage.check_directory(root, "runs location")
    if not storage.is_s3(root) and not storage.exists(root):
        raise RedlineError(f"no directory {root} (run a pipeline first, e.g. `redline quickstart`)")


def _children(root: str, rel: str) -> list[str]:
    """Folders directly under root/rel with plain names; locally, symbolic links are not folders of
    the location (a link could lead anywhere the viewer's user can read) and are left out."""
    fs, path = storage.resolve(storage.join(root, rel) if rel else root)
    if not storage.is_s3(root):
        try:
            with os.scandir(path) as entries_:
                return sorted(e.name for e in entries_ if e.is_dir(follow_symlinks=False) and SEGMENT.match(e.name))
        except FileNotFoundError:
            return []
        except OSError as err:
            raise RedlineError(f"cannot list {root}: {first_line(err)}") from None
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except OSError as err:
        raise RedlineError(f"cannot list {root}: {first_line(err)}") from None
    return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory and SEGMENT.match(i.base_name))


def run_uri(root: str, run_id: str) -> str:
    """The directory of run `run_id` under `root`; an id that is not a plain relative path is refused."""
    parts = run_id.split("/")
    if not run_id or len(parts) > MAX_DEPTH or not all(SEGMENT.match(p) for p in parts):
        raise RedlineError(f"not a run id: {run_id!r}")
    return storage.join(root, *parts)


class RunCache:
    """The run-list rows of finished runs, each kept until its manifest's size or modification time
    changes (local locations), so a list of thousands of runs reads only the manifests that changed and
    those of running runs. A row is kept without its manifest (the run page reads that afresh)."""

    def __init__(self, size: int = 100_000) -> None:
        self.size, self._rows, self._lock = size, OrderedDict[str, tuple[tuple[int, int], RunInfo]](), threading.Lock()
        self._base: dict[str, str | None] = {}  # a location's local directory (None: S3)

    def read(self, root: str, rel: str) -> RunInfo | None:
        if root not in self._base:
            self._base[root] = None if storage.is_s3(root) else storage.resolve(root)[1]
        stamp = _stamp(self._base[root], rel)
        with self._lock:
            hit = self._rows.get(rel)
        if stamp is not None and hit is not None and hit[0] == stamp:
            return hit[1]
        info = read_run(root, rel)
        if stamp is not None and info is not None and info.manifest is not None and info.state != "running":
            # a row, not the whole manifest (bounded memory); still marked readable
            kept = dataclasses.replace(info, manifest={"pipeline": info.pipeline, "state": info.state})
            with self._lock:
                self._rows[rel] = (stamp, kept)
                self._rows.move_to_end(rel)
                while len(self._rows) > self.size:
                    self._rows.popitem(last=False)
        return info


def _stamp(base: str | None, rel: str) -> tuple[int, int] | None:
    """A local manifest's (size, mtime in ns) below the location's directory `base`, None on S3
    (`base` None) or when it is not a regular file."""
    if base is None:
        return None
    try:
        st = os.lstat(os.path.join(base, *rel.split("/"), "manifest.json"))
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else None


def find_runs(root: str, workers: int | None = None, cache: RunCache | None = None) -> list[RunInfo]:
    """Every run under `root`, newest first. On S3 manifests are read 16 at a time (round trips
    dominate there); local reads are faster one after another than through threads. `cache`: finished
    runs' rows read before, reused while their manifest is unchanged."""
    workers = workers or (16 if storage.is_s3(root) else 1)
    read = cache.read if cache is not None else read_run
    candidates = _children(root, "")
    runs: list[RunInfo] = []
    with ThreadPoolExecutor(workers) as pool:
        mapped = pool.map if workers > 1 else map  # one thread: no futures to pay for (thousands of runs)
        for depth in range(1, MAX_DEPTH + 1):
            infos = list(mapped(lambda rel: read(root, rel), candidates))
            runs += [i for i in infos if i is not None]
            if depth == MAX_DEPTH:
                break
            # directories without a manifest may hold runs one level down (a folder of outputs)
            missing = [rel for rel, info in zip(candidates, infos) if info is None]
            candidates = [f"{rel}/{c}" for rels in mapped(lambda r: [(r, c) for c in _children(root, r)], missing)
                          for rel, c in rels]
    runs.sort(key=lambda r: (r.started or "", r.id), reverse=True)
    return runs


def read_run(root: str, rel: str) -> RunInfo | None:
    """The run at `rel`, None when the directory holds no manifest (not a run)."""
    uri = run_uri(root, rel)
    info = RunInfo(id=rel, uri=uri, name=rel.rsplit("/", 1)[-1])
    manifest_uri = RunDir(uri).manifest_uri
    try:  # one request: a missing manifest means "not a run" (no existence check first)
        data = storage.read_below(root, [*rel.split("/"), "manifest.json"], MAX_MANIFEST_BYTES)
    except (paths.NotFound, paths.NotRegular):
        return None
    except RedlineError as err:
        info.error = str(err)
        return info
    try:
        manifest = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        info.error = f"{manifest_uri} is not valid JSON (a damaged or half-written run directory)"
        return info
    if not isinstance(manifest, dict):
        info.error = f"{manifest_uri} is not a redline manifest"
        return info
    return describe(info, manifest)


def describe(info: RunInfo, manifest: dict[str, Any]) -> RunInfo:
    info.manifest = manifest
    info.pipeline = str(manifest.get("pipeline") or "")
    info.name = str(manifest.get("run_name") or info.name)
    info.state = str(manifest.get("state") or "unknown")
    info.started, info.updated = manifest.get("started_at"), manifest.get("updated_at")
    counts = manifest.get("counts")
    numbers = ((k, v) for k, v in (counts.items() if isinstance(counts, dict) else ()) if isinstance(v, (int, float)))
    info.counts = dict(itertools.islice(numbers, MAX_COUNTS))
    info.error = manifest.get("error")
    info.wall_s = wall_seconds(manifest)
    info.progress = progress(manifest)
    entry = entry_of(info.pipeline)
    if entry is None:
        info.error = info.error or f"unknown pipeline '{info.pipeline}' (written by another redline version?)"
    elif entry.headline is not None:
        info.figures = figures(entry.headline, summary_rows(manifest))
    return info


def summary_rows(manifest: dict[str, Any] | None) -> list[Any]:
    """The first MAX_SUMMARY_ROWS rows of a manifest's summary (what any page shows of it)."""
    summary = (manifest or {}).get("summary")
    return summary[:MAX_SUMMARY_ROWS] if isinstance(summary, list) else []


def entry_of(pipeline: str) -> Entry | None:
    return next((e for e in entries() if e.name == pipeline), None)


def progress(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """How far a sharded run's current step is, from what its driver saves every few seconds: the rows
    of the parts counted so far of every pool's shards; the running step's rate and time left as its
    driver last recorded them (`cluster.progress.Pace`); when the manifest was last written. None
    when the run records no shards."""
    per_shard, partials = manifest.get("input_rows"), manifest.get("partials")
    if not isinstance(per_shard, list) or not all(isinstance(n, int) for n in per_shard) or not per_shard:
        return None
    counted = next((t.get("shards") for t in (partials or {}).values() if isinstance(t, dict)), None) or []
    keys = {tuple(k) for k in counted if isinstance(k, list) and k and all(isinstance(x, int) for x in k)}
    detectors = ((manifest.get("config") or {}).get("detectors") if isinstance(manifest.get("config"), dict) else None)
    pools = max([k[1] + 1 for k in keys if len(k) > 1] + [len(detectors) if isinstance(detectors, list) else 1, 1])
    total = sum(per_shard) * pools
    done = min(total, sum(per_shard[k[0]] for k in keys if 0 <= k[0] < len(per_shard)))
    # the rate and the time left are the driver's own (the figures its progress line prints, recorded
    # with the counts), never one made up here from the run's start, start-up and reading included
    pace = manifest.get("progress") if manifest.get("state") == "running" else None
    pace = pace if isinstance(pace, dict) else {}
    rate, eta = _number(pace.get("rate")), _number(pace.get("eta_s"))
    unit = pace.get("unit") if isinstance(pace.get("unit"), str) and re.fullmatch(r"[a-z]{1,20}", pace["unit"]) else "rows"
    text = f"{done:,} of {total:,} rows ({done / total:.0%})" if total else "no rows"
    if rate:
        text += f" · {rate:,.0f} {unit}/s" if rate >= 10 else f" · {rate:,.2g} {unit}/s"
    if eta is not None:
        text += f" · about {eta:,.0f} s left"
    return {"done": done, "total": total, "rate": rate, "eta_s": eta, "updated": manifest.get("updated_at"),
            "text": text}


def _number(value: Any) -> float | None:
    """A finite, non-negative number from a manifest, else None (a manifest is read, never trusted)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < float("inf")
    return float(value) if ok else None


def wall_seconds(manifest: dict[str, Any]) -> float | None:
    """Time the run's work took: its recorded timings, else finished (or now, while running) minus started."""
    timings = manifest.get("timings")
    running = manifest.get("state") == "running"
    if isinstance(timings, dict) and timings and not running:
        return round(sum(v for v in timings.values() if isinstance(v, (int, float))), 1)
    start = _parse_time(manifest.get("started_at"))
    if start is None:
        return None
    end = datetime.now(timezone.utc) if running else _parse_time(manifest.get("finished_at") or manifest.get("updated_at"))
    return round((end - start).total_seconds(), 1) if end else None


def _parse_time(value: Any) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def row_label(row: dict[str, Any], keys: tuple[str, ...]) -> str:
    return " ".join(str(row[k]) for k in keys if row.get(k) not in (None, ""))


def figures(headline: Headline, summary: list[dict[str, Any]]) -> list[Figure]:
    out = []
    for row in summary:
        if not isinstance(row, dict):
            continue
        label = row_label(row, headline.keys)
        present = [(k, h, f) for k, h, f in headline.values if row.get(k) is not None]
        for key, heading, fmt in present[:1] if headline.first_only else present:
            out.append(Figure(label, heading, row[key], fmt))
    return out


def figure_name(f: Figure) -> str:
    """A headline figure's name across runs: the summary row's label and the figure's heading."""
    return f"{f.label} · {f.heading}" if f.label else f.heading


def figure_names(runs: list[RunInfo], limit: int = 200) -> list[str]:
    """The numeric headline figures `runs` hold, in the order they first appear (at most `limit`)."""
    names = dict.fromkeys(figure_name(f) for r in runs for f in r.figures if _number(f.value) is not None)
    return list(names)[:limit]


def by_figure(runs: list[RunInfo], name: str, descending: bool) -> list[tuple[RunInfo, float | None]]:
    """`runs` ordered by the figure `name` (runs without it last, newest first), each with its value."""
    def value(r: RunInfo) -> float | None:
        return next((_number(f.value) for f in r.figures if figure_name(f) == name), None)

    valued = [(r, value(r)) for r in runs]
    has = sorted((x for x in valued if x[1] is not None), key=lambda x: x[1], reverse=descending)
    return has + [x for x in valued if x[1] is None]
