"""Paths that come from listings (an S3 prefix, a local folder, a run directory) kept inside their
room: each path below a directory is checked segment by segment, files are created and read
without following a symbolic link anywhere below the root."""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from redline.errors import RedlineError, first_line


class NotFound(RedlineError):
    """No file at a path or URI."""


class NotRegular(RedlineError):
    """A path that is a folder, a symbolic link or a device where a regular file belongs."""


MAX_RELATIVE_CHARS = 1024
MAX_SEGMENT_BYTES = 255
MAX_DEPTH = 32
_UNSAFE_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")


def relative_parts(rel: str, what: str) -> list[str]:
    """The segments of a path that a listing (an S3 prefix, a local folder) gives below a directory,
    checked to stay below it: no empty, `.` or `..` segment (so no leading `/` and no `//`), no
    backslash, NUL or control character, bounded length and depth. Anything else is a one-line
    error naming `what`."""
    why = None
    parts = rel.split("/")
    if not rel:
        why = "it is empty"
    elif len(rel) > MAX_RELATIVE_CHARS:
        why = f"it is longer than {MAX_RELATIVE_CHARS} characters"
    elif _UNSAFE_CHARS.search(rel):
        why = "it holds a backslash or a control character"
    elif rel.startswith("/"):
        why = "it starts with '/'"
    elif any(p in ("", ".", "..") for p in parts):
        why = "it has an empty, '.' or '..' segment"
    elif len(parts) > MAX_DEPTH:
        why = f"it is more than {MAX_DEPTH} folders deep"
    elif any(len(p.encode("utf-8", "surrogatepass")) > MAX_SEGMENT_BYTES for p in parts):
        why = f"a segment is longer than {MAX_SEGMENT_BYTES} bytes"
    if why:
        shown = rel if len(rel) <= 120 else rel[:117] + "..."
        raise RedlineError(f"refusing {what}: {why} ({shown!r} would not stay inside its directory)")
    return parts


@contextmanager
def create_below(root: Path, parts: list[str], what: str, mode: str = "wb") -> Iterator[Any]:
    """A new file at root/parts opened for writing, never through a symbolic link: each folder is
    made or checked with lstat (a link or a file in the way is refused) and the file is created
    with O_EXCL | O_NOFOLLOW, so nothing is written outside `root`."""
    folder = root
    for segment in parts[:-1]:
        folder = folder / segment
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(folder).st_mode):
                raise RedlineError(f"refusing {what}: {folder.name} is both a file and a folder in the listing, or a "
                                   "link") from None
    try:
        access = os.O_RDWR if "+" in mode else os.O_WRONLY  # "w+b": the caller reads back what it wrote
        fd = os.open(folder / parts[-1], access | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        raise RedlineError(f"refusing {what}: its path is given twice in the listing") from None
    except IsADirectoryError:
        raise RedlineError(f"refusing {what}: it is both a file and a folder in the listing") from None
    with os.fdopen(fd, mode) as f:
        yield f


def read_local_below(root: Path, parts: list[str], max_bytes: int | None = None) -> bytes:
    """The bytes of the regular file root/parts (see `open_local_below`)."""
    with open_local_below(root, parts, max_bytes) as f:
        return f.read()


def open_local_below(root: Path, parts: list[str], max_bytes: int | None = None) -> BinaryIO:
    """The regular file root/parts opened for reading, each folder opened with O_NOFOLLOW relative to
    the one before (race-free: a link swapped in between two checks is still not followed)."""
    uri = str(root.joinpath(*parts))
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    fds: list[int] = []
    try:
        fds.append(os.open(root, os.O_RDONLY | os.O_DIRECTORY))
        for segment in parts[:-1]:
            fds.append(os.open(segment, flags | os.O_DIRECTORY, dir_fd=fds[-1]))
        fd = os.open(parts[-1], flags, dir_fd=fds[-1])
        fds.append(fd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(f"{uri} is not a regular file")
        if max_bytes is not None and st.st_size > max_bytes:
            raise RedlineError(f"{uri} is {st.st_size:,} bytes, over the limit of {max_bytes:,}")
        return os.fdopen(os.dup(fd), "rb")
    except FileNotFoundError:
        raise NotFound(f"file not found: {uri}") from None
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise NotRegular(f"{uri} is not a regular file below {root} (a symbolic link or not a folder)") from None
        raise RedlineError(f"cannot read {uri}: {first_line(err)}") from None
    finally:
        for fd in fds:
            os.close(fd)
