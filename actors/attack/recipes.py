"""Attack recipes as data: transformations, constraints and a search method, each a registered
component named by kind (`actors/attack/components.py`).

Five TextAttack recipes adapted to the TAE/BAE goals (DeepWordBug, TextBugger, PWWS, TextFooler,
A2T) and the ToxicTrap grid: {character edits, WordNet, masked LM, embedding neighbours} x
{greedy WIR by deletion, [UNK], gradient, weighted saliency; beam search}, with the ToxicTrap
constraints (no repeats, no stopwords, at most 10% of words or 4, POS match and sentence-encoder
similarity for word swaps, edit distance for character edits). Every recipe runs with either goal.
A config can declare its own recipe from registered components (`transformation:`, `pre:`,
`post:`, `search:`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from redline.actors.attack.components import BuildContext, component
from redline.cluster.config import Input, Result, Strict
from redline.errors import RedlineError

Spec = tuple[str, dict[str, Any]]


class AttackResources(Strict):
    """Models and files recipes draw on; defaults work offline except the masked LM."""

    mlm_model: str = Input("bert-base-uncased", description="Any HF fill-mask model (hub id or directory).")
    sentence_encoder: str | None = Input(
        None, description="HF encoder for similarity; default all-MiniLM-L6-v2 (offline package).")
    embeddings_file: str | None = Input(None, description="Counter-fitted GloVe-style text file (`word v1 v2 ...`).")
    embedding_model: str | None = Input(
        None, description="HF model whose input embeddings give word neighbours; default MiniLM.")


class ComponentSpec(Strict):
    """One component of a declared recipe: its registered kind and its arguments."""

    model_config = ConfigDict(extra="allow", str_min_length=1)
    kind: str = Result()

    def spec(self) -> Spec:
        return self.kind, dict(self.model_extra or {})


class RecipeOptions(BaseModel):
    """A recipe in an attack config: a built-in name with per-run overrides, or (with
    `transformation` and `search`) a recipe declared from registered components."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")
    query_budget: int = Field(2000, gt=0, description="Victim queries per example.")
    time_limit_s: float | None = Field(None, gt=0, description=(
        "Opt-in wall seconds per example. By default the query budget alone ends an attempt, so the same config "
        "and seed give the same attempts on any machine; attempts a time limit cuts depend on the machine's speed "
        "and are counted apart (`timed_out`)."))
    examples_per_seed: int = Field(1, ge=1, le=100, description="Distinct adversarial examples to find per seed: "
                                                                "after the first, the search goes on editing other "
                                                                "words (within the same budgets).")
    beam_width: int | None = Field(None, gt=0)
    pos_match: bool | None = Field(None, description="Force the part-of-speech constraint on or off.")
    min_similarity: float | None = Field(None, ge=-1, le=1)
    max_mod_rate: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, gt=0, description="Candidates per word for MLM / embedding swaps (5, 20, 50).")
    # a declared recipe
    transformation: list[ComponentSpec] | None = Field(None, description="Declared recipe: its transformations.")
    pre: list[ComponentSpec] = Field(default_factory=list)
    post: list[ComponentSpec] = Field(default_factory=list)
    search: ComponentSpec | None = None
    description: str | None = None

    @model_validator(mode="after")
    def _declared(self) -> "RecipeOptions":
        declared = self.transformation is not None or self.search is not None or self.pre or self.post
        if declared:
            if not self.transformation or self.search is None:
                raise ValueError(f"recipe '{self.name}': a declared recipe needs transformation and search")
            if self.name in RECIPES:
                raise ValueError(f"recipe '{self.name}' is built in: give the declared recipe another name")
            self.recipe().check()
        else:
            recipe(self.name)
        return self

    def recipe(self) -> "Recipe":
        if self.transformation is None:
            return recipe(self.name)
        return Recipe(self.name, "declared", tuple(c.spec() for c in self.transformation),
                      tuple(c.spec() for c in self.pre), tuple(c.spec() for c in self.post),
                      self.search.spec(), self.description or "declared in the config")  # type: ignore[union-attr]


