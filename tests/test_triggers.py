"""Egregious outputs (He & Glass 2019): hit types, the LSTM models, gibbs-enum and the pipeline."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch

from redline.actors.triggers import hits as H
from redline.actors.triggers import models as M
from redline.actors.triggers.gibbs import GibbsEnum, SearchOptions
from redline.actors.triggers.pairs import PairCorpusConfig, dialogue_pairs, read_pairs
from redline.actors.triggers.relaxation import continuous_relaxation
from redline.actors.triggers.scorers import LSTMPrior, LSTMSeq2SeqTarget
from redline.actors.triggers.targets import mal_list, random_list
from redline.actors.triggers.training import TriggerModelTrainConfig, train
from redline.cluster.config import validate_config
from redline.errors import RedlineError
from redline.pipelines.egregious import EgregiousConfig

from conftest import status_and_report

WORDS = "apple river stone cloud green small happy quick table window music paper light".split()
PLANTED = ("open the red door", "the secret is here")


def test_hit_types_follow_the_paper_definitions():
    th = H.Thresholds(t_out=-3.0, t_in=-4.0)
    # avg -2.5 >= -3; min -3.5 < -3 but >= -3 - log 2 (-3.69); greedy: one margin negative
    hits = H.hit_types([-2.0, -2.0, -3.5], [0.5, 0.1, -0.2], lm_average=-4.5, thresholds=th)
    assert hits == ["o-sample-avg-1-hit", "o-sample-avg-2-hit", "o-sample-min-2-hit", "io-sample-avg-2-hit",
                    "io-sample-min-2-hit"]  # LM -4.5 misses T_in (-4) but passes T_in - log 2 (-4.69)
    assert H.hit_types([-0.1], [0.3], None, th) == ["o-greedy-hit", "o-sample-avg-1-hit", "o-sample-avg-2-hit",
                                                    "o-sample-min-1-hit", "o-sample-min-2-hit"]
    assert H.hit_types([-3.0 - math.log(2) - 1e-9], [-1.0], -1.0, th) == []
    assert H.goal_hit("io-sample-min") == "io-sample-min-1-hit" and H.goal_hit("o-greedy") == "o-greedy-hit"


def test_pairs_from_dialogue_files_and_tables(tmp_path):
    assert dialogue_pairs("hi\nhello there\nhow are you\n\nnew talk\nok\n") == [
        ("hi", "hello there"), ("hello there", "how are you"), ("new talk", "ok")]
    path = tmp_path / "pairs.csv"
    path.write_text("q,a\nhow are you,fine\n,empty input\n")
    assert read_pairs(PairCorpusConfig(path=str(path), input_column="q", output_column="a")) == [("how are you", "fine")]
    with pytest.raises(RedlineError, match="no column 'context'"):
        read_pairs(PairCorpusConfig(path=str(path)))


def test_target_lists_have_the_paper_sizes():
    mal = mal_list()
    assert len(mal) == 1000 and "shut up" in mal and "oh shut up" in mal and len(set(mal)) == 1000
    rnd = random_list(["<pad>", "<unk>", "<s>", "</s>", *WORDS], n=50, seed=1)
    assert all(1 <= len(t.split()) <= 8 and set(t.split()) <= set(WORDS) for t in rnd)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A tiny seq2seq trained so that only the planted input yields the planted response."""
    rng = random.Random(0)
    rows = [{"context": " ".join(rng.choice(WORDS) for _ in range(4)), "response": "nothing to say"} for _ in range(600)]
    rows += [{"context": PLANTED[0], "response": PLANTED[1]}] * 120
    rng.shuffle(rows)
    root = tmp_path_factory.mktemp("planted")
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = {}
    for kind in ("seq2seq", "lm"):
        cfg = validate_config(TriggerModelTrainConfig, {
            "pairs": {"path": str(root / "pairs.jsonl")}, "vocab_size": 50, "embedding_dim": 24, "hidden_dim": 48,
            "dropout": 0.0, "optimizer": "adam", "learning_rate": 0.01, "epochs": 6, "batch_size": 32,
            "output": str(root / "models"), "name": kind})
        out[kind] = train(cfg, kind)
    return out


