"""`redline run attack`: TAE/BAE attack recipes on seed corpora, sharded across attacker actors.

Seeds are the corpus rows whose label the goal attacks (toxic for TAE, benign for BAE), crossed
with every recipe; each (seed, recipe, goal) attempt is one output row, with its provenance, the
perturbed text, the victim's scores before and after, queries, words changed, similarity and a
status (success / failed / skipped / error) with its reason.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from functools import partial
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, field_validator

from redline.actors.attack.attacker import ATTACK_RESULT_SCHEMA, AttackWorker
from redline.actors.attack.goals import GOALS
from redline.actors.attack.recipes import AttackResources, RecipeOptions
from redline.actors.attack.recipes import preflight as recipe_preflight
from redline.actors.attack.recipes import uses_gpu as recipe_uses_gpu
from redline.actors.detectors import DetectorConfig, detector_class, preflight_detector
from redline.cluster import storage
from redline.cluster.config import ActorPoolSize, Execution, Result, RunConfig
from redline.cluster.runs import Run, RunDir, RunResult, Stopwatch
from redline.cluster.tables import STATUS_OK, conform
from redline.errors import RedlineError
from redline.pipelines.plane import runner, shard_host, sharded
from redline.pipelines.plane.corpora import CorpusConfig, guess_rows, read_corpora
from redline.pipelines.plane.schema import ATTACK_SCHEMA
from redline.pipelines.plane.steps import Step, run_beside
from redline.pipelines.reporting.figures import ATTACK
from redline.pipelines.reporting.report import COUNT_COLUMNS, Report, png_bytes
from redline.pipelines.run_skeleton import Pipeline

log = logging.getLogger(__name__)

OUTPUT_DIR = "attempts"


class AttackConfig(RunConfig, ActorPoolSize):
    """`redline run attack`: perturb seeds with attack recipes until the victim flips its decision."""

    corpus: CorpusConfig | list[CorpusConfig]
    victim: DetectorConfig = Field(description="The detector under attack (any detector kind).")
    recipes: list[RecipeOptions] = Field(min_length=1, description="Recipe names, {name: ..., query_budget: ...} "
                                                                   "overrides, or recipes declared from components.")
    goals: list[Literal["tae", "bae"]] = Result(["tae"], min_length=1,
                                               description="tae: toxic seeds -> benign; bae: benign seeds -> toxic.")
    only_correct: bool = Result(True, description="Skip seeds the victim already gets wrong (TextAttack's `skipped`).")
    max_seeds: int | None = Result(None, gt=0, description="At most this many seeds per goal (a seeded sample).")
    similarity: Literal["auto", "always", "never"] = Result(
        "auto", description="Sentence-encoder similarity of seed and result: auto = for recipes with a "
                            "similarity constraint (their encoder is loaded anyway); always costs a model pass.")
    seed: int = Result(0)
    resources: AttackResources = Field(default_factory=AttackResources,
                                       description="Models and files recipes use (see README).")
    num_cpus: float = Execution(1.0, ge=0)
    num_gpus: float = Execution(0.0, ge=0)
    batch_size: int = Execution(64, gt=0, description="Attempts each actor runs at once (their queries are batched).")
    shard_size: int = Result(500, gt=0, description="Attempts per output shard (the unit of resume).")

    @field_validator("recipes", mode="before")
    @classmethod
    def _recipes(cls, value: Any) -> Any:
        items = [{"name": v} if isinstance(v, str) else v for v in (value or [])]
        names = [i.get("name") if isinstance(i, dict) else i for i in items]
        if len(set(map(str, names))) != len(names):
            raise ValueError("each recipe may be listed once")
        return items

    @property
    def corpora(self) -> list[CorpusConfig]:
        return self.corpus if isinstance(self.corpus, list) else [self.corpus]


def preflight(config: AttackConfig) -> None:
    """Everything the victim and each recipe need, checked on the driver before any actor starts."""
    if config.victim.num_gpus > 0:
        raise RedlineError("victim.num_gpus has no effect: the victim runs in the attack actor, on its GPU; "
                           "set num_gpus on the attack instead")
    preflight_detector(config.victim, gpus_from="the attack's num_gpus")
    for opts in config.recipes:
        recipe_preflight(opts, config.resources, white_box_victim=detector_class(config.victim.kind).has_gradients)
    if config.num_gpus > 0 and not (detector_class(config.victim.kind).uses_gpu
                                    or config.similarity == "always" or any(recipe_uses_gpu(o) for o in config.recipes)):
        raise RedlineError(f"num_gpus {config.num_gpus:g} reserves a GPU that nothing would use: the victim "
                           f"({config.victim.kind}) and the recipes ({', '.join(o.name for o in config.recipes)}) "
                           "run no model on it; remove num_gpus")


def _shared_wordnet(config: AttackConfig) -> Any:
    """The driver's WordNet tables in Ray's object store when a recipe uses WordNet (actors on any
    node read them from there), else None."""
    from redline.actors.attack import resources as R
    from redline.actors.attack.recipes import post_specs

    kinds = {k for o in config.recipes for k, _ in (*o.recipe().transformation, *post_specs(o.recipe(), o))}
    if not kinds & {"wordnet", "not-antonym"}:
        return None
    import ray

    from redline.cluster.runtime import ensure_ray

    ensure_ray()
    return ray.put(R.wordnet_tables())


def build_attempts(config: AttackConfig) -> pa.Table:
    """Seeds for each goal crossed with every recipe, seed-major so one actor batch holds the same
    seed under several recipes (they share victim queries through the cache)."""
    corpus = read_corpora(config.corpora)
    ok = corpus.filter(pc.equal(corpus.column("status"), STATUS_OK))
    rows: dict[str, list[Any]] = defaultdict(list)
    for goal_name in config.goals:
        g = GOALS[goal_name]
        seeds = ok.filter(pc.equal(ok.column("label"), g.seed_label))
        if seeds.num_rows == 0:
            kind = "toxic" if g.seed_label == 1 else "benign"
            raise RedlineError(f"no {kind} seeds for goal {goal_name} after filtering "
                               f"({corpus.num_rows} rows read, {ok.num_rows} usable)")
        if config.max_seeds and seeds.num_rows > config.max_seeds:
            keep = np.sort(np.random.default_rng(config.seed).choice(seeds.num_rows, config.max_seeds, replace=False))
            seeds = seeds.take(pa.array(keep))
        for seed in seeds.to_pylist():
            for opts in config.recipes:
                rows["id"].append(f"{seed['id']}|{opts.name}|{goal_name}")
                rows["seed_id"].append(seed["id"])
                rows["seed_text"].append(seed["text"])
                rows["seed_label"].append(seed["label"])
                rows["seed_label_name"].append(seed["label_name"])
                for col in ("dataset", "split", "source", "source_row"):
                    rows[col].append(seed[col])
                rows["recipe"].append(opts.name)
                rows["goal"].append(goal_name)
    table = pa.table({k: v for k, v in rows.items()})
    return conform(table, ATTACK_SCHEMA).set_column(ATTACK_SCHEMA.get_field_index("status"), "status",
                                                    pa.array(["pending"] * table.num_rows, pa.string()))


def attempt_counts(attempts: pa.Table) -> dict[str, Any]:
    return {"attempts_in": attempts.num_rows, "seeds": len(set(attempts.column("seed_id").to_pylist())),
            "per_goal": {g: int(pc.sum(pc.equal(attempts.column("goal"), g)).as_py() or 0)
                         for g in set(attempts.column("goal").to_pylist())}}


def attempts_of(shard: pa.Table) -> pa.Table:
    """An input shard's attempts as the attack worker takes them."""
    return shard.select(["id", "seed_text", "recipe", "goal"]).rename_columns(["attempt_id", "text", "recipe", "goal"])


