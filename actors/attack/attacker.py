"""The attacker: runs many (seed, recipe) attempts at once and batches all their victim queries.

Every attempt is a search generator. Each round, the attacker collects the texts every attempt of a
cohort asks for, deduplicates them, scores the ones the victim cache has not seen in one batched
call, and sends each attempt its answers. Cohorts take turns: the victim scores one on its own
thread while the searches of the other advance, so neither waits on the other. The victim, constraint models and recipe components are
loaded once per worker.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from redline.actors.attack.constraints import shared_encoder
from redline.actors.attack.goals import Goal, Victim
from redline.actors.attack.goals import goal as get_goal
from redline.actors.attack.recipes import (
    AttackResources,
    Components,
    RecipeOptions,
    build,
)
from redline.actors.attack.resources import WordNetTables
from redline.actors.attack.search import Outcome, SearchContext, SwapAsk
from redline.actors.attack.text import AttackedText
from redline.actors.detectors import DetectorConfig, build_detector
from redline.cluster.devices import placement
from redline.errors import RedlineError

log = logging.getLogger(__name__)

# What an attack worker returns per attempt (joined back onto the seed rows by `attempt_id`).
ATTEMPT_FIELDS = [
    pa.field("recipe", pa.string()),
    pa.field("goal", pa.string()),  # tae | bae
    pa.field("victim", pa.string()),
    pa.field("transformation", pa.string()),
    pa.field("constraints", pa.string()),
    pa.field("search", pa.string()),
    pa.field("perturbed_text", pa.string()),
    pa.field("score_before", pa.float64()),  # the victim's toxic score of the seed
    pa.field("score_after", pa.float64()),  # ... of the perturbed text
    pa.field("pred_before", pa.bool_()),
    pa.field("pred_after", pa.bool_()),
    pa.field("queries", pa.int64()),
    pa.field("words_changed", pa.int64()),
    pa.field("words_total", pa.int64()),
    pa.field("perturbed_pct", pa.float64()),
    pa.field("similarity", pa.float64()),  # sentence-encoder cosine, seed vs perturbed
    pa.field("seconds", pa.float64()),
    pa.field("more_examples", pa.list_(pa.string())),  # further distinct successes (examples_per_seed > 1)
]


ATTACK_RESULT_SCHEMA = pa.schema(
    [pa.field("attempt_id", pa.string()), pa.field("shard", pa.int32())] + ATTEMPT_FIELDS
    + [pa.field("attack_status", pa.string()), pa.field("attack_reason", pa.string())]
)


@dataclass
class Attempt:
    attempt_id: str
    text: str
    recipe: str
    goal: str


@dataclass
class AttemptResult:
    status: str  # success | failed | skipped | error
    reason: str | None
    perturbed: str | None
    score_before: float | None
    score_after: float | None
    pred_before: bool | None
    pred_after: bool | None
    queries: int
    words_changed: int
    words_total: int
    seconds: float
    similarity: float | None = None
    more: list[str] | None = None  # further distinct successful texts


class Attacker:
    def __init__(self, victim: Victim, recipes: dict[str, RecipeOptions], resources: AttackResources,
                 only_correct: bool = True, victim_batch: int = 4096, similarity: str = "auto",
                 num_gpus: float = 0.0, cohorts: int = 2) -> None:
        """`cohorts`: groups of attempts in flight at once; while the victim scores one group's
        candidates, the searches of the others make theirs (1: every attempt waits on every call)."""
        self.victim = victim
        self.cohorts = cohorts
        self.options = recipes
        self.resources = resources
        self.num_gpus = num_gpus
        self.only_correct = only_correct
        self.victim_batch = victim_batch
        self.similarity = similarity
        self._components: dict[str, Components] = {}

    def components(self, name: str) -> Components:
        if name not in self._components:
            self._components[name] = build(self.options[name], self.resources, self.num_gpus)
        return self._components[name]

    def _attempt(self, ctx: SearchContext, comps: Components) -> Any:
        started = time.monotonic()
        start = (yield from ctx.score([ctx.original.text]))[0]
        before = ctx.goal.verdict(*start)
        n = len(ctx.original)
        common = dict(score_before=before.toxic_score, pred_before=before.pred_toxic, words_total=n)
        if start[1]:
            status = "skipped" if self.only_correct else "success"
            return AttemptResult(status, f"victim already predicts {'benign' if ctx.goal.name == 'tae' else 'toxic'}",
                                 ctx.original.text if status == "success" else None, score_after=before.toxic_score,
                                 pred_after=before.pred_toxic, queries=ctx.queries, words_changed=0,
                                 seconds=time.monotonic() - started, **common)
        outcome: Outcome = yield from comps.search.run(ctx, start)
        after = ctx.goal.verdict(*ctx.memo[outcome.text.text]) if outcome.text.text in ctx.memo else before
        changed = len(outcome.text.modified)
        more = None
        if outcome.success:
            status, reason = "success", None
            more = [t.text for t, _ in outcome.more] or None
        elif outcome.nothing_to_modify:
            status, reason = "skipped", "no modifiable words (after pre-transformation constraints)"
        else:
            status = "failed"
            reason = "query budget spent" if ctx.queries >= ctx.query_budget else \
                "time limit reached" if time.monotonic() > ctx.deadline else "search exhausted"
        return AttemptResult(status, reason, outcome.text.text if changed else None, score_after=after.toxic_score,
                             pred_after=after.pred_toxic, queries=ctx.queries, words_changed=changed,
                             seconds=time.monotonic() - started, more=more, **common)

    def attack(self, attempts: list[Attempt]) -> list[AttemptResult]:
        results: list[AttemptResult | None] = [None] * len(attempts)
        started = time.monotonic()
        n = max(1, min(self.cohorts, len(attempts)))
        cohorts: list[dict[int, tuple[Any, Goal, list[str]]]] = [{} for _ in range(n)]

        def fail(k: int, err: BaseException) -> None:
            results[k] = AttemptResult("error", f"{type(err).__name__}: {err}"[:300], None, None, None, None, None,
                                       0, 0, len(AttackedText.from_text(attempts[k].text)), time.monotonic() - started)

        def advance(k: int, gen: Any, g: Goal, reply: Any) -> None:
            running = cohorts[k % n]
            try:
                request = gen.send(reply)
                running[k] = (gen, g, request)
            except StopIteration as stop:
                results[k] = stop.value
                running.pop(k, None)
            except Exception as err:  # noqa: BLE001 - one broken attempt must not sink the batch
                log.warning("attempt %s failed: %s", attempts[k].attempt_id, err)
                fail(k, err)
                running.pop(k, None)

        for k, a in enumerate(attempts):
            try:
                comps = self.components(a.recipe)
                g = get_goal(a.goal)
                opts = comps.options
                ctx = SearchContext(AttackedText.from_text(a.text), g, comps.transformation, comps.pre, comps.post,
                                    opts.query_budget,
                                    time.monotonic() + opts.time_limit_s if opts.time_limit_s else math.inf,
                                    gradient=(lambda text, spans, g=g: self.victim.word_importance_by_gradient(text, spans, g))
                                    if comps.search.needs_gradient else None, wanted=opts.examples_per_seed)
                advance(k, self._attempt(ctx, comps), g, None)
            except Exception as err:  # noqa: BLE001
                fail(k, err)

        def wanted(running: dict[int, tuple[Any, Goal, list[str]]]) -> list[str]:
            """The texts a cohort's attempts ask the victim about, once its swap asks are answered."""
            self._answer_swaps(running, advance, fail)
            return list(dict.fromkeys(t for _, _, req in running.values() for t in req))

        # The attempts run in cohorts; one thread asks the victim about one cohort while this thread
        # advances the searches of another, so the model (a GPU's, above all) is not idle while the
        # searches make their next candidates, and the searches do not wait on the model.
        with ThreadPoolExecutor(1, thread_name_prefix="victim") as victim_thread:
            asked = {c: victim_thread.submit(self._verdicts, wanted(r)) for c, r in enumerate(cohorts) if r}
            while asked:
                for c in list(asked):
                    running = cohorts[c]
                    try:
                        answers = asked.pop(c).result()
                    except RedlineError:
                        raise  # something the user must fix (an unreachable or refusing service)
                    except Exception as err:  # noqa: BLE001 - isolate: score each attempt's request alone
                        if self.victim.detector.remote:  # not one request per attempt against a failing service
                            for r in cohorts:
                                for k in list(r):
                                    fail(k, err)
                                    r.pop(k)
                            continue
                        log.warning("victim failed on a batch (%s); retrying per attempt", err)
                        answers = victim_thread.submit(self._isolate, running, fail).result()
                    for k, (gen, g, req) in list(running.items()):
                        advance(k, gen, g, [(g.score(answers[t].toxic_score), g.success(answers[t].pred_toxic))
                                            for t in req])
                    if running:
                        asked[c] = victim_thread.submit(self._verdicts, wanted(running))
        self._similarities(attempts, results)
        return results  # type: ignore[return-value]

    @staticmethod
    def _answer_swaps(running: dict[int, tuple[Any, Goal, Any]], advance: Any, fail: Any) -> None:
        """Answers the swap asks of a cohort's attempts (a masked LM's edits) in one batched call per
        transformation, round after round, until each attempt asks the victim or is done."""
        while asking := [(k, entry) for k, entry in running.items() if isinstance(entry[2], SwapAsk)]:
            by_transformation: dict[int, list[tuple[int, tuple[Any, Goal, SwapAsk]]]] = defaultdict(list)
            for k, entry in asking:
                by_transformation[id(entry[2].transformation)].append((k, entry))
            for group in by_transformation.values():
                transformation = group[0][1][2].transformation
                try:
                    flat = transformation.swaps_many([a for _, (_, _, ask) in group for a in ask.asks])
                    ends = np.cumsum([len(ask.asks) for _, (_, _, ask) in group])
                    answers: list[Any] = [flat[end - len(ask.asks):end] for end, (_, (_, _, ask)) in zip(ends, group)]
                except Exception as err:  # noqa: BLE001 - isolate: each attempt's asks alone, so one bad text fails one
                    log.warning("transformation failed on %d attempts' asks (%s); retrying per attempt", len(group), err)
                    answers = [_alone(transformation, k, ask, fail) for k, (_, _, ask) in group]
                for (k, (gen, g, _)), answer in zip(group, answers):
                    if answer is None:
                        running.pop(k)
                    else:
                        advance(k, gen, g, answer)

    def _verdicts(self, texts: list[str]) -> dict[str, Any]:
        answers: dict[str, Any] = {}
        for start in range(0, len(texts), self.victim_batch):
            chunk = texts[start:start + self.victim_batch]
            answers.update(zip(chunk, self.victim.query(chunk)))
        return answers

    def _isolate(self, running: dict[int, tuple[Any, Goal, list[str]]], fail: Any) -> dict[str, Any]:
        """After a failed batch of a local model: each attempt's request alone, so one bad text fails
        only its attempt."""
        answers: dict[str, Any] = {}
        for k, (_, _, req) in list(running.items()):
            try:
                answers.update(zip(req, self.victim.query(req)))
            except Exception as row_err:  # noqa: BLE001
                fail(k, row_err)
                running.pop(k)
        return answers

    def wants_similarity(self, recipe: str) -> bool:
        """`always`, `never`, or `auto`: only for recipes whose constraints already load a
        sentence encoder (elsewhere it would add a model pass the attack itself does not need)."""
        if self.similarity != "auto":
            return self.similarity == "always"
        comps = self._components.get(recipe)
        return comps is not None and any(c.kind == "sentence-similarity" for c in comps.post)

    def _similarities(self, attempts: list[Attempt], results: list[AttemptResult | None]) -> None:
        pairs = [(k, a.text, r.perturbed) for k, (a, r) in enumerate(zip(attempts, results))
                 if r is not None and r.perturbed and r.status in ("success", "failed") and self.wants_similarity(a.recipe)]
        if not pairs:
            return
        try:
            sims = shared_encoder(self.resources.sentence_encoder, placement(self.num_gpus).device).similarity([p[1] for p in pairs], [p[2] for p in pairs])
        except Exception as err:  # noqa: BLE001 - similarity is reported, not required
            log.warning("cannot compute similarities: %s", err)
            return
        for (k, _, _), s in zip(pairs, sims):
            results[k].similarity = float(s)  # type: ignore[union-attr]


