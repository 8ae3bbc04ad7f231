"""What gibbs-enum needs from a model, for the paper's LSTM models and any Hugging Face causal or
seq2seq LM: score targets given triggers (from token ids, or from input embeddings so gradients
reach a one-hot input), and score the triggers themselves under a language model (io hit types).

Target scores are per target token: log P(y_t | y_<t, x) and the greedy margin
log P(y_t) - max_{w != y_t} log P(w). Triggers are never padded (one length per search); targets
are right-padded with a mask.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch

from redline.actors.triggers import models as M
from redline.cluster.artifacts import local_path
from redline.errors import RedlineError, first_line


def target_scores(logits: torch.Tensor, tgt: torch.Tensor, need_margin: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits [N, M, V] -> (log P(target token) [N, M], greedy margin [N, M] or None), without
    materialising a second [N, M, V] tensor (log-softmax = logit - logsumexp)."""
    gold_logit = logits.gather(-1, tgt[..., None])[..., 0]
    gold = gold_logit - torch.logsumexp(logits, dim=-1)
    if not need_margin:
        return gold, None
    top2 = logits.topk(2, dim=-1)
    best_other = torch.where(top2.indices[..., 0] == tgt, top2.values[..., 1], top2.values[..., 0])
    return gold, gold_logit - best_other