@dataclass(frozen=True)
class Recipe:
    name: str
    family: str
    transformation: tuple[Spec, ...]
    pre: tuple[Spec, ...]
    post: tuple[Spec, ...]
    search: Spec
    description: str = ""
    source: str = ""  # where the settings come from

    @property
    def origin(self) -> str:
        """Whose recipe it is: a TextAttack recipe adapted to TAE/BAE, ToxicTrap as QData ships it, or redline's own."""
        if self.family == "textattack":
            return "TextAttack (adapted)"
        return "redline's own" if self.source.startswith("redline") else "ToxicTrap (QData)"

    def parts(self) -> list[tuple[str, str, dict[str, Any]]]:
        return ([("transformation", k, a) for k, a in self.transformation] + [("pre", k, a) for k, a in self.pre]
                + [("post", k, a) for k, a in self.post] + [("search", *self.search)])

    def check(self) -> None:
        """Every component is registered and takes the arguments given."""
        for role, kind, args in self.parts():
            component(role, kind).check_args(args)

    @property
    def white_box(self) -> bool:
        return any(component(role, kind).is_white_box(args) for role, kind, args in self.parts())

    @property
    def needs(self) -> list[str]:
        out = list(dict.fromkeys(r for role, kind, _ in self.parts() if (r := component(role, kind).requires)))
        return out + (["white-box hf victim"] if self.white_box else [])

    def describe(self) -> dict[str, str]:
        def fmt(items: Any) -> str:
            return ", ".join(k + (f"({', '.join(f'{a}={b}' for a, b in v.items())})" if v else "") for k, v in items) or "–"
        return {"transformation": fmt(self.transformation), "pre": fmt(self.pre), "post": fmt(self.post),
                "search": fmt([self.search])}


CHAR_OPS = ("insert", "insert-space", "delete", "swap", "keyboard", "homoglyph")
CHAR_DWB = ("char", {"ops": ("insert", "delete", "swap", "keyboard")})
CHAR_BUG = ("char", {"ops": ("insert-space", "delete", "swap", "homoglyph")})
CHAR_TT = ("char", {"ops": ("insert", "insert-space", "delete", "swap", "keyboard", "homoglyph")})
# ToxicTrap, as QData ships it in TextAttack-Multilabel (textattack_multilabel/): the composite recipe
# `MultilabelACL23_recipe` (multilabel_target_attack_recipe.py) and the one-transformation recipe
# `MultilabelACL23Transform` (multilabel_transform_attack_recipe.py). Both: RepeatModification,
# StopwordModification, PartOfSpeechTry (no verb/noun swaps), MaxModificationRate(0.1, min 4).
TT_PRE = (("no-repeat", {}), ("stopwords", {}), ("max-mod-rate", {"rate": 0.1, "min_words": 4}))
# MultilabelACL23Transform: PartOfSpeechTry, then the Universal Sentence Encoder (0.840845057, angular, window
# 15, compared with the previous text, texts shorter than the window skipped, as TextAttack's recipes set it);
# USE needs TensorFlow Hub, so redline's sentence encoder (MiniLM offline) stands in at the same settings.
# `not-antonym` is redline's: without the counter-fitted vectors the reference uses, embedding neighbours
# include antonyms (stupid -> smart), which WordNet bars from every word swap.
USE_LIKE = {"min_similarity": 0.840845057, "window": 15, "compare_against_original": False,
            "skip_shorter_than_window": True}
NOT_ANTONYM = ("not-antonym", {})
TT_WORD_POST = (NOT_ANTONYM, ("pos-match", {}), ("sentence-similarity", {**USE_LIKE, "metric": "angular"}))
# MultilabelACL23_recipe: PartOfSpeechTry, and the paper's recipe table's (and the authors' earlier release's)
# sentence encoder at 0.840845057, cosine, window 15.
TT_COMPOSITE_POST = (NOT_ANTONYM, ("pos-match", {}), ("sentence-similarity", {**USE_LIKE, "metric": "cosine"}))
TT_CHAR_POST = (("levenshtein", {"max_distance": 30}),)  # redline's char-only variant (not in QData's files)