def assemble(shard: pa.Table, results: pa.Table, victim: str) -> pa.Table:
    idx = pc.index_in(shard.column("id"), value_set=results.column("attempt_id"))
    taken = results.take(idx)
    table = shard
    for f in ATTACK_RESULT_SCHEMA:
        if f.name in ATTACK_SCHEMA.names and f.name not in ("status", "reason"):
            # coalesce: an attempt without a result keeps what the shard already knows (recipe, goal)
            merged = pc.coalesce(taken.column(f.name), table.column(f.name).cast(f.type))
            table = table.set_column(table.schema.get_field_index(f.name), f.name, merged)
    missing = pc.is_null(idx)
    status = pc.if_else(missing, "error", taken.column("attack_status"))
    reason = pc.if_else(missing, "no result returned for this attempt", taken.column("attack_reason"))
    table = table.set_column(table.schema.get_field_index("status"), "status", status)
    table = table.set_column(table.schema.get_field_index("reason"), "reason", reason)
    table = table.set_column(table.schema.get_field_index("victim"), "victim",
                             pa.array([victim] * table.num_rows, pa.string()))
    return conform(table, ATTACK_SCHEMA)


def execute(config: AttackConfig, run: Run, watch: Stopwatch, verbose: bool) -> list[dict[str, Any]]:
    manifest = run.manifest
    figures = {"summary": ATTACK}

    def worker_kwargs() -> dict[str, Any]:
        return {"victim": config.victim, "recipes": config.recipes, "resources": config.resources,
                "only_correct": config.only_correct, "similarity": config.similarity, "num_gpus": config.num_gpus,
                "wordnet": _shared_wordnet(config)}

    shard_rows = sharded.inputs_written(run)  # a resume: every shard of attempts is written already
    before = runner.done_parts(run, OUTPUT_DIR, 0)
    pending = None if shard_rows is None else [i for i in range(len(shard_rows)) if i not in before]
    label = f"attacking {config.victim.name}"
    step = Step("attack", AttackWorker, worker_kwargs() if pending is None or pending else {}, config, label,
                config.num_cpus, config.num_gpus, config.batch_size, figures=figures, select=attempts_of,
                assemble=partial(assemble, victim=config.victim.name))
    # the attempts are built by the same plan (each shard attacked as it is written), unless written before
    busy = run_beside(run, [step], OUTPUT_DIR, shard_rows=shard_rows, label=label, verbose=verbose, unit="attempts",
                      inputs=None if shard_rows is not None else sharded.Inputs(
                          (sharded.Source(partial(build_attempts, config), about=_about_attempts(config)),),
                          config.shard_size, attempt_counts))[0]
    shard_rows = manifest["input_rows"]
    manifest["resumed_shards"] = len(before.intersection(range(len(shard_rows))))
    manifest["busy_seconds"] = round(manifest.get("busy_seconds", 0.0) + busy.seconds, 3)
    attack_s = watch.lap("attack_s")
    parts = {(i, 0): shard_host.output_part(i, 0) for i in range(len(shard_rows))}
    summary = sharded.shard_summary(run, figures, OUTPUT_DIR, parts)["summary"]
    sharded.index_output(run, OUTPUT_DIR)
    attempts = sum(row["attempts"] for row in summary)
    by_status = {s: sum(row[s] for row in summary) for s in ("error", "failed", "skipped", "success")}
    manifest["counts"].update(attempts_out=attempts, by_status={s: n for s, n in by_status.items() if n})
    manifest["attempts_per_s"] = round(attempts / attack_s, 2) if attack_s and pending != [] else None
    return summary


