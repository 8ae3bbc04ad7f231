"""Build small BERT-style classifiers from scratch in seconds on a CPU, with no hub download.

A WordPiece tokenizer is trained on the corpus with `tokenizers`, a few-layer BERT is trained on
the labels, and both are saved with `save_pretrained`, so the result loads through exactly the same
hub-id-or-directory path (`AutoTokenizer` / `AutoModelForSequenceClassification`) as a hub model.
Tests and the quickstart use these; nothing here is a stand-in for the loading code.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redline.actors.hf_loading import save_model
from redline.errors import RedlineError

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def train_wordpiece_tokenizer(texts: Sequence[str], vocab_size: int = 4000, model_max_length: int = 128):
    """A lower-casing BERT-style WordPiece tokenizer trained on `texts`, as a transformers tokenizer.

    tokenizers' WordPieceTrainer picks a different vocabulary on every run (it breaks ties between
    merges by ids handed out in hash order), and a tiny model that changes with each build makes
    figures and tests irreproducible. So the merges come from its BPE trainer without a prefix
    (deterministic), and the WordPiece vocabulary is the pieces BPE splits the corpus words into
    ("##" on the non-initial ones) by frequency, ties by spelling, plus every character in both forms.
    """
    from collections import Counter

    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    normalizer, pre_tokenizer = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.normalizer, bpe.pre_tokenizer = normalizer, pre_tokenizer
    # show_progress=False: off a terminal its bars print only blank lines
    bpe.train_from_iterator(texts, trainer=trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                                               show_progress=False))
    pieces: Counter[str] = Counter()
    for text in texts:
        for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)):
            split = [t.value for t in bpe.model.tokenize(word)]
            pieces.update(split[:1] + ["##" + p for p in split[1:]])
    chars = sorted({c for piece in pieces for c in piece.removeprefix("##")})
    vocab = SPECIAL_TOKENS + chars + ["##" + c for c in chars]
    known = set(vocab)
    ranked = sorted((p for p in pieces if p not in known), key=lambda p: (-pieces[p], p))
    vocab += ranked[:max(0, vocab_size - len(vocab))]
    tok = Tokenizer(models.WordPiece(vocab={t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer, tok.decoder = normalizer, pre_tokenizer, decoders.WordPiece()
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]", model_max_length=model_max_length,
    )


def length_batches(lengths: Sequence[int], batch_size: int, window: int = 16) -> list[list[int]]:
    """One epoch's batches of indices: shuffled, then sorted by length within windows of `window`
    batches, so each batch holds texts of about one length (little padding: ~1.5x faster steps on
    tweets) while the epochs still differ; the batches come in shuffled order. Uses `random`."""
    order = random.sample(range(len(lengths)), len(lengths))
    batches = []
    for start in range(0, len(order), batch_size * window):
        part = sorted(order[start:start + batch_size * window], key=lengths.__getitem__)
        batches += [part[k:k + batch_size] for k in range(0, len(part), batch_size)]
    random.shuffle(batches)
    return batches


def _padded(rows: Sequence[Sequence[int]], pad_id: int) -> dict[str, Any]:
    """input_ids and attention_mask tensors of pre-tokenized rows, right-padded to the longest."""
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, :len(r)] = 1
    return {"input_ids": ids, "attention_mask": mask}


@dataclass(frozen=True)
class TinyBert:
    """A tiny BERT's shape and how it is trained."""

    vocab_size: int = 4000
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2
    max_length: int = 64
    epochs: int = 4
    batch_size: int = 32
    learning_rate: float = 2e-3
    seed: int = 0


def build_tiny_classifier(texts: Sequence[str], labels: Sequence[int] | Sequence[Sequence[int]], out_dir: str | Path,
                          *, label_names: Sequence[str] = ("benign", "toxic"), multi_label: bool = False,
                          spec: TinyBert = TinyBert()) -> Path:
    """Train and save a tiny BERT sequence classifier of `spec`'s shape; returns the directory.

    `labels` are class indices into `label_names`, or for `multi_label` one 0/1 vector per text.
    """
    vocab_size, hidden_size, num_layers, num_heads, max_length = (
        spec.vocab_size, spec.hidden_size, spec.num_layers, spec.num_heads, spec.max_length)
    epochs, batch_size, learning_rate, seed = spec.epochs, spec.batch_size, spec.learning_rate, spec.seed
    import torch
    from transformers import BertConfig, BertForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    if len(texts) != len(labels) or not texts:
        raise RedlineError("tiny classifier: need the same, non-zero number of texts and labels")
    random.seed(seed)
    torch.manual_seed(seed)
    out = Path(out_dir)
    tokenizer = train_wordpiece_tokenizer(texts, vocab_size=vocab_size, model_max_length=max_length)
    id2label = dict(enumerate(label_names))
    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, intermediate_size=hidden_size * 4, max_position_embeddings=max_length + 2,
        num_labels=len(label_names), id2label=id2label, label2id={v: k for k, v in id2label.items()},
        problem_type="multi_label_classification" if multi_label else "single_label_classification",
        pad_token_id=tokenizer.pad_token_id,
    )
    model = BertForSequenceClassification(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.01)
    encoded = tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]
    lengths = [len(ids) for ids in encoded]
    model.train()
    for epoch in range(epochs):
        total = 0.0
        for idx in length_batches(lengths, batch_size):
            enc = _padded([encoded[i] for i in idx], tokenizer.pad_token_id)
            target = torch.tensor([labels[i] for i in idx], dtype=torch.float32 if multi_label else torch.long)
            loss = model(**enc, labels=target).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(idx)
        log.info("tiny classifier epoch %d: loss %.4f", epoch + 1, total / len(texts))
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "redline_build.json").write_text(json.dumps(
        {"builder": "tiny_classifier", "rows": len(texts), "labels": list(label_names), "epochs": epochs,
         "hidden_size": hidden_size, "num_layers": num_layers, "vocab_size": len(tokenizer)}, indent=2))
    return out


