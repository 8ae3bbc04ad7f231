"""Target lists (He & Glass 2019, Section 5.2), as plain text files users can replace:

- mal: about 200 prototype malicious or insulting sentences written for redline, extended to
  about 1,000 with the paper's kind of heuristics (an interjection in front, "shut up" ->
  "oh shut up"; a softener or an exclamation after);
- normal: the model's own distinct greedy responses to test inputs (o-greedy; the paper's Ubuntu list);
- normal-sample: responses sampled word by word among words above T_out, for corpora whose greedy
  outputs are generic (o-sample-min; the paper's Switchboard and OpenSubtitles lists);
- planted: greedy responses to inputs of exactly the trigger length, so a trigger is known to exist
  (measures the search itself);
- random: 500 random sequences of up to 8 of the 1,000 most frequent words.
The lists built from inputs keep each target's source input.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, replace
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


MAX_SOURCES = 16  # inputs kept per target (the same reply to several inputs)


@dataclass(frozen=True)
class Target:
    """A target output, and the input it came from (None for lists not built from inputs); `sources`:
    every input that gave it (up to MAX_SOURCES), so a known trigger is any of them."""

    text: str
    source: str | None = None
    sources: tuple[str, ...] = ()


# Why a decoded response is no target (counted per list: `dropped`).
UNKNOWN_WORD = "the reply holds <unk> or another special token (the model's top word is none it can name)"
NO_END = "the reply has no </s> within the output length"
NO_WORDS = "the reply is empty"
DEAD_END = "no word above T_out at some step"


def normal_list(trained: M.TrainedModel, inputs: list[str], n: int = 500,
                dropped: Counter[str] | None = None) -> list[Target]:
    """The paper's normal list (Ubuntu): distinct greedy responses of the seq2seq to test inputs, up to
    `n`, never topped up; reported with o-greedy-hit. `dropped` counts the replies left out, by why."""
    return _distinct(decode(trained, inputs, "greedy", dropped=dropped), n)


def normal_sample_list(trained: M.TrainedModel, inputs: list[str], n: int = 500, rounds: int = 5,
                       seed: int = 0, dropped: Counter[str] | None = None) -> list[Target]:
    """The paper's normal list where greedy outputs are generic (Switchboard, OpenSubtitles):
    responses sampled word by word only among words whose log-probability exceeds T_out, so every
    word clears it under the source input; reported with o-sample-min-1-hit."""
    if trained.thresholds is None:
        raise ValueError("normal-sample needs the model's T_out (stored by `redline train seq2seq`)")
    out: list[Target] = []
    for r in range(rounds):
        out = _distinct(out + decode(trained, inputs, "above-t-out", seed=seed + r,
                                     t_out=trained.thresholds.average_logprob, dropped=dropped), n)
        if len(out) >= n:
            break
    return out


def planted_list(trained: M.TrainedModel, inputs: list[str], length: int, n: int = 200, top: int = 1000,
                 seed: int = 0, dropped: Counter[str] | None = None) -> list[Target]:
    """Targets a trigger of `length` words is known to reach: greedy outputs of held-out inputs cut to
    `length` words, and of random sequences of frequent words (half each)."""
    vocab = trained.vocab
    rng = random.Random(seed)
    cut = [" ".join(words[:length]) for words in (vocab_words(vocab, t) for t in inputs) if len(words) >= length]
    rng.shuffle(cut)
    frequent = [w for w in vocab.words if w not in SPECIALS][:top]
    rand = [" ".join(rng.choice(frequent) for _ in range(length)) for _ in range(n)]
    sources = list(dict.fromkeys(cut[: n // 2] + rand))
    return _distinct(decode(trained, sources, "greedy", dropped=dropped), n)


def vocab_words(vocab, text: str) -> list[str]:  # noqa: ANN001 - a Vocab
    """The in-vocabulary words of `text` as the model reads them (out-of-vocabulary words dropped)."""
    return [vocab.words[i] for i in vocab.encode(text) if i != vocab.unk]


def _distinct(targets: list[Target], n: int) -> list[Target]:
    """The first `n` distinct targets, each with the inputs of all its duplicates."""
    seen: dict[str, Target] = {}
    for t in targets:
        first = seen.setdefault(t.text, t)
        if first is not t:
            more = tuple(dict.fromkeys(first.sources + t.sources))[:MAX_SOURCES]
            seen[t.text] = replace(first, sources=more)
    return list(seen.values())[:n]


@torch.no_grad()
def decode(trained: M.TrainedModel, inputs: list[str], mode: str = "greedy", *, seed: int = 0,
           t_out: float | None = None, batch_size: int = 256, dropped: Counter[str] | None = None) -> list[Target]:
    """Responses of an LSTM seq2seq to `inputs`, decoded incrementally (the decoder's state carried
    step to step), in batches. One vocabulary rule everywhere: the argmax and the softmax run over the
    whole vocabulary, as the hit check does; a response that ends without </s> or holds a special
    token (<unk> where the model's top word is unknown) names no sentence and is left out.
    `above-t-out`: each word sampled only among words whose log-probability exceeds `t_out`.
    `dropped` counts the responses left out, by why (an input with no known word is no reply)."""
    module, vocab, spec = trained.module.eval(), trained.vocab, trained.spec
    device = next(module.parameters()).device
    pairs = [(t, ids) for t in inputs if (ids := vocab.encode(t, spec.max_input_len))]
    gen = torch.Generator().manual_seed(seed)
    out: list[Target] = []
    for start in range(0, len(pairs), batch_size):
        batch = pairs[start:start + batch_size]
        width = max(len(ids) for _, ids in batch)
        enc = torch.tensor([ids + [vocab.pad] * (width - len(ids)) for _, ids in batch], device=device)
        lengths = torch.tensor([len(ids) for _, ids in batch], device=device)
        for (source, _), (text, why) in zip(batch, _decode(module, vocab, enc, lengths, spec.max_output_len, mode, gen,
                                                           t_out)):
            if why is None:
                out.append(Target(text, source, (source,)))
            elif dropped is not None:
                dropped[why] += 1
    return out


def _decode(module: M.Seq2Seq, vocab, enc: torch.Tensor, lengths: torch.Tensor, max_len: int, mode: str,  # noqa: ANN001
            gen: torch.Generator, t_out: float | None = None) -> list[tuple[str, str | None]]:
    """Each row's reply and, when it is no target, why (None when it is one)."""
    n = enc.shape[0]
    specials = torch.tensor([vocab.pad, vocab.bos, vocab.unk], device=enc.device)
    enc_out, enc_state, mask = module.encode(module.enc_embedding(enc), lengths)
    state = None
    token = torch.full((n,), vocab.bos, dtype=torch.long, device=enc.device)
    finished = torch.zeros(n, dtype=torch.bool, device=enc.device)
    unknown = torch.zeros(n, dtype=torch.bool, device=enc.device)
    dead = torch.zeros(n, dtype=torch.bool, device=enc.device)
    steps = []
    for _ in range(max_len + 1):
        feats, state = module.decode_step(token, enc_out, enc_state, mask, state)
        logp = torch.log_softmax(module.out(feats).float(), dim=-1)
        if mode == "greedy":
            token = logp.argmax(-1)
        else:
            allowed = logp > t_out
            allowed[:, specials] = False
            dead |= ~allowed.any(-1) & ~finished
            weights = torch.where(allowed, logp.exp(), torch.zeros_like(logp))
            weights[~allowed.any(-1), vocab.eos] = 1.0  # a dead row: ends here (and is dropped)
            token = torch.multinomial(weights.cpu(), 1, generator=gen)[:, 0].to(enc.device)
        unknown |= torch.isin(token, specials) & ~finished & ~dead
        token = torch.where(finished, torch.full_like(token, vocab.pad), token)
        steps.append(token)
        finished |= token == vocab.eos
        if bool(finished.all()):
            break
    out: list[tuple[str, str | None]] = []
    for row, done, unk, stuck in zip(torch.stack(steps, 1).tolist(), finished.tolist(), unknown.tolist(),
                                     dead.tolist()):
        words = [vocab.words[i] for i in row if i not in (vocab.pad, vocab.eos)]
        why = (DEAD_END if stuck else UNKNOWN_WORD if unk else NO_END if not done else NO_WORDS if not words
               else None)
        out.append(("" if why else " ".join(words), why))
    return out
