"""gibbs-enum (He & Glass 2019, Algorithm 1); its continuous-relaxation baseline is `relaxation.py`.

For each input position in turn: take the gradient of the search objective with respect to that
position's one-hot input, keep the top-G tokens of its linear estimate, score every candidate
exactly, keep the best if it improves. A sweep visits every position; a trigger stops when a sweep
does not improve it (at most `max_sweeps`), and every restart of a target stops as soon as one
reaches the requested hit type. io searches start from LM samples and add the LM's average
log-likelihood of the trigger to the objective.

Speed: all restarts of all targets in flight move in lock step, so one backward pass gives every
row's gradient and one batched forward scores all their candidates; an upper bound on each
candidate's objective rules most of them out before the full-vocabulary softmax (_score_bounded). `one_at_a_time=True` is the
paper's loop (one forward pass per candidate, one backward per trigger) with the same decisions;
at fixed seeds both give the same triggers (tested), which is what the speed-up is measured on.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from redline.actors.triggers.hits import (
    Thresholds,
    goal_hit,
    hit_types,
    objective_of,
    uses_lm,
)
from redline.actors.triggers.scorers import (
    PriorModel,
    TargetModel,
    bound_support,
    target_score_bounds,
)
from redline.actors.triggers.settings import TriggerSearchSettings
from redline.cluster.config import Result
from redline.errors import RedlineError


class SearchOptions(TriggerSearchSettings):
    """One search call: a run's settings plus the hit type searched and the engine's own knobs."""

    search: str = Result("o-sample-avg")  # one of hits.SEARCHES
    early_stop: bool = Result(True)
    max_batch: int = Result(8192, gt=0)  # candidate sequences per forward pass
    # exact tokens of the candidate bounds (scorers.bound_support); 0: all in full
    bound_support: int = Result(16, ge=0)
    one_at_a_time: bool = Result(False)

    @classmethod
    def of(cls, settings: TriggerSearchSettings, search: str) -> "SearchOptions":
        """The options of one call: every run setting passed through as it is."""
        return cls(**dict(settings), search=search)


@dataclass
class TriggerResult:
    target: str
    trigger: str
    trigger_ids: list[int]
    objective: float
    target_logprobs: list[float]
    margins: list[float]
    lm_average: float | None
    hits: list[str]
    reached: bool  # the requested hit type
    restart: int
    sweeps: int
    forward_passes: int
    backward_passes: int
    sequences_scored: int
    seconds: float


@dataclass
class _Counters:
    forward: int = 0
    backward: int = 0
    sequences: int = 0
    exact: int = 0  # sequences scored over the full vocabulary (the rest were ruled out by a bound)
    lm: int = 0  # io searches: candidate sequences scored under the LM (the rest were ruled out first)


@dataclass
class _Rows:
    """Rows in flight: one per (target, restart)."""

    target: torch.Tensor  # [R] index into targets
    restart: torch.Tensor  # [R]
    trig: torch.Tensor  # [R, L]
    objective: torch.Tensor  # [R]
    improved: torch.Tensor  # [R] bool, this sweep
    sweeps: torch.Tensor  # [R]
    extra: dict[str, Any] = field(default_factory=dict)

    def keep(self, mask: torch.Tensor) -> _Rows:
        return _Rows(self.target[mask], self.restart[mask], self.trig[mask], self.objective[mask], self.improved[mask],
                     self.sweeps[mask])


@contextmanager
def gradient_pass() -> Iterator[None]:
    """Autograd through the models while they stay in eval mode (no dropout). cuDNN's RNN backward
    refuses eval mode ("cudnn RNN backward can only be called in training mode"), so this pass runs
    on PyTorch's own RNN kernels: the same numbers, and the only pass that needs a backward."""
    with torch.enable_grad(), torch.backends.cudnn.flags(enabled=False):
        yield


def target_seed(seed: int, target: str) -> int:
    """Per-target seed from its text: results do not depend on which actor or batch a target lands in."""
    return (zlib.crc32(target.encode("utf-8")) ^ (seed * 2654435761)) & 0x7FFFFFFF


