"""Search methods, written as generators so one actor can run many examples at once.

A search yields a list of texts it wants scored and is sent back their (goal score, success)
pairs; the attacker gathers the requests of every example in flight into one victim batch. Each
example memoises its own queries, so a text is never counted or scored twice for it. A search whose
transformation is a model (a masked LM) yields a `SwapAsk` for its edits the same way, and the
attacker answers every example's asks in one batched call.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from redline.actors.attack.components import BuildContext, Component, register
from redline.actors.attack.constraints import (
    PostConstraint,
    PreConstraint,
    apply_post,
    modifiable,
)
from redline.actors.attack.goals import Goal
from redline.actors.attack.text import AttackedText
from redline.actors.attack.transformations import Transformation
from redline.errors import RedlineError

Scored = tuple[float, bool]


@dataclass(frozen=True)
class SwapAsk:
    """The swaps a search step needs from a batched transformation: (text, word positions) asks."""

    transformation: Transformation
    asks: list[tuple[AttackedText, list[int]]]


# yields texts to score (sent back their results) or a SwapAsk (sent back each ask's swaps)
Request = Generator[list[str] | SwapAsk, Any, Any]

UNK = "[UNK]"


@dataclass
class SearchContext:
    original: AttackedText
    goal: Goal
    transformation: Transformation
    pre: list[PreConstraint]
    post: list[PostConstraint]
    query_budget: int
    deadline: float
    gradient: Any = None  # callable(text, spans) -> importance, for white-box victims
    wanted: int = 1  # distinct successful examples to find
    queries: int = 0
    memo: dict[str, Scored] = field(default_factory=dict)

    @property
    def exhausted(self) -> bool:
        return self.queries >= self.query_budget or time.monotonic() > self.deadline

    def score(self, texts: list[str]) -> Request:
        """Scores texts (memoised); asks for at most the remaining query budget."""
        new = [t for t in dict.fromkeys(texts) if t not in self.memo][: max(0, self.query_budget - self.queries)]
        if new:
            results = yield new
            self.queries += len(new)
            self.memo.update(zip(new, results))
        return [self.memo.get(t) for t in texts]

    def swaps(self, asks: list[tuple[AttackedText, list[int]]]) -> Request:
        """Each (text, positions) ask's swaps: from the attacker, gathered with every attempt's asks,
        when the transformation is a model; else here."""
        if not asks:
            return []
        if self.transformation.batched:
            return (yield SwapAsk(self.transformation, asks))
        return self.transformation.swaps_many(asks)

    def candidates(self, current: AttackedText, indices: list[int]) -> Request:
        """Every allowed one-word edit of `current` at `indices` that passes the post constraints."""
        (swaps,) = yield from self.swaps([(current, indices)])
        return self.edits(current, swaps)

    def edits(self, current: AttackedText, swaps: dict[int, list[str]]) -> tuple[list[AttackedText], list[int]]:
        """The edits of `current` that `swaps` make and the post constraints allow, and where each is."""
        texts, where = [], []
        for i, words in swaps.items():
            for w in words:
                texts.append(current.replace(i, w))
                where.append(i)
        keep = apply_post(self.post, self.original, texts, where, current)
        return [texts[k] for k in keep], [where[k] for k in keep]


@dataclass
class Outcome:
    text: AttackedText
    score: float
    success: bool
    nothing_to_modify: bool = False
    more: list[tuple[AttackedText, float]] = field(default_factory=list)  # further distinct successes


class Successes:
    """Distinct successful texts in the order found; the first step's best is the example, the
    rest are the seed's further examples (`examples_per_seed`)."""

    def __init__(self, wanted: int) -> None:
        self.wanted, self.found = wanted, {}

    def add(self, cands: list[AttackedText], results: list[Scored | None]) -> bool:
        """Adds this step's successes, best first; True once enough were found."""
        wins = sorted(((c, r[0]) for c, r in zip(cands, results) if r is not None and r[1]), key=lambda cr: -cr[1])
        for c, s in wins:
            self.found.setdefault(c.text, (c, s))
        return len(self.found) >= self.wanted

    def outcome(self) -> Outcome | None:
        if not self.found:
            return None
        (text, score), *more = list(self.found.values())[: self.wanted]
        return Outcome(text, score, True, more=more)