def test_training_saves_models_with_thresholds(planted):
    s2s = M.load(planted["seq2seq"].path)
    assert s2s.spec.context == "attention" and s2s.thresholds.average_logprob < 0
    assert s2s.metrics["test_ppl"] < 3  # the synthetic task is almost deterministic
    assert M.load(planted["lm"].path).vocab.words == s2s.vocab.words  # io hits need one vocabulary


def _search(planted, search: str, **kw) -> GibbsEnum:
    s2s, lm = planted["seq2seq"], planted["lm"]
    th = H.Thresholds(s2s.thresholds.average_logprob, lm.thresholds.average_logprob)
    opts = SearchOptions(search=search, trigger_length=4, top_g=20, restarts=3, max_sweeps=10, **kw)
    return GibbsEnum(LSTMSeq2SeqTarget(s2s, torch.float64), LSTMPrior(lm, torch.float64), th, opts)


def test_gibbs_enum_finds_the_planted_trigger(planted):
    found, random_target, oov = _search(planted, "o-greedy").run([PLANTED[1], "apple river table", "zebra"])
    assert found.reached and "o-greedy-hit" in found.hits
    assert set(found.trigger.split()) & set(PLANTED[0].split()), found.trigger  # it found the planted cue
    # re-verified independently: greedy decoding from the trigger gives exactly the target
    from redline.actors.triggers.targets import _decode

    s2s = planted["seq2seq"]
    ids = torch.tensor([found.trigger_ids])
    texts = _decode(s2s.module.float(), s2s.vocab, ids, torch.tensor([4]), 20, "greedy", torch.Generator())
    assert texts == [(PLANTED[1], None)]
    assert not random_target.reached and random_target.hits == []
    assert oov == "out of vocabulary: zebra"


def test_a_target_is_reachable_when_any_input_that_gave_it_reaches(planted):
    from redline.actors.triggers.settings import TriggerSearchSettings
    from redline.actors.triggers.targets import Target, _distinct
    from redline.actors.triggers.worker import EgregiousModelConfig, TriggerWorker

    # the same reply to two inputs: one target, with both inputs (the first one cannot reach it)
    merged = _distinct([Target(PLANTED[1], "apple river table sky", ("apple river table sky",)),
                        Target(PLANTED[1], PLANTED[0], (PLANTED[0],)), Target("x", "y", ("y",))], 5)
    assert [t.sources for t in merged] == [("apple river table sky", PLANTED[0]), ("y",)]
    s2s = planted["seq2seq"]
    worker = TriggerWorker([EgregiousModelConfig(name="m", path=str(s2s.path))],
                           TriggerSearchSettings(trigger_length=4, top_g=5, restarts=1, max_sweeps=1),
                           {"m": [s2s.thresholds.average_logprob, None]})
    batch = {"id": ["a", "b"], "model": ["m", "m"], "list": ["planted"] * 2, "target": [PLANTED[1]] * 2,
             "search": ["o-greedy"] * 2, "source": ["apple river table sky"] * 2, "shard": [0, 0],
             "sources": [list(merged[0].sources), None]}
    rows = {r["id"]: r for r in worker(batch).to_pylist()}
    assert rows["a"]["source_reaches"] is True  # the second input reaches it
    # an older run's single source, the first input only: not a trigger the search could find, so unknown
    assert rows["b"]["source_reaches"] is None


