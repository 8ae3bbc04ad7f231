"""Saving Hugging Face models (model and tokenizer together); where they run is `cluster.devices`."""

from __future__ import annotations

from typing import Any


def save_model(model: Any, tokenizer: Any, out_dir: Any) -> Any:
    """`save_pretrained` both into `out_dir` (created); returns it as a Path."""
    from pathlib import Path

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
