"""The trigger-search worker: what `redline run egregious` hosts on its actors."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import AliasChoices, Field

from redline.actors.triggers import hits as H
from redline.actors.triggers.pairs import PairCorpusConfig
from redline.actors.triggers.settings import TriggerSearchSettings
from redline.cluster.config import Input, Result, Strict
from redline.cluster.devices import placement
from redline.errors import RedlineError

RESULT_SCHEMA = pa.schema([
    ("id", pa.string()), ("shard", pa.int32()), ("status", pa.string()), ("reason", pa.string()), ("trigger", pa.string()),
    ("objective", pa.float64()), ("avg_logprob", pa.float64()), ("min_logprob", pa.float64()),
    ("min_margin", pa.float64()), ("lm_average", pa.float64()), ("hits", pa.list_(pa.string())),
    ("reached", pa.bool_()), ("restart", pa.int32()), ("sweeps", pa.int32()), ("forward_passes", pa.int64()),
    ("backward_passes", pa.int64()), ("sequences_scored", pa.int64()), ("seconds", pa.float64()),
    # a target built from an input (normal, normal-sample, planted): does that input itself reach the
    # goal hit as a trigger, and with which objective (None: not a possible trigger, e.g. another length)
    ("source_reaches", pa.bool_()), ("source_objective", pa.float64()),
])


class EgregiousModelConfig(Strict):
    """A generation model searched for triggers, with what its hit types need."""

    name: str = Result(pattern=r"^[A-Za-z0-9_.\-]+$")
    path: str = Input(
        description="A redline LSTM seq2seq directory, or an HF causal / seq2seq LM (hub id or directory).")
    lm: str | None = Input(None, description="A redline LSTM LM directory for the io hit types (same vocabulary); "
                                             "an HF causal LM is its own LM.")
    t_out: float | None = Result(None, description="Override T_out (default: stored with the LSTM model, or estimated "
                                                  "on threshold_pairs).")
    t_in: float | None = Result(None)
    threshold_pairs: PairCorpusConfig | None = Field(None, description="Held-out pairs to estimate T_out / T_in of an HF model.")
    precision: Literal["float32", "float64"] = Result("float32", validation_alias=AliasChoices("precision", "dtype"),
                                                     description="float64 breaks near-ties exactly (slower).")


class TriggerWorker:
    """A batch worker (an actor of the pipelines' pools): loads each model (and LM) once, on the
    actor's GPU when it has one; searches a batch's targets together per (model, search)."""

    input_columns: ClassVar[list[str]] = ["id", "model", "list", "target", "search", "source", "sources"]
    output_schema: ClassVar[pa.Schema] = RESULT_SCHEMA

    def __init__(self, models: list[EgregiousModelConfig], search: TriggerSearchSettings,
                 thresholds: dict[str, list[float | None]],
                 num_gpus: float = 0.0) -> None:
        from redline.actors.triggers import models as M
        from redline.actors.triggers.scorers import (
            HFTarget,
            LSTMPrior,
            LSTMSeq2SeqTarget,
        )

        self.search = search
        self.models: dict[str, Any] = {}
        for m in models:
            where = placement(num_gpus, m.precision)
            device, dtype = where.device, where.torch_dtype
            if M.is_trigger_model(m.path):
                target = LSTMSeq2SeqTarget(M.load(m.path, device), dtype)
                prior = LSTMPrior(M.load(m.lm, device), dtype) if m.lm else None
            else:
                target = HFTarget(m.path, device, dtype)
                prior = None if target.seq2seq else target
            t_out, t_in = thresholds[m.name]
            self.models[m.name] = (target, prior, H.Thresholds(t_out, t_in))  # type: ignore[arg-type]

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        from redline.actors.triggers.gibbs import GibbsEnum, SearchOptions, TriggerResult
        from redline.actors.triggers.relaxation import continuous_relaxation

        c = self.search
        out: list[dict[str, Any]] = []
        groups: dict[tuple[str, str], list[int]] = {}
        for k, (model, search) in enumerate(zip(batch["model"], batch["search"])):
            groups.setdefault((str(model), str(search)), []).append(k)
        for (model, search), idx in groups.items():
            target, prior, thresholds = self.models[model]
            targets = [str(batch["target"][k]) for k in idx]
            opts = SearchOptions.of(c, search)
            sources = [_sources(batch, k) for k in idx]
            checks: list[Any] = [None] * len(idx)
            try:
                if H.uses_lm(search) and (prior is None or thresholds.t_in is None):
                    raise RedlineError(f"'{search}' needs an LM and T_in for model '{model}'")
                gibbs = GibbsEnum(target, prior, thresholds, opts)
                results: list[TriggerResult | str] = (
                    gibbs.run(targets) if c.method == "gibbs-enum"
                    else continuous_relaxation(target, prior, thresholds, opts, targets, steps=c.relaxation_steps))
                pairs = [(j, src) for j, srcs in enumerate(sources) for src in srcs]
                if pairs:  # a target reaches when any input that gave it does (the best objective among them)
                    found = gibbs.check([src for _, src in pairs], [targets[j] for j, _ in pairs])
                    for (j, _), check in zip(pairs, found):
                        if check is not None:
                            prior_check = checks[j]
                            checks[j] = check if prior_check is None else (
                                prior_check[0] or check[0], max(prior_check[1], check[1]))
            except RedlineError as err:
                results = [f"error: {err}"] * len(idx)
            for k, r, check in zip(idx, results, checks):
                row = {**_row(str(batch["id"][k]), r), "shard": int(batch["shard"][k])}
                if check is not None:
                    row.update(source_reaches=check[0], source_objective=check[1])
                out.append(row)
        return pa.Table.from_pylist(out, schema=RESULT_SCHEMA)


def _sources(batch: dict[str, Any], k: int) -> list[str]:
    """The inputs a target came from: every one (`sources`), or the one recorded by older runs."""
    many = batch["sources"][k] if "sources" in batch else None
    if many is not None and len(many):
        return [str(x) for x in many]
    one = batch["source"][k] if "source" in batch else None
    return [str(one)] if one else []


def _row(row_id: str, r: Any) -> dict[str, Any]:
    if isinstance(r, str):
        status = "error" if r.startswith("error: ") else "skipped"
        return {"id": row_id, "status": status, "reason": r.removeprefix("error: ")}
    return {"id": row_id, "status": "ok", "reason": None, "trigger": r.trigger, "objective": r.objective,
            "avg_logprob": float(np.mean(r.target_logprobs)), "min_logprob": float(np.min(r.target_logprobs)),
            "min_margin": float(np.min(r.margins)), "lm_average": r.lm_average, "hits": r.hits, "reached": r.reached,
            "restart": r.restart, "sweeps": r.sweeps, "forward_passes": r.forward_passes,
            "backward_passes": r.backward_passes, "sequences_scored": r.sequences_scored, "seconds": r.seconds}