def _alone(transformation: Any, k: int, ask: SwapAsk, fail: Any) -> list[dict[int, list[str]]] | None:
    """One attempt's asks answered on their own; None (the attempt failed) when they fail alone too."""
    try:
        return transformation.swaps_many(ask.asks)
    except Exception as err:  # noqa: BLE001 - the attempt fails with its cause, the others go on
        fail(k, err)
        return None


class AttackWorker:
    """A batch worker (an actor of the pipelines' pools): loads the victim and recipe components once,
    attacks batches of attempts."""

    output_schema: ClassVar[pa.Schema] = ATTACK_RESULT_SCHEMA

    def __init__(self, victim: DetectorConfig, recipes: list[RecipeOptions], resources: AttackResources,
                 only_correct: bool = True, similarity: str = "auto", wordnet: Any = None,
                 num_gpus: float = 0.0) -> None:
        """`num_gpus`: this actor's GPUs, where the victim and every recipe model run (one device
        policy). `wordnet`: the driver's WordNet tables (or a Ray object reference to them), so this
        actor needs neither WordNet nor a cache on its own node."""
        if wordnet is not None:
            from redline.actors.attack.resources import use_wordnet_tables

            if not isinstance(wordnet, WordNetTables):
                import ray

                wordnet = ray.get(wordnet)
            use_wordnet_tables(wordnet)
        cfg = victim.model_copy(update={"num_gpus": num_gpus})
        self.victim_name = cfg.name
        opts = {r.name: r for r in recipes}
        self.attacker = Attacker(Victim(build_detector(cfg)), opts, resources,
                                 only_correct=only_correct, similarity=similarity, num_gpus=num_gpus)

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        attempts = [Attempt(i, t, r, g) for i, t, r, g in
                    zip(batch["attempt_id"], batch["text"], batch["recipe"], batch["goal"])]
        results = self.attacker.attack(attempts)
        labels = {}
        for a in attempts:
            try:
                labels[a.recipe] = self.attacker.components(a.recipe).label
            except Exception:  # noqa: BLE001 - the attempt already carries the error
                labels[a.recipe] = {}
        rows = []
        for a, r, shard in zip(attempts, results, batch["shard"]):
            lab = labels[a.recipe]
            pct = (100.0 * r.words_changed / r.words_total) if r.words_total else None
            rows.append({
                "attempt_id": a.attempt_id, "shard": int(shard), "recipe": a.recipe, "goal": a.goal, "victim": self.victim_name,
                "transformation": lab.get("transformation"), "constraints": lab.get("constraints"),
                "search": lab.get("search"), "perturbed_text": r.perturbed, "score_before": r.score_before,
                "score_after": r.score_after, "pred_before": r.pred_before, "pred_after": r.pred_after,
                "queries": r.queries, "words_changed": r.words_changed, "words_total": r.words_total,
                "perturbed_pct": pct, "similarity": r.similarity, "attack_status": r.status,
                "attack_reason": r.reason, "seconds": r.seconds, "more_examples": r.more,
            })
        return pa.Table.from_pylist(rows, schema=ATTACK_RESULT_SCHEMA)
