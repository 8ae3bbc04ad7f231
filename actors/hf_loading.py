"""What every Hugging Face model loader shares: where the model runs and in which precision."""

from __future__ import annotations

from typing import Any


def device_and_dtype(device: str, dtype: str, num_gpus: float) -> tuple[Any, Any]:
    """`auto` device: cuda when this actor was given a GPU; `auto` dtype: float16 on GPU, float32 on CPU."""
    import torch

    dev = torch.device(("cuda" if torch.cuda.is_available() and num_gpus > 0 else "cpu") if device == "auto" else device)
    dt = {"auto": torch.float16 if dev.type == "cuda" else torch.float32,
          "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    return dev, dt


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def save_model(model: Any, tokenizer: Any, out_dir: Any) -> Any:
    """`save_pretrained` both into `out_dir` (created); returns it as a Path."""
    from pathlib import Path

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
