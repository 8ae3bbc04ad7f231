"""The embedded-default main job: a bundled sample, offline detectors, local Ray and local files."""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path

from redline.cluster.config import AttackConfig, ScoreConfig, validate_config

SAMPLES = resources.files("redline.pipelines") / "samples"

# Words a moderation team might start a keyword list with; a deliberately crude baseline.
QUICKSTART_KEYWORDS = ["idiot", "moron", "stupid", "loser", "fuck", "shit", "bitch", "bastard", "dumbass",
                       "trash", "garbage"]


def sample_path(name: str) -> Path:
    return Path(str(SAMPLES / name))


def quickstart_model(models_dir: Path) -> Path:
    """The tiny classifier trained on the bundled train split; rebuilt only when the sample changes."""
    from redline.actors.tiny_models import build_tiny_classifier
    from redline.cluster.config import CorpusConfig
    from redline.pipelines.corpora import read_corpus

    train = sample_path("toxic_sample_train.csv")
    digest = hashlib.sha256(train.read_bytes()).hexdigest()[:10]
    out = models_dir / f"tiny-toxic-bert-{digest}"
    if (out / "config.json").is_file() and (out / "redline_build.json").is_file():
        return out
    table = read_corpus(CorpusConfig(path=str(train), text_column="text", label_column="label",
                                     toxic_values=["toxic"], split="train", dataset="redline-sample"))
    rows = [r for r in table.to_pylist() if r["status"] == "ok"]
    return build_tiny_classifier([r["text"] for r in rows], [r["label"] for r in rows], out, epochs=30,
                                 hidden_size=32, num_layers=1, vocab_size=600)


def quickstart_config(output: str, model_dir: Path) -> ScoreConfig:
    data = {
        "corpus": {"path": str(sample_path("toxic_sample_test.csv")), "text_column": "text", "label_column": "label",
                   "toxic_values": ["toxic"], "dataset": "redline-sample", "split": "test"},
        "detectors": [
            {"name": "profanity-check", "kind": "profanity-check", "batch_size": 512, "num_cpus": 0.5},
            {"name": "tiny-bert", "kind": "hf", "model": str(model_dir), "batch_size": 32, "num_cpus": 0.5},
            {"name": "keywords", "kind": "keywords", "patterns": QUICKSTART_KEYWORDS, "num_cpus": 0.25},
        ],
        "output": output,
        "run_name": "quickstart-" + hashlib.sha256(json.dumps(str(model_dir)).encode()).hexdigest()[:8],
        "shard_size": 20,
    }
    return validate_config(ScoreConfig, data, source="quickstart")  # type: ignore[return-value]


def quickstart_attack_config(output: str) -> AttackConfig:
    """Three recipes against profanity-check on the bundled sample, toxic and benign seeds."""
    corpus = {"text_column": "text", "label_column": "label", "toxic_values": ["toxic"], "dataset": "redline-sample"}
    data = {
        "corpus": [{**corpus, "path": str(sample_path("toxic_sample_train.csv")), "split": "train"},
                   {**corpus, "path": str(sample_path("toxic_sample_test.csv")), "split": "test"}],
        "victim": {"name": "profanity-check", "kind": "profanity-check", "batch_size": 4096},
        "recipes": ["deepwordbug", "pwws", {"name": "toxictrap-embedding-unk", "query_budget": 500}],
        "goals": ["tae", "bae"],
        "actors": 2, "num_cpus": 0.5, "batch_size": 32, "shard_size": 100,
        "output": output, "run_name": "quickstart-attack",
    }
    return validate_config(AttackConfig, data, source="quickstart attack")  # type: ignore[return-value]
