"""`redline`: the command line. Heavy imports (ray, torch) happen inside commands so --help is instant.

User mistakes raise RedlineError anywhere below; `main()` prints them as one line and exits with 2.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from redline.errors import RedlineError, unwrap_user_error

# Wide enough for the metrics tables when output goes to a pipe or a file (rich assumes 80 columns).
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)

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

PIPELINES = ("score", "attack", "taebench", "transfer", "advtrain", "diasafety", "egregious")


@app.callback()
def _global(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress details.")] = False) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("REDLINE_VERBOSE", "1" if verbose else "0")


def _verbose() -> bool:
    return os.environ.get("REDLINE_VERBOSE") == "1"


# --------------------------------------------------------------------------------------------
# list


@list_app.command("detectors")
def list_detectors() -> None:
    """Detector kinds usable as `kind:` in a config, with their own options."""
    from redline.actors.registry import detector_kinds

    table = Table(title="detector kinds", show_lines=False)
    table.add_column("kind", style="bold")
    table.add_column("what it is")
    table.add_column("options")
    for kind, cls in sorted(detector_kinds().items()):
        fields = cls.Options.model_fields
        opts = ", ".join(f"{n}{'' if f.is_required() else '?'}" for n, f in fields.items()) or "–"
        table.add_row(kind, cls.description, opts)
    console.print(table)
    console.print("Common fields: name, kind, threshold, rule (auto|score|argmax), batch_size, actors, num_cpus, num_gpus.")


@list_app.command("categories")
def list_categories() -> None:
    """The DiaSafety taxonomy: unsafe categories of chatbot responses, with their definitions."""
    from redline.actors.dialogue_safety.taxonomy import CATEGORIES, UTTERANCE_LEVEL

    table = Table(title="dialogue-safety categories", show_lines=True)
    for col in ("category", "personal", "level", "in DiaSafety", "definition"):
        table.add_column(col, overflow="fold")
    for c in (*CATEGORIES, UTTERANCE_LEVEL):
        table.add_row(c.name, "personal" if c.personal else "non-personal", c.level, "yes" if c.in_dataset else "no",
                      c.definition)
    console.print(table)
    console.print("Add categories in a config with add_categories: [{name, definition, personal}].")


@list_app.command("recipes")
def list_recipes() -> None:
    """Attack recipes usable in `recipes:`: transformation, constraints, search, what they need offline."""
    from redline.pipelines.attack import recipe_table

    table = Table(title="attack recipes (every one runs with goal tae or bae)", show_lines=False)
    table.add_column("name", no_wrap=True, style="bold")
    for col in ("family", "transformation", "pre", "post", "search", "needs"):
        table.add_column(col, overflow="fold")
    for r in recipe_table():
        table.add_row(*(r[c] for c in ("name", "family", "transformation", "pre", "post", "search", "needs")))
    console.print(table)


# --------------------------------------------------------------------------------------------
# run


def _parse_sets(sets: list[str] | None) -> dict[str, Any]:
    from redline.cluster.config import parse_overrides

    return parse_overrides(sets)


ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="Pipeline config YAML (see examples/).")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="Override any config field: --set corpus.limit=500 (repeatable).")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Redo a finished or partial run from scratch instead of reusing or resuming it.")]


@run_app.command("score")
def run_score_cmd(
    config: ConfigOpt,
    corpus: Annotated[Optional[str], typer.Option(help="Override corpus.path (local path or s3:// URI).")] = None,
    limit: Annotated[Optional[int], typer.Option(help="Score at most this many rows (a seeded random sample).")] = None,
    output: Annotated[Optional[str], typer.Option(help="Override output: a directory or s3:// URI for run directories.")] = None,
    run_name: Annotated[Optional[str], typer.Option(help="Name of the run directory (default score-<config hash>).")] = None,
    actors: Annotated[Optional[int], typer.Option(help="Actor pool size for every detector.")] = None,
    set_: SetOpt = None,
    force: ForceOpt = False,
) -> None:
    """Score a labelled corpus with several detectors across Ray actors and report how each does.

    Writes a run directory with per-row predictions (Parquet shards), manifest.json, and a report
    (report.md, report.html with plots, metrics.csv). Rerunning the same config reuses a finished
    run and resumes an interrupted one.
    """
    from redline.cluster.config import ScoreConfig, load_config, load_yaml

    overrides: dict[str, Any] = {"output": output, "run_name": run_name}
    raw = load_yaml(config)
    if corpus is not None or limit is not None:
        if isinstance(raw.get("corpus"), list):
            raise RedlineError("--corpus/--limit apply to a single corpus; this config lists several (use --set corpus.0.limit=...)")
        overrides.update({"corpus.path": corpus, "corpus.limit": limit})
    if actors is not None:
        for i, _ in enumerate(raw.get("detectors") or []):
            overrides[f"detectors.{i}.actors"] = actors
    overrides.update(_parse_sets(set_))
    cfg = load_config(ScoreConfig, config, overrides)
    _run_and_show(cfg, force=force)


@run_app.command("attack")
def run_attack_cmd(
    config: ConfigOpt,
    corpus: Annotated[Optional[str], typer.Option(help="Override corpus.path (local path or s3:// URI).")] = None,
    max_seeds: Annotated[Optional[int], typer.Option(help="At most this many seeds per goal.")] = None,
    recipe: Annotated[Optional[list[str]], typer.Option(help="Run only these recipes (repeatable).")] = None,
    output: Annotated[Optional[str], typer.Option(help="Override output: a directory or s3:// URI.")] = None,
    run_name: Annotated[Optional[str], typer.Option(help="Name of the run directory (default attack-<config hash>).")] = None,
    actors: Annotated[Optional[int], typer.Option(help="Attacker actors.")] = None,
    set_: SetOpt = None,
    force: ForceOpt = False,
) -> None:
    """Attack a victim detector with recipes: toxic seeds until it says benign (TAE), benign seeds
    until it says toxic (BAE). One output row per (seed, recipe, goal) attempt, with status and
    provenance; the report gives ASR, queries, % words perturbed and sample successes per recipe.
    Rerunning resumes an interrupted run and reuses a finished one.
    """
    from redline.cluster.config import AttackConfig, load_config, load_yaml
    from redline.pipelines.attack import run_attack

    raw = load_yaml(config)
    overrides: dict[str, Any] = {"output": output, "run_name": run_name, "max_seeds": max_seeds, "actors": actors,
                                 "recipes": recipe}
    if corpus is not None:
        if isinstance(raw.get("corpus"), list):
            raise RedlineError("--corpus applies to a single corpus; this config lists several")
        overrides["corpus.path"] = corpus
    overrides.update(_parse_sets(set_))
    cfg = load_config(AttackConfig, config, overrides)
    _show_attack(run_attack(cfg, force=force, verbose=_verbose()))


@run_app.command("taebench")
def run_taebench_cmd(
    config: ConfigOpt,
    output: Annotated[Optional[str], typer.Option(help="Override output: a directory or s3:// URI.")] = None,
    run_name: Annotated[Optional[str], typer.Option(help="Name of the run directory (default taebench-<config hash>).")] = None,
    set_: SetOpt = None,
    force: ForceOpt = False,
) -> None:
    """Filter attack runs' adversarial examples into TaeBench (valid TAE) and TaeBench+ (+ valid BAE).

    Stages: dedupe -> grammar (LanguageTool server) -> naturalness (acceptability classifier) ->
    label filter (LLM judge AND toxicity classifier). Each stage's kept and rejected rows (with
    reasons) are written to the run directory; the report has the rows left after each stage per
    goal and seed dataset (the paper's Table 2). A restarted run resumes after the last finished stage.
    """
    from redline.cluster.config import TaebenchConfig, load_config
    from redline.pipelines.report import format_value, taebench_columns
    from redline.pipelines.taebench import run_taebench

    cfg = load_config(TaebenchConfig, config, {"output": output, "run_name": run_name, **_parse_sets(set_)})
    result = run_taebench(cfg, force=force, verbose=_verbose())
    if result.reused:
        err_console.print(f"[dim]config already filtered in {result.run_uri}; reusing it (pass --force to redo)[/dim]")
    for name, info in result.manifest.get("stages", {}).items():
        if not isinstance(info, dict):
            console.print(f"stage {name}: {info}", style="yellow")
    cols = taebench_columns(result.summary)
    table = Table(title="rows remaining after each stage")
    for _, title, fmt in cols:
        table.add_column(title, justify="left" if fmt == "s" else "right")
    for row in result.summary:
        table.add_row(*(format_value(row.get(k), f) for k, _, f in cols))
    console.print(table)
    counts = result.manifest.get("counts", {})
    console.print(f"TaeBench: {counts.get('taebench')} rows, TaeBench+: {counts.get('taebench_plus')} rows")
    console.print(f"report: [bold]{result.report_html}[/bold]")


@run_app.command("transfer")
def run_transfer_cmd(
    config: ConfigOpt,
    output: Annotated[Optional[str], typer.Option(help="Override output: a directory or s3:// URI.")] = None,
    run_name: Annotated[Optional[str], typer.Option(help="Name of the run directory (default transfer-<config hash>).")] = None,
    set_: SetOpt = None,
    force: ForceOpt = False,
) -> None:
    """Benchmark detectors with a TaeBench run (transfer attack): ASR = FNR on TAE, FPR on BAE.

    Victims are any detector kind: local models, a `redline serve` endpoint (`url:`), OpenAI's
    moderation API, Llama-Guard-style or self-check LLMs on an OpenAI-compatible endpoint, and
    AWS Bedrock Guardrails. The original seeds are scored too, for the FNR before the attack.
    """
    from redline.cluster.config import TransferConfig, load_config
    from redline.pipelines.transfer import run_transfer

    cfg = load_config(TransferConfig, config, {"output": output, "run_name": run_name, **_parse_sets(set_)})
    result = run_transfer(cfg, force=force, verbose=_verbose())
    if result.reused:
        err_console.print(f"[dim]config already benchmarked in {result.run_uri}; reusing it (pass --force to redo)[/dim]")
    _show_transfer(result)


def _print_summary(title: str, cols: list[tuple[str, str, str]], result: Any) -> None:
    """A run's summary rows as a table, then where its report is."""
    from redline.pipelines.report import format_value

    table = Table(title=title)
    for _, heading, fmt in cols:
        table.add_column(heading, justify="left" if fmt == "s" else "right")
    for row in result.summary:
        table.add_row(*(format_value(row.get(k), f) for k, _, f in cols))
    console.print(table)
    console.print(f"report: [bold]{result.report_html}[/bold]")


def _show_transfer(result: Any) -> None:
    from redline.pipelines.transfer import TRANSFER_COLUMNS

    _print_summary("transfer attack", TRANSFER_COLUMNS, result)


@run_app.command("advtrain")
def run_advtrain_cmd(
    config: ConfigOpt,
    output: Annotated[Optional[str], typer.Option(help="Override output: a directory or s3:// URI.")] = None,
    run_name: Annotated[Optional[str], typer.Option(help="Name of the run directory (default advtrain-<config hash>).")] = None,
    set_: SetOpt = None,
    force: ForceOpt = False,
) -> None:
    """Adversarial training variants (no TAE, unfiltered TAE, TaeBench, TaeBench+, balanced TaeBench+)
    and any hyper-parameter grid as a Ray Tune sweep; the report is the paper's Table 5, best trial
    per variant. An interrupted sweep resumes where it stopped when the command is rerun.
    """
    from redline.cluster.config import AdvTrainConfig, load_config
    from redline.pipelines.advtrain import TABLE_COLUMNS, run_advtrain
    from redline.pipelines.report import format_value

    cfg = load_config(AdvTrainConfig, config, {"output": output, "run_name": run_name, **_parse_sets(set_)})
    result = run_advtrain(cfg, force=force, verbose=_verbose())
    if result.reused:
        err_console.print(f"[dim]config already trained in {result.run_uri}; reusing it (pass --force to redo)[/dim]")
    table = Table(title="adversarial training: best trial per variant")
    for _, title, fmt in TABLE_COLUMNS:
        table.add_column(title, justify="left" if fmt == "s" else "right")
    for row in result.summary:
        table.add_row(*(format_value(row.get(k), f) for k, _, f in TABLE_COLUMNS))
    console.print(table)
    console.print(f"report: [bold]{result.report_html}[/bold]")


@run_app.command("diasafety")
def run_diasafety_cmd(
    config: ConfigOpt,
    output: Annotated[Optional[str], typer.Option(help="Override output: a directory or s3:// URI.")] = None,
    run_name: Annotated[Optional[str], typer.Option(help="Name of the run directory (default diasafety-<config hash>).")] = None,
    set_: SetOpt = None,
    force: ForceOpt = False,
) -> None:
    """Evaluate chatbots on DiaSafety contexts: generate responses per context, judge them with the
    two-step detector (utterance-level, then the category's context classifier) and print the
    leaderboard of unsafe proportions per category (the paper's Table 8)."""
    from redline.cluster.config import DiaSafetyEvalConfig, load_config
    from redline.pipelines.diasafety import run_diasafety

    cfg = load_config(DiaSafetyEvalConfig, config, {"output": output, "run_name": run_name, **_parse_sets(set_)})
    _show_leaderboard(run_diasafety(cfg, force=force, verbose=_verbose()))


@run_app.command("egregious")
def run_egregious_cmd(
    config: ConfigOpt,
    output: Annotated[Optional[str], typer.Option(help="Override output: a directory or s3:// URI.")] = None,
    run_name: Annotated[Optional[str], typer.Option(help="Name of the run directory (default egregious-<config hash>).")] = None,
    set_: SetOpt = None,
    force: ForceOpt = False,
) -> None:
    """Search trigger inputs that make generation models produce target outputs (He & Glass 2019).

    gibbs-enum runs per (model, target list, hit family) — o-greedy, o-sample-avg/min and, with an
    LM, io-sample-avg/min — across Ray Data actors, and prints the hit-rate table (the paper's
    Table 3); the report adds example triggers (Table 4) and search effort. Models: LSTM seq2seq
    directories from `redline train seq2seq`, or any HF causal / seq2seq LM.
    """
    from redline.cluster.config import EgregiousConfig, load_config
    from redline.pipelines.egregious import run_egregious

    cfg = load_config(EgregiousConfig, config, {"output": output, "run_name": run_name, **_parse_sets(set_)})
    _show_hits(run_egregious(cfg, force=force, verbose=_verbose()))


def _show_hits(result: Any) -> None:
    from redline.pipelines.egregious import TABLE3_COLUMNS

    _print_summary("hit rates by list and hit type (He & Glass Table 3)", TABLE3_COLUMNS, result)


def _show_leaderboard(result: Any) -> None:
    from redline.pipelines.report import leaderboard_columns

    _print_summary("DiaSafety leaderboard: unsafe proportions (safest first)",
                   leaderboard_columns(result.manifest.get("categories", [])), result)


def _show_attack(result: Any) -> None:
    from redline.pipelines.report import ATTACK_COLUMNS, format_value

    if result.reused:
        err_console.print(f"[dim]config already attacked in {result.run_uri}; reusing it (pass --force to redo)[/dim]")
    keys = ["recipe", "goal", "attempts", "success", "failed", "skipped", "error", "asr", "mean_queries", "mean_pct_perturbed"]
    cols = [c for c in ATTACK_COLUMNS if c[0] in keys]
    table = Table(title=f"attacks on {result.summary[0]['victim'] if result.summary else '?'}")
    for _, title, fmt in cols:
        table.add_column(title, justify="left" if fmt == "s" else "right")
    for row in result.summary:
        table.add_row(*(format_value(row.get(k), f) for k, _, f in cols))
    console.print(table)
    rate = result.manifest.get("attempts_per_s")
    if rate:
        console.print(f"{rate:,.1f} attempts/s")
    console.print(f"report: [bold]{result.report_html}[/bold]")


def _run_and_show(cfg: Any, force: bool) -> None:
    from redline.pipelines.score import run_score

    result = run_score(cfg, force=force, verbose=_verbose())
    if result.reused:
        err_console.print(f"[dim]config already scored in {result.run_uri}; reusing it (pass --force to redo)[/dim]")
    show_metrics(result.summary)
    console.print(f"report: [bold]{result.report_html}[/bold]")


def show_metrics(metrics: list[dict[str, Any]]) -> None:
    from redline.pipelines.report import METRIC_COLUMNS, format_value

    keys = ["detector", "dataset", "n", "accuracy", "f1_toxic", "f1_macro", "roc_auc", "fnr", "fpr", "rows_per_s", "not_scored"]
    cols = [c for c in METRIC_COLUMNS if c[0] in keys]
    if all(m["dataset"] == "all" for m in metrics):
        cols = [c for c in cols if c[0] != "dataset"]
    table = Table(title="detectors (toxic = positive class)")
    for _, title, fmt in cols:
        table.add_column(title, justify="left" if fmt == "s" else "right")
    for m in metrics:
        table.add_row(*(format_value(m.get(k), f) for k, _, f in cols))
    console.print(table)


# --------------------------------------------------------------------------------------------
# train


@train_app.command("tiny-classifier")
def train_tiny(
    corpus: Annotated[str, typer.Option(help="Labelled corpus (CSV/JSONL/JSON/Parquet, local or s3://).")],
    out: Annotated[Path, typer.Option(help="Directory to save the model and tokenizer in (save_pretrained).")],
    preset: Annotated[Optional[str], typer.Option(help="Column mapping preset: davidson, jigsaw or diasafety.")] = None,
    text_column: Annotated[Optional[str], typer.Option(help="Text column (without a preset).")] = None,
    label_column: Annotated[Optional[str], typer.Option(help="Label column (without a preset).")] = None,
    toxic_values: Annotated[Optional[list[str]], typer.Option(help="Label values meaning toxic (repeatable).")] = None,
    limit: Annotated[Optional[int], typer.Option(help="Train on at most this many rows.")] = None,
    epochs: Annotated[int, typer.Option(help="Training epochs.")] = 4,
    hidden_size: Annotated[int, typer.Option(help="Hidden size of the tiny BERT.")] = 64,
    layers: Annotated[int, typer.Option(help="Transformer layers.")] = 2,
) -> None:
    """Train a tiny BERT toxic/benign classifier from scratch (seconds on a CPU, no downloads).

    The result is a normal Hugging Face model directory: use it as `kind: hf, model: DIR`.
    """
    from redline.actors.tiny_models import build_tiny_classifier
    from redline.cluster.config import CorpusConfig, validate_config
    from redline.pipelines.corpora import read_corpus

    fields = {"path": corpus, "preset": preset, "text_column": text_column, "label_column": label_column,
              "toxic_values": toxic_values, "limit": limit}
    cfg = validate_config(CorpusConfig, {k: v for k, v in fields.items() if v is not None}, source="corpus")
    table = read_corpus(cfg)
    rows = [r for r in table.select(["text", "label", "status"]).to_pylist() if r["status"] == "ok" and r["label"] is not None]
    if not rows:
        raise RedlineError(f"{corpus}: no labelled, non-empty rows to train on")
    with console.status(f"training a tiny classifier on {len(rows):,} rows"):
        path = build_tiny_classifier([r["text"] for r in rows], [int(r["label"]) for r in rows], out,
                                     epochs=epochs, hidden_size=hidden_size, num_layers=layers)
    console.print(f"saved: [bold]{path}[/bold] (use it as: kind: hf, model: {path})")


def _train_binary(corpus: str, out: Path, base_model: str, label_names: tuple[str, str], *, text_column: str | None,
                  label_column: str | None, positive_values: list[str] | None, preset: str | None, limit: int | None,
                  epochs: int, learning_rate: float, batch_size: int, use_for: str) -> None:
    from redline.actors.trainer import TrainSettings, fine_tune
    from redline.cluster.config import CorpusConfig, validate_config
    from redline.cluster.progress import progress_bar
    from redline.pipelines.corpora import read_corpus

    fields = {"path": corpus, "preset": preset, "text_column": text_column, "label_column": label_column,
              "toxic_values": positive_values, "limit": limit}
    cfg = validate_config(CorpusConfig, {k: v for k, v in fields.items() if v is not None}, source="corpus")
    rows = [r for r in read_corpus(cfg).select(["text", "label", "status"]).to_pylist()
            if r["status"] == "ok" and r["label"] is not None]
    if not rows:
        raise RedlineError(f"{corpus}: no labelled, non-empty rows to train on")
    settings = TrainSettings(epochs=epochs, learning_rate=learning_rate, batch_size=batch_size)
    with progress_bar(f"fine-tuning {base_model} on {len(rows):,} rows", total=int(len(rows) * 0.8) * epochs) as advance:
        result = fine_tune(base_model, [r["text"] for r in rows], [int(r["label"]) for r in rows], out,
                           label_names=label_names, settings=settings, progress=advance)
    m = result["held_out"]
    table = Table(title=f"held-out split ({result['held_out_rows']} rows), best epoch {result['best_epoch']}")
    for col in ("f1", "recall", "precision", "average_precision", "roc_auc"):
        table.add_column(col, justify="right")
    table.add_row(*(format(m[c], ".3f") if m.get(c) is not None else "–"
                    for c in ("f1", "recall", "precision", "average_precision", "roc_auc")))
    console.print(table)
    console.print(f"saved: [bold]{out}[/bold] ({use_for})")


BaseModelOpt = Annotated[str, typer.Option(help="Hub id or local directory to fine-tune (e.g. a CoLA model, DistilBERT, MiniLM).")]


@train_app.command("naturalness")
def train_naturalness(
    corpus: Annotated[str, typer.Option(help="Human-labelled rows: a text column and a natural yes/no column.")],
    out: Annotated[Path, typer.Option(help="Directory to save the model in (save_pretrained).")],
    base_model: BaseModelOpt,
    text_column: Annotated[str, typer.Option(help="Text column.")] = "text",
    label_column: Annotated[str, typer.Option(help="Column saying whether the text reads naturally.")] = "natural",
    natural_values: Annotated[Optional[list[str]], typer.Option(help="Values meaning natural (repeatable).")] = None,
    limit: Annotated[Optional[int], typer.Option(help="Train on at most this many rows.")] = None,
    epochs: Annotated[int, typer.Option(help="Training epochs.")] = 3,
    learning_rate: Annotated[float, typer.Option(help="AdamW learning rate.")] = 5e-5,
    batch_size: Annotated[int, typer.Option(help="Texts per step.")] = 16,
) -> None:
    """Fine-tune a text-acceptability classifier for the TaeBench naturalness stage.

    Reports F1, recall, precision, AP and ROC-AUC on a held-out 20%. Use the result as
    `naturalness: {model: DIR, natural_label: natural}` in a taebench config.
    """
    _train_binary(corpus, out, base_model, ("unnatural", "natural"), text_column=text_column, label_column=label_column,
                  positive_values=natural_values or ["yes", "1", "true", "natural"], preset=None, limit=limit,
                  epochs=epochs, learning_rate=learning_rate, batch_size=batch_size,
                  use_for="taebench: naturalness: {model: DIR, natural_label: natural}")


@train_app.command("judge-classifier")
def train_judge_classifier(
    corpus: Annotated[str, typer.Option(help="Labelled toxic/benign rows (CSV/JSONL/JSON/Parquet, local or s3://).")],
    out: Annotated[Path, typer.Option(help="Directory to save the model in (save_pretrained).")],
    base_model: BaseModelOpt,
    preset: Annotated[Optional[str], typer.Option(help="Column mapping preset: davidson, jigsaw or diasafety.")] = None,
    text_column: Annotated[Optional[str], typer.Option(help="Text column (without a preset).")] = None,
    label_column: Annotated[Optional[str], typer.Option(help="Label column (without a preset).")] = None,
    toxic_values: Annotated[Optional[list[str]], typer.Option(help="Label values meaning toxic (repeatable).")] = None,
    limit: Annotated[Optional[int], typer.Option(help="Train on at most this many rows.")] = None,
    epochs: Annotated[int, typer.Option(help="Training epochs.")] = 3,
    learning_rate: Annotated[float, typer.Option(help="AdamW learning rate.")] = 5e-5,
    batch_size: Annotated[int, typer.Option(help="Texts per step.")] = 16,
) -> None:
    """Fine-tune the toxicity classifier of the TaeBench label filter (benign/toxic).

    Reports held-out metrics; use the result as `classifier: {name: ..., kind: hf, model: DIR}`.
    """
    _train_binary(corpus, out, base_model, ("benign", "toxic"), text_column=text_column, label_column=label_column,
                  positive_values=toxic_values, preset=preset, limit=limit, epochs=epochs,
                  learning_rate=learning_rate, batch_size=batch_size,
                  use_for="taebench: classifier: {name: judge-classifier, kind: hf, model: DIR}")


@train_app.command("dialogue-safety")
def train_dialogue_safety(
    config: ConfigOpt,
    output: Annotated[Optional[str], typer.Option(help="Override output: a local directory for the run and models.")] = None,
    set_: SetOpt = None,
    force: ForceOpt = False,
) -> None:
    """Train DiaSafety context classifiers and compare them on the validation split.

    Variants: one-vs-all (a Safe/Unsafe/N-A classifier per category on context + response pairs),
    a single multi-class classifier, and the response-only ablation; utterance-level detectors add
    coarse-grain baselines. Prints the coarse-grain table; the report has the per-class tables.
    """
    from redline.cluster.config import DialogueSafetyTrainConfig, load_config
    from redline.pipelines.diasafety_train import run_dialogue_safety_training
    from redline.pipelines.report import COARSE_COLUMNS, format_value

    cfg = load_config(DialogueSafetyTrainConfig, config, {"output": output, **_parse_sets(set_)})
    with console.status("training dialogue-safety classifiers"):
        result = run_dialogue_safety_training(cfg, force=force, verbose=_verbose())
    table = Table(title="coarse-grain (unsafe vs safe) on the validation split")
    for _, title, fmt in COARSE_COLUMNS:
        table.add_column(title, justify="left" if fmt == "s" else "right")
    for row in result.summary:
        table.add_row(*(format_value(row.get(k), f) for k, _, f in COARSE_COLUMNS))
    console.print(table)
    for variant, rows in result.manifest.get("fine", {}).items():
        console.print(f"fine-grain macro F1, {variant}: {rows[-1]['f1']:.3f}")
    console.print(f"report: [bold]{result.report_html}[/bold]")


def _train_trigger_model(kind: str, config: Path, sets: list[str] | None, output: str | None) -> None:
    from redline.actors.triggers.training import train
    from redline.cluster.config import TriggerModelTrainConfig, load_config

    cfg = load_config(TriggerModelTrainConfig, config, {"output": output, **_parse_sets(sets)})
    model = train(cfg, kind)
    m = model.metrics
    table = Table(title=f"{kind} on held-out pairs (He & Glass Table 2 shape)")
    for col in ("model", "vocab", "train pairs", "test PPL", "test NLL", f"T_{'out' if kind == 'seq2seq' else 'in'}", "seconds"):
        table.add_column(col, justify="left" if col == "model" else "right")
    table.add_row(model.path.name, str(m["vocab_size"]), str(m["train_pairs"]), f"{m['test_ppl']:.2f}",
                  f"{m['test_nll']:.3f}", f"{model.thresholds.average_logprob:.3f}", f"{m['train_s']:.1f}")
    console.print(table)
    console.print(f"model: [bold]{model.path}[/bold]")


@train_app.command("seq2seq")
def train_seq2seq(
    config: ConfigOpt,
    output: Annotated[Optional[str], typer.Option(help="Directory the model directory is written under.")] = None,
    set_: SetOpt = None,
) -> None:
    """Train the paper's LSTM encoder-decoder on dialogue pairs (context: last-h or attention).

    Word-level vocabulary of the N most frequent words, inputs cut to 15 and outputs to 20 tokens,
    SGD with the paper's halving schedule by default. Saves the model, its vocabulary and T_out (its
    average per-word log-likelihood on held-out pairs) for `redline run egregious`.
    """
    _train_trigger_model("seq2seq", config, set_, output)


@train_app.command("lm")
def train_lm(
    config: ConfigOpt,
    output: Annotated[Optional[str], typer.Option(help="Directory the model directory is written under.")] = None,
    set_: SetOpt = None,
) -> None:
    """Train the LSTM language model over the input side of dialogue pairs (the io hit types'
    measure of how likely a trigger is as an input); saves T_in. Use the same pairs and vocab_size
    as the seq2seq so both share a vocabulary."""
    _train_trigger_model("lm", config, set_, output)


# --------------------------------------------------------------------------------------------
# quickstart


@app.command()
def quickstart(
    what: Annotated[str, typer.Argument(help="taebench (default): the whole chain; score: detectors on a labelled "
                                             "sample; attack: TAE/BAE recipes only; diasafety: chatbot "
                                             "evaluation; egregious: gibbs-enum trigger search.")] = "taebench",
    output: Annotated[str, typer.Option(help="Where run directories and the tiny models go.")] = "redline-runs",
    force: ForceOpt = False,
) -> None:
    """The main job on embedded defaults: local Ray, local files, offline models, a bundled sample.

    `taebench` runs the TaeBench chain in a few minutes: attack profanity-check on the bundled
    sample (toxic and benign seeds, 3 recipes), filter the adversarial examples (dedupe, grammar
    when a LanguageTool server is set, an LLM judge served by redline's own OpenAI-compatible
    generation service with a tiny model trained on the spot, AND a tiny classifier), then
    benchmark three detectors by transfer attack. `score` scores the sample's test split with
    three detectors; `attack` runs only the attack. `diasafety` trains tiny DiaSafety context
    classifiers on a slice of the dataset (REDLINE_DIASAFETY_DIR), evaluates a tiny dialogue model
    and prints the leaderboard. `egregious` trains a tiny LSTM seq2seq and LM on a slice of
    DiaSafety pairs (REDLINE_DIASAFETY_DIR) and prints gibbs-enum hit rates per target list.
    """
    from redline.pipelines import quickstart as qs

    if what == "score":
        model_dir = qs.quickstart_model(Path(output) / "models")
        _run_and_show(qs.quickstart_config(output, model_dir), force=force)
    elif what == "attack":
        from redline.pipelines.attack import run_attack

        _show_attack(run_attack(qs.quickstart_attack_config(output), force=force, verbose=_verbose()))
    elif what == "taebench":
        runs = qs.run_chain(output, force=force, verbose=_verbose(), say=lambda m: err_console.print(f"[bold]{m}[/bold]"))
        _show_attack(runs["attack"])
        counts = runs["taebench"].manifest["counts"]
        console.print(f"TaeBench: {counts['raw']} raw -> {counts['taebench']} TAE kept, "
                      f"{counts['taebench_plus']} in TaeBench+ (report: {runs['taebench'].report_html})")
        _show_transfer(runs["transfer"])
    elif what == "diasafety":
        runs = qs.run_diasafety_chain(output, force=force, verbose=_verbose(),
                                      say=lambda m: err_console.print(f"[bold]{m}[/bold]"))
        for row in runs["classifiers"].summary:
            console.print(f"classifier {row['model']} ({row['input']}): coarse F1 {row['f1']:.3f}")
        _show_leaderboard(runs["leaderboard"])
    elif what == "egregious":
        _show_hits(qs.run_egregious_chain(output, force=force, verbose=_verbose(),
                                          say=lambda m: err_console.print(f"[bold]{m}[/bold]")))
    else:
        raise RedlineError(f"unknown quickstart '{what}' (known: taebench, score, attack, diasafety, egregious)")


# --------------------------------------------------------------------------------------------
# cluster jobs and run status


AddressOpt = Annotated[Optional[str], typer.Option(
    help="Ray Jobs address (http://HEAD:8265); default $RAY_JOBS_ADDRESS, $RAY_ADDRESS if it is http(s), else http://127.0.0.1:8265.")]


@app.command()
def submit(
    pipeline: Annotated[str, typer.Argument(help=f"Pipeline to run: {', '.join(PIPELINES)}.")],
    config: ConfigOpt,
    address: AddressOpt = None,
    set_: SetOpt = None,
    env: Annotated[Optional[list[str]], typer.Option(
        "--env", help="Pass this environment variable to the job (repeatable), e.g. --env HF_TOKEN. Only S3 "
                      "endpoint/region and hub mirror settings travel by default, never credentials.")] = None,
    wait: Annotated[bool, typer.Option(help="Wait for the job to finish and stream its logs.")] = False,
) -> None:
    """Run a pipeline on a running Ray cluster through the Ray Jobs API.

    The config travels with the job; the cluster's nodes need redline installed (ray_cluster.yaml
    does that). Use s3:// paths for corpora and output so every node can reach them. Secrets (API
    keys, HF_TOKEN) reach the job only when named with --env.
    """
    from redline.cluster import jobs

    if pipeline not in PIPELINES:
        raise RedlineError(f"unknown pipeline '{pipeline}' (known: {', '.join(PIPELINES)})")
    job_id = jobs.submit(pipeline, config, jobs.jobs_address(address), sets=set_ or [], env_names=env or [])
    console.print(f"submitted job [bold]{job_id}[/bold]")
    console.print(f"  status: redline status {job_id}    logs: redline logs {job_id} --follow")
    if wait:
        status = jobs.follow(job_id, jobs.jobs_address(address), echo=lambda s: console.print(s, end="", markup=False, highlight=False))
        console.print(f"job {job_id}: {status}")
        if status != "SUCCEEDED":
            raise typer.Exit(1)


@app.command()
def status(
    target: Annotated[str, typer.Argument(help="A run directory (local or s3://) or a Ray job id.")],
    address: AddressOpt = None,
) -> None:
    """Show a run's state and counts from its manifest, or a submitted job's status."""
    from redline.cluster import jobs, storage

    if jobs.looks_like_job_id(target):
        info = jobs.job_info(target, jobs.jobs_address(address))
        console.print(f"job {target}: [bold]{info['status']}[/bold]")
        if info.get("message"):
            console.print(f"  {info['message']}")
        return
    if not storage.exists(target):
        raise RedlineError(f"no run directory or job id: {target}")
    manifest = storage.RunDir(target).manifest()
    if manifest is None:
        raise RedlineError(f"{target} is not a run directory (no manifest.json)")
    console.print(f"run {target}: [bold]{manifest.get('state')}[/bold] ({manifest.get('pipeline')}, config {manifest.get('config_hash')})")
    if manifest.get("error"):
        console.print(f"  error: {manifest['error']}")
    counts = manifest.get("counts", {})
    attack = manifest.get("pipeline") == "attack"
    if counts and attack:
        console.print(f"  attempts {counts.get('attempts_in')}, by status {counts.get('by_status', '–')}")
    elif counts:
        console.print(f"  rows in {counts.get('rows_in')}, rows out {counts.get('rows_out', '–')}, rejected {counts.get('rejected', {})}")
    if manifest.get("state") == "complete":
        from redline.pipelines.sharded import RunResult

        result = RunResult(target, manifest, manifest.get("summary" if attack else "metrics", []))
        if attack:
            _show_attack(result)
        else:
            show_metrics([m for m in result.summary if m.get("dataset") == "all"])
            console.print(f"report: {result.report_html}")
    elif manifest.get("input_shards") is not None:
        output_dir = "attempts" if attack else "predictions"
        done = len(storage.list_files(storage.join(target, output_dir), ".parquet"))
        console.print(f"  shards written: {done}/{manifest['input_shards']} (rerun the same command to resume)")


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


# --------------------------------------------------------------------------------------------
# serve and detect

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
    from redline.cluster.config import ServeConfig, load_config
    from redline.serve import runner

    cfg = load_config(ServeConfig, config, {"host": host, "port": port, "insecure": insecure or None,
                                            **_parse_sets(set_)})
    with console.status(f"starting {len(cfg.detectors)} detector(s) and {len(cfg.generators)} generator(s) on Ray Serve"):
        state = runner.start(cfg, config_file=str(config), verbose=_verbose(), announce=lambda _: None)
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

    for url in runner.stop(port):
        console.print(f"stopped {url}")


@serve_app.command("deploy-config")
def serve_deploy_config_cmd(
    config: ConfigOpt,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Write here instead of printing.")] = None,
) -> None:
    """Write a Serve config file (for `serve deploy` or the Ray dashboard) equivalent to a redline serve config."""
    from redline.cluster.config import ServeConfig, load_config
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

    from redline.serve.client import RedlineClient

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


# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Entry point: one line and exit code 2 for user mistakes, a traceback only for bugs."""
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
    except Exception as err:  # noqa: BLE001
        user = unwrap_user_error(err)
        if user is None:
            raise
        message = " ".join(str(user).split())  # always one line, whatever the source message held
        if sys.stderr.isatty():
            err_console.print(f"[bold red]error:[/bold red] {escape(message)}", highlight=False, soft_wrap=True)
        else:
            print(f"error: {message}", file=sys.stderr)
        return 2
    # With standalone_mode off, --help and `raise typer.Exit(n)` come back as an exit code.
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
