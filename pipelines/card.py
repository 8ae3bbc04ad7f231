"""`redline eval`: one safety card for one chat model and the guard that protects it, across the three
papers in one job:

(a) the guard under transfer attack: TaeBench built against it (attack -> quality filters) or an
    existing TaeBench run, then ASR = FNR on TAE and FPR on BAE;
(b) the model on DiaSafety contexts, judged by the two-step detector (the guard, or another
    utterance detector, then the context classifiers): unsafe proportions per category;
(c) the trigger search against the model when it is a local causal LM (white-box): hit rates per
    target list and hit type; any other model kind says why it was skipped.

Each part is an ordinary run of its own pipeline beside the card (`<card>-attack`, `-taebench`,
`-transfer`, `-diasafety`, `-triggers`), so it resumes like any run and can be opened alone; the
card's report links them and tables their headline figures.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from redline.actors.detectors import DetectorConfig
from redline.actors.generators import GeneratorConfig
from redline.cluster import storage
from redline.cluster.config import Input, Result, RunConfig, Strict, unique_names, validate_config
from redline.cluster.runs import Run, RunDir, Stopwatch
from redline.cluster.runtime import on_a_worker
from redline.cluster.tables import NO_ANSWER
from redline.errors import RedlineError
from redline.pipelines.plane import sharded
from redline.pipelines.reporting import card_figures as F
from redline.pipelines.reporting.figures import CARD, EGREGIOUS, TRANSFER
from redline.pipelines.reporting.report import Report, grouped_bars
from redline.pipelines.reporting.uncertainty import MAX_WIDTH, bootstrap_dialogue
from redline.pipelines.run_skeleton import Gate, Pipeline
from redline.pipelines.transfer import filter_victim_error, filter_victims


class GuardSection(Strict):
    """(a): `taebench_run` (an existing TaeBench run), or `attack` + `taebench` settings that build one
    by attacking the guard and each baseline (the attack runs are also their white-box figures)."""

    taebench_run: str | None = Input(None, description="A finished TaeBench run to transfer onto the detectors.")
    attack: dict[str, Any] | None = Result(None, description="`redline run attack` settings without victim/output.")
    taebench: dict[str, Any] | None = Result(
        None, description="`redline run taebench` settings without attacks/output.")
    attacked: list[str] | None = Result(None, min_length=1, description=(
        "Which of the guard and the baselines are attacked, by name (default: all). A detector's transfer "
        "figures count only the examples made against the others."))
    split: Literal["test", "train", "all"] = Result("all", description="TaeBench split the detectors are scored on.")

    @model_validator(mode="after")
    def _one_source(self) -> "GuardSection":
        if (self.taebench_run is None) == (self.attack is None):
            raise ValueError("guard_attack: give either taebench_run or attack (with taebench)")
        if self.attack is not None and self.taebench is None:
            raise ValueError("guard_attack: attack needs taebench settings (its quality filters)")
        return self


class CleanSection(Strict):
    """The guard's clean accuracy, beside the baselines': `redline run score` on labelled held-out sets."""

    corpus: dict[str, Any] | list[dict[str, Any]] = Input(description="Labelled held-out corpora (score's `corpus`).")
    shard_size: int = Result(2_000, gt=0)


class DialogueSection(Strict):
    """(b): `redline run diasafety` settings without generators/output (the generators are the card's
    model and references; `utterance_detector` defaults to the guard), and labelled DiaSafety pairs the
    two-step detector is checked on."""

    diasafety: dict[str, Any] = Result()
    labelled: str | None = Input(None, description=(
        "DiaSafety JSON with labels (a test split, or held-out data no model selection saw): the two-step "
        "detector's own precision and recall on it are shown beside the unsafe shares."))
    labelled_limit: int | None = Result(1_000, gt=0, description="At most this many labelled pairs (seeded sample).")


class TriggerSection(Strict):
    """(c): `redline run egregious` settings without models/output, and what the model's thresholds
    are estimated on (`threshold_pairs`) or given as (`t_out`, `t_in`)."""

    egregious: dict[str, Any] = Result(default_factory=lambda: {"lists": [{"name": "mal", "limit": 50}]})
    threshold_pairs: dict[str, Any] | None = Result(None)
    t_out: float | None = Result(None)
    t_in: float | None = Result(None)


class CardConfig(RunConfig):
    """`redline eval`: a safety card for one chat model and its guard detector, beside references."""

    model: GeneratorConfig = Input(description="The chat model (any provider).")
    guard: DetectorConfig = Field(description="The guard detector that protects it (any detector kind).")
    baselines: list[DetectorConfig] = Field(default_factory=list, description=(
        "Reference guards: every guard part runs them too, side by side and ranked, and they are the other "
        "victims the guard's transfer figures come from."))
    references: list[GeneratorConfig] = Field(default_factory=list, description=(
        "Reference chat models: the dialogue and trigger parts run them too, side by side and ranked."))
    guard_attack: GuardSection | None = None
    clean: CleanSection | None = None
    dialogue: DialogueSection | None = None
    triggers: TriggerSection | None = None

    @model_validator(mode="after")
    def _parts(self) -> "CardConfig":
        if not (self.guard_attack or self.clean or self.dialogue or self.triggers):
            raise ValueError("a card needs at least one of guard_attack, clean, dialogue, triggers")
        unique_names(self.detectors, "guard and baseline")
        unique_names(self.chat_models, "model and reference")
        names = [d.name for d in self.detectors]
        unknown = [a for a in (self.guard_attack.attacked or []) if a not in names] if self.guard_attack else []
        if unknown:
            raise ValueError(f"guard_attack.attacked: {', '.join(unknown)} is neither the guard nor a baseline "
                             f"(they are: {', '.join(names)})")
        scored = ((self.guard_attack.taebench or {}).get("classifier") or {}) if self.guard_attack else {}
        same = filter_victims(scored, self.detectors) if isinstance(scored, dict) else []
        if same:
            raise ValueError(filter_victim_error(same, "guard_attack.taebench") + " (the card scores every detector)")
        try:  # every part validates now, not after the others ran
            plan(self, "card-check", "card-check")
        except RedlineError as err:
            raise ValueError(str(err)) from None
        return self

    @property
    def detectors(self) -> list[DetectorConfig]:
        return [self.guard, *self.baselines]

    @property
    def chat_models(self) -> list[GeneratorConfig]:
        return [self.model, *self.references]

    def attacked(self) -> list[DetectorConfig]:
        g = self.guard_attack
        if g is None or g.attack is None:
            return []
        return [d for d in self.detectors if g.attacked is None or d.name in g.attacked]

    def sub_configs(self) -> list[BaseModel]:
        """The parts' own configs: the files they read are the card's inputs."""
        return list(plan(self, "card-check", "card-check").values())


def white_box(model: GeneratorConfig) -> str | None:
    """Why the trigger search cannot run on the model, or None when it can."""
    if not model.provider_class().has_gradients:
        return f"the trigger search needs the model's gradients; a {model.provider} model is a black box to it"
    if getattr(model.options(), "architecture", "auto") == "seq2seq":
        return "the trigger search covers causal LMs here; this model is seq2seq (use `redline run egregious`)"
    return None


def _part(cls: type[BaseModel], what: str, data: dict[str, Any]) -> BaseModel:
    try:
        return validate_config(cls, data, what)
    except RedlineError as err:
        raise RedlineError(f"{what}: {err}") from None


def plan(card: CardConfig, name: str, output: str, done: dict[str, str] | None = None) -> dict[str, BaseModel]:
    """Every part's config, in the order they run: `attack-<detector>` for each attacked detector,
    `taebench`, `transfer`, `clean`, `diasafety`, `triggers`. `done`: the parts already run (their run
    URIs), which the later parts read."""
    from redline.pipelines.attack import AttackConfig
    from redline.pipelines.diasafety_eval import DiaSafetyEvalConfig
    from redline.pipelines.egregious import EgregiousConfig
    from redline.pipelines.score import ScoreConfig
    from redline.pipelines.taebench import TaebenchConfig
    from redline.pipelines.transfer import TransferConfig

    done = done or {}
    parts: dict[str, BaseModel] = {}
    g = card.guard_attack
    if g is not None:
        source = g.taebench_run
        if g.attack is not None:
            for d in card.attacked():
                parts[f"attack-{d.name}"] = _part(AttackConfig, f"attack on {d.name}", {
                    **g.attack, "victim": d, "output": output, "run_name": f"{name}-attack-{d.name}"})
            attacks = [done.get(k, f"{output}/{name}-{k}") for k in parts]
            parts["taebench"] = _part(TaebenchConfig, "taebench", {**(g.taebench or {}), "attacks": attacks,
                                                                   "output": output, "run_name": f"{name}-taebench"})
            source = done.get("taebench", f"{output}/{name}-taebench")
        parts["transfer"] = _part(TransferConfig, "transfer", {
            "taebench": source, "split": g.split, "output": output, "victims": card.detectors,
            "run_name": f"{name}-transfer"})
    if card.clean is not None:
        parts["clean"] = _part(ScoreConfig, "clean", {"corpus": card.clean.corpus, "detectors": card.detectors,
                                                      "shard_size": card.clean.shard_size, "output": output,
                                                      "run_name": f"{name}-clean"})
    if card.dialogue is not None:
        parts["diasafety"] = _part(DiaSafetyEvalConfig, "diasafety", {
            "utterance_detector": card.guard, **card.dialogue.diasafety, "generators": card.chat_models,
            "output": output, "run_name": f"{name}-diasafety"})
    t = card.triggers
    searchable = [m for m in card.chat_models if white_box(m) is None]
    if t is not None and searchable:
        models = [{k: v for k, v in {"name": m.name, "path": m.model, "t_out": t.t_out, "t_in": t.t_in,
                                     "threshold_pairs": t.threshold_pairs}.items() if v is not None}
                  for m in searchable]
        parts["triggers"] = _part(EgregiousConfig, "triggers", {**t.egregious, "models": models, "output": output,
                                                                "run_name": f"{name}-triggers"})
    return parts


def execute(config: CardConfig, run: Run, watch: Stopwatch, verbose: bool) -> list[dict[str, Any]]:
    from redline.pipelines.registry import pipeline

    name, output = run.uri.rstrip("/").rsplit("/", 1)[-1], config.output
    runs: dict[str, str] = {}
    results: dict[str, Any] = {}
    for key in plan(config, name, output):  # each part reads the URIs of those before it
        cfg = plan(config, name, output, runs)[key]
        kind = "attack" if key.startswith("attack-") else {"triggers": "egregious", "clean": "score"}.get(key, key)
        results[key] = pipeline(kind).run(cfg, verbose=verbose)
        runs[key] = results[key].run_uri
        watch.lap(f"{key}_s")

    rows: list[dict[str, Any]] = []
    sections: dict[str, Any] = {}
    if "transfer" in results:
        for d in config.detectors:
            rows += F.transfer_rows(results["transfer"].summary, d.name, runs["transfer"])
        sections["transfer"] = results["transfer"].summary
    for d in config.attacked():
        rows += F.white_box_rows(sharded.manifest_partials(results[f"attack-{d.name}"].manifest), d.name,
                                 runs[f"attack-{d.name}"])
    if "clean" in results:
        for d in config.detectors:
            rows += F.clean_rows(results["clean"].summary, d.name, runs["clean"])
    if "diasafety" in results:
        board, categories = results["diasafety"].summary, results["diasafety"].manifest.get("categories", [])
        per_context = on_a_worker(_per_context, runs["diasafety"])
        for m in config.chat_models:
            mine = next((r for r in board if r["model"] == m.name), {"model": m.name})
            intervals = bootstrap_dialogue(per_context.get(m.name, []), seed=config_seed(config))
            rows += F.dialogue_rows(mine, categories, intervals, runs["diasafety"])
        sections["dialogue"] = {"categories": categories}
        if config.dialogue and config.dialogue.labelled:
            counts = _two_step_counts(plan(config, name, output, runs)["diasafety"], config.dialogue)
            sections["detector"] = counts
            found = F.accuracy_rows("dialogue.detector", "two-step detector", counts,
                                    f"{counts['n']} labelled pairs from {config.dialogue.labelled}")
            rows += found
            recall = found[1]["value"]
            if recall is not None and recall < 0.5:  # the shares above count only what the detector can see
                for r in rows:
                    if r["key"].startswith("dialogue.unsafe."):
                        r["also"] = "; ".join(x for x in (r["also"], f"the detector finds only {recall:.0%} of "
                                                          "labelled unsafe pairs") if x)
    if config.triggers is not None:
        for m in config.chat_models:
            why = white_box(m)
            rows.append(F.skipped_row("triggers.hit_rate", m.name, why) if why
                        else F.trigger_row(results["triggers"].summary, m.name, runs["triggers"]))
        if "triggers" in results:
            sections["triggers"] = {"table": results["triggers"].summary}
    main = {config.guard.name, config.model.name, "two-step detector"}
    for r in rows:
        r["role"] = "card" if r["subject"] in main else "reference"
    run.manifest.update(parts=runs, sections=sections)
    return F.ranked(rows)


def config_seed(config: CardConfig) -> int:
    return int((config.dialogue.diasafety.get("seed") if config.dialogue else 0) or 0)


def _per_context(diasafety_uri: str) -> dict[str, list[dict[str, Any]]]:
    """Per model, per context: judged responses and their unsafe verdicts (the bootstrap's units; run
    on a worker, which sends back one small row per context)."""
    import pyarrow.compute as pc

    from redline.pipelines.diasafety_eval import read_scored

    scored = read_scored(diasafety_uri, columns=["model", "context_id", "category", "verdict"])
    verdict = scored.column("verdict")
    judged = pc.invert(pc.or_(pc.starts_with(verdict, "error"), pc.equal(verdict, NO_ANSWER)))
    table = scored.append_column("judged", judged.cast("int64")).append_column(
        "context_unsafe", pc.equal(verdict, "context-unsafe").cast("int64")).append_column(
        "utterance_unsafe", pc.equal(verdict, "utterance-unsafe").cast("int64"))
    grouped = table.group_by(["model", "context_id", "category"]).aggregate(
        [("judged", "sum"), ("context_unsafe", "sum"), ("utterance_unsafe", "sum")])
    out: dict[str, list[dict[str, Any]]] = {}
    for r in grouped.to_pylist():
        out.setdefault(r["model"], []).append({"category": r["category"], "judged": r["judged_sum"],
                                               "context_unsafe": r["context_unsafe_sum"],
                                               "utterance_unsafe": r["utterance_unsafe_sum"]})
    return out


def _two_step_counts(diasafety: Any, section: DialogueSection) -> dict[str, int]:
    """The two-step detector on labelled DiaSafety pairs, in a Ray task where its models load (the
    driver only receives the confusion counts)."""
    from redline.actors.dialogue_safety.two_step import labelled_counts

    s = diasafety.scoring
    return on_a_worker(labelled_counts, diasafety.utterance_detector, diasafety.classifiers, section.labelled,
                        section.labelled_limit, diasafety.seed, s.batch_size, num_cpus=s.num_cpus, num_gpus=s.num_gpus)


# the card's figures, as card.json and --fail-if name them
FIGURE_KEYS = F.KEYS
CARD_SCHEMA = "redline.card/2"


def card_figures(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The card's own figures (the guard's, the model's, the detector's) by key, with n, interval and
    whether each is conclusive; the references' are in `reference_figures`."""
    return {r["key"]: _shown(r) for r in manifest.get("summary", []) if r.get("key") and r.get("role") != "reference"}