class GibbsEnum:
    def __init__(self, model: TargetModel, prior: PriorModel | None, thresholds: Thresholds, options: SearchOptions) -> None:
        objective_of(options.search)  # validates the name
        if uses_lm(options.search) and prior is None:
            raise RedlineError(f"'{options.search}' needs a language model over inputs (lm:)")
        if uses_lm(options.search) and thresholds.t_in is None:
            raise RedlineError(f"'{options.search}' needs T_in: the LM's threshold")
        self.model, self.prior, self.thresholds, self.opts = model, prior, thresholds, options
        self.objective = objective_of(options.search)
        self.goal = goal_hit(options.search)
        self.counters = _Counters()

    # -- objective ---------------------------------------------------------------------------

    def _reduce(self, logp: torch.Tensor, margin: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor:
        if self.objective == "avg":
            return (logp * mask).sum(-1) / mask.sum(-1)
        if self.objective == "min":
            return logp.masked_fill(~mask, float("inf")).min(-1).values
        # Greedy decoding gives the target only if every margin is positive, so a trigger that gets
        # there must outrank every one that does not, however large the near-miss's other margins:
        # a non-positive margin costs cap * (target length), more than all capped positive ones.
        # Monotone in every margin, so upper bounds on the margins still bound the objective.
        cap = self.opts.greedy_margin_cap
        penalty = cap * mask.sum(-1, keepdim=True)
        shaped = torch.where(margin > 0, margin.clamp(max=cap), margin - penalty)  # type: ignore[union-attr,operator]
        return (shaped * mask).sum(-1) / mask.sum(-1)

    def _lm_average(self, trig: torch.Tensor, at: int | None = None, onehot: torch.Tensor | None = None) -> torch.Tensor:
        return self.prior.token_logprobs(trig, at, onehot).mean(-1)  # type: ignore[union-attr]

    def _batch_rows(self, target_len: int) -> int:
        """Candidate sequences per forward pass: `max_batch`, fewer when the [N, M, V] logits would
        pass about 256 MB."""
        per_row = max(1, target_len * self.model.vocab_size * 4)
        return max(1, min(self.opts.max_batch, (256 << 20) // per_row))

    def _score(self, trig: torch.Tensor, tgt: torch.Tensor, mask: torch.Tensor, final: bool = False) -> dict[str, torch.Tensor]:
        """Exact objective (and what hit checks need) of triggers [N, L] for targets [N, M]; chunked,
        no grad. During search the margins (greedy) and the LM (io) are computed only if the
        objective uses them; `final` scores everything for the reported hits."""
        out: dict[str, list[torch.Tensor]] = {"objective": [], "logp": [], "margin": [], "lm": []}
        step = 1 if self.opts.one_at_a_time else self._batch_rows(tgt.shape[1])
        need_margin = final or self.objective == "greedy"
        with_lm = self.prior is not None and (final or uses_lm(self.opts.search))
        with torch.no_grad():
            for s in range(0, trig.shape[0], step):
                t, y, m = trig[s:s + step], tgt[s:s + step], mask[s:s + step]
                logp, margin = self.model.scores(t, y, need_margin)
                objective = self._reduce(logp, margin, m)
                self.counters.forward += 1
                if with_lm:
                    lm = self._lm_average(t)
                    self.counters.forward += 1
                    if uses_lm(self.opts.search):
                        objective = objective + self.opts.lm_weight * lm
                    out["lm"].append(lm)
                out["objective"].append(objective)
                out["logp"].append(logp)
                if margin is not None:
                    out["margin"].append(margin)
        self.counters.sequences += trig.shape[0]
        return {k: torch.cat(v) for k, v in out.items() if v}

    def _score_bounded(self, current: torch.Tensor, trial: torch.Tensor, tgt: torch.Tensor, mask: torch.Tensor,
                       floor: torch.Tensor, at: int) -> dict[str, torch.Tensor]:
        """Exact scores of the G candidates `trial` [N * G, L] of each row (its `current` trigger
        [N, L] with position `at` changed) that can beat the row's objective `floor` [N]; the others
        get -inf. A cheap upper bound (scorers.target_score_bounds, from what the current trigger
        ranks highest at each target position) rules most candidates out, and only the rest pay for
        the full vocabulary. In an io search the LM term is bounded too before the LM reads a whole
        candidate (`_bound_lm`). Decisions are those of scoring every candidate in full."""
        weight, bias = self.model.output_layer  # type: ignore[misc]
        n, m = tgt.shape
        g = trial.shape[0] // n
        K = min(self.opts.bound_support, self.model.vocab_size - 1)
        with_lm = uses_lm(self.opts.search)
        need_margin = self.objective == "greedy"
        objective = torch.full((n * g,), float("-inf"), dtype=self.model.dtype, device=trial.device)
        logp_all = torch.zeros(n * g, m, dtype=objective.dtype, device=trial.device)
        margin_all = torch.zeros_like(logp_all) if need_margin else None
        lm_all = torch.zeros_like(objective) if with_lm else None
        # float rounding of the subset logits must never rule out a candidate that would win
        slack = torch.finfo(objective.dtype).eps ** 0.5 * (1 + floor.abs())
        # Chunks of rows with one target length (rows come sorted by it), so padding costs nothing,
        # and small enough that the [rows, M, V] tensors of the bounds stay within ~256 MB.
        lengths = mask.sum(1).tolist()
        cap = max(1, min((256 << 20) // (m * self.model.vocab_size * 4 * 10), self.opts.max_batch // g))
        chunks, s = [], 0
        while s < n:
            e = s + 1
            while e < n and e - s < cap and lengths[e] == lengths[s]:
                e += 1
            chunks.append((s, e))
            s = e
        with torch.no_grad():
            for s, e in chunks:
                rows, width = slice(s, e), int(lengths[s])
                y, msk, r = tgt[rows, :width], mask[rows, :width], e - s
                ranked = self.model.project(self.model.target_features(self.model.embed(current[rows]), y))
                support = bound_support(ranked.to(weight.dtype), y, K, weight, bias)
                cand = slice(s * g, (s + r) * g)
                feats = self.model.target_features(self.model.embed(trial[cand]), y.repeat_interleave(g, dim=0))
                logp_ub, margin_ub = target_score_bounds(feats.view(r, g, width, -1), support)
                bound = self._reduce(logp_ub.to(objective.dtype), margin_ub.to(objective.dtype), msk[:, None, :]).reshape(-1)
                self.counters.forward += 2
                if with_lm:
                    bound, lm = self._bound_lm(current[rows], trial[cand], at, bound, floor[rows] - slack[rows], g)
                    lm_all[cand] = lm  # type: ignore[index]
                y_rep, msk_rep = y.repeat_interleave(g, dim=0), msk.repeat_interleave(g, dim=0)

                def exact(keep: torch.Tensor) -> None:
                    logp, margin = self.model.scores_from_features(feats[keep], y_rep[keep], need_margin, msk_rep[keep])
                    value = self._reduce(logp, margin, msk_rep[keep])
                    if with_lm:
                        value = value + self.opts.lm_weight * lm[keep]
                    at = keep + s * g
                    objective[at], logp_all[at, :width] = value, logp
                    if margin_all is not None:
                        margin_all[at, :width] = margin
                    self.counters.exact += len(keep)

                # Branch and bound: score the most promising candidates of each row first; what they
                # reach raises the bar the others' bounds must pass.
                bar = floor[rows] - slack[rows]
                first = (bound.view(r, g).topk(min(2, g), dim=1).indices + torch.arange(r, device=bound.device)[:, None] * g).reshape(-1)
                first = first[bound[first] > bar.repeat_interleave(min(2, g))]
                if len(first):
                    exact(first)
                    reached = objective[s * g:(s + r) * g].view(r, g).max(dim=1).values
                    bar = torch.maximum(bar, reached - slack[rows])
                keep = (bound > bar.repeat_interleave(g)).nonzero()[:, 0]
                keep = keep[~torch.isfinite(objective[keep + s * g])]
                if len(keep):
                    exact(keep)
        self.counters.sequences += trial.shape[0]
        out = {"objective": objective, "logp": logp_all}
        if margin_all is not None:
            out["margin"] = margin_all
        if lm_all is not None:
            out["lm"] = lm_all
        return out

    def _bound_lm(self, current: torch.Tensor, trial: torch.Tensor, at: int, bound: torch.Tensor, bar: torch.Tensor,
                  g: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The io objective's bound with its LM term [r * G], and that term. Every candidate shares the
        current trigger's tokens before `at`, so the LM reads that prefix once per row: it gives those
        tokens' log-probabilities and the candidate token's own; the tokens after it are at most 0. A
        candidate whose output bound plus that LM bound is at or under its row's `bar` [r] cannot win:
        the LM never reads the rest of it (its term -inf). The others are scored from the prefix's state
        on. An LM that cannot continue a state (`prefix` None) scores every candidate whole."""
        prior, length = self.prior, current.shape[1] + 1  # + </s>
        shared = prior.prefix(current, at)  # type: ignore[union-attr]
        self.counters.forward += 1
        if shared is None:
            lm = self._lm_average(trial).to(bound.dtype)
            self.counters.lm += trial.shape[0]
            return bound + self.opts.lm_weight * lm, lm
        before, next_logp, state = shared
        known = (before[:, None] + next_logp.gather(1, trial[:, at].view(-1, g))).reshape(-1).to(bound.dtype)
        alive = (bound + self.opts.lm_weight * known / length > bar.repeat_interleave(g)).nonzero()[:, 0]
        lm = torch.full_like(bound, float("-inf"))
        if len(alive):
            rest = prior.suffix_logprobs(state, alive // g, trial[alive, at:]).sum(-1)  # type: ignore[union-attr]
            lm[alive] = (known[alive] + rest.to(bound.dtype)) / length
            self.counters.forward += 1
            self.counters.lm += len(alive)
        return torch.where(torch.isfinite(lm), bound + self.opts.lm_weight * lm, float("-inf")), lm

    def _gradient(self, trig: torch.Tensor, at: int, tgt: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """d objective / d one-hot input at position `at`, [N, V]."""
        step = 1 if self.opts.one_at_a_time else trig.shape[0]
        grads = []
        for s in range(0, trig.shape[0], step):
            t, y, m = trig[s:s + step], tgt[s:s + step], mask[s:s + step]
            weight = self.model.embedding_weight
            onehot = torch.nn.functional.one_hot(t[:, at], weight.shape[0]).to(weight.dtype).requires_grad_(True)
            with gradient_pass():
                embeds = self.model.embed(t).clone()
                embeds[:, at] = onehot @ weight
                logp, margin = self.model.scores_from_embeds(embeds, y, self.objective == "greedy")
                objective = self._reduce(logp, margin, m)
                if uses_lm(self.opts.search):
                    lm_onehot = onehot if self.prior.embedding_weight.shape[0] == weight.shape[0] else None  # type: ignore[union-attr]
                    objective = objective + self.opts.lm_weight * self._lm_average(t, at, lm_onehot)
                objective.sum().backward()
            self.counters.forward += 1
            self.counters.backward += 1
            grads.append(onehot.grad)
        return torch.cat(grads)

    # -- search ------------------------------------------------------------------------------

    def _init(self, targets: list[str], n_targets: int) -> torch.Tensor:
        rows = []
        allowed = self.model.allowed
        ids = allowed.nonzero()[:, 0]
        for k in range(n_targets):
            gen = torch.Generator().manual_seed(target_seed(self.opts.seed, targets[k]))
            if uses_lm(self.opts.search):
                rows.append(self.prior.sample(self.opts.restarts, self.opts.trigger_length, allowed, gen))  # type: ignore[union-attr]
            else:
                pick = torch.randint(len(ids), (self.opts.restarts, self.opts.trigger_length), generator=gen)
                rows.append(ids.cpu()[pick].to(allowed.device))
        return torch.cat(rows)

    def check(self, triggers: list[str], targets: list[str]) -> list[tuple[bool, float] | None]:
        """For (trigger, target) pairs, e.g. a planted target and the input that produced it: whether
        the trigger reaches this search's goal hit, and its objective; None where the trigger is not
        one the search could find (another length, a word outside the vocabulary)."""
        vocab = getattr(self.model, "vocab", None)
        out: list[tuple[bool, float] | None] = []
        for text, target in zip(triggers, targets):
            ids, _ = self.model.target_ids(target)
            trig = vocab.encode(text) if vocab is not None else []
            device = self.model.allowed.device
            if not ids or len(trig) != self.opts.trigger_length or not bool(self.model.allowed[trig].all()):
                out.append(None)
                continue
            tgt = torch.tensor([ids], device=device)
            scored = self._score(torch.tensor([trig], device=device), tgt, torch.ones_like(tgt, dtype=torch.bool),
                                 final=True)
            lm = float(scored["lm"][0]) if "lm" in scored else None
            hits = hit_types(scored["logp"][0].tolist(), scored["margin"][0].tolist(), lm, self.thresholds)
            out.append((self.goal in hits, float(scored["objective"][0])))
        return out

    def run(self, targets: list[str]) -> list[TriggerResult | str]:
        """A result per target, or the reason it cannot be searched (e.g. out of vocabulary)."""
        if self.opts.one_at_a_time:
            return [r for t in targets for r in self._run([t])]
        return self._run(targets)

    def _run(self, targets: list[str]) -> list[TriggerResult | str]:
        started = time.perf_counter()
        before = _Counters(**vars(self.counters))
        encoded = [self.model.target_ids(t) for t in targets]
        # by target length: rows of one chunk then share a padded width close to their own
        live = sorted((k for k, (ids, _) in enumerate(encoded) if ids), key=lambda k: len(encoded[k][0]))
        results: list[TriggerResult | str] = [reason or "" for _, reason in encoded]
        if not live:
            return results
        device = self.model.allowed.device
        width = max(len(encoded[k][0]) for k in live)
        tgt_all = torch.tensor([encoded[k][0] + [0] * (width - len(encoded[k][0])) for k in live], device=device)
        mask_all = torch.tensor([[1] * len(encoded[k][0]) + [0] * (width - len(encoded[k][0])) for k in live],
                                device=device, dtype=torch.bool)
        R, L, G = self.opts.restarts, self.opts.trigger_length, self.opts.top_g
        n = len(live)
        rows = _Rows(torch.arange(n, device=device).repeat_interleave(R), torch.arange(R, device=device).repeat(n),
                     self._init([targets[k] for k in live], n), torch.zeros(n * R, device=device),
                     torch.zeros(n * R, dtype=torch.bool, device=device), torch.zeros(n * R, dtype=torch.long, device=device))
        first = self._score(rows.trig, tgt_all[rows.target], mask_all[rows.target])
        rows.objective = first["objective"]
        best_trig = rows.trig.clone()
        best_obj = rows.objective.clone()
        best_sweeps = torch.zeros_like(rows.sweeps)
        done = torch.zeros(n, dtype=torch.bool, device=device)  # reached the goal hit
        winner = torch.full((n,), -1, dtype=torch.long, device=device)  # the row index (target * R + restart)

        def check_hits(idx: torch.Tensor, scored: dict[str, torch.Tensor]) -> None:
            """Marks targets whose rows `idx` (just accepted) reach the goal hit; first restart wins."""
            if not self.opts.early_stop:
                return
            for j, row in enumerate(idx.tolist()):
                t = int(rows.target[row])
                if done[t]:
                    continue
                m = mask_all[t]
                margins = scored["margin"][j][m].tolist() if "margin" in scored else [-1.0]
                hits = hit_types(scored["logp"][j][m].tolist(), margins,
                                 float(scored["lm"][j]) if "lm" in scored else None, self.thresholds)
                if self.goal in hits:
                    done[t] = True
                    winner[t] = t * R + int(rows.restart[row])

        def record(idx: torch.Tensor) -> None:
            flat = rows.target[idx] * R + rows.restart[idx]
            better = rows.objective[idx] > best_obj[flat]
            best_obj[flat[better]] = rows.objective[idx][better]
            best_trig[flat[better]] = rows.trig[idx][better]
            best_sweeps[flat] = rows.sweeps[idx]

        check_hits(torch.arange(rows.trig.shape[0], device=device), first)
        record(torch.arange(rows.trig.shape[0], device=device))
        rows = rows.keep(~done[rows.target])
        for _sweep in range(self.opts.max_sweeps):
            if rows.trig.shape[0] == 0:
                break
            rows.improved[:] = False
            rows.sweeps += 1
            for at in range(L):
                if rows.trig.shape[0] == 0:
                    break
                tgt, mask = tgt_all[rows.target], mask_all[rows.target]
                grad = self._gradient(rows.trig, at, tgt, mask)
                current = rows.trig[:, at]
                gain = grad - grad.gather(1, current[:, None])
                gain = gain.masked_fill(~self.model.allowed[None, :], float("-inf"))
                gain.scatter_(1, current[:, None], float("-inf"))
                cand = gain.topk(min(G, int(self.model.allowed.sum()) - 1), dim=1).indices  # [N, G]
                g = cand.shape[1]
                trial = rows.trig.repeat_interleave(g, dim=0)
                trial[:, at] = cand.reshape(-1)
                if self.opts.one_at_a_time or not self.opts.bound_support or self.model.output_layer is None:
                    scored = self._score(trial, tgt.repeat_interleave(g, dim=0), mask.repeat_interleave(g, dim=0))
                else:
                    scored = self._score_bounded(rows.trig, trial, tgt, mask, rows.objective, at)
                objective = scored["objective"].view(-1, g)
                best_val, best_k = objective.max(dim=1)
                accept = best_val > rows.objective + 1e-9
                idx = accept.nonzero()[:, 0]
                if len(idx):
                    rows.trig[idx, at] = cand[idx, best_k[idx]]
                    rows.objective[idx] = best_val[idx]
                    rows.improved[idx] = True
                    flat_pick = idx * g + best_k[idx]
                    check_hits(idx, {k: v[flat_pick] for k, v in scored.items()})
                    record(idx)
                rows = rows.keep(~done[rows.target])
            rows = rows.keep(rows.improved)  # a sweep without improvement: converged
        return self._results(results, targets, live, tgt_all, mask_all, best_trig, best_obj, best_sweeps, done, winner,
                             started, before)

    def _results(self, results: list[TriggerResult | str], targets: list[str], live: list[int], tgt_all: torch.Tensor,
                 mask_all: torch.Tensor, best_trig: torch.Tensor, best_obj: torch.Tensor, best_sweeps: torch.Tensor,
                 done: torch.Tensor, winner: torch.Tensor, started: float, before: _Counters) -> list[TriggerResult | str]:
        R = self.opts.restarts
        pick = torch.where(done, winner, best_obj.view(-1, R).argmax(dim=1) + torch.arange(len(live), device=done.device) * R)
        final = self._score(best_trig[pick], tgt_all, mask_all, final=True)
        seconds = (time.perf_counter() - started) / len(live)
        for j, k in enumerate(live):
            m = mask_all[j]
            logp, margin = final["logp"][j][m].tolist(), final["margin"][j][m].tolist()
            lm = float(final["lm"][j]) if "lm" in final else None
            hits = hit_types(logp, margin, lm, self.thresholds)
            ids = best_trig[pick[j]].tolist()
            results[k] = TriggerResult(
                target=targets[k], trigger=self.model.decode(ids), trigger_ids=ids, objective=float(final["objective"][j]),
                target_logprobs=logp, margins=margin, lm_average=lm, hits=hits, reached=self.goal in hits,
                restart=int(pick[j]) % R, sweeps=int(best_sweeps[pick[j]]),
                forward_passes=(self.counters.forward - before.forward) // len(live),
                backward_passes=(self.counters.backward - before.backward) // len(live),
                sequences_scored=(self.counters.sequences - before.sequences) // len(live), seconds=seconds)
        return results