ADAPTED = [
    Recipe("deepwordbug", "textattack", (CHAR_DWB,), (("no-repeat", {}), ("stopwords", {})),
           (("levenshtein", {"max_distance": 30}),), ("greedy-wir", {"method": "unk"}),
           "Gao et al. 2018: character edits on the most important words"),
    Recipe("textbugger", "textattack", (CHAR_BUG, ("embedding", {"k": 5})), (("no-repeat", {}), ("stopwords", {})),
           (NOT_ANTONYM, ("sentence-similarity", {"min_similarity": 0.8, "window": None})),
           ("greedy-wir", {"method": "delete"}),
           "Li et al. 2019: character bugs and nearest-word swaps"),
    Recipe("pwws", "textattack", (("wordnet", {}),), (("no-repeat", {}), ("stopwords", {})), (),
           ("greedy-wir", {"method": "wsaliency"}), "Ren et al. 2019: WordNet synonyms by probability-weighted saliency"),
    Recipe("textfooler", "textattack", (("embedding", {"k": 50}),), (("no-repeat", {}), ("stopwords", {})),
           (NOT_ANTONYM, ("word-embedding-distance", {"min_cosine": 0.5}), ("pos-match", {}),
            ("sentence-similarity", {**USE_LIKE, "metric": "angular"})),
           ("greedy-wir", {"method": "delete"}), "Jin et al. 2020: embedding neighbours with POS and USE-style similarity"),
    Recipe("a2t", "textattack", (("embedding", {"k": 20}),),
           (("no-repeat", {}), ("stopwords", {}), ("max-mod-rate", {"rate": 0.1, "min_words": 4})),
           (NOT_ANTONYM, ("word-embedding-distance", {"min_cosine": 0.8}), ("pos-match", {}),
            ("sentence-similarity", {"min_similarity": 0.9, "window": None})),
           ("greedy-wir", {"method": "gradient"}), "Yoo & Qi 2021: cheap gradient-ranked embedding swaps"),
]


# The composite: space insertion, character deletion, neighbour swap (one random position each, first and
# last letters kept), homoglyph swap, and embedding top-20 (MultilabelACL23_recipe); the others: one
# transformation each with knn = 20 (MultilabelACL23Transform: glove / mlm / wordnet), plus redline's char-only.
TT_TRANSFORMS = {
    "composite": (("char", {"ops": ("insert-space", "delete", "swap", "homoglyph"), "per_op": 1}),
                  ("embedding", {"k": 20})),
    "char": (CHAR_TT,), "wordnet": (("wordnet", {}),), "mlm": (("mlm", {"top_k": 20}),),
    "embedding": (("embedding", {"k": 20}),),
}
TT_POST = {"composite": TT_COMPOSITE_POST, "char": TT_CHAR_POST}
TT_SOURCES = {"composite": "QData/TextAttack-Multilabel MultilabelACL23_recipe",
              "transform": "QData/TextAttack-Multilabel MultilabelACL23Transform",
              "char": "redline: ToxicTrap's character edits with its constraints (no QData recipe)"}

# Their `wir_method`s: GreedyWordSwapWIRTruncated(delete | unk | weighted-saliency | gradient, truncated to the
# model's length), BeamSearch(beam_width=3), AlzantotGeneticAlgorithm(pop_size=25, max_iters=10,
# give_up_if_no_improvement=True, post_crossover_check=False).
TT_SEARCHES = {"delete": ("greedy-wir", {"method": "delete"}), "unk": ("greedy-wir", {"method": "unk"}),
               "gradient": ("greedy-wir", {"method": "gradient"}),
               "weighted-saliency": ("greedy-wir", {"method": "wsaliency"}),
               "beam": ("beam", {"width": 3}), "genetic": ("genetic", {"population": 25, "iterations": 10})}


TOXICTRAP = [
    Recipe(f"toxictrap-{t}-{s}", "toxictrap", TT_TRANSFORMS[t], TT_PRE, TT_POST.get(t, TT_WORD_POST),
           TT_SEARCHES[s], f"ToxicTrap: {t} swaps, {s} search", TT_SOURCES.get(t, TT_SOURCES["transform"]))
    for t in TT_TRANSFORMS for s in TT_SEARCHES
]


RECIPES: dict[str, Recipe] = {r.name: r for r in ADAPTED + TOXICTRAP}
# Names earlier redline versions used, still accepted (their runs' keys keep the name they were given).
ALIASES = {f"toxictrap-{t}-wsaliency": f"toxictrap-{t}-weighted-saliency" for t in TT_TRANSFORMS}


