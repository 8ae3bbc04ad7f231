"""Target lists (He & Glass 2019, Section 5.2), as plain text files users can replace:

- mal: about 200 prototype malicious or insulting sentences written for redline, extended to
  about 1,000 with the paper's kind of heuristics (an interjection in front, "shut up" ->
  "oh shut up"; a softener or an exclamation after);
- normal: the model's own greedy responses to test inputs, plus sampled responses whose average
  log-likelihood is above T_out where greedy decoding is too generic;
- random: 500 random sequences of up to 8 of the 1,000 most frequent words.
"""

from __future__ import annotations

import random
from importlib import resources
from pathlib import Path

import torch

from redline.actors.triggers import models as M
from redline.actors.triggers.vocab import SPECIALS
from redline.cluster import storage

PREFIXES = ("oh", "well", "hey", "look", "honestly", "seriously", "you know", "oh well", "yeah", "no",
            "just", "man", "dude", "listen", "ok", "so", "and", "but", "really", "haha")
SUFFIXES = ("!", ".", "okay ?", "right ?", "now", "then", "too", "again", "already", "forever")


def read_list(path: str | Path) -> list[str]:
    """One target per line; blank lines and `#` comments skipped; duplicates dropped."""
    lines = storage.read_bytes(str(path)).decode("utf-8").splitlines()
    return list(dict.fromkeys(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")))


def mal_prototypes() -> list[str]:
    text = resources.files("redline.actors.triggers").joinpath("data/mal_prototypes.txt").read_text(encoding="utf-8")
    return list(dict.fromkeys(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")))


def mal_list(size: int = 1000, seed: int = 0) -> list[str]:
    """The prototypes, each with "oh" in front (the paper's example), then other heuristic variants
    in a seeded order until `size`."""
    base = mal_prototypes()
    variants = [f"{pre} {s}" for s in base for pre in PREFIXES[1:]] + [f"{s} {suf}" for s in base for suf in SUFFIXES]
    random.Random(seed).shuffle(variants)
    return list(dict.fromkeys(base + [f"oh {s}" for s in base] + variants))[:size]


def random_list(vocab_words: list[str], n: int = 500, max_len: int = 8, top: int = 1000, seed: int = 0) -> list[str]:
    """`n` sequences of 1..max_len words drawn uniformly from the `top` most frequent words."""
    words = [w for w in vocab_words if w not in SPECIALS][:top]
    rng = random.Random(seed)
    return list(dict.fromkeys(" ".join(rng.choice(words) for _ in range(rng.randint(1, max_len))) for _ in range(n)))


@torch.no_grad()
def normal_list(trained: M.TrainedModel, inputs: list[str], n: int = 500, samples: int = 3, seed: int = 0) -> list[str]:
    """Greedy responses of an LSTM seq2seq to `inputs`; when greedy decoding gives fewer than `n`
    distinct responses, sampled ones with average log-likelihood above T_out fill the list."""
    module, vocab, spec = trained.module.eval(), trained.vocab, trained.spec
    device = next(module.parameters()).device
    encoded = [ids for ids in (vocab.encode(t, spec.max_input_len) for t in inputs) if ids]
    out: dict[str, None] = {}
    gen = torch.Generator().manual_seed(seed)
    t_out = trained.thresholds.average_logprob if trained.thresholds else float("-inf")
    for mode in ["greedy"] + ["sample"] * samples:
        for start in range(0, len(encoded), 128):
            batch = encoded[start:start + 128]
            width = max(len(x) for x in batch)
            enc = torch.tensor([x + [0] * (width - len(x)) for x in batch], device=device)
            lengths = torch.tensor([len(x) for x in batch], device=device)
            for text, avg in zip(*_decode(module, vocab, enc, lengths, spec.max_output_len, mode, gen)):
                if text and (mode == "greedy" or avg >= t_out):
                    out.setdefault(text, None)
        if len(out) >= n:
            break
    return list(out)[:n]


def _decode(module: M.Seq2Seq, vocab, enc: torch.Tensor, lengths: torch.Tensor, max_len: int, mode: str,
            gen: torch.Generator) -> tuple[list[str], list[float]]:
    """Greedy or sampled decoding by re-running the decoder on the growing prefix (short outputs)."""
    n = enc.shape[0]
    ids = torch.full((n, 1), vocab.bos, dtype=torch.long, device=enc.device)
    finished = torch.zeros(n, dtype=torch.bool, device=enc.device)
    total = torch.zeros(n, device=enc.device)
    count = torch.zeros(n, device=enc.device)
    embeds = module.enc_embedding(enc)
    for _ in range(max_len + 1):
        logp = torch.log_softmax(module(embeds, lengths, ids)[:, -1].float(), dim=-1)
        logp[:, [vocab.pad, vocab.bos, vocab.unk]] = float("-inf")
        nxt = logp.argmax(-1) if mode == "greedy" else torch.multinomial(logp.exp().cpu(), 1, generator=gen)[:, 0].to(enc.device)
        step = logp.gather(1, nxt[:, None])[:, 0]
        total += torch.where(finished, torch.zeros_like(step), step)
        count += (~finished).float()
        nxt = torch.where(finished, torch.full_like(nxt, vocab.pad), nxt)
        finished |= nxt == vocab.eos
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        if bool(finished.all()):
            break
    texts = []
    for row, done in zip(ids[:, 1:].tolist(), finished.tolist()):
        words = [vocab.words[i] for i in row if i not in (vocab.pad, vocab.eos)]
        texts.append(" ".join(words) if done else "")
    return texts, (total / count.clamp(min=1)).tolist()

