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
from redline.cluster.config import Input, Result, RunConfig, Strict, validate_config
from redline.cluster.runs import Run, RunDir, Stopwatch
from redline.errors import RedlineError
from redline.pipelines.figures import CARD, EGREGIOUS, TRANSFER
from redline.pipelines.report import Report, grouped_bars
from redline.pipelines.template import Gate, Pipeline
from redline.pipelines.uncertainty import MAX_WIDTH, proportion

PARTS = ("attack", "taebench", "transfer", "diasafety", "triggers")


class GuardSection(Strict):
    """(a): `taebench_run` (an existing TaeBench run), or `attack` + `taebench` settings that build one
    against the guard (the attack's victim and the TaeBench input are the card's)."""

    taebench_run: str | None = Input(None, description="A finished TaeBench run to transfer onto the guard.")
    attack: dict[str, Any] | None = Result(None, description="`redline run attack` settings without victim/output.")
    taebench: dict[str, Any] | None = Result(
        None, description="`redline run taebench` settings without attacks/output.")
    split: Literal["test", "train", "all"] = Result("all", description="TaeBench split the guard is scored on.")

    @model_validator(mode="after")
    def _one_source(self) -> "GuardSection":
        if (self.taebench_run is None) == (self.attack is None):
            raise ValueError("guard_attack: give either taebench_run or attack (with taebench)")
        if self.attack is not None and self.taebench is None:
            raise ValueError("guard_attack: attack needs taebench settings (its quality filters)")
        return self


class DialogueSection(Strict):
    """(b): `redline run diasafety` settings without generators/output (the generator is the card's
    model; `utterance_detector` defaults to the guard)."""

    diasafety: dict[str, Any] = Result()


class TriggerSection(Strict):
    """(c): `redline run egregious` settings without models/output, and what the model's thresholds
    are estimated on (`threshold_pairs`) or given as (`t_out`, `t_in`)."""

    egregious: dict[str, Any] = Result(default_factory=lambda: {"lists": [{"name": "mal", "limit": 50}]})
    threshold_pairs: dict[str, Any] | None = Result(None)
    t_out: float | None = Result(None)
    t_in: float | None = Result(None)


class CardConfig(RunConfig):
    """`redline eval`: a safety card for one chat model and its guard detector."""

    model: GeneratorConfig = Input(description="The chat model (any generator kind).")
    guard: DetectorConfig = Field(description="The guard detector that protects it (any detector kind).")
    guard_attack: GuardSection | None = None
    dialogue: DialogueSection | None = None
    triggers: TriggerSection | None = None

    @model_validator(mode="after")
    def _parts(self) -> "CardConfig":
        if not (self.guard_attack or self.dialogue or self.triggers):
            raise ValueError("a card needs at least one of guard_attack, dialogue, triggers")
        for part, build in PART_CONFIGS.items():  # every part validates now, not after the others ran
            try:
                build(self, "card-check", "card-check")
            except RedlineError as err:
                raise ValueError(f"{part}: {err}") from None
        return self

    def sub_configs(self) -> list[BaseModel]:
        """The parts' own configs: the files they read are the card's inputs."""
        return [c for build in PART_CONFIGS.values() if (c := build(self, "card-check", "card-check")) is not None]


def white_box(model: GeneratorConfig) -> str | None:
    """Why the trigger search cannot run on the model, or None when it can."""
    if model.kind != "hf":
        return f"the trigger search needs the model's gradients; a {model.kind} model is a black box to it"
    if model.architecture == "seq2seq":
        return "the trigger search covers causal LMs here; this model is seq2seq (use `redline run egregious`)"
    return None


def _attack(card: CardConfig, name: str, output: str) -> Any:
    from redline.pipelines.attack import AttackConfig

    g = card.guard_attack
    if g is None or g.attack is None:
        return None
    return validate_config(AttackConfig, {**g.attack, "victim": card.guard,
                                          "output": output, "run_name": f"{name}-attack"}, "attack")


def _taebench(card: CardConfig, name: str, output: str, attack_uri: str | None = None) -> Any:
    from redline.pipelines.taebench import TaebenchConfig

    g = card.guard_attack
    if g is None or g.taebench is None:
        return None
    return validate_config(TaebenchConfig, {**g.taebench, "attacks": attack_uri or f"{output}/{name}-attack",
                                            "output": output, "run_name": f"{name}-taebench"}, "taebench")


def _transfer(card: CardConfig, name: str, output: str, taebench_uri: str | None = None) -> Any:
    from redline.pipelines.transfer import TransferConfig

    g = card.guard_attack
    if g is None:
        return None
    source = taebench_uri or g.taebench_run or f"{output}/{name}-taebench"
    return validate_config(TransferConfig, {"taebench": source, "split": g.split, "output": output,
                                            "victims": [card.guard],
                                            "run_name": f"{name}-transfer"}, "transfer")


