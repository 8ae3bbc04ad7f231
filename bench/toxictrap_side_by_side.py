"""ToxicTrap's step one, redline against the reference (TextAttack 0.3.11 building QData's
TextAttack-Multilabel recipes), on the same seeds:

    .venv/bin/python bench/toxictrap_side_by_side.py [--seeds 12] [--textattack-python PY] [--json OUT]

For each seed (Davidson tweets flagged offensive, fixed by the corpus' order): the words the
pre-transformation constraints leave modifiable (no-repeat, stopwords, max-modification-rate 0.1
min 4), every WordNet swap proposed at those words (`toxictrap-wordnet-*`), every character edit of
the composite (`toxictrap-composite-*`: space insertion, deletion, neighbour swap; at every
position on both sides, since each draws one at random), and the sentence-encoder constraint's
verdict on each WordNet swap (window 15, threshold 0.840845057, angular, compared with the text
edited, short texts skipped; both sides encode with all-MiniLM-L6-v2, which stands in for USE).
Prints, per part, how many seeds/words/candidates agree and the differences, twice: with redline's
defaults, and with the named options that give the reference's values (`stopwords: {case_sensitive:
true}`, `wordnet: {match_case: false, letters_only: false}`); exits 1 if the second does not match
everywhere.

What cannot run side by side here, and why: the embedding and MLM swaps (the reference downloads
counter-fitted vectors and a BERT; none offline), part of speech (the reference tags with NLTK's
perceptron tagger, whose data is a download; redline tags with spaCy), the homoglyph table (named
in README's difference table).

TextAttack runs in its own environment (bench/.textattack-venv; create it with:
python3 -m venv bench/.textattack-venv && bench/.textattack-venv/bin/pip install torch==2.13.0
textattack==0.3.11 'transformers<5' alt-profanity-check).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_CORPUS = HERE.parents[1] / "shared" / "data" / "offensive_tweet" / "labeled_data.csv"
DEFAULT_TEXTATTACK = HERE / ".textattack-venv" / "bin" / "python"


def davidson_seeds(corpus: Path, n: int) -> list[str]:
    """The first `n` offensive tweets (class 1) of 8 to 30 words without mentions, links or
    entities: the words the two sides split the same way."""
    out = []
    with open(corpus, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            text = " ".join(row["tweet"].split())
            if row["class"] != "1" or any(c in text for c in "@&#/:") or not 8 <= len(text.split()) <= 30:
                continue
            out.append(text)
            if len(out) == n:
                break
    return out


def reference(seeds: list[str], python: str, encoder: str) -> dict[str, Any]:
    from attack_vs_textattack import textattack_env  # the offline nltk data TextAttack imports

    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "seeds.jsonl"
        path.write_text("".join(json.dumps({"text": s}) + "\n" for s in seeds), encoding="utf-8")
        done = subprocess.run([python, str(HERE / "toxictrap_reference.py"), str(path), encoder], capture_output=True,
                              text=True, env=textattack_env(Path(work)), check=False)
        if done.returncode != 0:
            raise SystemExit(f"the reference failed: {done.stderr.strip().splitlines()[-1:]}")
        return json.loads(done.stdout)


def redline_side(seeds: list[dict[str, Any]], reference_settings: bool) -> list[dict[str, Any]]:
    """What redline's ToxicTrap components see at step one of the same seeds (the encoder's verdicts on
    the reference's WordNet candidates, so both judge the same texts): as the recipe builds them, or
    with the named options that give the reference's values (case-sensitive stopwords; WordNet lemma
    names as spelt, with digits and hyphens)."""
    from redline.actors.attack.constraints import SentenceSimilarity, Stopwords, modifiable
    from redline.actors.attack.recipes import USE_LIKE, AttackResources, RecipeOptions, build
    from redline.actors.attack.text import AttackedText
    from redline.actors.attack.transformations import CharEdits, WordNetSynonyms

    recipe = build(RecipeOptions(name="toxictrap-wordnet-delete"), AttackResources())
    pre, wordnet = recipe.pre, recipe.transformation
    if reference_settings:
        pre = [Stopwords(case_sensitive=True) if isinstance(c, Stopwords) else c for c in pre]
        wordnet = WordNetSynonyms(match_case=False, letters_only=False)
    chars = CharEdits(ops=("insert-space", "delete", "swap"), per_op=10_000)  # every position
    encoder = SentenceSimilarity(**{**USE_LIKE, "metric": "angular"})
    out = []
    for ref in seeds:
        t = AttackedText.from_text(ref["text"])
        idx = modifiable(pre, t, t)
        mine: dict[str, Any] = {"words": t.words, "modifiable": idx, "wordnet": {}, "chars": {}, "encoder": {}}
        swaps = wordnet.swaps(t, idx)
        for i in idx:
            mine["wordnet"][str(i)] = sorted(swaps.get(i, []))
            mine["chars"][str(i)] = sorted(chars.edit(t.word(i)))
        for i, verdicts in ref["encoder"].items():
            words = list(verdicts)
            if int(i) < len(t.words):
                ok = encoder.check(t, [t.replace(int(i), w) for w in words], [int(i)] * len(words))
                mine["encoder"][i] = dict(zip(words, map(bool, ok)))
        out.append(mine)
    return out


def compare(ref: list[dict[str, Any]], mine: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per part: what agrees, of how many, and each difference."""
    parts: dict[str, dict[str, Any]] = {p: {"agree": 0, "of": 0, "differences": []}
                                        for p in ("words", "modifiable", "wordnet", "chars", "encoder")}

    def tally(part: str, same: bool, what: str) -> None:
        parts[part]["of"] += 1
        parts[part]["agree"] += same
        if not same:
            parts[part]["differences"].append(what)

    for r, m in zip(ref, mine):
        tally("words", r["words"] == m["words"], f"{r['text']!r}: {r['words']} vs {m['words']}")
        if r["words"] != m["words"]:
            continue
        tally("modifiable", r["modifiable"] == m["modifiable"],
              f"{r['text']!r}: {[r['words'][i] for i in r['modifiable']]} vs {[m['words'][i] for i in m['modifiable']]}")
        for part in ("wordnet", "chars"):
            for i in sorted(set(r[part]) & set(m[part]), key=int):
                word = r["words"][int(i)]
                a, b = set(r[part][i]), set(m[part][i])
                tally(part, a == b, f"{word!r}: reference only {sorted(a - b)}, redline only {sorted(b - a)}")
        for i, verdicts in r["encoder"].items():
            for w, ok in verdicts.items():
                theirs = m["encoder"].get(i, {}).get(w)
                tally("encoder", theirs == ok, f"{r['words'][int(i)]!r} -> {w!r} in {r['text']!r}: reference "
                                               f"{'keeps' if ok else 'rejects'}, redline {'keeps' if theirs else 'rejects'}")
    return parts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--seeds", type=int, default=12)
    parser.add_argument("--textattack-python", default=os.environ.get("REDLINE_TEXTATTACK_PYTHON", str(DEFAULT_TEXTATTACK)))
    parser.add_argument("--json", help="also write the comparison here")
    args = parser.parse_args()
    if not Path(args.textattack_python).exists():
        print(f"no TextAttack environment at {args.textattack_python}: see this script's docstring", file=sys.stderr)
        return 2
    from redline.actors.attack.resources import default_sentence_encoder

    seeds = davidson_seeds(Path(args.corpus), args.seeds)
    ref = reference(seeds, args.textattack_python, default_sentence_encoder())
    results = {}
    for mode, settings in (("redline's defaults", False), ("the reference's settings", True)):
        result = results[mode] = compare(ref["seeds"], redline_side(ref["seeds"], settings))
        print(f"ToxicTrap step one on {len(seeds)} Davidson seeds, redline ({mode}) vs TextAttack "
              f"{ref['textattack']} (QData/TextAttack-Multilabel's components):")
        for part, r in result.items():
            print(f"  {part:<10} {r['agree']:>4} of {r['of']:<4} agree")
            for d in r["differences"][:8]:
                print(f"      {d}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1), encoding="utf-8")
    exact = results["the reference's settings"]
    return 0 if all(r["agree"] == r["of"] for r in exact.values()) else 1


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
