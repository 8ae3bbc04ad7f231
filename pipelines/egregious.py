"""`redline run egregious`: gibbs-enum trigger search (He & Glass 2019) over target lists.

The driver resolves each model's thresholds and target lists, writes one input row per (model,
list, target, search), and shards of them go to `TriggerWorker` actors, which load every
model (and its LM) once and search a whole batch of targets together. One output row per input:
the best trigger, its scores, every hit type it reaches, effort and time. The report gives the
paper's Table 3 (hit rate per list and hit type, per model) and Table 4 (example triggers).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, model_validator

from redline.actors.triggers import hits as H
from redline.actors.triggers.pairs import PairCorpusConfig
from redline.actors.triggers.settings import TriggerSearchSettings
from redline.actors.triggers.worker import RESULT_SCHEMA, EgregiousModelConfig, TriggerWorker
from redline.cluster import storage
from redline.cluster.artifacts import local_path
from redline.cluster.config import ActorPoolSize, Execution, Input, Result, RunConfig, Strict, unique_names
from redline.cluster.runs import Run, RunDir, RunResult, Stopwatch
from redline.errors import RedlineError
from redline.pipelines.plane import runner, shard_host, sharded
from redline.pipelines.plane.steps import Step, run_beside
from redline.pipelines.reporting.figures import EGREGIOUS, EGREGIOUS_EFFORT, EGREGIOUS_SOURCES, outcomes
from redline.pipelines.reporting.report import Report, grouped_bars
from redline.pipelines.run_skeleton import Pipeline

OUTPUT_DIR = "triggers"


BUILT_IN = ("normal", "normal-sample", "planted", "mal", "random")
Search = Literal["o-greedy", "o-sample-avg", "o-sample-min", "io-sample-avg", "io-sample-min"]
# The hit type the paper reports on each list built from the model's own outputs.
LIST_SEARCHES = {"normal": ["o-greedy"], "normal-sample": ["o-sample-min"], "planted": ["o-greedy"]}


class TargetListConfig(Strict):
    name: str = Result(pattern=r"^[A-Za-z0-9_.\-]+$", description="normal, normal-sample, planted, mal and random are "
                                                                 "built in; any other name needs path.")
    path: str | None = Input(None, description="One target per line (replaces the built-in list of that name).")
    limit: int | None = Result(None, gt=0, description="Search at most this many targets (a seeded sample).")
    searches: list[Search] | None = Result(
        None, min_length=1, description="Hit types searched on this list; default: the paper's "
                                                           "(normal, planted: o-greedy; normal-sample: o-sample-min), "
                                                           "else the run's `searches`.")


class EgregiousConfig(RunConfig, TriggerSearchSettings, ActorPoolSize):
    """`redline run egregious`: gibbs-enum trigger search over target lists, hit rates by hit type (the
    search's settings are TriggerSearchSettings' fields, set at the top level)."""

    models: list[EgregiousModelConfig] = Field(min_length=1)
    lists: list[TargetListConfig] = Field(default_factory=lambda: [TargetListConfig(name=n) for n in ("normal", "mal", "random")], min_length=1)
    normal_inputs: PairCorpusConfig | None = Field(None, description="Test pairs whose inputs give the normal list "
                                                                     "(LSTM models; HF models need a normal list file).")
    searches: list[Search] = Result(
        ["o-greedy", "o-sample-avg", "o-sample-min", "io-sample-avg", "io-sample-min"], min_length=1,
        description="Hit types to search for (each reports k = 1 and 2); io needs an LM.")
    num_cpus: float = Execution(1.0, gt=0)
    num_gpus: float = Execution(0.0, ge=0)
    batch_size: int = Execution(64, gt=0, description="Targets per actor call (searched together in one batch).")
    shard_size: int = Result(256, gt=0)

    @model_validator(mode="after")
    def _unique(self) -> EgregiousConfig:
        unique_names(self.models, "model")
        unique_names(self.lists, "target list")
        for t in self.lists:
            if t.path is None and t.name not in BUILT_IN:
                raise ValueError(f"target list '{t.name}' is not built in ({', '.join(BUILT_IN)}): give its path")
        return self


INPUT_SCHEMA = pa.schema([("id", pa.string()), ("model", pa.string()), ("list", pa.string()), ("target", pa.string()),
                          ("search", pa.string()), ("source", pa.string()), ("sources", pa.list_(pa.string()))])


def search_settings(config: EgregiousConfig) -> TriggerSearchSettings:
    """The run's search settings as its workers receive them: the config's own (it extends the one
    settings type), already validated."""
    return TriggerSearchSettings.model_construct(**{name: getattr(config, name)
                                                    for name in TriggerSearchSettings.model_fields})


def list_searches(config: EgregiousConfig, spec: TargetListConfig) -> list[str]:
    return spec.searches or LIST_SEARCHES.get(spec.name if spec.path is None else "", config.searches)


def resolved_thresholds(model: EgregiousModelConfig) -> H.Thresholds:
    """T_out / T_in: the config's, else stored with the LSTM models, else estimated on threshold_pairs."""
    from redline.actors.triggers import models as M

    t_out, t_in = model.t_out, model.t_in
    if M.is_trigger_model(model.path):
        trained = M.load(model.path)
        if t_out is None and trained.thresholds:
            t_out = trained.thresholds.average_logprob
        if model.lm and t_in is None:
            lm = M.load(model.lm)
            if lm.vocab.words != trained.vocab.words:
                raise RedlineError(f"model '{model.name}': the LM {model.lm} has another vocabulary than {model.path} "
                                   "(train both on the same pairs with the same vocab_size)")
            t_in = lm.thresholds.average_logprob if lm.thresholds else None
    elif model.threshold_pairs is not None and (t_out is None or t_in is None):
        from redline.actors.triggers.pairs import read_pairs
        from redline.actors.triggers.scorers import HFTarget
        from redline.actors.triggers.thresholds import estimate

        est_out, est_in = estimate(HFTarget(model.path), read_pairs(model.threshold_pairs))
        t_out = est_out if t_out is None else t_out
        t_in = est_in if t_in is None else t_in
    if t_out is None:
        raise RedlineError(f"model '{model.name}': no T_out — give t_out, or threshold_pairs to estimate it")
    return H.Thresholds(t_out, t_in)


