"""The pipeline registry: one entry per pipeline. The CLI builds its `run` / `train` commands from
it, and `submit`, `status`, `report` and the examples test read it. Modules are imported only when a
pipeline is used, so `redline --help` stays instant.

Adding a pipeline: a config model, a module with `PIPELINE = Pipeline(...)`, a worker, and one entry
here (README "Development" walks through one).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from redline.cluster.plugins import Registry
from redline.pipelines.reporting import figures
from redline.pipelines.reporting.figures import Headline, Table

if TYPE_CHECKING:
    from redline.pipelines.run_skeleton import Pipeline


@dataclass(frozen=True)
class Flag:
    """A command-line shortcut for a config field: `--<name> VALUE` sets `path` (`*` in a path: every
    item of that list)."""

    name: str
    path: str
    help: str
    type: type = str
    multiple: bool = False


@dataclass(frozen=True)
class Entry:
    """Everything the CLI, `submit`, `status`, `report` and `redline view` know of a pipeline."""

    name: str  # the pipeline's name: run directories `<name>-<hash>`, manifest["pipeline"]
    module: str  # defines PIPELINE
    command: tuple[str, ...]  # where the CLI puts it: ("run", "score"), ("train", "dialogue-safety"), ("eval",)
    help: str
    example: str  # examples/<file>: a config that validates
    table: Table  # its summary table: the figures, declared in pipelines/reporting/figures.py
    rows: tuple[str, ...] = ()  # its main row tables (the viewer lists them first), e.g. ("attempts",)
    flags: tuple[Flag, ...] = field(default_factory=tuple)
    gated: bool = False  # its command takes --fail-if rules on the run's figures (the pipeline's `gate`)

    @property
    def headline(self) -> Headline | None:
        return self.table.headline_of() if self.table.headline else None


CORPUS = Flag("corpus", "corpus.path", "Override corpus.path (local path or s3:// URI).")
ENTRIES: tuple[Entry, ...] = (
    Entry("score", "redline.pipelines.score", ("run", "score"),
          "Score a labelled corpus with several detectors across Ray actors and report how each does: per-row "
          "predictions (Parquet shards), manifest.json, and a report (metrics per detector and dataset, ROC and "
          "rate plots, the most confident misses).", "score_davidson.yaml", figures.SCORE, ("predictions",),
          (CORPUS, Flag("limit", "corpus.limit", "Score at most this many rows (a seeded random sample).", int),
           Flag("actors", "detectors.*.actors", "Actor pool size for every detector.", int))),
    Entry("attack", "redline.pipelines.attack", ("run", "attack"),
          "Attack a victim detector with recipes: toxic seeds until it says benign (TAE), benign seeds until it "
          "says toxic (BAE). One row per (seed, recipe, goal) attempt with status and provenance; the report gives "
          "ASR, queries, % words perturbed and sample successes per recipe.", "attack_quick.yaml", figures.ATTACK,
          ("attempts",),
          (CORPUS, Flag("max_seeds", "max_seeds", "At most this many seeds per goal.", int),
           Flag("recipe", "recipes", "Run only these recipes (repeatable).", str, True),
           Flag("actors", "actors", "Attacker actors.", int))),
    Entry("taebench", "redline.pipelines.taebench", ("run", "taebench"),
          "Filter attack runs' adversarial examples into TaeBench (valid TAE) and TaeBench+ (+ valid BAE): dedupe "
          "-> grammar (LanguageTool) -> naturalness -> label filter (LLM judge AND classifier); each stage's kept and "
          "rejected rows are kept with reasons; the report is the paper's Table 2.", "taebench.yaml", figures.TAEBENCH, ("taebench", "taebench_plus")),
    Entry("transfer", "redline.pipelines.transfer", ("run", "transfer"),
          "Benchmark detectors with a TaeBench run (transfer attack): ASR = FNR on TAE, FPR on BAE, and the FNR on "
          "the original seeds, per victim and seed dataset. Victims are any detector kind.", "transfer.yaml", figures.TRANSFER, ("predictions",)),
    Entry("advtrain", "redline.pipelines.advtrain", ("run", "advtrain"),
          "Adversarial training variants (no TAE, unfiltered TAE, TaeBench, TaeBench+, balanced TaeBench+) and any "
          "hyper-parameter grid as a Ray Tune sweep; the report is the paper's Table 5 (best trial per variant). An "
          "interrupted sweep resumes when the command is rerun.", "advtrain.yaml", figures.ADVTRAIN, ()),
    Entry("diasafety", "redline.pipelines.diasafety_eval", ("run", "diasafety"),
          "Evaluate chatbots on DiaSafety contexts: generate responses per context, judge them with the two-step "
          "detector (utterance-level, then the category's context classifier) and print the leaderboard of unsafe "
          "proportions per category (the paper's Table 8).", "diasafety.yaml", figures.DIASAFETY, ("scored",)),
    Entry("egregious", "redline.pipelines.egregious", ("run", "egregious"),
          "Search trigger inputs that make generation models produce target outputs (He & Glass 2019): gibbs-enum per "
          "(model, target list, hit family) across actors; prints the hit-rate table (Table 3), the report "
          "adds example triggers (Table 4) and search effort.", "egregious.yaml", figures.EGREGIOUS, ("triggers",)),
    Entry("dialogue-safety-train", "redline.pipelines.diasafety_train", ("train", "dialogue-safety"),
          "Train DiaSafety context classifiers and compare them on the validation (and test) split: one-vs-all "
          "(Safe/Unsafe/N-A per category on context + response), a single multi-class classifier, the response-only "
          "ablation, and utterance-level baselines.", "dialoguesafety_train.yaml", figures.DIALOGUE_SAFETY_TRAIN, ()),
    Entry("eval", "redline.pipelines.card", ("eval",),
          "A safety card for one chat model and the guard detector that protects it, in one job: the guard under "
          "transfer attack (TaeBench built against it, or an existing one), the model on DiaSafety contexts judged "
          "by the two-step detector, and the trigger search when the model is a local causal LM. Each part is a "
          "resumable run of its own; the card's report tables and links them, and card.json holds every figure "
          "with its n and 95% interval.", "card.yaml", figures.CARD, (), gated=True),
)


PIPELINES: Registry[Entry] = Registry("pipeline", lambda e: e.name, lambda: ENTRIES)


def entries() -> tuple[Entry, ...]:
    return tuple(PIPELINES.all().values())


def entry(name: str) -> Entry:
    return PIPELINES.get(name)


def pipeline(name: str) -> "Pipeline[Any]":
    return importlib.import_module(entry(name).module).PIPELINE
