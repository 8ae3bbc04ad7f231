"""redline's attack pipeline vs TextAttack 0.3.11 on the same recipes, victim and seeds, in one run.

    .venv/bin/python bench/attack_vs_textattack.py [--seeds 2000] [--recipes deepwordbug,pwws]
        [--victims profanity-check,tiny-bert] [--textattack-python bench/.textattack-venv/bin/python]

Victims: profanity-check, and a tiny BERT trained here on 4,000 Davidson tweets that are not seeds.
Seeds: Davidson toxic tweets that the victim flags as toxic; goal: make it say benign
(TextAttack: TargetedClassification to class 0). TextAttack runs in its own environment
(create it with: python3 -m venv bench/.textattack-venv && bench/.textattack-venv/bin/pip install
torch==2.13.0 textattack==0.3.11 'transformers<5' alt-profanity-check). Timings: redline's wall
seconds include actor start-up and writing the run directory, not Ray's own start-up; TextAttack's
include building its attack. Prints one JSON object per figure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("REDLINE_PROGRESS", "0")

HERE = Path(__file__).resolve().parent
DEFAULT_CORPUS = HERE.parents[1] / "shared" / "data" / "offensive_tweet" / "labeled_data.csv"


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def textattack_env(work: Path) -> dict[str, str]:
    """nltk data TextAttack imports offline: our stopword list and the WordNet redline prepared."""
    from redline.actors.attack.resources import STOPWORDS, nltk_data_dir, wordnet

    wordnet()
    stop = work / "nltk_data" / "corpora" / "stopwords"
    stop.mkdir(parents=True, exist_ok=True)
    (stop / "english").write_text("\n".join(sorted(STOPWORDS)) + "\n")
    return {**os.environ, "NLTK_DATA": f"{work / 'nltk_data'}:{nltk_data_dir()}", "TA_CACHE_DIR": str(work / "ta-cache"),
            "TOKENIZERS_PARALLELISM": "false"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--seeds", type=int, default=2000)
    parser.add_argument("--recipes", default="deepwordbug,pwws")
    parser.add_argument("--victims", default="profanity-check,tiny-bert")
    parser.add_argument("--tiny-bert-seeds", type=int, default=500,
                        help="seeds for the tiny BERT victim (TextAttack is slow on a model victim)")
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--textattack-python", default=os.environ.get(
        "REDLINE_TEXTATTACK_PYTHON", str(HERE / ".textattack-venv" / "bin" / "python")))
    args = parser.parse_args()

    import ray

    from redline.actors.detectors import DetectorConfig, build_detector
    from redline.actors.tiny_models import TinyBert, build_tiny_classifier
    from redline.cluster.config import validate_config
    from redline.cluster.runtime import ensure_ray
    from redline.pipelines.attack import AttackConfig, run_attack
    from redline.pipelines.plane.corpora import CorpusConfig, read_corpus

    work = Path(tempfile.mkdtemp(prefix="redline-attack-bench-"))
    corpus = [r for r in read_corpus(CorpusConfig(path=args.corpus, preset="davidson")).to_pylist() if r["status"] == "ok"]
    random.Random(0).shuffle(corpus)
    victims: dict[str, dict] = {}
    for name in args.victims.split(","):
        if name == "profanity-check":
            victims[name] = {"name": name, "kind": "profanity-check", "batch_size": 8192}
        elif name == "tiny-bert":
            train = corpus[:4000]
            model = build_tiny_classifier([r["text"] for r in train], [r["label"] for r in train], work / "tiny-bert",
                                          spec=TinyBert(epochs=3))
            victims[name] = {"name": name, "kind": "hf", "model": str(model), "batch_size": 256}
        else:
            raise SystemExit(f"unknown victim {name} (profanity-check, tiny-bert)")
    toxic = [r for r in corpus[4000:] if r["label"] == 1]
    ensure_ray()
    rows = []
    for vname, vcfg in victims.items():
        limit = args.seeds if vname == "profanity-check" else min(args.seeds, args.tiny_bert_seeds)
        flags = build_detector(DetectorConfig.model_validate(vcfg)).detect([r["text"] for r in toxic])[2]
        flagged = [r for r, t in zip(toxic, flags) if t][:limit]
        seeds_file = work / f"seeds-{vname}.jsonl"
        seeds_file.write_text("".join(json.dumps({"text": r["text"], "label": "toxic"}) + "\n" for r in flagged))
        on = f"{len(flagged)} Davidson toxic seeds flagged by {vname}, {os.cpu_count()} CPUs"
        for name in args.recipes.split(","):
            cfg = validate_config(AttackConfig, {
                "corpus": {"path": str(seeds_file), "text_column": "text", "label_column": "label",
                           "toxic_values": ["toxic"], "dataset": "davidson-flagged"},
                "victim": vcfg, "recipes": [name], "goals": ["tae"], "similarity": "auto", "actors": args.actors,
                "num_cpus": (os.cpu_count() or 2) / args.actors, "batch_size": 256, "shard_size": 1000,
                "output": str(work / "runs"), "run_name": f"{vname}-{name}",
            })
            started = time.perf_counter()
            result = run_attack(cfg, force=True)
            wall = time.perf_counter() - started
            row = result.summary[0]
            ours = {"asr": row["asr"], "mean_queries": row["mean_queries"], "wall_s": wall,
                    "examples_per_s": len(flagged) / wall}
            emit(measured=f"redline {name} on {vname} (TAE, targeted benign), {args.actors} actors", on=on, **ours)
            # the same run again, Ray and its workers up: what is left beside the search is the run's fixed cost
            started = time.perf_counter()
            again = run_attack(cfg, force=True)
            wall_again = time.perf_counter() - started
            search_s = again.manifest["busy_seconds"] / args.actors
            emit(measured=f"redline {name} on {vname}, second run (Ray up)", wall_s=round(wall_again, 2),
                 search_s_per_actor=round(search_s, 2), fixed_cost_s=round(wall_again - search_s, 2),
                 target_fixed_cost_s=3.0)
            rows.append((vname, name, seeds_file, on, ours, vcfg))
    ray.shutdown()

    python = Path(args.textattack_python)
    if not python.exists():
        emit(measured="textattack baseline", skipped=f"no TextAttack environment at {python} (see this script's docstring)")
        return
    env = textattack_env(work)
    for vname, name, seeds_file, on, mine, vcfg in rows:
        victim_arg = vcfg.get("model", "profanity-check")
        proc = subprocess.run([str(python), str(HERE / "textattack_side.py"), str(seeds_file), name, "--victim", victim_arg],
                              capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            emit(measured=f"textattack {name} on {vname}", error=proc.stderr.strip().splitlines()[-1:])
            continue
        theirs = json.loads(proc.stdout.strip().splitlines()[-1])
        emit(measured=f"textattack {name} on {vname} (TAE, targeted benign), one process", on=on,
             **{k: theirs[k] for k in ("asr", "mean_queries", "wall_s", "examples_per_s")})
        emit(measured=f"speed: redline vs textattack, {name} on {vname}", on=on, ours=round(mine["examples_per_s"], 1),
             baseline=round(theirs["examples_per_s"], 1), ratio=round(mine["examples_per_s"] / theirs["examples_per_s"], 2),
             unit="examples/s", asr_ours=mine["asr"], asr_textattack=theirs["asr"],
             asr_gap_points=round(100 * ((theirs["asr"] or 0) - (mine["asr"] or 0)), 2))


if __name__ == "__main__":
    main()