def target_lists(config: EgregiousConfig, model: EgregiousModelConfig
                 ) -> tuple[dict[str, list[Any]], dict[str, str], dict[str, dict[str, int]]]:
    """Each list's targets (text and source input) for this model, why a list was left out, and for
    the lists decoded from inputs the replies that named no target, by why."""
    from collections import Counter

    from redline.actors.triggers import models as M
    from redline.actors.triggers import targets as T

    lists: dict[str, list[Any]] = {}
    skipped: dict[str, str] = {}
    dropped: dict[str, dict[str, int]] = {}
    lstm = M.is_trigger_model(model.path)
    for spec in config.lists:
        if spec.path is not None:
            items = [T.Target(t) for t in T.read_list(spec.path)]
        elif spec.name == "mal":
            items = [T.Target(t) for t in T.mal_list(seed=config.seed)]
        elif spec.name == "random":
            words = M.load(model.path).vocab.words if lstm else _frequent_tokens(model.path)
            items = [T.Target(t) for t in T.random_list(words, seed=config.seed)]
        elif not lstm:
            skipped[spec.name] = f"built-in {spec.name} list needs an LSTM model: give a list file for HF models"
            continue
        elif config.normal_inputs is None:
            skipped[spec.name] = f"set normal_inputs (test pairs) to build the {spec.name} list"
            continue
        else:
            from redline.actors.triggers.pairs import read_pairs

            inputs = [a for a, _ in read_pairs(config.normal_inputs, config.seed)]
            trained = M.load(model.path)
            why: Counter[str] = Counter()
            if spec.name == "normal":
                items = T.normal_list(trained, inputs, dropped=why)
            elif spec.name == "normal-sample":
                items = T.normal_sample_list(trained, inputs, seed=config.seed, dropped=why)
            else:
                items = T.planted_list(trained, inputs, config.trigger_length, seed=config.seed, dropped=why)
            dropped[spec.name] = dict(why)
        if spec.limit is not None and len(items) > spec.limit:
            items = random.Random(config.seed).sample(items, spec.limit)
        if not items:
            skipped[spec.name] = "empty list"
            continue
        lists[spec.name] = items
    return lists, skipped, dropped