def _best(cands: list[AttackedText], results: list[Scored | None]) -> tuple[int, bool] | None:
    """Index of the best candidate: any success first (highest score among them), else top score."""
    scored = [(k, r) for k, r in enumerate(results) if r is not None]
    if not scored:
        return None
    wins = [(k, r) for k, r in scored if r[1]]
    k, r = max(wins or scored, key=lambda kr: kr[1][0])
    return k, r[1]


def _score_and_pick(ctx: SearchContext, cands: list[AttackedText]) -> Request:
    """Scores candidates in one request; returns (results, (best index, succeeded) or None)."""
    results = yield from ctx.score([c.text for c in cands])
    return results, _best(cands, results)


class Search(Component):
    role = "search"
    needs_gradient: bool = False

    @property
    def label(self) -> str:
        return self.kind

    def run(self, ctx: SearchContext, start: Scored) -> Request:
        raise NotImplementedError


@register
class GreedyWIR(Search):
    """Greedy word swap in order of word importance (TextAttack's GreedyWordSwapWIR): importance
    by deleting the word, by masking it with [UNK], by the victim's gradient (white-box), or
    PWWS's weighted saliency as TextAttack computes it: the softmax of the [UNK]-masked texts'
    scores times the best score among the word's swaps (0 for a word with none)."""

    kind = "greedy-wir"
    METHODS = ("delete", "unk", "gradient", "wsaliency")

    @classmethod
    def is_white_box(cls, args: dict[str, Any]) -> bool:
        return args.get("method") == "gradient"

    def __init__(self, method: str = "delete") -> None:
        if method not in self.METHODS:
            raise RedlineError(f"unknown word-importance method '{method}' (known: {', '.join(self.METHODS)})")
        self.method = method
        self.needs_gradient = method == "gradient"

    @property
    def label(self) -> str:
        return f"greedy-wir-{self.method}"

    def importance(self, ctx: SearchContext, idx: list[int], start: Scored) -> Request:
        orig = ctx.original
        if self.method == "gradient":
            grads = ctx.gradient(orig.text, list(orig.spans))
            ctx.queries += 1
            return np.array([grads[i] for i in idx])
        if self.method == "delete":
            results = yield from ctx.score([orig.delete(i) for i in idx])
        else:
            results = yield from ctx.score([orig.replace(i, UNK).text for i in idx])
        saliency = np.array([(r[0] if r else start[0]) - start[0] for r in results])
        if self.method != "wsaliency":
            return saliency
        cands, where = yield from ctx.candidates(orig, idx)
        scored = yield from ctx.score([c.text for c in cands])
        best: dict[int, float] = {}
        for i, r in zip(where, scored):
            if r is not None:
                best[i] = max(best.get(i, r[0]), r[0])
        soft = np.exp(saliency - saliency.max())  # softmax of the masked scores (shift-free: the same)
        soft /= soft.sum()
        return soft * np.array([best.get(i, 0.0) for i in idx])

    def run(self, ctx: SearchContext, start: Scored) -> Request:
        orig = ctx.original
        idx = modifiable(ctx.pre, orig, orig)
        current, cur_score = orig, start[0]
        if not idx:
            return Outcome(orig, cur_score, False, nothing_to_modify=True)
        importance = np.asarray((yield from self.importance(ctx, idx, start)), dtype=float)
        # a word the victim never sees (past its max length: NaN) is not attacked, as in TextAttack's
        # GreedyWordSwapWIRTruncated
        order = [idx[k] for k in np.argsort(-importance, kind="stable") if not np.isnan(importance[k])]
        successes = Successes(ctx.wanted)
        for i in order:
            if ctx.exhausted:
                break
            allowed = modifiable(ctx.pre, current, orig)
            if not allowed:
                break
            if i not in allowed:
                continue
            cands, _ = yield from ctx.candidates(current, [i])
            if not cands:
                continue
            results, best = yield from _score_and_pick(ctx, cands)
            if best is None:
                continue
            k, won = best
            if won:
                if successes.add(cands, results):
                    break
                continue  # more examples wanted: keep `current` and edit the next words instead
            if results[k][0] > cur_score:
                current, cur_score = cands[k], results[k][0]
        return successes.outcome() or Outcome(current, cur_score, False)


