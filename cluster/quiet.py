"""Ray's own noise kept off the user's terminal on the happy path (with `-v` everything shows).

Messages Ray prints are known to be harmless here: the C++ warning that Ray Data's actors get their
constructor arguments from the object store (the map function itself, put there by Ray Data), the
retry notice of Serve's controller as it shuts down, and the stack dump of a stop signal. The first is written by
Ray's C++ core straight to file descriptor 2, so stderr is read through a pipe that drops exactly
those lines; the second comes through Ray's driver-side printer, which is wrapped the same way.
Everything else passes through unchanged.
"""

from __future__ import annotations

import os
import re
import sys
import threading

NOISE = re.compile(
    r"constructor arguments in the object store and max_restarts > 0"
    r"|ServeController\.graceful_shutdown failed\. There are infinite retries remaining"
    r"|Set ray log level from environment variable"
)

# A stopped run (`redline stop`, a pod's SIGTERM) ends with a clear line; the C++ core's failure
# handler would first print a stack dump of the signal, twice. Crash signals (SIGSEGV, ...) keep theirs.
STOP_DUMP = re.compile(r"\*\*\* SIG(TERM|INT) received at time=")
DUMP_FRAME = re.compile(r"^(\[[^]]*\] logging\.cc:\d+: )?(PC: @|\s+@ )")

_installed = False


def _pump(source: int, target: int) -> None:
    pending, in_dump = b"", False
    while True:
        try:
            chunk = os.read(source, 65536)
        except OSError:
            return
        if not chunk:
            if pending:
                os.write(target, pending)
            return
        pending += chunk
        *lines, pending = pending.split(b"\n")
        kept = []
        for line in lines:
            text = line.decode("utf-8", "replace")
            in_dump = bool(STOP_DUMP.search(text)) or (in_dump and bool(DUMP_FRAME.match(text)))
            if not in_dump and not NOISE.search(text):
                kept.append(line)
        if kept:
            os.write(target, b"\n".join(kept) + b"\n")


def quiet_ray_noise() -> None:
    """Filter the known-benign lines from this process's fd 2 and Ray's driver printer (once)."""
    global _installed
    if _installed:
        return
    _installed = True
    try:
        import ray._private.worker as ray_worker

        printer = ray_worker.print_to_stdstream

        def filtered(data: dict, ignore_prefix: bool) -> None:
            lines = [ln for ln in data.get("lines", []) if not NOISE.search(str(ln))]
            if lines:
                printer({**data, "lines": lines}, ignore_prefix)

        ray_worker.print_to_stdstream = filtered
    except (ImportError, AttributeError):  # another Ray layout: nothing to wrap
        pass
    try:
        sys.stderr.flush()
        original = os.dup(2)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 2)
        os.close(write_end)
    except OSError:
        return
    # Python's own stderr writes go straight to the terminal; only native code uses the pipe.
    sys.stderr = os.fdopen(os.dup(original), "w", buffering=1, encoding=getattr(sys.stderr, "encoding", "utf-8"),
                           errors="backslashreplace")
    threading.Thread(target=_pump, args=(read_end, original), name="redline-quiet-stderr", daemon=True).start()