def _frequent_tokens(path: str) -> list[str]:
    """Whole-word tokens of an HF tokenizer in id order (BPE merges come roughly by frequency)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(local_path(path))
    words = [tok.decode([i]).strip() for i in range(len(tok))]
    return ["<pad>", "<unk>", "<s>", "</s>", *dict.fromkeys(w for w in words if w.isalpha() and len(w) > 1)]


def preflight(config: EgregiousConfig) -> None:
    from redline.actors.triggers import models as M

    for m in config.models:
        local = m.path.startswith(("/", ".", "~")) or "/" not in m.path
        if not M.is_trigger_model(m.path) and not Path(m.path).expanduser().exists() and local:
            raise RedlineError(f"model '{m.name}': no model directory {m.path} (nor a hub id)")
        if m.lm is not None and not M.is_trigger_model(m.lm):
            raise RedlineError(f"model '{m.name}': lm {m.lm} is not an LSTM LM directory (train one with `redline train lm`)")
        used = {s for spec in config.lists for s in list_searches(config, spec)}
        if any(H.uses_lm(s) for s in used) and m.lm is None and M.is_trigger_model(m.path):
            raise RedlineError(f"model '{m.name}': the io searches need `lm:` (an LSTM LM trained on the same pairs), "
                               "or drop io-sample-* from searches")
        for t in config.lists:
            if t.path is not None and not t.path.startswith("s3://") and not Path(t.path).is_file():
                raise RedlineError(f"target list '{t.name}': no file {t.path}")


def model_targets(config: EgregiousConfig, model: EgregiousModelConfig
                  ) -> tuple[H.Thresholds, dict[str, list[Any]], dict[str, str], dict[str, dict[str, int]]]:
    """One model's thresholds and target lists: a Ray task, so decoding the test inputs (the normal
    lists) runs on the cluster with the search's resources, never on the driver."""
    return resolved_thresholds(model), *target_lists(config, model)


def build_inputs(config: EgregiousConfig) -> pa.Table:
    """Every (model, list, target, search) row, built in a task on a worker: each model's target lists
    come from a task of its own (`model_targets`; one model on CPUs: in this task); what each model's lists and thresholds were rides in
    the table's metadata (`models`), which `input_counts` hands to the driver."""
    import ray

    from redline.cluster.runtime import check_placeable

    rows: dict[str, list[str]] = {f.name: [] for f in INPUT_SCHEMA}
    per_model: dict[str, Any] = {}
    if len(config.models) == 1 and not config.num_gpus:
        # one model: built here, in this task on a worker (a task of its own cost a process and its imports)
        built = [model_targets(config, config.models[0])]
    else:
        check_placeable("the task building target lists", config.num_cpus, config.num_gpus)
        task = ray.remote(num_cpus=config.num_cpus, num_gpus=config.num_gpus or 0, max_retries=1)(model_targets)
        built = ray.get([task.remote(config, model) for model in config.models])
    for model, (thresholds, lists, skipped, dropped) in zip(config.models, built):
        per_model[model.name] = {"t_out": thresholds.t_out, "t_in": thresholds.t_in, "lists": {k: len(v) for k, v in lists.items()},
                                 "lists_skipped": skipped, "replies_dropped": dropped}
        specs = {spec.name: spec for spec in config.lists}
        for name, items in lists.items():
            for target in items:
                for search in list_searches(config, specs[name]):
                    key = f"{model.name}\x00{name}\x00{target.text}\x00{search}"
                    rows["id"].append(hashlib.sha256(key.encode()).hexdigest()[:16])
                    rows["model"].append(model.name)
                    rows["list"].append(name)
                    rows["target"].append(target.text)
                    rows["search"].append(search)
                    rows["source"].append(target.source)
                    rows["sources"].append(list(target.sources) or None)
    return pa.table(rows, schema=INPUT_SCHEMA.with_metadata({"models": json.dumps(per_model)}))


