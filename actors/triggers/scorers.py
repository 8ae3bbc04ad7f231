"""What gibbs-enum needs from a model, for the paper's LSTM models and any Hugging Face causal or
seq2seq LM: score targets given triggers (from token ids, or from input embeddings so gradients
reach a one-hot input), and score the triggers themselves under a language model (io hit types).

Target scores are per target token: log P(y_t | y_<t, x) and the greedy margin
log P(y_t) - max_{w != y_t} log P(w). Triggers are never padded (one length per search); targets
are right-padded with a mask.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from redline.actors.triggers import models as M
from redline.errors import RedlineError


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


# ----------------------------------------------------------------------------------------------
# The paper's LSTM models


class LSTMSeq2SeqTarget(TargetModel):
    def __init__(self, trained: M.TrainedModel, dtype: torch.dtype = torch.float32) -> None:
        if trained.spec.kind != "seq2seq":
            raise RedlineError(f"{trained.path} is an LSTM {trained.spec.kind}, not a seq2seq model")
        self.trained = trained
        self.vocab = trained.vocab
        self.module = trained.module.to(dtype).eval()
        self.name = trained.path.name
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

    def scores_from_embeds(self, trig_embeds: torch.Tensor, tgt: torch.Tensor,
                           need_margin: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        dec_in = torch.cat([torch.full_like(tgt[:, :1], self.vocab.bos), tgt[:, :-1]], dim=1)
        return target_scores(self.module(trig_embeds, None, dec_in), tgt, need_margin)

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
        if at is not None and onehot is not None:
            embeds = embeds.clone()
            embeds[:, at + 1] = onehot @ self.embedding_weight
        logp = torch.log_softmax(self.module(embeds), dim=-1)  # step t predicts token t (then </s>)
        gold = torch.cat([trig, torch.full_like(trig[:, :1], self.vocab.eos)], dim=1)
        out = logp.gather(-1, gold[..., None])[..., 0]
        if at is not None and onehot is not None:
            out = out.clone()
            out[:, at] = (onehot * logp[:, at]).sum(-1)
        return out

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
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

        try:
            config = AutoConfig.from_pretrained(path)
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.seq2seq = bool(getattr(config, "is_encoder_decoder", False))
            cls = AutoModelForSeq2SeqLM if self.seq2seq else AutoModelForCausalLM
            self.model = cls.from_pretrained(path, dtype=dtype).to(device).eval()
        except (OSError, ValueError) as err:
            raise RedlineError(f"cannot load generation model '{path}': {str(err).splitlines()[0]}") from None
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
        out = logp.gather(-1, trig[..., None])[..., 0]
        if at is not None and onehot is not None:
            out = out.clone()
            out[:, at] = (onehot * logp[:, at]).sum(-1)
        return out

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
