"""`redline serve ...` and `redline detect`: detectors and generators as HTTP services on Ray Serve."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
import yaml
from rich.markup import escape
from rich.table import Table

from redline.cli.apps import app
from redline.cli.runs import ConfigOpt, SetOpt
from redline.cli.show import console, verbose
from redline.errors import RedlineError

serve_app = typer.Typer()
app.add_typer(serve_app, name="serve")

PortOpt = Annotated[Optional[int], typer.Option(help="Only the server on this port (default: every known one).")]


@serve_app.callback(invoke_without_command=True)
def serve_cmd(
    ctx: typer.Context,
    config: Annotated[Optional[Path], typer.Option("--config", "-c", help="Serve config YAML (see examples/serve.yaml).")] = None,
    host: Annotated[Optional[str], typer.Option(help="Override host (default 127.0.0.1; 0.0.0.0 exposes it).")] = None,
    port: Annotated[Optional[int], typer.Option(help="Override port (default 8000).")] = None,
    insecure: Annotated[bool, typer.Option("--insecure", help="Serve on a non-loopback host without an API key "
                                                               "(refused otherwise).")] = False,
    set_: SetOpt = None,
) -> None:
    """Start the detector and generation services of a config and print their URLs.

    Endpoints: POST /v1/detect, POST /v1/moderations (OpenAI-compatible), POST /v1/chat/completions,
    POST /v1/completions, GET /v1/models (OpenAI-compatible), GET /v1/detectors, GET /healthz.
    Without RAY_ADDRESS it runs on an embedded local Ray until Ctrl-C or `redline serve stop`; with
    RAY_ADDRESS it deploys on that cluster and returns. When the environment variable named by
    `api_key_env` (default REDLINE_API_KEY) is set, every request but /healthz must send it as a
    Bearer token; a host other than loopback without one is refused unless --insecure.
    """
    if ctx.invoked_subcommand is not None:
        return
    if config is None:
        raise RedlineError("redline serve needs --config FILE.yaml (or a subcommand: status, stop, deploy-config)")
    from redline.cluster.config import load_config, parse_overrides
    from redline.serve import runner
    from redline.serve.config import ServeConfig

    cfg = load_config(ServeConfig, config, {"host": host, "port": port, "insecure": insecure or None,
                                            **parse_overrides(set_)})
    with console.status(f"starting {len(cfg.detectors)} detector(s) and {len(cfg.generators)} generator(s) on Ray Serve"):
        state = runner.start(cfg, config_file=str(config), verbose=verbose(), announce=lambda _: None)
    _show_endpoints(state)
    if state["mode"] == "local":
        console.print("serving until Ctrl-C or `redline serve stop`", style="dim")
        runner.serve_forever(state)
        console.print("stopped")


def _show_endpoints(state: dict[str, Any]) -> None:
    url = state["url"]
    console.print(f"redline serving at [bold]{url}[/bold]" + (" (API key required)" if state.get("api_key_required") else ""))
    if state["detectors"]:
        console.print(f"  detectors  {', '.join(state['detectors'])}:  POST {url}/v1/detect   POST {url}/v1/moderations")
    if state["generators"]:
        console.print(f"  generators {', '.join(state['generators'])}:  OpenAI base URL {url}/v1")
    if state.get("dialogue_safety"):
        console.print(f"  dialogue safety (two-step):  POST {url}/v1/dialogue-safety")
    console.print(f"  health     GET {url}/healthz    API docs {url}/docs")


@serve_app.command("status")
def serve_status_cmd(port: PortOpt = None) -> None:
    """Known servers: URL, whether they answer, and each deployment's state and replicas."""
    from redline.serve import runner

    rows = runner.status(port)
    if not rows:
        console.print("no redline server is running (start one with `redline serve --config FILE`)")
        raise typer.Exit(1)
    for row in rows:
        health = row["health"]
        ok = isinstance(health, dict)
        console.print(f"[bold]{row.get('url') or row.get('ray_address')}[/bold] ({row.get('mode')}, pid {row.get('pid') or '–'}): "
                      + ("[green]healthy[/green]" if ok else f"[red]{escape(str(health))}[/red]"))
        table = Table(show_header=True)
        for col in ("application", "deployment", "status", "replicas"):
            table.add_column(col)
        for app_name, app_info in (row.get("applications") or {}).items():
            for dep, info in app_info["deployments"].items():
                replicas = ", ".join(f"{k.lower()} {v}" for k, v in info["replicas"].items()) or "–"
                table.add_row(app_name, dep, info["status"], replicas)
        if table.row_count:
            console.print(table)


@serve_app.command("stop")
def serve_stop_cmd(port: PortOpt = None) -> None:
    """Stop the server on --port, or every known one."""
    from redline.serve import runner

    stopped, problems = runner.stop(port)
    for url in stopped:
        console.print(f"stopped {url}")
    if problems:
        raise RedlineError("; ".join(problems))


@serve_app.command("deploy-config")
def serve_deploy_config_cmd(
    config: ConfigOpt,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Write here instead of printing.")] = None,
) -> None:
    """Write a Serve config file (for `serve deploy` or the Ray dashboard) equivalent to a redline serve config."""
    from redline.cluster.config import load_config
    from redline.serve.config import ServeConfig
    from redline.serve.runner import deploy_config

    text = yaml.safe_dump(deploy_config(load_config(ServeConfig, config)), sort_keys=False)
    if out is None:
        console.print(text, markup=False, highlight=False)
    else:
        out.write_text(text)
        console.print(f"wrote {out} (deploy with: serve deploy {out})")


@app.command()
def detect(
    texts: Annotated[list[str], typer.Argument(help="Texts to score.")],
    url: Annotated[str, typer.Option(help="The server (or its /v1/detect URL).")] = "http://127.0.0.1:8000",
    detector: Annotated[Optional[list[str]], typer.Option(help="Only these served detectors (repeatable).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw JSON response.")] = False,
    allow_insecure_http: Annotated[bool, typer.Option(help="Send the API key over plain http:// to another "
                                                            "host (refused otherwise).")] = False,
) -> None:
    """Score texts with the detectors of a running `redline serve` (API key from $REDLINE_API_KEY)."""
    import json

    from redline.cluster.client import RedlineClient

    with RedlineClient(url, allow_insecure_http=allow_insecure_http) as client:
        resp = client.detect(texts, detector)
    if as_json:
        print(json.dumps(resp.model_dump(exclude_none=True), indent=2))
        return
    table = Table(title=f"detections from {url}")
    table.add_column("text", overflow="fold")
    for name in resp.detectors:
        table.add_column(name, justify="right")
    for r in resp.results:
        cells = []
        for name in resp.detectors:
            d = r.detections[name]
            cells.append(f"error: {d.error}" if d.error else
                         f"{'[red]toxic[/red]' if d.toxic else '[green]benign[/green]'} {d.toxic_score:.3f}")
        table.add_row(escape(texts[r.index]), *cells)
    console.print(table)


