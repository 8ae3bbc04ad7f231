"""T_out / T_in of a Hugging Face model, estimated on held-out pairs: the average per-token
log-likelihood of responses given their inputs, and of the inputs themselves under the model
(the LSTM models get theirs at training time)."""

from __future__ import annotations

from collections import defaultdict

import torch

from redline.actors.triggers.pairs import Pair
from redline.actors.triggers.scorers import HFTarget
from redline.errors import RedlineError


@torch.no_grad()
def estimate(model: HFTarget, pairs: list[Pair], max_pairs: int = 500, max_input_tokens: int = 32) -> tuple[float, float | None]:
    groups: dict[tuple[int, int], list[tuple[list[int], list[int]]]] = defaultdict(list)
    for x, y in pairs[:max_pairs]:
        trig = model.tokenizer(x, add_special_tokens=False).input_ids[:max_input_tokens]
        tgt, _ = model.target_ids(y)
        if trig and tgt:
            groups[(len(trig), len(tgt))].append((trig, tgt))
    if not groups:
        raise RedlineError("no usable threshold pairs (every input or response is empty or too long)")
    out_sum = out_n = in_sum = in_n = 0.0
    for batch in groups.values():
        trig = torch.tensor([t for t, _ in batch], device=model.device)
        tgt = torch.tensor([y for _, y in batch], device=model.device)
        logp, _ = model.scores(trig, tgt, need_margin=False)
        out_sum, out_n = out_sum + float(logp.sum()), out_n + logp.numel()
        if not model.seq2seq:
            lm = model.token_logprobs(trig)
            in_sum, in_n = in_sum + float(lm.sum()), in_n + lm.numel()
    return out_sum / out_n, (in_sum / in_n if in_n else None)