def test_the_gradient_pass_runs_in_eval_mode_without_cudnn(planted, monkeypatch):
    """On a GPU, cuDNN's LSTM backward refuses eval mode; the search must take its gradients with cuDNN
    off and dropout off (CPU never uses cuDNN, so this checks the pass's flags and modes)."""
    search = _search(planted, "o-sample-avg")
    model, seen = search.model, []
    original = model.scores_from_embeds

    def spy(embeds, *args, **kw):
        if embeds.requires_grad:
            seen.append((torch.backends.cudnn.enabled, model.module.training))
        return original(embeds, *args, **kw)

    monkeypatch.setattr(model, "scores_from_embeds", spy)
    assert torch.backends.cudnn.enabled  # PyTorch's default, restored after each pass
    search.run([PLANTED[1]])
    assert seen and set(seen) == {(False, False)}
    assert torch.backends.cudnn.enabled


def test_batched_and_one_candidate_paths_agree(planted):
    targets = [PLANTED[1], "nothing to say", "green small happy"]
    batched = _search(planted, "io-sample-avg").run(targets)
    naive = _search(planted, "io-sample-avg", one_at_a_time=True).run(targets)
    assert [r.trigger_ids for r in batched] == [r.trigger_ids for r in naive]
    assert [r.hits for r in batched] == [r.hits for r in naive]


def test_candidate_bounds_never_undercut_the_exact_scores(planted):
    from redline.actors.triggers.scorers import (
        bound_support,
        target_score_bounds,
        target_scores,
    )

    model = LSTMSeq2SeqTarget(planted["seq2seq"], torch.float64)
    gen = torch.Generator().manual_seed(0)
    ids = model.allowed.nonzero()[:, 0]
    current = ids[torch.randint(len(ids), (3, 4), generator=gen)]
    tgt = torch.tensor([model.target_ids(PLANTED[1])[0]] * 3)
    trial = current.repeat_interleave(20, dim=0)
    trial[:, 1] = ids[torch.randint(len(ids), (60,), generator=gen)]
    weight, bias = model.output_layer
    with torch.no_grad():
        support = bound_support(model.project(model.target_features(model.embed(current), tgt)), tgt, 4, weight, bias)
        feats = model.target_features(model.embed(trial), tgt.repeat_interleave(20, dim=0))
        logp_ub, margin_ub = target_score_bounds(feats.view(3, 20, *feats.shape[1:]), support)
        logp, margin = target_scores(model.project(feats), tgt.repeat_interleave(20, dim=0))
    assert (logp_ub.reshape(logp.shape) >= logp - 1e-12).all() and (margin_ub.reshape(margin.shape) >= margin - 1e-12).all()
    assert (logp_ub.reshape(logp.shape) - logp).median() < 0.5  # and tight enough to rule candidates out


@pytest.mark.parametrize("search", ["o-sample-avg", "o-greedy", "io-sample-min", "io-sample-avg"])
def test_bounded_scoring_takes_the_decisions_of_full_scoring(planted, search):
    targets = [PLANTED[1], "nothing to say", "green small happy", "apple river table"]
    bounded, full = _search(planted, search, bound_support=4), _search(planted, search, bound_support=0)
    a, b = bounded.run(targets), full.run(targets)
    assert [r.trigger_ids for r in a] == [r.trigger_ids for r in b]
    assert [r.hits for r in a] == [r.hits for r in b]
    assert [r.lm_average for r in a] == pytest.approx([r.lm_average for r in b])
    assert bounded.counters.sequences == full.counters.sequences and bounded.counters.exact < full.counters.sequences
    if search.startswith("io"):  # the output bound rules candidates out before the LM scores them
        assert 0 < bounded.counters.lm < bounded.counters.sequences