def input_counts(table: pa.Table) -> dict[str, Any]:
    """The input table's counts, and each model's lists and thresholds (`build_inputs`' metadata)."""
    models = json.loads((table.schema.metadata or {}).get(b"models", b"{}"))
    return {"rows_in": table.num_rows, "targets": len(set(table.column("target").to_pylist())), "models": models}


def assemble(shard: pa.Table, results: pa.Table) -> pa.Table:
    idx = pc.index_in(shard.column("id"), value_set=results.column("id"))
    taken = results.take(idx)
    table = shard
    for f in RESULT_SCHEMA:
        if f.name not in ("id", "shard"):
            table = table.append_column(f, taken.column(f.name))
    missing = pc.is_null(idx)
    table = table.set_column(table.schema.get_field_index("status"), "status",
                             pc.if_else(missing, "error", table.column("status")))
    return table.set_column(table.schema.get_field_index("reason"), "reason",
                            pc.if_else(missing, "no result returned for this target", table.column("reason")))


def examples(run: RunDir, per_list: int = 3) -> list[dict[str, Any]]:
    """Table 4 shape: reached hits, the highest-objective ones first, a few distinct targets per
    model and list: read shard by shard (only reached rows and the columns shown), keeping each
    model and list's best so far."""
    best: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for part in storage.list_files(run.path(OUTPUT_DIR), ".parquet"):
        reached = storage.read_parquet(part, EXAMPLE_COLUMNS, [("status", "=", "ok"), ("reached", "=", True)])
        for r in reached.to_pylist():
            mine = sorted([*best.get((r["model"], r["list"]), []), r], key=lambda x: -x["avg_logprob"])
            first = {x["target"]: x for x in reversed(mine)}  # each target's best
            best[(r["model"], r["list"])] = sorted(first.values(), key=lambda x: -x["avg_logprob"])[:per_list]
    return [r for rows in best.values() for r in rows]


def _every_row(shard: pa.Table) -> pa.Table:
    return shard


EXAMPLE_COLUMNS = ["model", "list", "search", "trigger", "target", "avg_logprob", "lm_average"]
FIGURES = {"summary": EGREGIOUS, "sources": EGREGIOUS_SOURCES, "effort": EGREGIOUS_EFFORT, "outcomes": outcomes()}


def execute(config: EgregiousConfig, run: Run, watch: Stopwatch, verbose: bool) -> list[dict[str, Any]]:
    manifest = run.manifest
    # built in a task on a worker, each model's lists in a task of its own (build_inputs); written before: kept
    shard_rows = sharded.prepare_inputs(run, lambda: build_inputs(config), config.shard_size, input_counts)
    if "models" in manifest.get("counts", {}):
        manifest["models"] = manifest["counts"].pop("models")
    watch.lap("targets_s")
    thresholds = {name: [m["t_out"], m["t_in"]] for name, m in manifest["models"].items()}
    kwargs = {"models": config.models, "search": search_settings(config),
              "thresholds": thresholds, "num_gpus": config.num_gpus}
    step = Step("triggers", TriggerWorker, kwargs, config, "searching triggers", config.num_cpus, config.num_gpus,
                config.batch_size, figures=FIGURES, select=_every_row, assemble=assemble,
                what="each trigger-search actor")
    manifest["resumed_shards"] = len(runner.done_parts(run, OUTPUT_DIR, 0).intersection(range(len(shard_rows))))

    def hits_so_far(run: Run) -> str:
        partials = sharded.run_partials(run, {"effort": EGREGIOUS_EFFORT}, OUTPUT_DIR, {})
        effort = EGREGIOUS_EFFORT.rows(partials["effort"])
        searched = sum(r["targets"] for r in effort)
        reached = round(sum(r["targets"] * (r["reached"] or 0) for r in effort))
        return f"triggers found {reached:,}/{searched:,}"

    run_beside(run, [step], OUTPUT_DIR, shard_rows=shard_rows, label=step.label, verbose=verbose, unit="searches",
               note=hits_so_far)
    search_s = watch.lap("search_s")
    parts = {(i, 0): shard_host.output_part(i, 0) for i in range(len(shard_rows))}
    tables = sharded.shard_summary(run, FIGURES, OUTPUT_DIR, parts)
    outcomes = sorted(tables["outcomes"], key=lambda r: r["status"])
    manifest["counts"].update(rows_out=sum(r["rows"] for r in outcomes),
                              by_status={r["status"]: r["rows"] for r in outcomes},
                              not_searched={k: n for r in outcomes if r["status"] == "skipped"
                                            for k, n in r["reasons"].items()})
    manifest["search_s"] = round(search_s, 2)
    manifest["source_checks"] = tables["sources"]
    manifest["effort"] = tables["effort"]
    return tables["summary"]


