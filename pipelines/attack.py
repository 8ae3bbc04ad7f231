"""`redline run attack`: TAE/BAE attack recipes on seed corpora, sharded across attacker actors.

Seeds are the corpus rows whose label the goal attacks (toxic for TAE, benign for BAE), crossed
with every recipe; each (seed, recipe, goal) attempt is one output row, with its provenance, the
perturbed text, the victim's scores before and after, queries, words changed, similarity and a
status (success / failed / skipped / error) with its reason.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from redline.actors.attack.goals import GOALS
from redline.actors.attack.recipes import recipe
from redline.actors.registry import detector_class
from redline.cluster import storage
from redline.cluster.config import AttackConfig
from redline.errors import RedlineError
from redline.pipelines import sharded
from redline.pipelines.corpora import read_corpora
from redline.pipelines.schema import ATTACK_RESULT_SCHEMA, ATTACK_SCHEMA, STATUS_OK, conform

log = logging.getLogger(__name__)

OUTPUT_DIR = "attempts"


def preflight(config: AttackConfig) -> None:
    """Everything a recipe needs, checked on the driver before any actor starts."""
    from redline.actors.attack import resources as R

    detector_class(config.victim.kind).preflight(config.victim)
    res = config.resources
    for opts in config.recipes:
        r = recipe(opts.name)
        kinds = {k for k, _ in r.transformation} | {k for k, _ in r.post}
        if opts.pos_match:
            kinds.add("pos-match")
        if "wordnet" in kinds:
            R.refresh_wordnet_tables()  # built or verified here once; actors get them from the object store
        if "pos-match" in kinds and opts.pos_match is not False:
            R.pos_tagger()
        if r.search[1].get("method") == "gradient" and config.victim.kind != "hf":
            raise RedlineError(f"recipe {r.name} ranks words by gradient: it needs a white-box `hf` victim, "
                               f"not '{config.victim.kind}'")
        if "mlm" in kinds:
            _check_model(res.mlm_model, f"recipe {r.name} needs a fill-mask model: set resources.mlm_model")
        if "sentence-similarity" in kinds:
            _check_model(res.sentence_encoder or R.default_sentence_encoder(),
                         f"recipe {r.name} needs a sentence encoder: set resources.sentence_encoder")


def _shared_wordnet(config: AttackConfig) -> Any:
    """The driver's WordNet tables in Ray's object store when a recipe uses WordNet (actors on any
    node read them from there), else None."""
    from redline.actors.attack import resources as R

    if not any("wordnet" in {k for k, _ in recipe(o.name).transformation} for o in config.recipes):
        return None
    import ray

    from redline.cluster.runtime import ensure_ray

    ensure_ray()
    return ray.put(R.wordnet_tables())


def _check_model(name: str, hint: str) -> None:
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise RedlineError(f"{hint} (cannot load '{name}': {first})") from None


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


def summarize(attempts: pa.Table, wall_s: float | None) -> list[dict[str, Any]]:
    """Per recipe, goal and victim: counts, ASR = successes / (successes + failures), mean queries,
    mean % words perturbed and similarity of successes."""
    df = attempts.to_pandas()
    out = []
    for (rec, goal, victim), g in df.groupby(["recipe", "goal", "victim"], sort=False):
        succ = g[g.status == "success"]
        tried = g[g.status.isin(["success", "failed"])]
        out.append({
            "recipe": rec, "goal": goal, "victim": victim, "attempts": len(g), "success": len(succ),
            "failed": int((g.status == "failed").sum()), "skipped": int((g.status == "skipped").sum()),
            "error": int((g.status == "error").sum()),
            "asr": len(succ) / len(tried) if len(tried) else None,
            "mean_queries": float(tried.queries.mean()) if len(tried) else None,
            "mean_pct_perturbed": float(succ.perturbed_pct.mean()) if len(succ) else None,
            "mean_similarity": float(succ.similarity.mean()) if len(succ) and succ.similarity.notna().any() else None,
            "mean_seconds": float(g.seconds.mean()) if g.seconds.notna().any() else None,
        })
    return out


def run_attack(config: AttackConfig, *, force: bool = False, verbose: bool = False) -> sharded.RunResult:
    from redline.actors.attack.attacker import AttackWorker
    from redline.pipelines import report
    from redline.pipelines.actor_pool import ActorPool

    preflight(config)
    run = sharded.open_run("attack", config, config.output, config.run_name, force)
    if run.reused:
        return sharded.RunResult(run.uri, run.manifest, run.manifest.get("summary", []), reused=True)
    watch = storage.Stopwatch()
    manifest = run.manifest
    with sharded.lifecycle(run):
        shards = sharded.prepare_inputs(run, lambda: build_attempts(config), config.shard_size, attempt_counts)
        watch.lap("build_attempts_s")
        pending = sharded.pending_shards(run, OUTPUT_DIR, len(shards))
        worker_kwargs = {"victim": config.victim.model_dump(mode="json"),
                         "recipes": [r.model_dump(mode="json") for r in config.recipes],
                         "resources": config.resources.model_dump(mode="json"), "only_correct": config.only_correct,
                         "similarity": config.similarity, "wordnet": _shared_wordnet(config) if pending else None}
        with ActorPool(AttackWorker, worker_kwargs, config.actors if pending else 0, num_cpus=config.num_cpus,
                       num_gpus=config.num_gpus, batch_size=config.batch_size) as pool:
            sharded.stream_shards(
                run, shards, pending, output_dir=OUTPUT_DIR,
                select=lambda shard: shard.select(["id", "seed_text", "recipe", "goal"]).rename_columns(
                    ["attempt_id", "text", "recipe", "goal"]),
                results_per_row=1, process=pool.map_unordered,
                assemble=lambda shard, results: assemble(shard, results, config.victim.name),
                empty_results=ATTACK_RESULT_SCHEMA, key=["attempt_id"], batch_size=config.batch_size,
                actors=config.actors, label=f"attacking {config.victim.name}", verbose=verbose,
            )
        attack_s = watch.lap("attack_s")
        attempts = sharded.read_outputs(run, OUTPUT_DIR)
        statuses = attempts.column("status").to_pylist()
        manifest["counts"].update(attempts_out=attempts.num_rows,
                                  by_status={s: statuses.count(s) for s in sorted(set(statuses))})
        summary = summarize(attempts, attack_s)
        manifest["summary"] = summary
        manifest["attempts_per_s"] = round(attempts.num_rows / attack_s, 2) if attack_s and pending else None
        report.write_attack_report(run.dir, attempts, summary, manifest)
        watch.lap("report_s")
        manifest["timings"] = {**manifest.get("timings", {}), **watch.timings}
        sharded.complete(run)
    return sharded.RunResult(run.uri, manifest, summary)


def recipe_table() -> list[dict[str, str]]:
    from redline.actors.attack.recipes import RECIPES

    return [{"name": r.name, "family": r.family, **r.describe(), "needs": ", ".join(r.needs) or "–"}
            for r in RECIPES.values()]