def recipe(name: str) -> Recipe:
    name = ALIASES.get(name, name)
    if name not in RECIPES:
        raise RedlineError(f"unknown recipe '{name}' (see `redline list recipes`)")
    return RECIPES[name]


EMBEDDING_NOTE = ("resources.embeddings_file when given (counter-fitted vectors, as the reference), else "
                  "all-MiniLM-L6-v2's input embeddings (not counter-fitted: antonyms barred by not-antonym)")
ENCODER_NOTE = "sentence encoder: all-MiniLM-L6-v2 offline, standing in for USE (resources.sentence_encoder)"


def recipe_table() -> list[dict[str, str]]:
    def uses(r: Recipe) -> str:
        kinds = {k for k, _ in (*r.transformation, *r.post)}
        notes = ([f"embeddings: {EMBEDDING_NOTE}"] if kinds & {"embedding", "word-embedding-distance"} else []) + (
            [ENCODER_NOTE] if "sentence-similarity" in kinds else [])
        return "; ".join(notes) or "–"

    return [{"name": r.name, "origin": r.origin, **r.describe(), "needs": ", ".join(r.needs) or "–",
             "source": r.source or "–", "models": uses(r)}
            for r in RECIPES.values()]


@dataclass
class Components:
    recipe: Recipe
    options: RecipeOptions
    transformation: Any
    pre: list[Any]
    post: list[Any]
    search: Any
    label: dict[str, str] = field(default_factory=dict)


def post_specs(r: Recipe, options: RecipeOptions) -> list[Spec]:
    """The recipe's post constraints with the run's part-of-speech override, cheapest first."""
    specs = list(r.post)
    if options.pos_match is True and not any(k == "pos-match" for k, _ in specs):
        specs.insert(0, ("pos-match", {}))
    if options.pos_match is False:
        specs = [(k, a) for k, a in specs if k != "pos-match"]
    return sorted(specs, key=lambda ka: component("post", ka[0]).cost)


def preflight(options: RecipeOptions, resources: AttackResources, white_box_victim: bool) -> None:
    """What a recipe needs (models, WordNet, a tagger, a white-box victim), checked on the driver
    before any actor starts."""
    r = options.recipe()
    if r.white_box and not white_box_victim:
        raise RedlineError(f"recipe {r.name} ranks words by gradient: it needs a white-box victim (a detector kind with "
                           "gradients, such as `hf`)")
    ctx = BuildContext(resources, options)
    specs = ([("transformation", k, a) for k, a in r.transformation] + [("pre", k, a) for k, a in r.pre]
             + [("post", k, a) for k, a in post_specs(r, options)] + [("search", *r.search)])
    for role, kind, args in specs:
        component(role, kind).preflight(args, ctx)


def uses_gpu(options: RecipeOptions) -> bool:
    """Whether any of the recipe's components runs a model on the actor's GPU (a masked LM, a sentence encoder)."""
    r = options.recipe()
    specs = ([("transformation", k) for k, _ in r.transformation] + [("pre", k) for k, _ in r.pre]
             + [("post", k) for k, _ in post_specs(r, options)] + [("search", r.search[0])])
    return any(component(role, kind).uses_gpu for role, kind in specs)


def build(options: RecipeOptions, resources: AttackResources, num_gpus: float = 0.0) -> Components:
    from redline.actors.attack import constraints as C
    from redline.actors.attack import transformations as T

    r = options.recipe()
    ctx = BuildContext(resources, options, num_gpus)
    parts = [component("transformation", k).build(dict(a), ctx) for k, a in r.transformation]
    transformation = parts[0] if len(parts) == 1 else T.Composite(parts)
    pre = [component("pre", k).build(dict(a), ctx) for k, a in r.pre]
    post = [component("post", k).build(dict(a), ctx) for k, a in post_specs(r, options)]
    search = component("search", r.search[0]).build(dict(r.search[1]), ctx)
    comps = Components(r, options, transformation, pre, post, search)
    comps.label = {"transformation": T.describe(transformation), "constraints": C.describe(comps.pre + comps.post),
                   "search": search.label}
    return comps
