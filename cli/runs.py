"""Pipeline commands, built from the pipeline registry: `redline run <pipeline>` (and `redline train
dialogue-safety`), `status`, `report`, `submit` and `logs`."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from redline.cli.apps import app, run_app, train_app
from redline.cli.show import console, print_table, show_result, verbose
from redline.errors import RedlineError
from redline.pipelines import registry

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="Pipeline config YAML (see examples/).")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="Override any config field: --set corpus.limit=500 "
                                                                   "(repeatable).")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Redo a finished or partial run from scratch instead of "
                                                        "reusing or resuming it.")]
OutputOpt = Annotated[Optional[str], typer.Option(help="Override output: a directory or s3:// URI for run directories.")]
RunNameOpt = Annotated[Optional[str], typer.Option(help="Name of the run directory (default <pipeline>-<config hash>).")]
AddressOpt = Annotated[Optional[str], typer.Option(
    help="Ray Jobs address (http://HEAD:8265); default $RAY_JOBS_ADDRESS, $RAY_ADDRESS if it is http(s), else "
         "http://127.0.0.1:8265.")]


def flag_overrides(entry: registry.Entry, raw: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """The config fields a pipeline's shortcut flags set (`*` in a flag's path: every list item)."""
    out: dict[str, Any] = {}
    for flag in entry.flags:
        value = values.get(flag.name)
        if value is None or value == []:
            continue
        head, _, rest = flag.path.partition(".*.")
        if rest:
            for i, _item in enumerate(raw.get(head) or []):
                out[f"{head}.{i}.{rest}"] = value
            continue
        top = flag.path.split(".")[0]
        if "." in flag.path and isinstance(raw.get(top), list):
            raise RedlineError(f"--{flag.name.replace('_', '-')} applies to a single {top}; this config lists several "
                               f"(use --set {top}.0.{flag.path.split('.', 1)[1]}=...)")
        out[flag.path] = value
    return out


FailIfOpt = Annotated[Optional[list[str]], typer.Option(
    "--fail-if", help="A release gate (repeatable): exit 1 when the rule holds on the finished run, e.g. "
                      "--fail-if 'guard.transfer.asr_tae > 0.3' or 'triggers.hit_rate.high >= 0.5' "
                      "(FIGURE[.value|.low|.high|.n] OP NUMBER; the figures are card.json's).")]


def run_entry(entry: registry.Entry, config: Path, flags: dict[str, Any], output: str | None, run_name: str | None,
              sets: list[str] | None, force: bool, fail_if: list[str] | None = None) -> None:
    from redline.cluster.config import load_config, load_yaml, parse_overrides
    from redline.pipelines.reporting import gates

    pipeline = registry.pipeline(entry.name)
    rules = gates.parse(fail_if or [], pipeline.gate.keys if pipeline.gate else ())
    overrides: dict[str, Any] = {"output": output, "run_name": run_name}
    overrides.update(flag_overrides(entry, load_yaml(config), flags))
    overrides.update(parse_overrides(sets))
    cfg = load_config(pipeline.config, config, overrides)
    result = pipeline.run(cfg, force=force, verbose=verbose())
    show_result(pipeline, result)
    failing = gates.failures(rules, pipeline.gate.figures(result.manifest)) if rules and pipeline.gate else []
    if failing:
        print("error: " + "; ".join(failing), file=sys.stderr)
        raise typer.Exit(1)


def _command(entry: registry.Entry) -> Any:
    """A typer command for one registry entry: --config, its shortcut flags, --output, --run-name,
    --set and --force."""
    names = [f.name for f in entry.flags]

    def command(config: Path, output: str | None = None, run_name: str | None = None,
                set_: list[str] | None = None, force: bool = False, fail_if: list[str] | None = None,
                **flags: Any) -> None:
        run_entry(entry, config, {k: flags.get(k) for k in names}, output, run_name, set_, force, fail_if)

    kw = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("config", kw, annotation=ConfigOpt)]
    for f in entry.flags:
        kind: Any = list[f.type] if f.multiple else f.type  # type: ignore[name-defined]
        params.append(inspect.Parameter(f.name, kw, default=None, annotation=Annotated[
            Optional[kind], typer.Option(f"--{f.name.replace('_', '-')}", help=f.help)]))
    params += [inspect.Parameter("output", kw, default=None, annotation=OutputOpt),
               inspect.Parameter("run_name", kw, default=None, annotation=RunNameOpt),
               inspect.Parameter("set_", kw, default=None, annotation=SetOpt),
               inspect.Parameter("force", kw, default=False, annotation=ForceOpt)]
    if entry.gated:
        params.append(inspect.Parameter("fail_if", kw, default=None, annotation=FailIfOpt))
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {}
    command.__doc__ = (f"{entry.help}\n\nRerunning the same config reuses a finished run and resumes an "
                       f"interrupted one. Example config: examples/{entry.example}")
    return command


for _entry in registry.entries():
    _group = {"run": run_app, "train": train_app}.get(_entry.command[0], app) if len(_entry.command) > 1 else app
    _group.command(_entry.command[-1])(_command(_entry))


def _pipeline_of(manifest: dict[str, Any], target: str) -> Any:
    try:
        return registry.pipeline(manifest.get("pipeline", ""))
    except RedlineError:
        raise RedlineError(f"{target}: a run of an unknown pipeline '{manifest.get('pipeline')}'") from None


def _run_manifest(target: str) -> tuple[Any, dict[str, Any]]:
    from redline.cluster import storage
    from redline.cluster.runs import RunDir

    if not storage.exists(target):
        raise RedlineError(f"no run directory or job id: {target}")
    manifest = RunDir(target).manifest()
    if manifest is None:
        raise RedlineError(f"{target} is not a run directory (no manifest.json)")
    return RunDir(target), manifest


@app.command()
def status(
    target: Annotated[str, typer.Argument(help="A run directory (local or s3://) or a Ray job id.")],
    address: AddressOpt = None,
) -> None:
    """Show a run's state, counts and summary from its manifest (any pipeline), or a submitted job's status."""
    import time

    from redline.cluster import jobs, leases, storage
    from redline.cluster.runs import RunResult

    if jobs.looks_like_job_id(target):
        info = jobs.job_info(target, jobs.jobs_address(address))
        console.print(f"job {target}: [bold]{info['status']}[/bold]")
        if info.get("message"):
            console.print(f"  {info['message']}")
        return
    run, manifest = _run_manifest(target)
    pipeline = _pipeline_of(manifest, target)
    console.print(f"run {target}: [bold]{manifest.get('state')}[/bold] ({manifest.get('pipeline')}, "
                  f"config {manifest.get('config_hash')})")
    if manifest.get("error"):
        console.print(f"  error: {manifest['error']}")
    holder = leases.held(run.path(leases.LEASE))
    if manifest.get("state") != "complete" and holder and float(holder.get("expires", 0)) > time.time():
        console.print(f"  driver: {leases.describe(holder)}")
    counts = manifest.get("counts", {})
    if counts:
        console.print("  counts: " + ", ".join(f"{k} {v}" for k, v in counts.items() if not isinstance(v, dict)))
    if manifest.get("state") == "complete":
        result = RunResult(target, manifest, manifest.get("summary", []))
        print_table(pipeline.title, result.summary, pipeline.columns(manifest))
        for note in pipeline.notes(manifest):
            console.print(note)
        console.print(f"report: {result.report_html}")
    elif manifest.get("input_shards") is not None:
        parts = [d for d in ("predictions", "attempts", "triggers") if storage.exists(run.path(d))]
        done = len(storage.list_files(run.path(parts[0]), ".parquet")) if parts else 0
        console.print(f"  shards written: {done}/{manifest['input_shards']} (rerun the same command to resume)")


@app.command()
def report(
    target: Annotated[str, typer.Argument(help="A finished run directory (local or s3://).")],
) -> None:
    """Re-render a finished run's report (report.md, report.html, plots) from its run directory."""
    run, manifest = _run_manifest(target)
    if manifest.get("state") != "complete":
        raise RedlineError(f"{target} is a {manifest.get('state')} run; only a finished run has a report to render")
    pipeline = _pipeline_of(manifest, target)
    pipeline.write_report(run, manifest)
    console.print(f"report: [bold]{run.path('report.html')}[/bold]")