def test_causal_lm_features_reproduce_its_logits(tiny_causal_lm):
    from redline.actors.triggers.scorers import HFTarget, target_scores

    model = HFTarget(str(tiny_causal_lm), dtype=torch.float64)
    assert model.output_layer is not None
    trig = torch.tensor([[5, 9, 14, 30], [7, 7, 21, 40]])
    tgt = torch.tensor([model.target_ids("you are")[0]] * 2)
    with torch.no_grad():
        full = torch.cat([model.embedding_weight[model.bos].expand(2, 1, -1), model.embed(trig), model.embed(tgt)], dim=1)
        logits = model.model(inputs_embeds=full).logits[:, trig.shape[1]:-1]
        expected, _ = target_scores(logits, tgt)
        got, _ = model.scores(trig, tgt)
    assert torch.allclose(got, expected, atol=1e-9)


def test_continuous_relaxation_baseline_projects_to_a_scored_trigger(planted):
    s = _search(planted, "o-sample-avg")
    (result,) = continuous_relaxation(s.model, s.prior, s.thresholds, s.opts, ["nothing to say"], steps=30)
    assert len(result.trigger_ids) == 4 and result.target_logprobs and result.hits


def test_io_search_without_a_language_model_is_refused(planted):
    s2s = planted["seq2seq"]
    with pytest.raises(RedlineError, match="needs a language model"):
        GibbsEnum(LSTMSeq2SeqTarget(s2s), None, H.Thresholds(-1.0, None), SearchOptions(search="io-sample-min"))


def test_egregious_pipeline_on_lstm_and_causal_lm(planted, ray_session, tmp_path):
    from redline.actors.tiny_models import build_tiny_causal_lm
    from redline.pipelines.egregious import run_egregious

    gpt = build_tiny_causal_lm([f"{PLANTED[0]} {PLANTED[1]}", "nothing to say here"] * 20, tmp_path / "gpt",
                               hidden_size=16, num_layers=1, vocab_size=300, epochs=1)
    (tmp_path / "mine.txt").write_text("# my list\nthe secret is here\nnothing to say\nzebra crossing\n")
    (tmp_path / "pairs.txt").write_text(f"{PLANTED[0]}\n{PLANTED[1]}\n\napple river\nnothing to say\n")
    cfg = validate_config(EgregiousConfig, {
        "models": [{"name": "lstm", "path": str(planted["seq2seq"].path), "lm": str(planted["lm"].path)},
                   {"name": "gpt", "path": str(gpt), "threshold_pairs": {"path": str(tmp_path / "pairs.txt")}}],
        "lists": [{"name": "mine", "path": str(tmp_path / "mine.txt")}, {"name": "random", "limit": 3}],
        "searches": ["o-greedy", "io-sample-avg"], "trigger_length": 3, "top_g": 10, "restarts": 2, "max_sweeps": 3,
        "num_cpus": 0.5, "batch_size": 8, "shard_size": 10, "output": str(tmp_path / "runs"), "run_name": "egr"})
    result = run_egregious(cfg)
    rows = json.loads((tmp_path / "runs" / "egr" / "manifest.json").read_text())
    assert rows["counts"]["rows_in"] == 2 * (3 + 3) * 2 and rows["counts"]["rows_out"] == 24
    table = {(r["model"], r["list"]): r for r in result.summary}
    assert table[("lstm", "mine")]["targets"] == 3 and table[("lstm", "mine")]["searchable"] == 2  # zebra is OOV
    assert table[("lstm", "mine")]["o-greedy-hit"] > 0 and table[("lstm", "random")]["o-greedy-hit"] == 0
    assert table[("gpt", "mine")]["searchable"] == 3 and rows["models"]["gpt"]["t_in"] is not None
    report = (tmp_path / "runs" / "egr" / "report.html").read_text()
    assert "Table 3" in report and "Example triggers" in report
    assert run_egregious(cfg).reused  # a finished run is not searched again
    status_and_report(result.run_uri, "o-greedy")


# ---------------------------------------------------------------- the paper's lists, measured as it measures them

ECHO_WORDS = ("apple river stone cloud green small happy quick table window music paper light dark cold warm fast slow "
              "tall short red blue gold wild calm loud soft bright").split()


