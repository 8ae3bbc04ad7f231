"""The reference's half of bench/toxictrap_side_by_side.py. Runs inside TextAttack's own virtual
environment (textattack==0.3.11, transformers<5):

    python bench/toxictrap_reference.py SEEDS.jsonl ENCODER_DIR > STEP_ONE.json

Builds the components of QData/TextAttack-Multilabel's ToxicTrap recipes from TextAttack 0.3.11
(`MultilabelACL23Transform` with WordNet swaps; the composite's character edits of
`MultilabelACL23_recipe`) and, for each seed, what step one of an attack sees: the words the
pre-transformation constraints leave modifiable, every candidate each transformation proposes at
those words (the character edits at every position: `random_one=False`, since the recipe draws one
position at random and two random streams cannot be compared), and the sentence-encoder
constraint's verdict on each WordNet candidate (TextAttack's `SentenceEncoder` at the recipe's
settings, encoding with the sentence encoder in ENCODER_DIR, since the Universal Sentence Encoder
needs TensorFlow Hub). Prints one JSON object.
"""

from __future__ import annotations

import json
import sys

THRESHOLD = 0.840845057  # MultilabelACL23Transform's UniversalSentenceEncoder settings
WINDOW = 15


def main() -> None:
    seeds_path, encoder_dir = sys.argv[1], sys.argv[2]
    seeds = [json.loads(line)["text"] for line in open(seeds_path, encoding="utf-8")]

    import torch
    import transformers
    from textattack.constraints.pre_transformation import (
        MaxModificationRate,
        RepeatModification,
        StopwordModification,
    )
    from textattack.constraints.semantics.sentence_encoders import SentenceEncoder
    from textattack.shared import AttackedText
    from textattack.transformations import (
        WordSwapNeighboringCharacterSwap,
        WordSwapRandomCharacterDeletion,
        WordSwapRandomCharacterInsertion,
        WordSwapWordNet,
    )

    tokenizer = transformers.AutoTokenizer.from_pretrained(encoder_dir)
    model = transformers.AutoModel.from_pretrained(encoder_dir).eval()

    class MiniLM(SentenceEncoder):
        """TextAttack's sentence-encoder constraint, encoding with mean-pooled MiniLM (what the
        sentence-transformers config of all-MiniLM-L6-v2 does), in place of USE."""

        def encode(self, sentences):
            batch = tokenizer(list(sentences), padding=True, truncation=True, max_length=256, return_tensors="pt")
            with torch.no_grad():
                out = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).float()
            emb = (out * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(emb, dim=1)

    pre = [RepeatModification(), StopwordModification(), MaxModificationRate(max_rate=0.1, min_threshold=4)]
    wordnet = WordSwapWordNet()
    chars = {"insert-space": WordSwapRandomCharacterInsertion(random_one=False, letters_to_insert=" ",
                                                              skip_first_char=True, skip_last_char=True),
             "delete": WordSwapRandomCharacterDeletion(random_one=False, skip_first_char=True, skip_last_char=True),
             "swap": WordSwapNeighboringCharacterSwap(random_one=False, skip_first_char=True, skip_last_char=True)}
    encoder = MiniLM(threshold=THRESHOLD, metric="angular", compare_against_original=False, window_size=WINDOW,
                     skip_text_shorter_than_window=True)
    out = []
    for text in seeds:
        t = AttackedText(text)
        modifiable = set(range(len(t.words)))
        for c in pre:
            modifiable &= set(c(t, wordnet))
        seed = {"text": text, "words": t.words, "modifiable": sorted(modifiable), "wordnet": {}, "chars": {},
                "encoder": {}}
        for i in sorted(modifiable):
            swaps = wordnet(t, indices_to_modify=[i])
            seed["wordnet"][i] = sorted({s.words[i] for s in swaps})
            if swaps:
                kept = encoder.call_many(swaps, t)  # compare_against_original=False: against the text edited
                seed["encoder"][i] = {s.words[i]: any(k.text == s.text for k in kept) for s in swaps}
            edits = set()
            for op in chars.values():
                edits |= {e for e in op._get_replacement_words(t.words[i]) if e != t.words[i]}
            seed["chars"][i] = sorted(edits)
        out.append(seed)
    from importlib.metadata import version

    json.dump({"textattack": version("textattack"), "seeds": out}, sys.stdout)


if __name__ == "__main__":
    main()