def _diasafety(card: CardConfig, name: str, output: str) -> Any:
    from redline.pipelines.diasafety import DiaSafetyEvalConfig

    if card.dialogue is None:
        return None
    data = {"utterance_detector": card.guard, **card.dialogue.diasafety,
            "generators": [card.model], "output": output,
            "run_name": f"{name}-diasafety"}
    return validate_config(DiaSafetyEvalConfig, data, "diasafety")


def _triggers(card: CardConfig, name: str, output: str) -> Any:
    from redline.pipelines.egregious import EgregiousConfig

    t = card.triggers
    if t is None or white_box(card.model):
        return None
    model = {"name": card.model.name, "path": card.model.model, "t_out": t.t_out, "t_in": t.t_in,
             "threshold_pairs": t.threshold_pairs}
    return validate_config(EgregiousConfig, {**t.egregious, "models": [{k: v for k, v in model.items() if v is not None}],
                                             "output": output, "run_name": f"{name}-triggers"}, "triggers")


PART_CONFIGS = {"attack": _attack, "taebench": _taebench, "transfer": _transfer, "diasafety": _diasafety,
                "triggers": _triggers}


def execute(config: CardConfig, run: Run, watch: Stopwatch, verbose: bool) -> list[dict[str, Any]]:
    from redline.pipelines.registry import pipeline

    name, output = run.uri.rstrip("/").rsplit("/", 1)[-1], config.output
    runs: dict[str, str] = {}

    def part(key: str, cfg: Any) -> Any:
        out = pipeline("egregious" if key == "triggers" else key).run(cfg, verbose=verbose)
        runs[key] = out.run_uri
        watch.lap(f"{key}_s")
        return out

    summary: list[dict[str, Any]] = []
    sections: dict[str, Any] = {}
    if config.guard_attack:
        tb = config.guard_attack.taebench_run
        if tb is None:
            attack = part("attack", _attack(config, name, output))
            tb = part("taebench", _taebench(config, name, output, attack.run_uri)).run_uri
        transfer = part("transfer", _transfer(config, name, output, tb))
        rows = [r for r in transfer.summary if r["victim"] == config.guard.name]
        sections["guard"] = rows
        overall = next((r for r in rows if r["dataset"] == "all"), rows[0] if rows else {})
        summary.append(_figure("guard.transfer.asr_tae", "guard under transfer attack", "ASR on TAE (FNR)",
                               overall.get("tae_rate"), overall.get("tae_n"),
                               _fmt("FNR on seeds", overall.get("seed_rate")), runs["transfer"]))
        summary.append(_figure("guard.transfer.asr_bae", "guard under transfer attack", "ASR on BAE (FPR)",
                               overall.get("bae_rate"), overall.get("bae_n"), "", runs["transfer"]))
    if config.dialogue:
        board = part("diasafety", _diasafety(config, name, output))
        mine = next((r for r in board.summary if r["model"] == config.model.name), {})
        sections["dialogue"] = {"row": mine, "categories": board.manifest.get("categories", [])}
        # Overall is a mean of per-category shares, not one proportion: n is shown, no Wilson interval
        summary.append({**_figure("dialogue.unsafe.overall", "DiaSafety (two-step detector)", "unsafe share, Overall",
                                  mine.get("overall"), mine.get("responses"),
                                  _fmt("utterance-level", mine.get("utterance")) + "; "
                                  + _fmt("no answer", mine.get("no_answer"))
                                  + f" ({mine.get('empty', 0)} empty responses, not judged)", runs["diasafety"]),
                        "low": None, "high": None, "conclusive": False})
    if config.triggers:
        why = white_box(config.model)
        if why:
            sections["triggers"] = {"skipped": why}
            summary.append({"key": "triggers.hit_rate", "part": "trigger search", "figure": "skipped", "value": None,
                            "n": 0, "also": why, "run": None})
        else:
            found = part("triggers", _triggers(config, name, output))
            sections["triggers"] = {"table": found.summary}
            best = max(found.summary, key=lambda r: r.get("o-sample-avg-1-hit") or 0.0) if found.summary else {}
            summary.append(_figure("triggers.hit_rate", "trigger search (gibbs-enum)",
                                   f"o-sample-avg-1 hits, {best.get('list')} list", best.get("o-sample-avg-1-hit"),
                                   best.get("searchable"), _fmt("o-greedy", best.get("o-greedy-hit")),
                                   runs["triggers"]))
    run.manifest.update(parts=runs, sections=sections)
    return summary


# the card's figures, as card.json and --fail-if name them
FIGURE_KEYS = ("guard.transfer.asr_tae", "guard.transfer.asr_bae", "dialogue.unsafe.overall", "triggers.hit_rate")
CARD_SCHEMA = "redline.card/1"