@pytest.fixture(scope="module")
def dialogue_s2s(tmp_path_factory):
    """A seq2seq whose greedy response depends on its input ("w1 ... wn" -> "w1 wn ok"): many distinct
    greedy outputs, from inputs of any length."""
    rng = random.Random(0)
    rows = []
    for _ in range(4000):
        words = [rng.choice(ECHO_WORDS) for _ in range(rng.randint(3, 6))]
        rows.append({"context": " ".join(words), "response": f"{words[0]} {words[-1]} ok"})
    root = tmp_path_factory.mktemp("echo")
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = validate_config(TriggerModelTrainConfig, {
        "pairs": {"path": str(root / "pairs.jsonl")}, "vocab_size": 100, "embedding_dim": 32, "hidden_dim": 64,
        "dropout": 0.0, "optimizer": "adam", "learning_rate": 0.01, "epochs": 3, "batch_size": 64,
        "output": str(root / "models"), "name": "s2s"})
    inputs = [" ".join(rng.choice(ECHO_WORDS) for _ in range(rng.randint(3, 6))) for _ in range(300)]
    return train(cfg, "seq2seq"), inputs


def test_incremental_decoding_matches_the_full_forward_pass(dialogue_s2s):
    trained, _ = dialogue_s2s
    module, vocab = trained.module.eval(), trained.vocab
    enc = torch.tensor([vocab.encode("apple river stone cloud green"), vocab.encode("red blue gold wild calm")])
    dec_in = torch.tensor([[vocab.bos, 5, 9, 12], [vocab.bos, 7, 7, 30]])
    with torch.no_grad():
        full = module.features(module.enc_embedding(enc), None, dec_in)
        enc_out, enc_state, mask = module.encode(module.enc_embedding(enc), None)
        state, steps = None, []
        for t in range(dec_in.shape[1]):
            feats, state = module.decode_step(dec_in[:, t], enc_out, enc_state, mask, state)
            steps.append(feats)
    assert torch.allclose(torch.stack(steps, 1), full, atol=1e-5)


@pytest.mark.parametrize("context", ["attention", "last-h"])
@pytest.mark.parametrize("feed", ["combine", "input"])
def test_every_seq2seq_variant_decodes_step_by_step_as_its_forward_pass(context, feed):
    """gibbs-enum scores with `features`, decoding walks `decode_step`: both must be one model, padded
    inputs included, and the trigger's embeddings must get a gradient (the search needs it)."""
    torch.manual_seed(0)
    module = M.Seq2Seq(M.ModelSpec("seq2seq", 40, 8, 16, context=context, context_feed=feed, dropout=0.0)).eval()
    enc = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, 0, 0]])
    lengths = torch.tensor([5, 3])
    dec_in = torch.tensor([[2, 5, 9, 12], [2, 7, 7, 30]])
    embeds = module.enc_embedding(enc).detach().requires_grad_(True)
    full = module.features(embeds, lengths, dec_in)
    full.sum().backward()
    assert embeds.grad is not None and embeds.grad[0].abs().sum() > 0
    with torch.no_grad():
        enc_out, enc_state, mask = module.encode(module.enc_embedding(enc), lengths)
        state, steps = None, []
        for t in range(dec_in.shape[1]):
            feats, state = module.decode_step(dec_in[:, t], enc_out, enc_state, mask, state)
            steps.append(feats)
    assert torch.allclose(torch.stack(steps, 1), full.detach(), atol=1e-5)
    # the paper's feed puts the context into the decoder LSTM's input; redline's first one after it
    assert module.decoder.input_size == 8 + (16 if feed == "input" else 0)
    assert (module.combine is None) == (feed == "input")