@app.command()
def submit(
    pipeline: Annotated[str, typer.Argument(help="Pipeline to run: " + ", ".join(
        e.name for e in registry.entries()) + ".")],
    config: ConfigOpt,
    address: AddressOpt = None,
    set_: SetOpt = None,
    env: Annotated[Optional[list[str]], typer.Option(
        "--env", help="Pass this (non-secret) environment variable's value to the job (repeatable). Only S3 "
                      "endpoint/region and hub mirror settings travel by default; a name that looks like a "
                      "secret is refused (the Jobs API shows a job's environment).")] = None,
    secret: Annotated[Optional[list[str]], typer.Option(
        "--secret", help="A secret the job needs, by name (repeatable), e.g. --secret OPENAI_API_KEY: checked "
                         "to be set on the cluster's driver and nodes (a Kubernetes secretKeyRef, the cloud's "
                         "secret store); its value never travels with the job.")] = None,
    wait: Annotated[bool, typer.Option(help="Wait for the job to finish and stream its logs.")] = False,
) -> None:
    """Run a pipeline on a running Ray cluster through the Ray Jobs API.

    The config travels with the job; the cluster's nodes need redline installed (ray_cluster.yaml
    does that). Use s3:// paths for corpora and output so every node can reach them. Secrets (API
    keys, HF_TOKEN) live on the cluster's nodes, never in the job: name them with --secret.
    """
    from redline.cluster import jobs

    entry = registry.entry(pipeline)
    job_id = jobs.submit(entry.name, " ".join(entry.command), registry.pipeline(entry.name).config, config,
                         jobs.jobs_address(address), sets=set_ or [], env_names=env or [], secret_names=secret or [])
    console.print(f"submitted job [bold]{job_id}[/bold]")
    console.print(f"  status: redline status {job_id}    logs: redline logs {job_id} --follow")
    if wait:
        state = jobs.follow(job_id, jobs.jobs_address(address),
                            echo=lambda s: console.print(s, end="", markup=False, highlight=False))
        console.print(f"job {job_id}: {state}")
        if state != "SUCCEEDED":
            raise typer.Exit(1)


