"""The paper's LSTM dialogue models (He & Glass 2019, Section 5.1) and how they are saved.

`Seq2Seq`: an LSTM encoder and an LSTM decoder started from the encoder's final state; the
decoder's context vector is either the encoder's last hidden state (`last-h`) or Luong's general
attention over the encoder outputs (`attention`). Where the context enters (`context_feed`):
`combine` mixes it in after the decoder LSTM (Luong's tanh(W[c;h]), redline's first model), `input`
concatenates it with the word embedding at the decoder's input, as the paper describes (attention
then attends from the decoder's previous state: the encoder's final state at the first step).
`LanguageModel`: an LSTM LM over the input side, which measures how likely a trigger is as an input
(the io hit types). Both read token embeddings as well as ids, which is how gibbs-enum takes
gradients with respect to one-hot inputs.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from redline.actors.triggers.vocab import Vocab
from redline.cluster import storage
from redline.cluster.artifacts import local_path
from redline.errors import RedlineError

MODEL_FILE = "redline_model.json"


@dataclass
class ModelSpec:
    kind: str  # seq2seq | lm
    vocab_size: int
    embedding_dim: int
    hidden_dim: int
    layers: int = 1
    dropout: float = 0.3
    context: str | None = None  # seq2seq: last-h | attention
    max_input_len: int = 15
    max_output_len: int = 20
    context_feed: str = "combine"  # seq2seq: combine (after the decoder LSTM) | input (the paper's)


class Seq2Seq(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        if spec.context not in ("last-h", "attention"):
            raise RedlineError(f"unknown context vector '{spec.context}' (last-h or attention)")
        if spec.context_feed not in ("combine", "input"):
            raise RedlineError(f"unknown context feed '{spec.context_feed}' (combine or input)")
        self.spec = spec
        fed = spec.context_feed == "input"
        drop = spec.dropout if spec.layers > 1 else 0.0
        self.enc_embedding = nn.Embedding(spec.vocab_size, spec.embedding_dim, padding_idx=0)
        self.dec_embedding = nn.Embedding(spec.vocab_size, spec.embedding_dim, padding_idx=0)
        self.encoder = nn.LSTM(spec.embedding_dim, spec.hidden_dim, spec.layers, batch_first=True, dropout=drop)
        self.decoder = nn.LSTM(spec.embedding_dim + (spec.hidden_dim if fed else 0), spec.hidden_dim, spec.layers,
                               batch_first=True, dropout=drop)
        self.attn = nn.Linear(spec.hidden_dim, spec.hidden_dim, bias=False)  # Luong "general": h_t^T W_a h_s
        self.combine = None if fed else nn.Linear(2 * spec.hidden_dim, spec.hidden_dim)
        self.drop = nn.Dropout(spec.dropout)
        self.out = nn.Linear(spec.hidden_dim, spec.vocab_size)

    @property
    def input_embedding(self) -> nn.Embedding:
        return self.enc_embedding

    def forward(self, enc_embeds: torch.Tensor, enc_lengths: torch.Tensor | None, dec_in: torch.Tensor) -> torch.Tensor:
        """Logits [N, M, V] for decoder inputs `dec_in` [N, M] given encoder input embeddings [N, L, D]
        (right-padded to `enc_lengths` in training; triggers are never padded)."""
        return self.out(self.drop(self.features(enc_embeds, enc_lengths, dec_in)))

    def features(self, enc_embeds: torch.Tensor, enc_lengths: torch.Tensor | None, dec_in: torch.Tensor) -> torch.Tensor:
        """What the output layer reads, [N, M, H]: logits = out(features) (dropout aside)."""
        enc_out, state, mask = self.encode(enc_embeds, enc_lengths)
        embeds = self.dec_embedding(dec_in)
        if self.combine is not None:
            dec_out, _ = self.decoder(embeds, state)
            return torch.tanh(self.combine(torch.cat([self._context(dec_out, enc_out, state, mask), dec_out], dim=-1)))
        if self.spec.context == "last-h":  # one context for every step: the whole sequence in one call
            dec_out, _ = self.decoder(torch.cat([embeds, self._context(embeds, enc_out, state, mask)], dim=-1), state)
            return dec_out
        steps, dec_state = [], state
        for t in range(embeds.shape[1]):  # attention from the previous state: one step at a time
            out, dec_state = self._fed_step(embeds[:, t:t + 1], enc_out, state, mask, dec_state)
            steps.append(out)
        return torch.cat(steps, dim=1)

    def encode(self, enc_embeds: torch.Tensor, enc_lengths: torch.Tensor | None
               ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor | None]:
        """(encoder outputs [N, L, H], the encoder's final state, the padding mask or None)."""
        if enc_lengths is None:
            enc_out, state = self.encoder(enc_embeds)
            return enc_out, state, None
        packed = nn.utils.rnn.pack_padded_sequence(enc_embeds, enc_lengths.cpu(), batch_first=True,
                                                   enforce_sorted=False)
        out, state = self.encoder(packed)
        enc_out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=enc_embeds.shape[1])
        mask = torch.arange(enc_embeds.shape[1], device=enc_embeds.device)[None, :] < enc_lengths[:, None]
        return enc_out, state, mask

    def decode_step(self, token: torch.Tensor, enc_out: torch.Tensor, enc_state: tuple[torch.Tensor, torch.Tensor],
                    mask: torch.Tensor | None, dec_state: tuple[torch.Tensor, torch.Tensor] | None = None
                    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """One decoder step for tokens [N]: (features [N, H], the decoder's state to carry)."""
        embeds = self.dec_embedding(token[:, None])
        state = enc_state if dec_state is None else dec_state
        if self.combine is None:
            out, dec_state = self._fed_step(embeds, enc_out, enc_state, mask, state)
            return out[:, 0], dec_state
        dec_out, dec_state = self.decoder(embeds, state)
        context = self._context(dec_out, enc_out, enc_state, mask)
        return torch.tanh(self.combine(torch.cat([context, dec_out], dim=-1)))[:, 0], dec_state

    def _fed_step(self, embeds: torch.Tensor, enc_out: torch.Tensor, enc_state: tuple[torch.Tensor, torch.Tensor],
                  mask: torch.Tensor | None, state: tuple[torch.Tensor, torch.Tensor]
                  ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The paper's step: [word embedding; context from the previous state] into the decoder LSTM."""
        context = self._context(state[0][-1][:, None, :], enc_out, enc_state, mask)
        return self.decoder(torch.cat([embeds, context], dim=-1), state)

    def _context(self, query: torch.Tensor, enc_out: torch.Tensor, enc_state: tuple[torch.Tensor, torch.Tensor],
                 mask: torch.Tensor | None) -> torch.Tensor:
        """The context vector for each query position [N, M, H]: attention over the encoder outputs
        from the query, or the encoder's last hidden state at every position (`last-h`)."""
        if self.spec.context == "attention":
            scores = query @ self.attn(enc_out).transpose(1, 2)  # [N, M, L]
            if mask is not None:
                scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
            return torch.softmax(scores, dim=-1) @ enc_out
        return enc_state[0][-1][:, None, :].expand(query.shape[0], query.shape[1], -1)


class LanguageModel(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        drop = spec.dropout if spec.layers > 1 else 0.0
        self.embedding = nn.Embedding(spec.vocab_size, spec.embedding_dim, padding_idx=0)
        self.lstm = nn.LSTM(spec.embedding_dim, spec.hidden_dim, spec.layers, batch_first=True, dropout=drop)
        self.drop = nn.Dropout(spec.dropout)
        self.out = nn.Linear(spec.hidden_dim, spec.vocab_size)

    @property
    def input_embedding(self) -> nn.Embedding:
        return self.embedding

    def forward(self, embeds: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.drop(embeds))
        return self.out(self.drop(out))


@dataclass
class Thresholds:
    """T_out (T_in for an LM): the model's average per-word log-likelihood on held-out data."""

    average_logprob: float
    words: int
    data: str


@dataclass
class TrainedModel:
    path: str | Path  # where it was saved (local, or s3://)
    spec: ModelSpec
    vocab: Vocab
    module: nn.Module
    thresholds: Thresholds | None
    metrics: dict[str, Any]


def save(path: Path, module: nn.Module, vocab: Vocab, thresholds: Thresholds | None,
         metrics: dict[str, Any]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    torch.save(module.state_dict(), path / "model.pt")
    vocab.save(path / "vocab.json")
    (path / MODEL_FILE).write_text(json.dumps({
        "spec": asdict(module.spec), "thresholds": asdict(thresholds) if thresholds else None, "metrics": metrics,
    }, indent=2))


def is_trigger_model(path: str | Path) -> bool:
    """A redline LSTM model directory, local or s3://."""
    if storage.is_s3(str(path)):
        return storage.exists(storage.join(str(path), MODEL_FILE))
    return (Path(path) / MODEL_FILE).is_file()


def load(path: str | Path, device: str = "cpu") -> TrainedModel:
    if not is_trigger_model(path):
        raise RedlineError(f"{path} is not a redline LSTM model directory (no {MODEL_FILE}; "
                           "train one with `redline train seq2seq` / `redline train lm`)")
    root = Path(local_path(str(path)))
    if not is_trigger_model(root):
        raise RedlineError(f"{root} is not a redline LSTM model directory (no {MODEL_FILE}; "
                           "train one with `redline train seq2seq` / `redline train lm`)")
    meta = json.loads((root / MODEL_FILE).read_text())
    spec = ModelSpec(**meta["spec"])
    module = Seq2Seq(spec) if spec.kind == "seq2seq" else LanguageModel(spec)
    module.load_state_dict(torch.load(root / "model.pt", map_location=device, weights_only=True))
    module.to(device).eval()
    thresholds = Thresholds(**meta["thresholds"]) if meta.get("thresholds") else None
    return TrainedModel(root, spec, Vocab.load(root / "vocab.json"), module, thresholds, meta.get("metrics", {}))