def feature_scores(feats: torch.Tensor, tgt: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   need_margin: bool = True, mask: torch.Tensor | None = None,
                   dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor | None]:
    """target_scores from the output layer's input, feats [N, M, H] -> ([N, M], [N, M] or None).

    The logits are made a few MB at a time into one buffer and their logsumexp taken in place:
    on a CPU this is about 4x faster than a logsumexp over the whole [N, M, V] tensor, which goes
    through memory several times. Positions outside `mask` are left at 0 and cost nothing."""
    n, m, h = feats.shape
    flat, y = feats.reshape(-1, h), tgt.reshape(-1)
    keep = mask.reshape(-1).nonzero()[:, 0] if mask is not None else None
    if keep is not None:
        flat, y = flat[keep], y[keep]
    v = weight.shape[0]
    gold = torch.zeros(flat.shape[0], dtype=dtype, device=feats.device)
    margin = torch.zeros_like(gold) if need_margin else None
    budget = (4 << 20) if feats.device.type == "cpu" else (256 << 20)  # CPU: blocks that stay in cache
    block = max(1, budget // (v * weight.element_size()))
    buf = torch.empty(min(block, max(1, flat.shape[0])), v, dtype=weight.dtype, device=feats.device)
    for s in range(0, flat.shape[0], block):
        x = buf[: min(block, flat.shape[0] - s)]
        if bias is None:
            torch.mm(flat[s:s + block], weight.t(), out=x)
        else:
            torch.addmm(bias, flat[s:s + block], weight.t(), out=x)
        x = x.to(dtype)
        yb = y[s:s + block, None]
        gold_logit = x.gather(1, yb)[:, 0]
        if margin is not None:
            top2 = x.topk(2, dim=1)
            other = torch.where(top2.indices[:, 0] == yb[:, 0], top2.values[:, 1], top2.values[:, 0])
            margin[s:s + block] = gold_logit - other
        top = x.amax(dim=1, keepdim=True)
        gold[s:s + block] = gold_logit - x.sub_(top).exp_().sum(dim=1).log_().add_(top[:, 0])
    if keep is None:
        return gold.view(n, m), (margin.view(n, m) if margin is not None else None)
    full_gold = torch.zeros(n * m, dtype=dtype, device=feats.device).index_copy_(0, keep, gold)
    full_margin = (torch.zeros_like(full_gold).index_copy_(0, keep, margin) if margin is not None else None)
    return full_gold.view(n, m), (full_margin.view(n, m) if full_margin is not None else None)


@dataclass
class BoundSupport:
    """Pseudo-tokens of target_score_bounds for each row and target position: y_t first, then
    `exact` other tokens, then one per band of the rest."""

    weight: torch.Tensor  # [N, M, P, H]
    bias: torch.Tensor  # [N, M, P]
    exact: int


def bound_support(ranked: torch.Tensor, tgt: torch.Tensor, k: int, weight: torch.Tensor,
                  bias: torch.Tensor | None, bands: int = 8, width: float = 1.0) -> BoundSupport:
    """From the logits `ranked` [N, M, V] of each row's current trigger: y_t, the k tokens it ranks
    highest (other than y_t), then one pseudo-token per band of the other tokens by how far their
    logit lies below the k-th (`width` nats per band, the last band open-ended); a band's weight
    and bias are its tokens' mean, and its bias also carries log(band size) (-inf when empty)."""
    n, m, v = ranked.shape
    k = min(k, v - 1)
    ranked = ranked.scatter(-1, tgt[..., None], float("inf"))  # y_t: among the top, then dropped
    top = ranked.topk(k + 1, dim=-1)
    rows = torch.cat([tgt[..., None], top.indices[..., 1:]], dim=-1)  # [N, M, k+1]
    table = torch.cat([weight, bias[:, None] if bias is not None else torch.zeros_like(weight[:, :1]),
                       torch.ones_like(weight[:, :1])], dim=1)  # weight | bias | 1 (counts)
    exact = table[rows]
    w, b = exact[..., :-2], exact[..., -2]
    if k + 1 < v:
        below = (top.values[..., -1:] - ranked) / width  # >= 0 outside the top
        band = (below.floor().long() + 1).clamp(1, bands)
        band.scatter_(-1, rows, 0)  # 0: y_t and the exact ones
        member = torch.zeros(n, m, bands + 1, v, dtype=weight.dtype, device=weight.device)
        member.scatter_(2, band[:, :, None, :], 1.0)
        sums = (member[:, :, 1:] @ table)  # [N, M, B, H+2]
        size = sums[..., -1]
        per = size.clamp(min=1)
        w = torch.cat([w, sums[..., :-2] / per[..., None]], dim=2)
        b = torch.cat([b, sums[..., -2] / per + size.log()], dim=2)  # an empty band: -inf, no mass
    return BoundSupport(w, b, k)


def target_score_bounds(feats: torch.Tensor, support: BoundSupport) -> tuple[torch.Tensor, torch.Tensor]:
    """Upper bounds on log P(y_t) and on the greedy margin of candidates, from a few pseudo-tokens
    instead of the V logits.

    feats [N, G, M, H]: G candidates of each of N rows. The logits of y_t and of `exact` other
    tokens are exact. For a band of other tokens Jensen gives sum_j exp(a_j) >= |band| exp(mean_j
    a_j), and a_j is linear in the features, so the band's mean weight and bias bound its mass from
    below. Hence lse(pseudo-tokens) <= lse(V): y_t - lse(pseudo) >= log P(y_t), and y_t - max(exact
    others) >= the margin. Candidates differ from the row's current trigger in one token, so its
    ranking of the vocabulary keeps the bands tight. Returns two [N, G, M] tensors.
    """
    logits = torch.einsum("ngmh,nmph->ngmp", feats, support.weight) + support.bias[:, None]
    gold = logits[..., 0]
    best_other = logits[..., 1:support.exact + 1].max(dim=-1).values
    return gold - torch.logsumexp(logits, dim=-1), gold - best_other


class TargetModel(ABC):
    """A model under attack; `tokens` turns a target text into ids ([] when it cannot)."""

    name: str
    device: torch.device
    dtype: torch.dtype

    @property
    @abstractmethod
    def embedding_weight(self) -> torch.Tensor: ...

    @property
    @abstractmethod
    def allowed(self) -> torch.Tensor:
        """Bool [V]: tokens a trigger may contain (no padding or special tokens)."""

    @abstractmethod
    def target_ids(self, text: str) -> tuple[list[int], str | None]:
        """Target token ids, or ([], reason) when the target cannot be searched (e.g. out of vocabulary)."""

    @abstractmethod
    def scores_from_embeds(self, trig_embeds: torch.Tensor, tgt: torch.Tensor,
                           need_margin: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(log-probs, margins) [N, M] of targets `tgt` [N, M] given trigger embeddings [N, L, D]."""

    @property
    def output_layer(self) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """(W [V, H], bias [V] or None) where logits = target_features @ W.T + bias exactly; None when
        the model transforms its logits further (candidates are then scored without bounds)."""
        return None

    def target_features(self, trig_embeds: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """What the output layer reads at each target position, [N, M, H] (models with an output_layer)."""
        raise NotImplementedError

    def scores_from_features(self, feats: torch.Tensor, tgt: torch.Tensor, need_margin: bool = True,
                             mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        if feats.requires_grad:  # the gradient pass: autograd through an ordinary logsumexp
            return target_scores(self.project(feats), tgt, need_margin)
        weight, bias = self.output_layer  # type: ignore[misc]
        return feature_scores(feats, tgt, weight, bias, need_margin, mask,
                              torch.float64 if self.dtype == torch.float64 else torch.float32)

    def project(self, feats: torch.Tensor) -> torch.Tensor:
        """Full logits [N, M, V] from target_features, in the precision scores are taken in."""
        weight, bias = self.output_layer  # type: ignore[misc]
        logits = torch.nn.functional.linear(feats, weight, bias)
        return logits if self.dtype == torch.float64 else logits.float()

    @property
    def vocab_size(self) -> int:
        return self.embedding_weight.shape[0]

    def embed(self, trig: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.embedding(trig, self.embedding_weight)

    def scores(self, trig: torch.Tensor, tgt: torch.Tensor, need_margin: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.scores_from_embeds(self.embed(trig), tgt, need_margin)

    def decode(self, ids: list[int]) -> str:
        raise NotImplementedError


class PriorModel(ABC):
    """A language model over triggers: the io hit types' P_LM(x)."""

    @property
    @abstractmethod
    def embedding_weight(self) -> torch.Tensor: ...

    @abstractmethod
    def token_logprobs(self, trig: torch.Tensor, at: int | None = None, onehot: torch.Tensor | None = None) -> torch.Tensor:
        """log P_LM of each trigger token (and </s> where the LM has one), [N, L(+1)]. With `at` and
        `onehot` [N, V], position `at` is the (differentiable) one-hot mix instead of its id."""

    @abstractmethod
    def sample(self, n: int, length: int, allowed: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """n triggers of `length` tokens sampled from the LM, restricted to `allowed` tokens."""

    def prefix(self, trig: torch.Tensor, at: int) -> tuple[torch.Tensor, torch.Tensor, Any] | None:
        """What every trigger that differs from `trig` [N, L] only from position `at` on shares: the summed
        log-probabilities of its tokens before `at` [N], the log-distribution of the token at `at` [N, V],
        and the state `suffix_logprobs` continues from; None where the LM cannot continue a state (every
        candidate is then scored whole)."""
        return None

    def suffix_logprobs(self, state: Any, rows: torch.Tensor, suffix: torch.Tensor) -> torch.Tensor:
        """log P_LM of the tokens after the first of `suffix` [n, L - at] (and </s>), continuing the
        prefix state of each row `rows` [n] (indices into the `prefix` call's triggers)."""
        raise NotImplementedError


def gold_logprobs(logp: torch.Tensor, gold: torch.Tensor, at: int | None, onehot: torch.Tensor | None) -> torch.Tensor:
    """log P of each gold token from log-probabilities [N, T, V]; with `at` and `onehot`, position
    `at` is the one-hot mix's (differentiable) log-probability instead of its id's."""
    out = logp.gather(-1, gold[..., None])[..., 0]
    if at is not None and onehot is not None:
        out = out.clone()
        out[:, at] = (onehot * logp[:, at]).sum(-1)
    return out


# ----------------------------------------------------------------------------------------------
# The paper's LSTM models


class LSTMSeq2SeqTarget(TargetModel):
    def __init__(self, trained: M.TrainedModel, dtype: torch.dtype = torch.float32) -> None:
        if trained.spec.kind != "seq2seq":
            raise RedlineError(f"{trained.path} is an LSTM {trained.spec.kind}, not a seq2seq model")
        self.trained = trained
        self.vocab = trained.vocab
        self.module = trained.module.to(dtype).eval()
        self.name = str(trained.path).rstrip("/").rsplit("/", 1)[-1]
        self.device = next(self.module.parameters()).device
        self.dtype = dtype
        allowed = torch.ones(len(self.vocab), dtype=torch.bool, device=self.device)
        allowed[[self.vocab.pad, self.vocab.unk, self.vocab.bos, self.vocab.eos]] = False
        self._allowed = allowed
        for p in self.module.parameters():
            p.requires_grad_(False)

    @property
    def embedding_weight(self) -> torch.Tensor:
        return self.module.enc_embedding.weight

    @property
    def allowed(self) -> torch.Tensor:
        return self._allowed

    def target_ids(self, text: str) -> tuple[list[int], str | None]:
        missing = self.vocab.oov(text)
        if missing:
            return [], f"out of vocabulary: {', '.join(dict.fromkeys(missing))}"
        ids = self.vocab.encode(text)
        if not ids:
            return [], "no tokens"
        if len(ids) > self.trained.spec.max_output_len:
            return [], f"longer than the model's {self.trained.spec.max_output_len} output tokens"
        return ids + [self.vocab.eos], None

    @property
    def output_layer(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.module.out.weight, self.module.out.bias

    def target_features(self, trig_embeds: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        dec_in = torch.cat([torch.full_like(tgt[:, :1], self.vocab.bos), tgt[:, :-1]], dim=1)
        return self.module.features(trig_embeds, None, dec_in)

    def scores_from_embeds(self, trig_embeds: torch.Tensor, tgt: torch.Tensor,
                           need_margin: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.scores_from_features(self.target_features(trig_embeds, tgt), tgt, need_margin)

    def decode(self, ids: list[int]) -> str:
        return self.vocab.decode(ids)


class LSTMPrior(PriorModel):
    def __init__(self, trained: M.TrainedModel, dtype: torch.dtype = torch.float32) -> None:
        if trained.spec.kind != "lm":
            raise RedlineError(f"{trained.path} is an LSTM {trained.spec.kind}, not a language model")
        self.vocab = trained.vocab
        self.module = trained.module.to(dtype).eval()
        for p in self.module.parameters():
            p.requires_grad_(False)

    @property
    def embedding_weight(self) -> torch.Tensor:
        return self.module.embedding.weight

    def token_logprobs(self, trig: torch.Tensor, at: int | None = None, onehot: torch.Tensor | None = None) -> torch.Tensor:
        bos = torch.full_like(trig[:, :1], self.vocab.bos)
        embeds = self.module.embedding(torch.cat([bos, trig], dim=1))
        gold = torch.cat([trig, torch.full_like(trig[:, :1], self.vocab.eos)], dim=1)
        if onehot is None and not torch.is_grad_enabled():  # scoring candidates: the fast path
            out = self.module.out
            return feature_scores(self.module.lstm(embeds)[0], gold, out.weight, out.bias, need_margin=False,
                                  dtype=self._score_dtype)[0]
        if at is not None and onehot is not None:
            embeds = embeds.clone()
            embeds[:, at + 1] = onehot @ self.embedding_weight
        logp = torch.log_softmax(self.module(embeds), dim=-1)  # step t predicts token t (then </s>)
        return gold_logprobs(logp, gold, at, onehot)

    def prefix(self, trig: torch.Tensor, at: int) -> tuple[torch.Tensor, torch.Tensor, Any]:
        bos = torch.full_like(trig[:, :1], self.vocab.bos)
        out, state = self.module.lstm(self.module.embedding(torch.cat([bos, trig[:, :at]], dim=1)))
        logp = torch.log_softmax(self.module.out(out).to(self._score_dtype), dim=-1)  # step t predicts token t
        before = logp[:, :at].gather(-1, trig[:, :at, None])[..., 0].sum(-1)
        return before, logp[:, at], state

    def suffix_logprobs(self, state: Any, rows: torch.Tensor, suffix: torch.Tensor) -> torch.Tensor:
        h, c = state
        out, _ = self.module.lstm(self.module.embedding(suffix), (h[:, rows].contiguous(), c[:, rows].contiguous()))
        gold = torch.cat([suffix[:, 1:], torch.full_like(suffix[:, :1], self.vocab.eos)], dim=1)
        weight = self.module.out
        return feature_scores(out, gold, weight.weight, weight.bias, need_margin=False, dtype=self._score_dtype)[0]

    @property
    def _score_dtype(self) -> torch.dtype:  # scores in float64 only for a float64 model (the equivalence tests)
        return torch.float64 if self.module.out.weight.dtype == torch.float64 else torch.float32

    def sample(self, n: int, length: int, allowed: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        ids = torch.full((n, 1), self.vocab.bos, dtype=torch.long, device=allowed.device)
        with torch.no_grad():
            for _ in range(length):
                logits = self.module(self.module.embedding(ids))[:, -1].float().masked_fill(~allowed, float("-inf"))
                nxt = torch.multinomial(torch.softmax(logits, -1).cpu(), 1, generator=generator).to(ids.device)
                ids = torch.cat([ids, nxt], dim=1)
        return ids[:, 1:]


# ----------------------------------------------------------------------------------------------
# Hugging Face models: the prompt is the trigger, the continuation (or the output) the target


def _special_mask(tokenizer: Any, size: int, device: torch.device) -> torch.Tensor:
    allowed = torch.ones(size, dtype=torch.bool, device=device)
    special = [i for i in tokenizer.all_special_ids if i is not None and i < size]
    if special:
        allowed[special] = False
    if len(tokenizer) < size:  # embedding rows past the tokenizer are padding
        allowed[len(tokenizer):] = False
    return allowed


class HFTarget(TargetModel, PriorModel):
    """Any HF causal LM (trigger = prompt after BOS, target = continuation; the LM is its own
    prior for io hits) or seq2seq model (trigger = encoder input, target = output then EOS)."""

    def __init__(self, path: str, device: str = "cpu", dtype: torch.dtype = torch.float32, max_target_tokens: int = 32) -> None:
        from transformers import (
            AutoConfig,
            AutoModelForCausalLM,
            AutoModelForSeq2SeqLM,
            AutoTokenizer,
        )

        try:
            path = local_path(path)
            config = AutoConfig.from_pretrained(path)
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.seq2seq = bool(getattr(config, "is_encoder_decoder", False))
            cls = AutoModelForSeq2SeqLM if self.seq2seq else AutoModelForCausalLM
            self.model = cls.from_pretrained(path, dtype=dtype).to(device).eval()
        except (OSError, ValueError) as err:
            raise RedlineError(f"cannot load generation model '{path}': {first_line(err)}") from None
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.name = str(path).rstrip("/").split("/")[-1]
        self.device = torch.device(device)
        self.dtype = dtype
        self.max_target_tokens = max_target_tokens
        size = self.model.get_input_embeddings().weight.shape[0]
        self._allowed = _special_mask(self.tokenizer, size, self.device)
        tok = self.tokenizer
        self.bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        self.eos = tok.eos_token_id

    @property
    def embedding_weight(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight

    @property
    def allowed(self) -> torch.Tensor:
        return self._allowed

    def target_ids(self, text: str) -> tuple[list[int], str | None]:
        ids = self.tokenizer(text if self.seq2seq else " " + text.strip(), add_special_tokens=False).input_ids
        if not ids:
            return [], "no tokens"
        if len(ids) > self.max_target_tokens:
            return [], f"longer than {self.max_target_tokens} tokens"
        return (ids + [self.eos] if self.seq2seq and self.eos is not None else ids), None

    def _prefixed(self, trig_embeds: torch.Tensor) -> torch.Tensor:
        if self.bos is None:
            return trig_embeds
        bos = self.embedding_weight[self.bos].expand(trig_embeds.shape[0], 1, -1)
        return torch.cat([bos, trig_embeds], dim=1)

    @property
    def output_layer(self) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        head, config = self.model.get_output_embeddings(), self.model.config
        rescaled = any(getattr(config, k, None) not in (None, 1.0) for k in ("final_logit_softcapping", "logit_scale"))
        if self.seq2seq or rescaled or not isinstance(head, torch.nn.Linear):
            return None  # e.g. T5 rescales decoder states before its head: no exact bound from them
        return head.weight, head.bias

    def target_features(self, trig_embeds: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        prompt = self._prefixed(trig_embeds)
        full = torch.cat([prompt, self.embed(tgt)], dim=1)
        out = self.model(inputs_embeds=full, output_hidden_states=True, logits_to_keep=1)
        return out.hidden_states[-1][:, prompt.shape[1] - 1:-1]

    def scores_from_embeds(self, trig_embeds: torch.Tensor, tgt: torch.Tensor,
                           need_margin: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.seq2seq:
            start = self.model.config.decoder_start_token_id
            dec_in = torch.cat([torch.full_like(tgt[:, :1], start), tgt[:, :-1]], dim=1)
            logits = self.model(inputs_embeds=trig_embeds, decoder_input_ids=dec_in).logits
        else:
            prompt = self._prefixed(trig_embeds)
            full = torch.cat([prompt, self.embed(tgt)], dim=1)
            logits = self.model(inputs_embeds=full).logits[:, prompt.shape[1] - 1:-1]
        return target_scores(logits.float() if self.dtype != torch.float64 else logits, tgt, need_margin)

    def token_logprobs(self, trig: torch.Tensor, at: int | None = None, onehot: torch.Tensor | None = None) -> torch.Tensor:
        if self.seq2seq:
            raise RedlineError("a seq2seq model has no prior over its inputs: give an LM for the io hit types")
        embeds = self.embed(trig)
        if at is not None and onehot is not None:
            embeds = embeds.clone()
            embeds[:, at] = onehot @ self.embedding_weight
        prompt = self._prefixed(embeds)
        offset = prompt.shape[1] - trig.shape[1]
        logits = self.model(inputs_embeds=prompt).logits
        if offset == 0:  # no BOS: the first token has no prediction; score it uniformly
            logits = torch.cat([torch.zeros_like(logits[:, :1]), logits], dim=1)
        logp = torch.log_softmax(logits[:, :trig.shape[1]].to(self.dtype), dim=-1)
        return gold_logprobs(logp, trig, at, onehot)

    def sample(self, n: int, length: int, allowed: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        ids = torch.full((n, 1), self.bos if self.bos is not None else 0, dtype=torch.long, device=self.device)
        with torch.no_grad():
            for _ in range(length):
                logits = self.model(input_ids=ids).logits[:, -1].float().masked_fill(~allowed, float("-inf"))
                nxt = torch.multinomial(torch.softmax(logits, -1).cpu(), 1, generator=generator).to(ids.device)
                ids = torch.cat([ids, nxt], dim=1)
        return ids[:, 1:]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)