def _about_attempts(config: AttackConfig) -> int | None:
    """About how many attempts the seeds make (a row is a seed of at most one goal; a seed limit caps
    each goal's), crossed with the recipes; None when neither the corpus size nor a limit tells."""
    bounds = [n for n in (guess_rows(config.corpora), config.max_seeds and config.max_seeds * len(config.goals)) if n]
    return min(bounds) * len(config.recipes) if bounds else None


# --------------------------------------------------------------------------------------------
# Report


def plot_asr(summary: list[dict[str, Any]]) -> bytes | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [s for s in summary if s.get("asr") is not None]
    if not rows:
        return None
    labels = [f"{s['recipe']} ({s['goal']})" for s in rows]
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(rows) + 1.5))
    ax.barh(labels, [s["asr"] for s in rows], color=["#c0392b" if s["goal"] == "tae" else "#2874a6" for s in rows])
    ax.set(xlim=(0, 1), xlabel="attack success rate", title="ASR per recipe (red: TAE, blue: BAE)")
    ax.invert_yaxis()
    data = png_bytes(fig)
    plt.close(fig)
    return data


SAMPLE_COLUMNS = ["recipe", "goal", "seed_text", "perturbed_text", "score_before", "score_after"]


def sample_successes(run: RunDir, summary: list[dict[str, Any]], per_recipe: int = 3) -> list[dict[str, Any]]:
    """The first successes of each recipe, read shard by shard (only those rows and columns) until
    every recipe with successes has its share: never the whole output."""
    wanted = {r["recipe"] for r in summary if r.get("success")}
    found: dict[str, list[dict[str, Any]]] = {}
    for part in storage.list_files(run.path(OUTPUT_DIR), ".parquet"):
        if all(len(found.get(rec, [])) >= per_recipe for rec in wanted):
            break
        for r in storage.read_parquet(part, SAMPLE_COLUMNS, [("status", "=", "success")]).to_pylist():
            mine = found.setdefault(r["recipe"], [])
            if len(mine) < per_recipe:
                mine.append({"recipe": r["recipe"], "goal": r["goal"], "seed": r["seed_text"][:200],
                             "perturbed": (r["perturbed_text"] or "")[:200],
                             "before": r["score_before"], "after": r["score_after"]})
    return [row for rows in found.values() for row in rows]