def build_tiny_mlm(texts: Sequence[str], out_dir: str | Path, *, vocab_size: int = 2000, hidden_size: int = 64,
                   num_layers: int = 2, max_length: int = 64, epochs: int = 3, batch_size: int = 32,
                   learning_rate: float = 2e-3, seed: int = 0) -> Path:
    """Train and save a tiny BERT fill-mask model (15% masking), loadable by AutoModelForMaskedLM."""
    import torch
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        DataCollatorForLanguageModeling,
    )
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if not texts:
        raise RedlineError("tiny MLM: need some texts")
    random.seed(seed)
    torch.manual_seed(seed)
    tokenizer = train_wordpiece_tokenizer(texts, vocab_size=vocab_size, model_max_length=max_length)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=num_layers,
                        num_attention_heads=2, intermediate_size=hidden_size * 4, max_position_embeddings=max_length + 2,
                        pad_token_id=tokenizer.pad_token_id)
    model = BertForMaskedLM(config)
    collate = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    encoded = tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]
    lengths = [len(ids) for ids in encoded]
    model.train()
    for _ in range(epochs):
        for idx in length_batches(lengths, batch_size):
            batch = collate([{"input_ids": encoded[i]} for i in idx])
            loss = model(**batch).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def train_bpe_tokenizer(texts: Sequence[str], vocab_size: int = 2000, model_max_length: int = 256):
    """A byte-level BPE tokenizer (GPT-2 style) trained on `texts`, with <pad>, <s>, </s> and <unk>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", model_max_length=model_max_length)


def _gpt2(config: Any) -> Any:
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel(config)
    # transformers finds the loss by class name, which "GPT2LMHeadModel" does not carry: without this
    # it warns on the first training step (and uses this very loss)
    model.loss_type = "ForCausalLM"
    return model


def _train_lm(model, batches, epochs: int, learning_rate: float) -> None:
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    model.train()
    for _ in range(epochs):
        for batch in batches():
            loss = model(**batch).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()


def build_tiny_causal_lm(texts: Sequence[str | Sequence[str]], out_dir: str | Path, *, chat_template: str | None = None,
                         vocab_size: int = 2000, hidden_size: int = 64, num_layers: int = 2, max_length: int = 128,
                         epochs: int = 2, batch_size: int = 16, learning_rate: float = 3e-3, seed: int = 0) -> Path:
    """Train and save a tiny GPT-2 (DialoGPT-style: turns end with the EOS token) on `texts`,
    loadable by AutoModelForCausalLM; a text given as a sequence of turns (context, response) is one
    dialogue, so the model learns to answer after the EOS a prompt ends with; `chat_template` is
    stored with the tokenizer when given."""
    import torch
    from transformers import GPT2Config

    if not texts:
        raise RedlineError("tiny causal LM: need some texts")
    random.seed(seed)
    torch.manual_seed(seed)
    dialogues = [[t] if isinstance(t, str) else list(t) for t in texts]
    tokenizer = train_bpe_tokenizer([turn for d in dialogues for turn in d], vocab_size=vocab_size,
                                    model_max_length=max_length)
    if chat_template:
        tokenizer.chat_template = chat_template
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=max_length * 2, n_embd=hidden_size, n_layer=num_layers,
                        n_head=2, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id)
    model = _gpt2(config)
    lines = ["".join(turn + tokenizer.eos_token for turn in d) for d in dialogues]

    encoded = tokenizer(lines, truncation=True, max_length=max_length)["input_ids"]
    lengths = [len(ids) for ids in encoded]

    def batches():
        for idx in length_batches(lengths, batch_size):
            enc = _padded([encoded[i] for i in idx], tokenizer.pad_token_id)
            labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
            yield {**enc, "labels": labels}

    _train_lm(model, batches, epochs, learning_rate)
    return save_model(model, tokenizer, out_dir)


def build_tiny_seq2seq(pairs: Sequence[tuple[str, str]], out_dir: str | Path, *, vocab_size: int = 2000,
                       hidden_size: int = 64, num_layers: int = 2, max_length: int = 128, epochs: int = 2,
                       batch_size: int = 16, learning_rate: float = 3e-3, seed: int = 0) -> Path:
    """Train and save a tiny BART (Blenderbot-style encoder-decoder) on (context, response) pairs,
    loadable by AutoModelForSeq2SeqLM."""
    import torch
    from transformers import BartConfig, BartForConditionalGeneration

    if not pairs:
        raise RedlineError("tiny seq2seq: need some (context, response) pairs")
    random.seed(seed)
    torch.manual_seed(seed)
    tokenizer = train_bpe_tokenizer([t for p in pairs for t in p], vocab_size=vocab_size, model_max_length=max_length)
    config = BartConfig(vocab_size=len(tokenizer), d_model=hidden_size, encoder_layers=num_layers,
                        decoder_layers=num_layers, encoder_attention_heads=2, decoder_attention_heads=2,
                        encoder_ffn_dim=hidden_size * 4, decoder_ffn_dim=hidden_size * 4,
                        max_position_embeddings=max_length, pad_token_id=tokenizer.pad_token_id,
                        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                        decoder_start_token_id=tokenizer.eos_token_id, forced_eos_token_id=tokenizer.eos_token_id)
    model = BartForConditionalGeneration(config)

    contexts = tokenizer([c for c, _ in pairs], truncation=True, max_length=max_length)["input_ids"]
    lengths = [len(ids) for ids in contexts]

    def batches():
        for idx in length_batches(lengths, batch_size):
            chunk = [pairs[i] for i in idx]
            enc = tokenizer([c for c, _ in chunk], padding=True, truncation=True, max_length=max_length,
                            return_tensors="pt")
            target = tokenizer([r + tokenizer.eos_token for _, r in chunk], padding=True, truncation=True,
                               max_length=max_length, return_tensors="pt")["input_ids"]
            yield {**enc, "labels": target.masked_fill(target == tokenizer.pad_token_id, -100)}

    _train_lm(model, batches, epochs, learning_rate)
    return save_model(model, tokenizer, out_dir)


def build_tiny_judge_lm(texts: Sequence[str], labels: Sequence[int], template: str, out_dir: str | Path, *,
                        vocab_size: int = 1500, hidden_size: int = 64, num_layers: int = 2, epochs: int = 80,
                        batch_size: int = 8, learning_rate: float = 1e-3, seed: int = 0) -> Path:
    """A tiny GPT-2 that answers `template` (a few-shot judge prompt with {text}) with " Yes" (label 1)
    or " No": trained on the answer token only, so it works as an LLM judge behind the OpenAI API
    without any download. A stand-in for a real LLM in the quickstart, served by the same code."""
    import torch
    from transformers import GPT2Config

    if len(texts) != len(labels) or not texts:
        raise RedlineError("tiny judge: need the same, non-zero number of texts and labels")
    random.seed(seed)
    torch.manual_seed(seed)
    prompts = [template.replace("{text}", t) for t in texts]
    tokenizer = train_bpe_tokenizer(list(texts) + [template] * 4 + [" Yes", " No"], vocab_size=vocab_size,
                                    model_max_length=1024)
    longest = max(len(tokenizer(p)["input_ids"]) for p in prompts) + 4
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=max(longest * 2, 256), n_embd=hidden_size,
                        n_layer=num_layers, n_head=2, bos_token_id=tokenizer.bos_token_id,
                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = _gpt2(config)
    tokenizer.padding_side = "left"
    answers = [" Yes" if y else " No" for y in labels]

    def batches():
        order = random.sample(range(len(prompts)), len(prompts))
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            full = [prompts[i] + answers[i] + tokenizer.eos_token for i in idx]
            enc = tokenizer(full, padding=True, return_tensors="pt")
            target = torch.full_like(enc["input_ids"], -100)
            for row, i in enumerate(idx):  # learn the answer and the end of turn, not the prompt
                n_answer = len(tokenizer(answers[i] + tokenizer.eos_token)["input_ids"])
                target[row, -n_answer:] = enc["input_ids"][row, -n_answer:]
            yield {**enc, "labels": target}

    _train_lm(model, batches, epochs, learning_rate)
    tokenizer.padding_side = "right"
    # Served behind /v1/chat/completions: the user's message is the prompt, verbatim.
    tokenizer.chat_template = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
    return save_model(model, tokenizer, out_dir)