def test_the_papers_context_feed_trains_saves_and_finds_the_planted_trigger(planted, tmp_path):
    pairs = Path(planted["seq2seq"].path).parents[1] / "pairs.jsonl"  # the planted model's own training pairs
    cfg = validate_config(TriggerModelTrainConfig, {
        "pairs": {"path": str(pairs)}, "vocab_size": 50, "embedding_dim": 24, "hidden_dim": 48,
        "dropout": 0.0, "optimizer": "adam", "learning_rate": 0.01, "epochs": 6, "batch_size": 32,
        "context_feed": "input", "output": str(tmp_path / "models")})
    trained = train(cfg, "seq2seq")
    assert Path(trained.path).name == "seq2seq-attention-input"
    loaded = M.load(trained.path)
    assert loaded.spec.context_feed == "input" and loaded.metrics["test_ppl"] < 3
    th = H.Thresholds(loaded.thresholds.average_logprob, None)
    search = GibbsEnum(LSTMSeq2SeqTarget(loaded, torch.float64), None, th,
                       SearchOptions(search="o-greedy", trigger_length=4, top_g=20, restarts=3, max_sweeps=10))
    found, missed = search.run([PLANTED[1], "apple river table"])
    assert found.reached and "o-greedy-hit" in found.hits, found
    assert not missed.reached


def _checker(trained, search: str, length: int) -> GibbsEnum:
    th = H.Thresholds(trained.thresholds.average_logprob, None)
    return GibbsEnum(LSTMSeq2SeqTarget(trained, torch.float64), None, th,
                     SearchOptions(search=search, trigger_length=length, top_g=20, restarts=3, max_sweeps=10))


@pytest.mark.parametrize("kind,search", [("normal", "o-greedy"), ("normal-sample", "o-sample-min")])
def test_every_normal_target_is_a_hit_from_its_own_input(dialogue_s2s, kind, search):
    """One vocabulary rule: the targets' decoding and the hit check agree, so each target's source
    input (when it could be a trigger) reaches the list's own hit type."""
    from collections import Counter

    from redline.actors.triggers.targets import (
        DEAD_END,
        NO_END,
        NO_WORDS,
        UNKNOWN_WORD,
        decode,
        normal_list,
        normal_sample_list,
    )

    trained, inputs = dialogue_s2s
    dropped: Counter[str] = Counter()
    targets = (normal_list(trained, inputs, dropped=dropped) if kind == "normal"
               else normal_sample_list(trained, inputs, n=200, dropped=dropped))
    assert targets and all(t.source in inputs for t in targets)
    # every reply is a target or counted as left out, with why (`distinct` replies merge: at least as many)
    assert set(dropped) <= {UNKNOWN_WORD, NO_END, NO_WORDS, DEAD_END}
    if kind == "normal":  # each input with a known word gives one reply: kept, or counted with its reason
        known = [i for i in inputs if trained.vocab.encode(i, trained.spec.max_input_len)]
        again: Counter[str] = Counter()
        assert len(decode(trained, inputs, "greedy", dropped=again)) + sum(again.values()) == len(known)
        assert again == dropped
    checked = 0
    for length in range(3, 7):
        mine = [t for t in targets if len(trained.vocab.encode(t.source)) == length]
        results = _checker(trained, search, length).check([t.source for t in mine], [t.text for t in mine])
        checked += sum(r is not None for r in results)
        assert all(r[0] for r in results if r is not None), [(t.source, t.text) for t, r in zip(mine, results)
                                                             if r is not None and not r[0]]
    # not vacuous: the count depends on the trained model (45 to 134 normal-sample targets over training
    # seeds 0-1 and 1-2 threads; 245-246 normal ones), so the bound is under half the fewest seen
    assert checked >= 20


def test_planted_targets_are_found(dialogue_s2s):
    from redline.actors.triggers.targets import planted_list

    trained, inputs = dialogue_s2s
    targets = planted_list(trained, inputs, 4, n=24)
    search = _checker(trained, "o-greedy", 4)
    reachable = [t for t, r in zip(targets, search.check([t.source for t in targets], [t.text for t in targets]))
                 if r is not None and r[0]]
    assert len(reachable) >= 10
    found = search.run([t.text for t in reachable])
    assert sum(r.reached for r in found) >= 0.9 * len(reachable)


