"""`redline train ...`: the models the pipelines use (tiny classifiers, naturalness and judge
classifiers, the LSTM seq2seq / LM of the trigger search). `train dialogue-safety` is a pipeline
and comes from the registry."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from redline.cli.apps import train_app
from redline.cli.runs import ConfigOpt, SetOpt
from redline.cli.show import console
from redline.cluster.artifacts import local_output
from redline.errors import RedlineError


@train_app.command("tiny-classifier")
def train_tiny(
    corpus: Annotated[str, typer.Option(help="Labelled corpus (CSV/JSONL/JSON/Parquet, local or s3://).")],
    out: Annotated[str, typer.Option(help="Directory (or s3:// URI) to save the model and tokenizer in "
                                          "(save_pretrained).")],
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
    from redline.actors.tiny_models import TinyBert, build_tiny_classifier
    from redline.cluster.config import validate_config
    from redline.pipelines.plane.corpora import CorpusConfig, read_corpus

    fields = {"path": corpus, "preset": preset, "text_column": text_column, "label_column": label_column,
              "toxic_values": toxic_values, "limit": limit}
    cfg = validate_config(CorpusConfig, {k: v for k, v in fields.items() if v is not None}, source="corpus")
    table = read_corpus(cfg)
    rows = [r for r in table.select(["text", "label", "status"]).to_pylist() if r["status"] == "ok" and r["label"] is not None]
    if not rows:
        raise RedlineError(f"{corpus}: no labelled, non-empty rows to train on")
    with console.status(f"training a tiny classifier on {len(rows):,} rows"):
        with local_output(out) as local:
            build_tiny_classifier([r["text"] for r in rows], [int(r["label"]) for r in rows], local,
                                  spec=TinyBert(epochs=epochs, hidden_size=hidden_size, num_layers=layers))
    console.print(f"saved: [bold]{out}[/bold] (use it as: kind: hf, model: {out})")


def _train_binary(corpus: str, out: str, base_model: str, label_names: tuple[str, str], *, text_column: str | None,
                  label_column: str | None, positive_values: list[str] | None, preset: str | None, limit: int | None,
                  epochs: int, learning_rate: float, batch_size: int, use_for: str) -> None:
    from redline.actors.trainer import TrainSettings, fine_tune
    from redline.cluster.config import validate_config
    from redline.cluster.progress import progress_bar
    from redline.pipelines.plane.corpora import CorpusConfig, read_corpus

    fields = {"path": corpus, "preset": preset, "text_column": text_column, "label_column": label_column,
              "toxic_values": positive_values, "limit": limit}
    cfg = validate_config(CorpusConfig, {k: v for k, v in fields.items() if v is not None}, source="corpus")
    rows = [r for r in read_corpus(cfg).select(["text", "label", "status"]).to_pylist()
            if r["status"] == "ok" and r["label"] is not None]
    if not rows:
        raise RedlineError(f"{corpus}: no labelled, non-empty rows to train on")
    settings = TrainSettings(epochs=epochs, learning_rate=learning_rate, batch_size=batch_size)
    with progress_bar(f"fine-tuning {base_model} on {len(rows):,} rows", total=int(len(rows) * 0.8) * epochs) as advance:
        with local_output(out) as local:
            result = fine_tune(base_model, [r["text"] for r in rows], [int(r["label"]) for r in rows], local,
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
    out: Annotated[str, typer.Option(help="Directory (or s3:// URI) to save the model in (save_pretrained).")],
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
    out: Annotated[str, typer.Option(help="Directory (or s3:// URI) to save the model in (save_pretrained).")],
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


def _train_trigger_model(kind: str, config: Path, sets: list[str] | None, output: str | None) -> None:
    from redline.actors.triggers.training import TriggerModelTrainConfig, train
    from redline.cluster.config import load_config, parse_overrides

    cfg = load_config(TriggerModelTrainConfig, config, {"output": output, **parse_overrides(sets)})
    model = train(cfg, kind)
    m = model.metrics
    table = Table(title=f"{kind} on held-out pairs (He & Glass Table 2 shape)")
    for col in ("model", "vocab", "train pairs", "test PPL", "test NLL", f"T_{'out' if kind == 'seq2seq' else 'in'}", "seconds"):
        table.add_column(col, justify="left" if col == "model" else "right")
    table.add_row(str(model.path).rstrip("/").rsplit("/", 1)[-1], str(m["vocab_size"]), str(m["train_pairs"]), f"{m['test_ppl']:.2f}",
                  f"{m['test_nll']:.3f}", f"{model.thresholds.average_logprob:.3f}", f"{m['train_s']:.1f}")
    console.print(table)
    console.print(f"model: [bold]{model.path}[/bold]")


@train_app.command("seq2seq")
def train_seq2seq(
    config: ConfigOpt,
    output: Annotated[Optional[str], typer.Option(help="Directory the model directory is written under.")] = None,
    set_: SetOpt = None,
) -> None:
    """Train the paper's LSTM encoder-decoder on dialogue pairs (context: last-h or attention;
    context_feed: input puts it beside the word embedding at the decoder's input, as the paper does,
    combine (the default) mixes it with the decoder's output).

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