@app.command("check-secrets", hidden=True)
def check_secrets(names: Annotated[list[str], typer.Argument(help="Environment variable names.")]) -> None:
    """Run as a job by `submit --secret`: prints `missing: NAME on ...` for each secret not set on the
    driver or a node, and fails if any is missing. Never prints a value."""
    from redline.cluster import jobs

    missing = jobs.missing_on_nodes([jobs.variable_name(n, "--secret") for n in names])
    for where in missing:
        typer.echo(f"missing: {where}")
    if missing:
        raise typer.Exit(2)
    typer.echo(f"present on the driver and every node: {', '.join(names)}")


@app.command("stop")
def stop_job(
    job_id: Annotated[str, typer.Argument(help="A job id printed by `redline submit`.")],
    address: AddressOpt = None,
    wait_s: Annotated[float, typer.Option("--wait-s", help="Seconds to wait for the job to end (0: do not wait).")] = 60,
) -> None:
    """Stop a submitted job and wait until it has ended; its run is marked as stopped and resumes when the
    pipeline is submitted again."""
    from redline.cluster import jobs

    status = jobs.stop(job_id, jobs.jobs_address(address), wait_s=wait_s)
    console.print(f"job {job_id}: {status}")
    if status not in ("SUCCEEDED", "FAILED", "STOPPED") and wait_s > 0:
        raise RedlineError(f"job {job_id} is still {status} after {wait_s:g} s; its driver did not exit")


@app.command()
def logs(
    job_id: Annotated[str, typer.Argument(help="A job id printed by `redline submit`.")],
    address: AddressOpt = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Stream until the job ends.")] = False,
) -> None:
    """Print a submitted job's logs."""
    from redline.cluster import jobs

    addr = jobs.jobs_address(address)
    if follow:
        jobs.follow(job_id, addr, echo=lambda s: console.print(s, end="", markup=False, highlight=False))
    else:
        console.print(jobs.job_logs(job_id, addr), end="", markup=False, highlight=False)
