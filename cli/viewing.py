"""`redline view`: the web viewer of run directories."""

from __future__ import annotations

import os
import socket
from typing import Annotated, Optional

import typer

from redline.cli.apps import app
from redline.cli.show import console
from redline.cluster.access import check_exposure
from redline.errors import RedlineError

MAX_CONNECTIONS = 64  # beyond this uvicorn answers 503 at once instead of queueing


@app.command()
def view(
    location: Annotated[str, typer.Argument(help="A directory or s3:// prefix holding run directories (a "
                                                 "pipeline's `output`).")] = "redline-runs",
    host: Annotated[str, typer.Option(help="Address to bind; anything but loopback needs the key (or --insecure).")]
    = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to serve on.", min=1, max=65535)] = 8765,
    api_key_env: Annotated[Optional[str], typer.Option(help="Environment variable holding the key every request "
                                                            "must carry when it is set.")] = "REDLINE_API_KEY",
    insecure: Annotated[bool, typer.Option("--insecure", help="Serve on a non-loopback host without a key "
                                                               "(anyone who can reach the port reads the runs).")] = False,
    allow_host: Annotated[Optional[list[str]], typer.Option(
        "--allow-host", help="Another name the viewer answers to in the Host header (repeatable; e.g. the DNS name "
                             "of a machine it serves from). Localhost names and the bound address always work.")] = None,
    refresh: Annotated[Optional[float], typer.Option(
        help="Seconds between an open page's checks of a running run, its progress and its end (default 3); a run "
             "list with none running checks for new runs 10/3 as long apart (10 s).", min=0.1, max=3600)] = None,
) -> None:
    """Browse runs in a web browser: a read-only viewer of every run under LOCATION.

    The run list shows each run's pipeline, state (running runs update live), start, wall time,
    counts and headline figures (ASR per recipe, transfer ASR per victim, leaderboard Overall per
    model, hit rates per list, Table-5 rows); tick runs of one pipeline to compare them side by side
    with a grouped bar chart. A run page shows its report and plots, manifest and config, and its
    rows (attempts, predictions, stage verdicts, triggers) paged, filterable and sortable straight
    from its Parquet, each adversarial example beside its seed with the changed words marked.

    Serves on 127.0.0.1 by default. When the variable named by --api-key-env is set, every request
    needs the key: open any page once with ?key=<key> (the browser keeps a cookie), or send
    `Authorization: Bearer <key>`. Another host without a key is refused unless --insecure. Requests
    whose Host header names neither a localhost name, the bound address nor an --allow-host name are
    refused (421), so a web page cannot rebind its domain to this viewer (DNS rebinding).
    """
    import uvicorn

    from redline.view.app import build_app
    from redline.view.catalog import check_location

    key = os.environ.get(api_key_env) if api_key_env else None
    check_exposure(host, bool(key), insecure, f"${api_key_env}" if api_key_env else "an --api-key-env variable",
                   "view", "the runs")
    check_location(location)
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a port in TIME_WAIT is free
        try:
            probe.bind((host, port))
        except OSError as err:
            raise RedlineError(f"cannot serve on {host}:{port}: {err.strerror or err} (pass --port)") from None
    shown = f"[{host}]" if ":" in host else host
    console.print(f"viewing the runs under {location} at [bold]http://{shown}:{port}/[/bold]"
                  + (f" (key: ${api_key_env}; open with ?key=...)" if key else "") + " — Ctrl-C stops")
    uvicorn.run(build_app(location, key, host, tuple(allow_host or ()),
                          **({"refresh_s": refresh} if refresh else {})), host=host, port=port, log_level="warning",
                access_log=False, limit_concurrency=MAX_CONNECTIONS, timeout_keep_alive=5)