def dropped_note(models: dict[str, Any]) -> str:
    """The replies that named no target, per model and list decoded from inputs (a list built from a
    model's replies is only as representative as the replies it kept)."""
    parts = []
    for name, m in models.items():
        for lst, why in (m.get("replies_dropped") or {}).items():
            total = sum(why.values())
            kept = (m.get("lists") or {}).get(lst, 0)
            parts.append(f"{name} {lst}: {kept} targets kept, {total} replies left out"
                         + (" (" + "; ".join(f"{n} {w}" for w, n in sorted(why.items(), key=lambda x: -x[1])) + ")"
                            if total else ""))
    return ("Replies left out of the lists decoded from inputs: " + "; ".join(parts) + ".") if parts else ""


def write_report(run: RunDir, manifest: dict[str, Any]) -> None:
    summary = manifest.get("summary", [])
    ex = examples(run)
    models = manifest.get("models", {})
    note = ("Hit rate = share of the list's searchable targets for which gibbs-enum found a trigger reaching that hit "
            "type (searched once per hit family; k = 1 and 2 from the same search). Thresholds: "
            + "; ".join(f"{n}: T_out {m['t_out']:.3f}" + (f", T_in {m['t_in']:.3f}" if m.get("t_in") is not None else "")
                        for n, m in models.items())
            + ". Lists left out: " + (", ".join(f"{k} ({v})" for m in models.values() for k, v in m["lists_skipped"].items()) or "none")
            + ". " + dropped_note(models))
    report = Report(run, "redline egregious-output report (gibbs-enum)", manifest, note)
    report.table("Hit rates (Table 3)", summary, EGREGIOUS.columns())
    report.plot("hit_rates", grouped_bars([{**r, "name": f"{r['model']} / {r['list']}"} for r in summary], "name",
                                          [(h, h) for h in ("o-greedy-hit", "o-sample-min-1-hit", "o-sample-avg-1-hit",
                                                            "io-sample-min-1-hit", "io-sample-avg-1-hit")],
                                          "hit rate per list"))
    report.table("Targets with a known trigger (planted; normal from inputs of the trigger length)",
                 manifest.get("source_checks", []), EGREGIOUS_SOURCES.columns())
    report.table("Example triggers (Table 4)", ex, [("model", "model", "s"), ("list", "list", "s"), ("search", "search", "s"),
                                                    ("trigger", "trigger", "s"), ("target", "target", "s"),
                                                    ("avg_logprob", "avg log P", ".2f"), ("lm_average", "LM avg", ".2f")])
    report.table("Search effort per hit family", manifest.get("effort", []), EGREGIOUS_EFFORT.columns())
    reasons = manifest.get("counts", {}).get("not_searched", {})
    if reasons:
        report.table("Targets not searched", [{"reason": k, "n": v} for k, v in reasons.items()],
                     [("reason", "reason", "s"), ("n", "rows", "d")])
    report.write("table3.csv", summary)


PIPELINE = Pipeline("egregious", EgregiousConfig, execute, write_report,
                    "hit rates by list and hit type (He & Glass Table 3)", lambda manifest: EGREGIOUS.columns(),
                    preflight=preflight)


def run_egregious(config: EgregiousConfig, *, force: bool = False, verbose: bool = False) -> RunResult:
    return PIPELINE.run(config, force=force, verbose=verbose)
