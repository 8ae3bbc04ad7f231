"""Training the LSTM seq2seq and LM on dialogue pairs, with the paper's SGD schedule by default,
and the thresholds the hit types need: T_out (T_in) = the model's average per-word
log-likelihood on held-out data, </s> included."""

from __future__ import annotations

import math
import random
import time
from typing import Any, Literal

import torch
from pydantic import Field
from torch import nn

from redline.actors.triggers import models as M
from redline.actors.triggers.pairs import Pair, PairCorpusConfig, read_pairs, split
from redline.actors.triggers.vocab import Vocab
from redline.cluster import storage
from redline.cluster.artifacts import local_output
from redline.cluster.config import Execution, Result, SafeName, Strict
from redline.cluster.devices import placement
from redline.cluster.progress import progress_bar
from redline.errors import RedlineError

Example = tuple[list[int], list[int]]


class TriggerModelTrainConfig(Strict):
    """`redline train seq2seq` / `redline train lm`: the paper's LSTM dialogue models."""

    pairs: PairCorpusConfig
    test_pairs: PairCorpusConfig | None = Field(None, description="Held-out pairs; default: a seeded 10% of `pairs`.")
    vocab_size: int = Result(10_000, gt=4, description="The N most frequent words (plus <pad> <unk> <s> </s>).")
    max_input_len: int = Result(15, gt=0)
    max_output_len: int = Result(20, gt=0)
    context: Literal["last-h", "attention"] = Result(
        "attention", description="seq2seq only: the decoder's context vector.")
    context_feed: Literal["combine", "input"] = Result(
        "combine", description="seq2seq only: where the context enters the decoder — combine: mixed with the "
                               "decoder LSTM's output, tanh(W[c;h]) (Luong); input: concatenated with the word "
                               "embedding at the decoder's input (the paper's architecture).")
    embedding_dim: int = Result(300, gt=0)
    hidden_dim: int = Result(600, gt=0)
    layers: int = Result(1, gt=0)
    dropout: float = Result(0.3, ge=0, lt=1)
    optimizer: Literal["sgd", "adam"] = Result("sgd", description="sgd: the paper's schedule (lr 1, halved when "
                                                                 "validation loss stops improving, gradient clipping).")
    learning_rate: float = Result(1.0, gt=0)
    lr_decay: float = Result(0.5, gt=0, le=1)
    clip: float = Result(5.0, gt=0)
    epochs: int = Result(10, gt=0)
    batch_size: int = Execution(64, gt=0)
    seed: int = Result(0)
    num_gpus: float = Execution(0.0, ge=0, description="Train on a GPU (1): the device policy's only input here.")
    output: str = Execution("redline-runs/models", description="Directory the model directory is written under.")
    name: SafeName = Result(None, description="Model directory name; default seq2seq-<context> or lm.")


def encode(pairs: list[Pair], vocab: Vocab, spec: M.ModelSpec) -> list[Example]:
    """Token ids per pair; pairs whose input or response has no tokens are left out."""
    out = []
    for a, b in pairs:
        x, y = vocab.encode(a, spec.max_input_len), vocab.encode(b, spec.max_output_len)
        if x and y:
            out.append((x, y))
    return out


def _pad(seqs: list[list[int]], device: torch.device) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    return torch.tensor([s + [0] * (width - len(s)) for s in seqs], device=device)


def batch_loss(module: nn.Module, batch: list[Example], vocab: Vocab, device: torch.device) -> tuple[torch.Tensor, int]:
    """Summed token NLL (</s> included) and the number of tokens."""
    if isinstance(module, M.Seq2Seq):
        enc = _pad([x for x, _ in batch], device)
        lengths = torch.tensor([len(x) for x, _ in batch], device=device)
        dec_in = _pad([[vocab.bos] + y for _, y in batch], device)
        gold = _pad([y + [vocab.eos] for _, y in batch], device)
        logits = module(module.enc_embedding(enc), lengths, dec_in)
    else:
        inputs = _pad([[vocab.bos] + x for x, _ in batch], device)
        gold = _pad([x + [vocab.eos] for x, _ in batch], device)
        logits = module(module.embedding(inputs))
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), gold.reshape(-1),
                                       ignore_index=0, reduction="sum")
    return loss, int((gold != 0).sum())


@torch.no_grad()
def evaluate(module: nn.Module, data: list[Example], vocab: Vocab, device: torch.device, batch_size: int = 256) -> float:
    """Average per-token NLL."""
    module.eval()
    total, tokens = 0.0, 0
    for start in range(0, len(data), batch_size):
        loss, n = batch_loss(module, data[start:start + batch_size], vocab, device)
        total, tokens = total + float(loss), tokens + n
    return total / max(tokens, 1)