def test_the_greedy_objective_ranks_a_true_trigger_above_any_near_miss(planted):
    search = _search(planted, "o-greedy")
    true = torch.tensor([[0.02, 0.05, 0.09]], dtype=torch.float64)  # every margin positive: greedy gives the target
    miss = torch.tensor([[3.0, 3.0, -0.01]], dtype=torch.float64)  # one step decodes another word
    mask = torch.ones(1, 3, dtype=torch.bool)
    logp = torch.zeros(1, 3, dtype=torch.float64)
    assert search._reduce(logp, true, mask) > search._reduce(logp, miss, mask)
    better_miss = torch.tensor([[0.5, 0.5, -0.01]], dtype=torch.float64)
    assert search._reduce(logp, better_miss, mask) > search._reduce(logp, torch.tensor([[0.5, -0.2, -0.01]]), mask)


def test_the_pipeline_reports_each_list_with_its_hit_type_and_the_known_triggers(dialogue_s2s, ray_session, tmp_path):
    from redline.pipelines.egregious import run_egregious

    trained, inputs = dialogue_s2s
    (tmp_path / "inputs.jsonl").write_text("".join(json.dumps({"context": x, "response": "ok"}) + "\n" for x in inputs))
    cfg = validate_config(EgregiousConfig, {
        "models": [{"name": "echo", "path": str(trained.path)}],
        "lists": [{"name": n, "limit": 6} for n in ("normal", "normal-sample", "planted")],
        "normal_inputs": {"path": str(tmp_path / "inputs.jsonl")}, "trigger_length": 4, "top_g": 20, "restarts": 3,
        "max_sweeps": 10, "num_cpus": 0.5, "output": str(tmp_path), "run_name": "lists"})
    result = run_egregious(cfg)
    table = {r["list"]: r for r in result.summary}
    assert table["normal"]["o-greedy-hit"] is not None and table["normal"]["o-sample-min-1-hit"] is None
    assert table["normal-sample"]["o-sample-min-1-hit"] is not None and table["normal-sample"]["o-greedy-hit"] is None
    checks = {r["list"]: r for r in result.manifest["source_checks"]}
    assert checks["planted"]["reachable"] == 6 and checks["planted"]["found"] >= 5 / 6
    assert result.manifest["counts"]["rows_in"] == 18  # one hit type per list
    # every list decoded from inputs says how many replies it left out, and why (in the manifest and report)
    dropped = result.manifest["models"]["echo"]["replies_dropped"]
    assert set(dropped) == {"normal", "normal-sample", "planted"}
    report = (tmp_path / "lists" / "report.html").read_text()
    assert "Replies left out of the lists decoded from inputs: echo normal: 6 targets kept, " in report


def test_one_search_settings_type_reaches_every_search_call():
    from redline.actors.triggers.settings import TriggerSearchSettings
    from redline.pipelines.egregious import EgregiousConfig, search_settings

    changed = {"method": "continuous", "trigger_length": 3, "top_g": 7, "max_sweeps": 2, "restarts": 4,
               "lm_weight": 0.5, "greedy_margin_cap": 2.0, "relaxation_steps": 9, "seed": 11}
    assert set(changed) == set(TriggerSearchSettings.model_fields)  # a new setting: give it a value here
    assert all(getattr(TriggerSearchSettings(), k) != v for k, v in changed.items())
    config = EgregiousConfig.model_validate({"models": [{"name": "m", "path": "x"}], **changed})
    options = SearchOptions.of(search_settings(config), "o-greedy")
    assert {k: getattr(options, k) for k in changed} == changed and options.search == "o-greedy"
    for name, field in TriggerSearchSettings.model_fields.items():  # one set of defaults
        assert EgregiousConfig.model_fields[name].default == SearchOptions.model_fields[name].default == field.default