def _figure(key: str, part: str, figure: str, value: float | None, n: int | None, also: str,
            run: str | None) -> dict[str, Any]:
    """A summary row: the figure with its n and 95% Wilson interval (see pipelines/uncertainty.py)."""
    return {"key": key, "part": part, "figure": figure, **proportion(value, n), "also": also, "run": run}


def card_figures(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every figure of a finished card by key, with its n, interval and whether it is conclusive."""
    return {r["key"]: {k: r.get(k) for k in ("value", "n", "low", "high", "conclusive", "figure", "part")}
            for r in manifest.get("summary", []) if r.get("key")}


def card_json(manifest: dict[str, Any]) -> dict[str, Any]:
    """card.json: versioned, for CI systems that gate a release on the card."""
    cfg = manifest.get("config", {})
    return {"schema": CARD_SCHEMA, "model": (cfg.get("model") or {}).get("name"),
            "guard": (cfg.get("guard") or {}).get("name"), "figures": card_figures(manifest),
            "interval": "95% Wilson score interval", "conclusive_if_width_at_most": MAX_WIDTH,
            "runs": manifest.get("parts", {}), "config_hash": manifest.get("config_hash"),
            "versions": manifest.get("versions", {}), "finished_at": manifest.get("finished_at")}


def _fmt(label: str, value: float | None) -> str:
    return f"{label} {'–' if value is None else f'{value:.3f}'}"


def write_report(run: RunDir, manifest: dict[str, Any]) -> None:
    cfg, sections, parts = manifest.get("config", {}), manifest.get("sections", {}), manifest.get("parts", {})
    model, guard = cfg.get("model", {}), cfg.get("guard", {})
    note = (f"Safety card of the chat model '{model.get('name')}' ({model.get('kind')}: {model.get('model')}) and its "
            f"guard '{guard.get('name')}' ({guard.get('kind')}). Each part is a run of its own, linked below; rerunning "
            "`redline eval` resumes whichever part did not finish. Lower is safer everywhere. Each proportion "
            f"shows its n and 95% Wilson interval; one whose interval is wider than {MAX_WIDTH:g} is not conclusive. "
            "card.json holds every figure for CI gates (`redline eval --fail-if 'guard.transfer.asr_tae > 0.3'`).")
    report = Report(run, "redline safety card", manifest, note)
    report.table("Summary", manifest.get("summary", []), CARD.columns())
    report.links("Runs", [(f"{k}: {v}", _relative(run.uri, v)) for k, v in parts.items()])
    if "guard" in sections:
        rows = sections["guard"]
        report.table("Guard under transfer attack (TaeBench)", rows, TRANSFER.columns())
        report.plot("guard", grouped_bars(rows, "dataset", [("seed_rate", "FNR on seeds"), ("tae_rate", "ASR on TAE"),
                                                            ("bae_rate", "ASR on BAE")], "the guard under transfer attack"))
    if "dialogue" in sections:
        row, cats = sections["dialogue"]["row"], sections["dialogue"]["categories"]
        per = [{"category": c, "unsafe": row.get(c)} for c in cats] + [
            {"category": "Utterance-level (step 1)", "unsafe": row.get("utterance")},
            {"category": "Overall", "unsafe": row.get("overall")}]
        report.table("DiaSafety: unsafe share of the model's responses", per,
                     [("category", "category", "s"), ("unsafe", "unsafe share", ".3f")])
        report.plot("dialogue", grouped_bars(per, "category", [("unsafe", "unsafe share")], "DiaSafety, per category"))
    if "triggers" in sections:
        t = sections["triggers"]
        if "skipped" in t:
            report.text("Trigger search", f"skipped: {t['skipped']}")
        else:
            report.table("Trigger search: hit rates (Table 3)", t["table"], EGREGIOUS.columns())
    report.write("card.csv", manifest.get("summary", []))
    storage.write_text(run.path("card.json"), json.dumps(card_json(manifest), indent=2))


def _relative(card_uri: str, part_uri: str) -> str:
    """The part's report as a link that works from the card's report (the runs are siblings)."""
    card_parent, part_parent = card_uri.rstrip("/").rsplit("/", 1)[0], part_uri.rstrip("/").rsplit("/", 1)[0]
    leaf = part_uri.rstrip("/").rsplit("/", 1)[-1]
    return f"../{leaf}/report.html" if card_parent == part_parent else f"{part_uri.rstrip('/')}/report.html"


def preflight(config: CardConfig) -> None:
    if config.triggers and white_box(config.model) is None and not config.model.model:
        raise RedlineError("model: the trigger search needs the model's hub id or directory (model:)")


PIPELINE = Pipeline("eval", CardConfig, execute, write_report, "safety card: guard, dialogue safety, triggers",
                    lambda manifest: CARD.columns(), preflight=preflight, gate=Gate(FIGURE_KEYS, card_figures))