def train(config: TriggerModelTrainConfig, kind: str) -> M.TrainedModel:
    """Trains a seq2seq or LM, saves it with its vocabulary, metrics and threshold, returns it."""
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    device = placement(config.num_gpus).torch_device
    pairs = read_pairs(config.pairs, config.seed)
    if config.test_pairs is not None:
        train_pairs, test_pairs = pairs, read_pairs(config.test_pairs, config.seed)
    else:
        train_pairs, test_pairs = split(pairs, 0.1, config.seed)
    train_pairs, valid_pairs = split(train_pairs, 0.05, config.seed + 1)
    # Both sides, for both kinds: an LM trained with the same settings shares the seq2seq's vocabulary,
    # which the io hit types need (one trigger, scored by both).
    vocab = Vocab.build([t for p in train_pairs for t in p], config.vocab_size)
    spec = M.ModelSpec(kind, len(vocab), config.embedding_dim, config.hidden_dim, config.layers, config.dropout,
                       config.context if kind == "seq2seq" else None, config.max_input_len, config.max_output_len,
                       context_feed=config.context_feed)
    data = {name: encode(p, vocab, spec) for name, p in (("train", train_pairs), ("valid", valid_pairs),
                                                         ("test", test_pairs))}
    if not data["train"] or not data["test"]:
        raise RedlineError(f"too few usable pairs to train on ({len(data['train'])} train, {len(data['test'])} test)")
    module = (M.Seq2Seq(spec) if kind == "seq2seq" else M.LanguageModel(spec)).to(device)
    lr = config.learning_rate
    opt: torch.optim.Optimizer = (torch.optim.SGD(module.parameters(), lr=lr) if config.optimizer == "sgd"
                                  else torch.optim.Adam(module.parameters(), lr=lr))
    history: list[dict[str, Any]] = []
    best = math.inf
    best_state: dict[str, torch.Tensor] | None = None
    started = time.perf_counter()
    steps = math.ceil(len(data["train"]) / config.batch_size)
    with progress_bar(f"training {kind}", total=config.epochs * steps) as advance:
        for epoch in range(config.epochs):
            module.train()
            order = list(range(len(data["train"])))
            rng.shuffle(order)
            total, tokens = 0.0, 0
            for start in range(0, len(order), config.batch_size):
                batch = [data["train"][i] for i in order[start:start + config.batch_size]]
                loss, n = batch_loss(module, batch, vocab, device)
                opt.zero_grad()
                (loss / n).backward()
                nn.utils.clip_grad_norm_(module.parameters(), config.clip)
                opt.step()
                total, tokens = total + loss.item(), tokens + n
                advance(1)
            valid = evaluate(module, data["valid"], vocab, device) if data["valid"] else total / tokens
            history.append({"epoch": epoch + 1, "lr": lr, "train_nll": round(total / tokens, 4), "valid_nll": round(valid, 4)})
            if valid < best:
                best = valid
                best_state = {k: v.detach().clone() for k, v in module.state_dict().items()}
            elif config.optimizer == "sgd":
                lr *= config.lr_decay  # the paper's schedule: halve when validation stops improving
                for group in opt.param_groups:
                    group["lr"] = lr
    if best_state is not None:
        module.load_state_dict(best_state)
    test_nll = evaluate(module, data["test"], vocab, device)
    metrics = {"train_pairs": len(data["train"]), "valid_pairs": len(data["valid"]), "test_pairs": len(data["test"]),
               "vocab_size": len(vocab), "test_nll": round(test_nll, 4), "test_ppl": round(math.exp(test_nll), 2),
               "train_s": round(time.perf_counter() - started, 1), "history": history,
               "device": str(device)}
    words = sum(len(y if kind == "seq2seq" else x) + 1 for x, y in data["test"])
    thresholds = M.Thresholds(average_logprob=-test_nll, words=words, data=config.pairs.path if config.test_pairs is None
                              else config.test_pairs.path)
    feed = "-input" if config.context_feed == "input" else ""
    name = config.name or (f"seq2seq-{config.context}{feed}" if kind == "seq2seq" else "lm")
    path = storage.join(config.output, name)
    with local_output(path) as local:
        M.save(local, module.cpu(), vocab, thresholds, metrics)
    module.eval()
    return M.TrainedModel(path, spec, vocab, module, thresholds, metrics)