@register
class Beam(Search):
    """Beam search over one-word edits, TextAttack's BeamSearch: keep the `width` best texts each
    step, until one succeeds, no text has an edit left (the constraints bar repeats) or the budget
    is spent; the attempt's text is the last step's best. `plateau_stop`: also stop when a step
    brings no improvement, keeping the best text so far (fewer queries; not the reference's loop)."""

    kind = "beam"

    @classmethod
    def build(cls, args: dict[str, Any], ctx: BuildContext) -> "Beam":
        return cls(width=ctx.options.beam_width or args.get("width", 4), plateau_stop=args.get("plateau_stop", False))

    def __init__(self, width: int = 4, plateau_stop: bool = False) -> None:
        self.width, self.plateau_stop = width, plateau_stop

    @property
    def label(self) -> str:
        return f"beam-{self.width}" + ("-plateau" if self.plateau_stop else "")

    def run(self, ctx: SearchContext, start: Scored) -> Request:
        orig = ctx.original
        if not modifiable(ctx.pre, orig, orig):
            return Outcome(orig, start[0], False, nothing_to_modify=True)
        beam = [orig]
        best_text, best_score = orig, start[0]
        successes = Successes(ctx.wanted)
        while not ctx.exhausted:
            asks = [(text, allowed) for text in beam if (allowed := modifiable(ctx.pre, text, orig))]
            answers = yield from ctx.swaps(asks)
            cands = [c for (text, _), swaps in zip(asks, answers) for c in ctx.edits(text, swaps)[0]]
            cands = list({c.text: c for c in cands}.values())  # a text two beam members reach: asked once
            if not cands:
                break
            results, best = yield from _score_and_pick(ctx, cands)
            if best is None:
                break
            k, won = best
            if won and successes.add(cands, results):
                break
            ranked = sorted(((c, r[0]) for c, r in zip(cands, results) if r is not None and not r[1]),
                            key=lambda cr: -cr[1])
            if not ranked or (self.plateau_stop and ranked[0][1] <= best_score):
                break
            beam = [c for c, _ in ranked[: self.width]]
            best_text, best_score = ranked[0]
        return successes.outcome() or Outcome(best_text, best_score, False)


@dataclass
class Member:
    """One text of a genetic population and its goal result."""

    text: AttackedText
    score: float
    success: bool


def parent_probabilities(scores: np.ndarray, temperature: float) -> np.ndarray:
    """How likely each member is drawn as a parent: softmax(score / temperature), so the fitter (a
    higher goal score) the likelier, as in Alzantot et al.'s release. TextAttack's GeneticAlgorithm
    (0.3.x, which TextAttack-Multilabel's ToxicTrap recipes run) takes softmax(-score / temperature),
    favouring the least fit: a bug there that redline does not copy."""
    probs = np.exp((scores - scores.max()) / temperature)
    return probs / probs.sum()


