"""`redline`: the command line. Heavy imports (ray, torch) happen inside commands so --help is instant.

User mistakes raise RedlineError anywhere below; `main()` prints them as one line and exits with 2.
Any other failure is one line too (its cause, without Ray's wrapping) and exit 1, with the full
traceback in the run's error.log (or ~/.cache/redline/logs) and on the terminal with --verbose.
Commands live by domain: pipelines (`run`, `train`, `status`, `report`, `submit`, `logs`), models
(`train`), serving (`serve`, `detect`), `view`, `list` and `quickstart`.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from typing import Any

import typer
from rich.markup import escape

from redline.cli import listing, quickstart, runs, serving, train, viewing  # noqa: F401  (commands register on import)
from redline.cli.apps import app
from redline.cli.show import err_console
from redline.errors import cause_line, first_line, unwrap_user_error

__all__ = ["app", "main"]


def _stop_on_signal(signum: int, _: Any) -> None:
    """SIGTERM (a stopped Ray job, `kill`) ends the run like Ctrl-C does: recorded in its manifest.
    (`ray.init` installs the same handler of its own in a driver.)"""
    raise SystemExit(signum)


MAX_ERROR_CHARS = 2000


def _one_line(message: str) -> None:
    message = " ".join(message.split())  # always one line, whatever the source message held
    if len(message) > MAX_ERROR_CHARS:
        message = message[:MAX_ERROR_CHARS - 3] + "..."
    if sys.stderr.isatty():
        err_console.print(f"[bold red]error:[/bold red] {escape(message)}", highlight=False, soft_wrap=True)
    else:
        print(f"error: {message}", file=sys.stderr)


def _trace_file(err: BaseException) -> str:
    """Where the failure's traceback is: the run's error.log, else a file in the user's log folder."""
    recorded = getattr(err, "redline_log", None)
    if recorded:
        return recorded
    from redline.cluster.storage import user_cache_dir

    folder = user_cache_dir() / "logs"
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = folder / f"error-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
        path.write_text("".join(traceback.format_exception(err)))
        return str(path)
    except OSError:
        return "not saved; rerun with -v"


def main(argv: list[str] | None = None) -> int:
    """Entry point: one line and exit code 2 for user mistakes, a traceback only for bugs."""
    try:
        signal.signal(signal.SIGTERM, _stop_on_signal)
    except ValueError:  # not the main thread (embedded use)
        pass
    try:
        result = app(args=argv, prog_name="redline", standalone_mode=False)
    except typer.Exit as exit_:
        return exit_.exit_code
    except typer.TyperException as err:  # usage errors: unknown command, missing option, bad value
        ctx = getattr(err, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        fmt = getattr(err, "format_message", None)
        message = " ".join((fmt() if fmt else str(err)).split())
        print(f"error: {message}{hint}", file=sys.stderr)
        return int(getattr(err, "exit_code", 2) or 2)
    except typer.Abort:
        err_console.print("aborted")
        return 130
    except KeyboardInterrupt:
        err_console.print("interrupted; rerun the same command to resume")
        return 130
    except SystemExit as stop:
        if stop.code == signal.SIGTERM:  # the log's last line says why it ends, and how to go on
            print("stopped by SIGTERM; rerun the same command to resume", file=sys.stderr, flush=True)
        raise
    except Exception as err:  # noqa: BLE001
        user = unwrap_user_error(err)
        if user is not None:  # a mistake the user can fix: one line (Ray may append its own), exit 2
            _one_line(first_line(user))
            return 2
        # A failed run (a remote call that failed inside a worker, a crash): one line with its cause, exit 1;
        # the whole trace is in the run's error.log (or the user's log folder) and printed with --verbose.
        if os.environ.get("REDLINE_VERBOSE") == "1":
            traceback.print_exception(err)
        _one_line(f"{cause_line(err)} (full traceback: {_trace_file(err)})")
        return 1
    # With standalone_mode off, --help and `raise typer.Exit(n)` come back as an exit code.
    return result if isinstance(result, int) else 0
