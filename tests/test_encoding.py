"""The fast tokenising path gives exactly what `tokenizer(..., padding=True, truncation=True)` gives,
and the overlapped loop keeps batches in order."""

from __future__ import annotations

import numpy as np
import pytest

TEXTS = ["you idiot", "", "   ", "have a lovely day " * 40, "naïve café — 😀 ok", "a\tb\nc", "SHUT UP", "x" * 500]


@pytest.mark.parametrize("side", ["right", "left"])
def test_fast_encoding_matches_the_tokenizers_own_call(tiny_binary_model, side):
    from transformers import AutoTokenizer

    from redline.actors.encoding import TextEncoder

    tok = AutoTokenizer.from_pretrained(tiny_binary_model)
    tok.padding_side = tok.truncation_side = side
    encoder = TextEncoder(tok, max_length=16)
    assert encoder.backend is not None  # the fast path, not the fallback
    want = tok(TEXTS, padding=True, truncation=True, max_length=16, return_tensors="np")
    got = encoder(TEXTS)
    assert set(got) == {n for n in tok.model_input_names if n in want}
    for name, tensor in got.items():
        assert np.array_equal(tensor.numpy(), want[name]), name
    assert got["input_ids"].shape[1] == 16  # truncated to max_length, special tokens included


def test_a_tokenizer_without_a_fast_backend_falls_back_to_its_own_call(tiny_binary_model):
    from transformers import AutoTokenizer

    from redline.actors.encoding import TextEncoder

    tok = AutoTokenizer.from_pretrained(tiny_binary_model)
    encoder = TextEncoder(tok, max_length=8)
    encoder.backend = None
    want = tok(TEXTS, padding=True, truncation=True, max_length=8, return_tensors="np")
    assert np.array_equal(encoder(TEXTS)["input_ids"].numpy(), want["input_ids"])


def test_hf_detector_scores_match_a_plain_transformers_loop(tiny_binary_model):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from redline.actors.detectors import DetectorConfig, build_detector

    det = build_detector(DetectorConfig.model_validate(
        {"name": "t", "kind": "hf", "model": str(tiny_binary_model), "batch_size": 3, "max_length": 24}))
    got = det.predict_proba(TEXTS)
    tok = AutoTokenizer.from_pretrained(tiny_binary_model)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_binary_model).eval()
    with torch.inference_mode():
        want = [model(**tok([t], truncation=True, max_length=24, return_tensors="pt")).logits.double().softmax(-1)[0]
                .numpy() for t in TEXTS]
    assert np.allclose(got, np.array(want), atol=1e-5)


def test_overlapped_keeps_order_and_collects_one_batch_late():
    from redline.actors.encoding import overlapped

    events: list[str] = []
    out = list(overlapped(range(3), prepare=lambda b: events.append(f"prepare {b}") or b,
                          launch=lambda b: events.append(f"launch {b}") or b * 10,
                          collect=lambda r: events.append(f"collect {r // 10}") or r))
    assert out == [(0, 0), (1, 10), (2, 20)]
    # batch 1 is prepared before batch 0's result is collected: the CPU work overlaps the device's
    assert events[:4] == ["prepare 0", "launch 0", "prepare 1", "collect 0"]