@register
class AlzantotGenetic(Search):
    """Alzantot et al. 2018's genetic search, with the settings of TextAttack's
    AlzantotGeneticAlgorithm as TextAttack-Multilabel's ToxicTrap recipes use it (population 25,
    10 iterations, temperature 0.3, give up when an iteration does not improve, no post-crossover
    check). A member is perturbed by drawing a word with probability proportional to its number of
    candidate edits and taking its best edit when that improves the score (else another word);
    parents are drawn with probability softmax(score / temperature), and a child takes each word
    from either parent. Every member's step is scored in one victim batch; the draws are seeded by
    the text, so a rerun finds the same example."""

    kind = "genetic"

    def __init__(self, population: int = 25, iterations: int = 10, temperature: float = 0.3,
                 give_up_if_no_improvement: bool = True) -> None:
        if population < 2 or iterations < 1 or temperature <= 0:
            raise RedlineError("genetic search needs population >= 2, iterations >= 1 and temperature > 0")
        self.population, self.iterations, self.temperature = population, iterations, temperature
        self.give_up = give_up_if_no_improvement

    @property
    def label(self) -> str:
        return f"genetic-{self.population}x{self.iterations}"

    def run(self, ctx: SearchContext, start: Scored) -> Request:
        orig = ctx.original
        idx = modifiable(ctx.pre, orig, orig)
        if not idx:
            return Outcome(orig, start[0], False, nothing_to_modify=True)
        seed = int.from_bytes(hashlib.blake2b(orig.text.encode(), digest_size=8).digest(), "big")
        rng = np.random.default_rng(seed)
        _, where = yield from ctx.candidates(orig, idx)
        weights = np.bincount(np.asarray(where, dtype=int), minlength=len(orig)).astype(float)
        successes = Successes(ctx.wanted)
        members = [Member(orig, start[0], False) for _ in range(self.population)]
        members = yield from self._perturb(ctx, members, weights, rng, successes)
        best_score = start[0]
        for _ in range(self.iterations):
            members.sort(key=lambda m: -m.score)
            if len(successes.found) >= ctx.wanted or ctx.exhausted:
                break
            if members[0].score > best_score:
                best_score = members[0].score
            elif self.give_up:
                break
            probs = parent_probabilities(np.array([m.score for m in members]), self.temperature)
            n = len(members)
            pairs = zip(rng.choice(n, n - 1, p=probs), rng.choice(n, n - 1, p=probs))
            children = [self._crossover(ctx, members[a], members[b], rng) for a, b in pairs]
            results = yield from ctx.score([c.text.text for c in children])
            successes.add([c.text for c in children], results)
            children = [Member(c.text, r[0], r[1]) if r is not None else c for c, r in zip(children, results)]
            if len(successes.found) >= ctx.wanted:
                break
            children = yield from self._perturb(ctx, children, weights, rng, successes)
            members = [members[0], *children]
        best = max(members, key=lambda m: m.score)
        return successes.outcome() or Outcome(best.text, best.score, False)

    def _crossover(self, ctx: SearchContext, a: Member, b: Member, rng: np.random.Generator) -> Member:
        """Each word from either parent; a child over the modification budget is the fitter parent."""
        orig = ctx.original
        child = orig
        take_b = rng.uniform(size=len(orig)) < 0.5
        for i in sorted(a.text.modified | b.text.modified):
            word = (b.text if take_b[i] else a.text).word(i)
            if word != orig.word(i):
                child = child.replace(i, word)
        if not all(c.within(child, orig) for c in ctx.pre):
            return a if a.score >= b.score else b
        parent = a if child.text == a.text.text else b if child.text == b.text.text else None
        return parent or Member(child, min(a.score, b.score), False)

    def _perturb(self, ctx: SearchContext, members: list[Member], weights: np.ndarray, rng: np.random.Generator,
                 successes: Successes) -> Request:
        """Every member's best improving one-word edit, all members' candidates scored together per step."""
        orig = ctx.original
        out = list(members)
        left = {j: weights.copy() for j in range(len(out))}
        while left and not ctx.exhausted and len(successes.found) < ctx.wanted:
            drawn: dict[int, int] = {}  # member -> the word it edits this step
            for j in list(left):
                w = np.zeros_like(left[j])
                allowed = modifiable(ctx.pre, out[j].text, orig)
                w[allowed] = left[j][allowed]
                if w.sum() <= 0:
                    del left[j]
                    continue
                drawn[j] = int(rng.choice(len(w), p=w / w.sum()))
            answers = yield from ctx.swaps([(out[j].text, [i]) for j, i in drawn.items()])
            steps: dict[int, tuple[int, list[AttackedText]]] = {}
            for (j, i), swaps in zip(drawn.items(), answers):
                cands, _ = ctx.edits(out[j].text, swaps)
                if cands:
                    steps[j] = (i, cands)
                else:
                    left[j][i] = 0
            if not steps:
                continue
            flat = [c for _, cands in steps.values() for c in cands]
            results = yield from ctx.score([c.text for c in flat])
            k = 0
            for j, (i, cands) in steps.items():
                mine = results[k:k + len(cands)]
                k += len(cands)
                successes.add(cands, mine)
                best = _best(cands, mine)
                if best is not None and mine[best[0]][0] > out[j].score:
                    out[j] = Member(cands[best[0]], mine[best[0]][0], best[1])
                    del left[j]
                else:
                    left[j][i] = 0
        return out
