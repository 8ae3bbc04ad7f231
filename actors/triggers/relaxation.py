"""The paper's continuous-relaxation baseline for gibbs-enum (He & Glass 2019, Section 3)."""

from __future__ import annotations

import time

import torch

from redline.actors.triggers.gibbs import GibbsEnum, SearchOptions, TriggerResult, gradient_pass, target_seed
from redline.actors.triggers.hits import Thresholds, hit_types
from redline.actors.triggers.scorers import PriorModel, TargetModel


def continuous_relaxation(model: TargetModel, prior: PriorModel | None, thresholds: Thresholds, options: SearchOptions,
                          targets: list[str], steps: int = 200, learning_rate: float = 0.1) -> list[TriggerResult | str]:
    """The paper's Section 3 baseline: optimise a softmax-relaxed input with Adam, then project each
    position to its most likely token and score the discrete trigger exactly."""
    search = GibbsEnum(model, prior, thresholds, options)
    out: list[TriggerResult | str] = []
    weight = model.embedding_weight
    allowed = model.allowed
    for target in targets:
        started = time.perf_counter()
        ids, reason = model.target_ids(target)
        if not ids:
            out.append(reason or "")
            continue
        gen = torch.Generator().manual_seed(target_seed(options.seed, target))
        R, L = options.restarts, options.trigger_length
        tgt = torch.tensor([ids] * R, device=allowed.device)
        mask = torch.ones_like(tgt, dtype=torch.bool)
        z = (0.1 * torch.randn(R, L, weight.shape[0], generator=gen)).to(weight.device, weight.dtype).requires_grad_(True)
        opt = torch.optim.Adam([z], lr=learning_rate)
        for _ in range(steps):
            with gradient_pass():
                probs = torch.softmax(z.masked_fill(~allowed, float("-inf")), dim=-1)
                logp, margin = model.scores_from_embeds(probs @ weight, tgt)
                objective = search._reduce(logp, margin, mask)
                loss = -objective.sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
        trig = z.detach().masked_fill(~allowed, float("-inf")).argmax(-1)
        scored = search._score(trig, tgt, mask, final=True)
        best = int(scored["objective"].argmax())
        logp_l, margin_l = scored["logp"][best].tolist(), scored["margin"][best].tolist()
        lm = float(scored["lm"][best]) if "lm" in scored else None
        hits = hit_types(logp_l, margin_l, lm, thresholds)
        out.append(TriggerResult(target, model.decode(trig[best].tolist()), trig[best].tolist(), float(scored["objective"][best]),
                                 logp_l, margin_l, lm, hits, search.goal in hits, best, steps, steps * R, steps * R, R,
                                 time.perf_counter() - started))
    return out
