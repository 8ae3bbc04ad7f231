"""Input fingerprints: a run refuses to reuse or resume on inputs that changed since it read them."""

from __future__ import annotations

import hashlib
from typing import Any

import pyarrow.fs as pafs

from redline.cluster.storage import join, read_json, resolve
from redline.errors import RedlineError, first_line

EDGE_BYTES = 1 << 20


def fingerprint(uri: str) -> dict[str, Any]:
    """What identifies an input's content cheaply. A file: size, modification time and a hash of its
    first and last MB. A run directory: its config hash and when it finished. Another directory:
    a hash of every file's relative path, size and modification time."""
    fs, path = resolve(uri)
    try:
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            return {"missing": True}
        if info.type == pafs.FileType.File:
            digest = hashlib.sha256()
            with fs.open_input_file(path) as f:
                digest.update(f.read_at(min(EDGE_BYTES, info.size), 0))
                if info.size > EDGE_BYTES:
                    tail = min(EDGE_BYTES, info.size - EDGE_BYTES)
                    digest.update(f.read_at(tail, info.size - tail))
            return {"size": info.size, "mtime_ns": info.mtime_ns, "sha256_edges": digest.hexdigest()[:32]}
        manifest = join(uri, "manifest.json")
        if fs.get_file_info(resolve(manifest)[1]).type == pafs.FileType.File:
            m = read_json(manifest)
            return {"run": m.get("config_hash"), "state": m.get("state"), "finished_at": m.get("finished_at")}
        files = fs.get_file_info(pafs.FileSelector(path, recursive=True))
        listing = sorted((i.path[len(path):], i.size, i.mtime_ns) for i in files if i.type == pafs.FileType.File)
        return {"files": len(listing), "sha256_listing": hashlib.sha256(repr(listing).encode()).hexdigest()[:32]}
    except (OSError, ValueError) as err:
        raise RedlineError(f"cannot read input {uri}: {first_line(err)}") from None


def of(uris: Any) -> dict[str, dict[str, Any]]:
    """The fingerprint of each input, once per distinct URI."""
    return {u: fingerprint(u) for u in dict.fromkeys(uris) if u}


def changed_inputs(before: dict[str, dict[str, Any]], now: dict[str, dict[str, Any]]) -> list[str]:
    """Inputs whose fingerprint differs from the one recorded (inputs a run did not record are new).
    One this node cannot see but that was recorded where it was read (a corpus on the workers' disk)
    is checked there, when it is read again."""
    return [u for u, fp in now.items() if u in before and before[u] != fp
            and not (fp.get("missing") and not before[u].get("missing"))]


def merged(before: dict[str, dict[str, Any]], now: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`now`, keeping what was recorded where this node sees nothing (see `changed_inputs`)."""
    return {u: before[u] if fp.get("missing") and u in before and not before[u].get("missing") else fp
            for u, fp in now.items()}