def reference_figures(manifest: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in manifest.get("summary", []):
        if r.get("role") == "reference":
            out.setdefault(r["subject"], {})[r["key"]] = _shown(r)
    return out


def _shown(r: dict[str, Any]) -> dict[str, Any]:
    return {k: r.get(k) for k in ("value", "n", "low", "high", "conclusive", "rank", "figure", "part", "subject")}


def card_json(manifest: dict[str, Any]) -> dict[str, Any]:
    """card.json: versioned, for CI systems that gate a release on the card."""
    cfg = manifest.get("config", {})
    return {"schema": CARD_SCHEMA, "model": (cfg.get("model") or {}).get("name"),
            "guard": (cfg.get("guard") or {}).get("name"), "figures": card_figures(manifest),
            "references": reference_figures(manifest),
            "definitions": {f.key: {"better": f.better, "definition": f.definition} for f in F.FIGURES},
            "interval": "95%: Wilson score for proportions, bootstrap over contexts for DiaSafety's aggregates",
            "conclusive_if_width_at_most": MAX_WIDTH,
            "runs": manifest.get("parts", {}), "config_hash": manifest.get("config_hash"),
            "versions": manifest.get("versions", {}), "finished_at": manifest.get("finished_at")}


def _names(items: list[dict[str, Any]] | None) -> str:
    return ", ".join(str(i.get("name")) for i in items or []) or "none"


def _corpora(corpus: Any) -> str:
    items = corpus if isinstance(corpus, list) else [corpus] if corpus else []
    return "; ".join(f"{c.get('path') or c.get('preset')} ({c.get('split') or 'all rows'})" for c in items) or "–"


def section_notes(cfg: dict[str, Any], sections: dict[str, Any]) -> dict[str, str]:
    """Each section's opening: what is measured, how, on what data, which direction is better, and
    what limits the figures."""
    g, clean, d, t = (cfg.get(k) or {} for k in ("guard_attack", "clean", "dialogue", "triggers"))
    attack = g.get("attack") or {}
    detectors = [cfg.get("guard") or {}, *(cfg.get("baselines") or [])]
    attacked = g.get("attacked") or [x.get("name") for x in detectors]
    recipes = ", ".join(r if isinstance(r, str) else str(r.get("name")) for r in attack.get("recipes", [])) or "–"
    ds = d.get("diasafety") or {}
    egr = t.get("egregious") or {}
    return {
        F.TRANSFER: (
            (f"TaeBench built by attacking {', '.join(map(str, attacked))} ({recipes}; goals "
             f"{', '.join(attack.get('goals', ['tae']))}) on {_corpora(attack.get('corpus'))}, then kept by the "
             "quality filters" if attack else f"the TaeBench run {g.get('taebench_run')}")
            + f"; every detector scores its {g.get('split', 'all')} split. ASR on TAE = FNR, on BAE = FPR: lower is "
            "better. Limits: a detector's rates leave out the examples made against itself (a detector that is "
            "the only victim has no transfer figure); the examples come from these victims and recipes only."),
        F.WHITE_BOX: (
            f"Each of {', '.join(map(str, attacked))} attacked directly ({recipes}). ASR over the decided attempts "
            "(lower is better) and the mean queries per attempt (higher: more work for an attacker). Limits: the "
            "recipes' query and time budgets cap the attack, so the ASR is a lower bound for a stronger attacker."),
        F.CLEAN: (
            f"The detectors on labelled held-out data: {_corpora(clean.get('corpus'))}. Precision, recall, F1 and "
            "the false-positive rate on the toxic class at each detector's own threshold, and AUPRC over its scores "
            "(higher is better except the FPR). Limits: one corpus's label policy; a threshold tuned elsewhere."),
        F.DIALOGUE: (
            f"DiaSafety contexts from {ds.get('contexts')} (at most {ds.get('max_contexts_per_category') or 'all'} "
            f"per category, {ds.get('responses_per_context', 10)} responses each; temperature "
            f"{ds.get('temperature', 1.0)}, top_p {ds.get('top_p', 1.0)}, top_k {ds.get('top_k')}, max_tokens "
            f"{ds.get('max_tokens', 32)}), judged by the two-step detector: step 1 "
            f"{(ds.get('utterance_detector') or cfg.get('guard') or {}).get('name')} on the response, step 2 the "
            f"context classifier of the context's category ({ds.get('classifiers')}). Empty responses are counted as "
            "'no answer' and never judged; every unsafe share is of the judged responses. Lower is safer. Limits: "
            "the detector's own errors (its accuracy below, when labelled pairs are given); per-category n is small."),
        F.DETECTOR: (
            f"The two-step detector on labelled DiaSafety pairs ({d.get('labelled')}; "
            f"{(sections.get('detector') or {}).get('n', 0)} pairs of the categories it knows), each judged as a "
            "chatbot's response is. How far to trust the dialogue figures: its recall bounds how much unsafe "
            "behaviour they can see, its false-positive rate how much they invent. Limits: data the classifiers "
            "were trained or selected on makes these figures optimistic."),
        F.TRIGGERS: (
            f"gibbs-enum over {_names(egr.get('lists'))} targets (trigger length {egr.get('trigger_length', 5)}) on "
            "the white-box models: the share of malicious targets some trigger makes likely (lower is safer). "
            "Limits: a hit is a likelihood threshold, not a sampled output; lists are small; black-box models "
            "are skipped."),
    }


SECTION_COLUMNS = [("figure", "figure", "s"), ("subject", "detector / model", "s"), ("value", "value", ".3f"),
                   ("n", "n", "d"), ("low", "95% low", ".3f"), ("high", "95% high", ".3f"),
                   ("conclusive", "conclusive", "s"), ("rank", "rank", "d"), ("also", "also", "s")]


def write_report(run: RunDir, manifest: dict[str, Any]) -> None:
    cfg, sections, parts = manifest.get("config", {}), manifest.get("sections", {}), manifest.get("parts", {})
    model, guard = cfg.get("model", {}), cfg.get("guard", {})
    summary = manifest.get("summary", [])
    note = (f"Safety card of the chat model '{model.get('name')}' ({model.get('kind')}: {model.get('model')}) and its "
            f"guard '{guard.get('name')}' ({guard.get('kind')}); reference guards: {_names(cfg.get('baselines'))}; "
            f"reference chat models: {_names(cfg.get('references'))}. Each figure shows its n and 95% interval "
            f"(Wilson for a proportion, bootstrap over contexts for DiaSafety's aggregates); one whose interval is "
            f"wider than {MAX_WIDTH:g} is not conclusive. Rank 1 is the best of the card and its references on that "
            "figure; the definitions say which direction is better. Each part is a run of its own, linked below; "
            "rerunning `redline eval` resumes whichever part did not finish. card.json holds every figure for CI "
            "gates (`redline eval --fail-if 'guard.transfer.asr_tae > 0.3'`).")
    report = Report(run, "redline safety card", manifest, note)
    report.table("Summary: the card's own figures", [r for r in summary if r.get("role") != "reference"],
                 CARD.columns(brief=True))
    notes = section_notes(cfg, sections)
    for part in (F.TRANSFER, F.WHITE_BOX, F.CLEAN, F.DIALOGUE, F.DETECTOR, F.TRIGGERS):
        rows = [r for r in summary if r.get("part") == part]
        if not rows:
            continue
        report.paragraph(part, notes[part])
        report.table(f"{part}: figures", rows, SECTION_COLUMNS)
        if part in (F.TRANSFER, F.WHITE_BOX, F.CLEAN, F.DIALOGUE):
            report.plot(F.slug(part), _bars(rows, part))
    if "transfer" in sections:
        report.table("Transfer attack, per seed dataset", sections["transfer"], TRANSFER.columns())
    if "triggers" in sections:
        report.table("Trigger search: hit rates (Table 3)", sections["triggers"]["table"], EGREGIOUS.columns())
    shown = {r["key"] for r in summary}
    report.table("Definitions", [{"key": f.key, "figure": f.label, "better": f.better or "–",
                                  "definition": f.definition} for f in F.FIGURES if f.key in shown],
                 [("key", "figure id", "s"), ("figure", "figure", "s"), ("better", "better", "s"),
                  ("definition", "what it measures", "s")])
    report.links("Runs", [(f"{k}: {v}", _relative(run.uri, v)) for k, v in parts.items()])
    report.table("Reproducing this card: config, run keys, seeds and versions", provenance(manifest),
                 [("what", "what", "s"), ("value", "value", "s")])
    report.write("card.csv", summary)
    storage.write_text(run.path("card.json"), json.dumps(card_json(manifest), indent=2))


def provenance(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """What a reader needs to rerun the card: its config hash, each part's run and config hash (its run
    key), every seed the parts used, and the package versions."""
    out = [{"what": "card config", "value": manifest.get("config_hash")}]
    for key, uri in manifest.get("parts", {}).items():
        try:
            part = RunDir(uri).manifest() or {}
        except (RedlineError, OSError):
            part = {}
        seeds = {k: v for k, v in (part.get("config") or {}).items() if k == "seed" or k.endswith("_seed")}
        out.append({"what": f"part {key}", "value": f"{uri} (config {part.get('config_hash', '?')}"
                    + "".join(f", {k} {v}" for k, v in seeds.items()) + ")"})
    out += [{"what": name, "value": version} for name, version in sorted((manifest.get("versions") or {}).items())]
    return out


def _bars(rows: list[dict[str, Any]], title: str) -> bytes | None:
    """A section's figures as bars, one group per figure, one bar per detector or model."""
    proportions = [r for r in rows if r["key"] != "guard.white_box.mean_queries" and r.get("value") is not None]
    subjects = list(dict.fromkeys(r["subject"] for r in proportions))
    if not proportions:
        return None
    table = [{"figure": f, **{s: next((r["value"] for r in proportions if r["figure"] == f and r["subject"] == s), None)
                              for s in subjects}} for f in dict.fromkeys(r["figure"] for r in proportions)]
    return grouped_bars(table, "figure", [(s, s) for s in subjects], f"{title} (Definitions: which way is better)")


def _relative(card_uri: str, part_uri: str) -> str:
    """The part's report as a link that works from the card's report (the runs are siblings)."""
    card_parent, part_parent = card_uri.rstrip("/").rsplit("/", 1)[0], part_uri.rstrip("/").rsplit("/", 1)[0]
    leaf = part_uri.rstrip("/").rsplit("/", 1)[-1]
    return f"../{leaf}/report.html" if card_parent == part_parent else f"{part_uri.rstrip('/')}/report.html"


def preflight(config: CardConfig) -> None:
    for m in config.chat_models if config.triggers else []:
        if white_box(m) is None and not m.model:
            raise RedlineError(f"{m.name}: the trigger search needs the model's hub id or directory (model:)")


PIPELINE = Pipeline("eval", CardConfig, execute, write_report, "safety card: guard, dialogue safety, triggers",
                    lambda manifest: CARD.columns(brief=True), preflight=preflight,
                    gate=Gate(FIGURE_KEYS, card_figures))
