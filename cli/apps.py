"""The command tree's roots: `redline` and its `list`, `run` and `train` groups, with the global
options. The command modules add their commands to these; `redline.cli` puts them together."""

from __future__ import annotations

import logging
import os
import sys
from typing import Annotated

import typer

app = typer.Typer(
    name="redline",
    help="Distributed safety evaluation of toxicity detectors and conversational models on Ray.\n\n"
    "Runs locally on an embedded Ray by default; set RAY_ADDRESS to use a running cluster, or "
    "`redline submit` to send a pipeline to one through the Ray Jobs API.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


list_app = typer.Typer(help="Show the registered components.", no_args_is_help=True)
run_app = typer.Typer(help="Run a pipeline from a YAML config (see examples/).", no_args_is_help=True)
train_app = typer.Typer(help="Train models used by the pipelines.", no_args_is_help=True)
app.add_typer(list_app, name="list")
app.add_typer(run_app, name="run")
app.add_typer(train_app, name="train")


def _print_version(show: bool) -> None:
    if show:
        import ray

        from redline import __version__

        print(f"redline {__version__} (ray {ray.__version__}, python {sys.version.split()[0]})")
        raise typer.Exit()


@app.callback()
def _global(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress details.")] = False,
            version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                                  help="Print redline's version and exit.")] = False) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("REDLINE_VERBOSE", "1" if verbose else "0")