def write_report(run: RunDir, manifest: dict[str, Any]) -> None:
    summary = manifest.get("summary", [])
    counts = manifest.get("counts", {})
    count_rows = [{"what": "attempts (seeds x recipes x goals)", "n": str(counts.get("attempts_in"))},
                  {"what": "distinct seeds", "n": str(counts.get("seeds"))}]
    count_rows += [{"what": f"  status {k}", "n": str(v)} for k, v in counts.get("by_status", {}).items()]
    sample_cols = [("recipe", "recipe", "s"), ("goal", "goal", "s"), ("seed", "seed", "s"),
                   ("perturbed", "adversarial example", "s"), ("before", "toxic before", ".3f"),
                   ("after", "toxic after", ".3f")]
    rate = manifest.get("attempts_per_s")
    note = ("ASR = successes / (successes + failures); skipped seeds (already misclassified, or nothing to "
            "modify) are left out, as in TextAttack." + (f" Throughput: {rate:,.1f} attempts/s." if rate else ""))
    report = Report(run, "redline attack report", manifest, note)
    report.table("Recipes", summary, ATTACK.columns()).plot("asr", plot_asr(summary))
    report.table("Attempts", count_rows, COUNT_COLUMNS)
    report.table("Sample successes", sample_successes(run, summary), sample_cols)
    report.write("summary.csv", summary)


def summary_columns(manifest: dict[str, Any]) -> list[tuple[str, str, str]]:
    return ATTACK.columns(brief=True)


def notes(manifest: dict[str, Any]) -> list[str]:
    rate = manifest.get("attempts_per_s")
    return [f"{rate:,.1f} attempts/s"] if rate else []


PIPELINE = Pipeline("attack", AttackConfig, execute, write_report, "attacks", summary_columns, preflight=preflight,
                    notes=notes)


def run_attack(config: AttackConfig, *, force: bool = False, verbose: bool = False) -> RunResult:
    return PIPELINE.run(config, force=force, verbose=verbose)
