"""Detectors: decision rules, each kind, HF models of every label shape, and failure isolation."""

from __future__ import annotations

import numpy as np
import pytest

from redline.actors.detectors import DecisionRule, DetectorConfig, build_detector
from redline.actors.detectors.worker import DetectionWorker
from redline.errors import RedlineError

TEXTS = ["you are a stupid idiot", "have a lovely day", "fuck off loser", "the library opens at nine"]


def det(**kw) -> DetectorConfig:
    return DetectorConfig.model_validate({"name": "d", **kw})


def test_binary_rule_thresholds_the_single_probability():
    rule = DecisionRule(labels=("offensive",), toxic=(True,), multi_label=False, threshold=0.7)
    score, toxic = rule.decide(np.array([[0.69], [0.7], [0.1]]))
    assert score.tolist() == pytest.approx([0.69, 0.7, 0.1]) and toxic.tolist() == [False, True, False]


def test_multilabel_rule_any_toxic_label_over_its_threshold():
    rule = DecisionRule(labels=("toxic", "insult", "neutral"), toxic=(True, True, False), multi_label=True,
                        threshold={"toxic": 0.5, "insult": 0.9})
    score, toxic = rule.decide(np.array([[0.4, 0.8, 0.99], [0.6, 0.1, 0.0], [0.1, 0.95, 0.0]]))
    assert score.tolist() == pytest.approx([0.8, 0.6, 0.95])
    assert toxic.tolist() == [False, True, True]  # the neutral label never makes a row toxic


def test_multiclass_rule_argmax_by_default_and_score_on_request():
    probs = np.array([[0.3, 0.3, 0.4], [0.1, 0.6, 0.3], [0.45, 0.05, 0.5]])
    argmax = DecisionRule(labels=("hate", "offensive", "neither"), toxic=(True, True, False), multi_label=False)
    score, toxic = argmax.decide(probs)
    assert score.tolist() == pytest.approx([0.6, 0.7, 0.5])
    assert toxic.tolist() == [False, True, False]  # top class decides, even when toxic mass is 0.6
    by_score = DecisionRule(labels=argmax.labels, toxic=argmax.toxic, multi_label=False, rule="score")
    assert by_score.decide(probs)[1].tolist() == [True, True, True]


def test_rule_rejects_configs_without_a_toxic_label_or_with_unknown_thresholds():
    with pytest.raises(RedlineError, match="no toxic label"):
        DecisionRule(labels=("a", "b"), toxic=(False, False), multi_label=False)
    with pytest.raises(RedlineError, match="unknown labels"):
        DecisionRule(labels=("a",), toxic=(True,), multi_label=True, threshold={"zzz": 0.1})


def test_profanity_check_matches_the_package_and_is_a_real_victim():
    from profanity_check import predict_prob

    d = build_detector(det(kind="profanity-check"))
    probs, score, toxic = d.detect(TEXTS)
    assert probs.shape == (4, 1)
    np.testing.assert_allclose(score, predict_prob(TEXTS), rtol=1e-5)
    assert toxic.tolist() == [True, False, True, False]


def test_profanity_check_scores_without_sklearn_are_the_packages_own_bit_for_bit(davidson, tmp_path, monkeypatch):
    """Actors score with the package's model read once into plain arrays (no sklearn import per actor):
    the numbers are exactly the package's, on every Davidson tweet and on texts with no known word."""
    import pyarrow.csv as pacsv
    from profanity_check import profanity_check as package

    from redline.actors.detectors import profanity_arrays

    monkeypatch.setenv("REDLINE_CACHE", str(tmp_path / "cache"))
    texts = pacsv.read_csv(davidson, parse_options=pacsv.ParseOptions(newlines_in_values=True)).column("tweet")
    texts = [*texts.to_pylist(), "", "   ", "the and of", "Ünïcödé STRASSE fuck", "fuck " * 5000]
    want = package.model.predict_proba(package.vectorizer.transform(texts))[:, 1]
    made = profanity_arrays.cached()  # read from sklearn, then kept in the cache
    assert list((tmp_path / "cache").glob("profanity-check-*.npz"))
    reloaded = profanity_arrays.cached()
    for arrays in (made, reloaded):
        np.testing.assert_array_equal(arrays.predict_proba(texts), want)
    score = build_detector(det(kind="profanity-check")).detect(texts[:2000])[1]
    np.testing.assert_array_equal(score, want[:2000])


def test_the_profanity_arrays_cache_is_data_checked_before_use(tmp_path, monkeypatch):
    """A corrupt, truncated or linked cache file is never used (nor followed): the model is read again."""
    import subprocess
    import sys

    from redline.actors.detectors import profanity_arrays

    cache = tmp_path / "cache"
    monkeypatch.setenv("REDLINE_CACHE", str(cache))
    want = profanity_arrays.cached().predict_proba(TEXTS)
    path = next(cache.glob("profanity-check-*.npz"))
    # a later process scores without importing sklearn at all
    probe = ("import sys; from redline.actors.detectors import DetectorConfig, build_detector;"
             "d = build_detector(DetectorConfig(name='p', kind='profanity-check'));"
             f"print(d.detect({TEXTS!r})[1].tolist(), 'sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "REDLINE_CACHE": str(cache)}).stdout.split("] ")
    assert out[1].strip() == "False" and np.array(eval(out[0] + "]")).tolist() == want.tolist()

    good = path.read_bytes()
    for planted in (b"not an npz", good[: len(good) // 2]):
        path.write_bytes(planted)
        np.testing.assert_array_equal(profanity_arrays.cached().predict_proba(TEXTS), want)
        assert path.read_bytes() == good  # made again from the package
    elsewhere = tmp_path / "elsewhere.npz"
    elsewhere.write_bytes(good)
    path.unlink()
    path.symlink_to(elsewhere)
    assert profanity_arrays.load(path) is None  # a link is not followed
    np.testing.assert_array_equal(profanity_arrays.cached().predict_proba(TEXTS), want)
    assert not path.is_symlink()


def test_scores_keep_double_precision_near_certainty():
    # Attack search climbs differences of 1e-8 on seeds the victim is sure about; float32 would
    # round both texts to 1.0 and the search would stall (what lowered our PWWS ASR vs TextAttack).
    sure = ["fuck no that bitch dont even suck dick fuck", "fuck no that beef dont even suck dick fuck"]
    _, score, _ = build_detector(det(kind="profanity-check")).detect(sure)
    assert score.dtype == np.float64 and (score > 1 - 1e-6).all()
    assert 1.0 - score[1] > 1.0 - score[0] > 0


def test_no_texts_give_empty_results_of_the_right_shape(tiny_multiclass_model):
    for d in (build_detector(det(kind="profanity-check")),
              build_detector(det(kind="hf", model=str(tiny_multiclass_model)))):
        probs, score, toxic = d.detect([])
        assert probs.shape == (0, len(d.rule.labels)) and score.shape == toxic.shape == (0,)


def test_keywords_match_whole_words_and_regexes(tmp_path):
    words = tmp_path / "words.txt"
    words.write_text("# my list\nidiot\n\nf+u+ck\n")
    d = build_detector(det(kind="keywords", patterns=["loser"], patterns_file=str(words)))
    _, score, toxic = d.detect(["you IDIOT", "idiotic plan", "fuuuck", "sore loser", "losers"])
    assert toxic.tolist() == [True, False, True, True, False]
    with pytest.raises(RedlineError, match="invalid regular expression"):
        build_detector(det(kind="keywords", patterns=["(unclosed"]))
    with pytest.raises(RedlineError, match="needs `patterns`"):
        build_detector(det(kind="keywords"))


def test_hf_binary_tiny_model_loads_by_directory_and_learns(tiny_binary_model):
    d = build_detector(det(kind="hf", model=str(tiny_binary_model), batch_size=2))
    assert d.rule.labels == ("benign", "toxic") and d.rule.toxic == (False, True)
    probs, score, toxic = d.detect(TEXTS)
    assert probs.shape == (4, 2)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    assert score[0] > score[1] and score[2] > score[3]


def test_hf_batching_and_length_sorting_do_not_change_results(tiny_binary_model):
    texts = TEXTS * 5 + ["a much longer sentence that pads the batch " * 4]
    one = build_detector(det(kind="hf", model=str(tiny_binary_model), batch_size=1)).predict_proba(texts)
    many = build_detector(det(kind="hf", model=str(tiny_binary_model), batch_size=64)).predict_proba(texts)
    np.testing.assert_allclose(one, many, atol=1e-5)


def test_hf_multiclass_uses_argmax_over_named_labels(tiny_multiclass_model):
    d = build_detector(det(kind="hf", model=str(tiny_multiclass_model)))
    assert d.rule.labels == ("hate", "offensive", "neither") and d.rule.toxic == (True, True, False)
    assert d.rule.effective_rule == "argmax" and not d.rule.multi_label
    probs, score, toxic = d.detect(TEXTS)
    assert probs.shape == (4, 3)
    np.testing.assert_allclose(score, probs[:, 0] + probs[:, 1], rtol=1e-5)
    np.testing.assert_array_equal(toxic, probs.argmax(axis=1) != 2)


def test_hf_multilabel_uses_sigmoid_per_label(tiny_multilabel_model):
    d = build_detector(det(kind="hf", model=str(tiny_multilabel_model), threshold={"toxic": 0.5, "insult": 0.99}))
    assert d.rule.multi_label
    probs, score, toxic = d.detect(TEXTS)
    assert probs.shape == (4, 2) and not np.allclose(probs.sum(axis=1), 1.0)
    np.testing.assert_allclose(score, probs.max(axis=1), rtol=1e-6)
    np.testing.assert_array_equal(toxic, (probs[:, 0] >= 0.5) | (probs[:, 1] >= 0.99))


def test_hf_toxic_labels_choose_which_classes_count(tiny_multiclass_model):
    d = build_detector(det(kind="hf", model=str(tiny_multiclass_model), toxic_labels=["hate"], rule="score"))
    probs, score, _ = d.detect(TEXTS)
    np.testing.assert_allclose(score, probs[:, 0], rtol=1e-6)


@pytest.mark.parametrize(
    "model, message",
    [("/no/such/model-dir", "model directory does not exist: /no/such/model-dir"),
     ("./also-missing", "model directory does not exist")],
)
def test_hf_missing_model_directory_fails_preflight(model, message):
    from redline.actors.detectors.local import HFDetector

    with pytest.raises(RedlineError, match=message):
        HFDetector.preflight(det(kind="hf", model=model))


def test_hf_directory_without_config_and_unknown_toxic_label(tmp_path, tiny_binary_model):
    from redline.actors.detectors.local import HFDetector

    with pytest.raises(RedlineError, match="has no config.json"):
        HFDetector.preflight(det(kind="hf", model=str(tmp_path)))
    with pytest.raises(RedlineError, match=r"toxic_labels \['rude'\] are not labels"):
        HFDetector.preflight(det(kind="hf", model=str(tiny_binary_model), toxic_labels=["rude"]))


def test_worker_isolates_rows_that_make_a_batch_fail(monkeypatch):
    worker = DetectionWorker(DetectorConfig(name="p", kind="profanity-check"))
    real = worker.detector.predict_proba

    def flaky(texts):
        if any("boom" in t for t in texts):
            raise ValueError("cannot score boom")
        return real(texts)

    monkeypatch.setattr(worker.detector, "predict_proba", flaky)
    batch = {"id": np.array(["a", "b", "c"], dtype=object), "shard": np.array([0, 0, 0]),
             "text": np.array(["fuck you", "boom", "nice day"], dtype=object)}
    out = worker(batch).to_pylist()
    assert [r["det_status"] for r in out] == ["ok", "error", "ok"]
    assert out[1]["det_reason"] == "ValueError: cannot score boom" and out[1]["probs"] is None
    assert out[0]["pred_toxic"] is True and out[2]["pred_toxic"] is False


def perspective_config(url: str, **extra) -> DetectorConfig:
    return DetectorConfig.model_validate({"name": "persp", "kind": "perspective", "base_url": url + "/v1alpha1", "api_key_env": "PERSPECTIVE_TEST_KEY",
            "attributes": ["TOXICITY", "INSULT"], "languages": ["en"], "requests_per_second": 10, "backoff_s": 0.05,
            **extra})


def test_perspective_speaks_comments_analyze_within_its_quota(monkeypatch):
    from redline.actors.detectors.perspective import PerspectiveOptions

    from standins import perspective

    assert PerspectiveOptions().requests_per_second == 1.0  # the API's default quota
    monkeypatch.setenv("PERSPECTIVE_TEST_KEY", "test-key")
    with perspective() as api:
        worker = DetectionWorker(perspective_config(api.url))
        probs, score, toxic, status, reason = worker.score(["you idiot", "a lovely morning", "klingon words",
                                                            "you are stupid"])
        arrivals, bodies = api.httpd.arrivals, api.httpd.bodies
    assert list(status) == ["ok", "ok", "error", "ok"]
    assert list(toxic[[0, 1, 3]]) == [True, False, True] and np.isnan(score[2])
    assert "does not support request languages" in reason[2] and reason[0] is None
    assert bodies[0] == {"comment": {"text": "you idiot"}, "requestedAttributes": {"TOXICITY": {}, "INSULT": {}},
                         "doNotStore": True, "languages": ["en"]}
    assert len(arrivals) == 5  # the first answer was a 429, retried
    gaps = np.diff(arrivals)  # 10 requests/s at most (arrival times jitter a little on a busy machine)
    assert arrivals[-1] - arrivals[0] >= 0.9 * 0.1 * (len(arrivals) - 1) and np.median(gaps) >= 0.08, gaps


def test_perspective_refused_key_stops_with_one_line_and_no_key(monkeypatch):
    from standins import perspective

    monkeypatch.setenv("PERSPECTIVE_TEST_KEY", "wrong-secret")
    with perspective() as api, pytest.raises(RedlineError) as err:
        DetectionWorker(perspective_config(api.url)).score(["hello"])
    assert "refused the key in $PERSPECTIVE_TEST_KEY (HTTP 403" in str(err.value)
    assert "wrong-secret" not in str(err.value)
    monkeypatch.delenv("PERSPECTIVE_TEST_KEY")
    with pytest.raises(RedlineError, match=r"set the API key in \$PERSPECTIVE_TEST_KEY"):
        DetectionWorker(perspective_config("http://127.0.0.1:9"))


def test_perspective_quota_is_shared_by_every_actor(ray_session):
    """Two actors at 5 requests/s between them, not 5 each."""
    import ray

    from standins import perspective

    with perspective(throttle_first=0) as api:
        worker = ray.remote(num_cpus=0)(DetectionWorker).options(
            runtime_env={"env_vars": {"PERSPECTIVE_TEST_KEY": "test-key"}})
        actors = [worker.remote(perspective_config(api.url, requests_per_second=5)) for _ in range(2)]
        results = ray.get([a.score.remote([f"text {i} from {k}" for i in range(4)]) for k, a in enumerate(actors)])
        arrivals = sorted(api.httpd.arrivals)
    assert all(list(r[3]) == ["ok"] * 4 for r in results)
    # not shared, the two actors would send 10 a second between them: pairs at once, 0.7 s in all
    gaps = np.diff(arrivals)
    assert len(arrivals) == 8 and arrivals[-1] - arrivals[0] >= 0.9 * 0.2 * 7 and np.median(gaps) >= 0.15, gaps


DETOXIFY_CLASSES = ["toxic", "severe_toxic", "obscene", "identity_hate", "insult", "threat", "sexual_explicit",
                    "male", "female", "muslim"]


class NotAWeight:  # a checkpoint holding this needs code to load: refused
    pass


def detoxify_checkpoint(tmp_path, extra: dict | None = None):
    """A tiny model in Detoxify's own checkpoint format (the `unbiased` model's classes): identity
    classes sure, toxicity classes unsure-to-no."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from redline.actors.tiny_models import train_wordpiece_tokenizer

    base = tmp_path / "base"
    tok = train_wordpiece_tokenizer(["you are an idiot", "have a lovely day", "muslim men and women"] * 20,
                                    vocab_size=120, model_max_length=64)
    tok.save_pretrained(base)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, num_labels=len(DETOXIFY_CLASSES))
    cfg.save_pretrained(base)
    torch.manual_seed(0)
    model = BertForSequenceClassification(cfg)
    with torch.no_grad():
        model.classifier.weight.mul_(0.05)
        model.classifier.bias.copy_(torch.tensor([-3.0] * 7 + [4.0, 4.0, 4.0]))
    path = tmp_path / "detoxify.ckpt"
    torch.save({"config": {"arch": {"args": {"model_type": str(base), "model_name": "BertForSequenceClassification",
                                             "tokenizer_name": "BertTokenizerFast", "num_classes": len(DETOXIFY_CLASSES)}},
                           "dataset": {"args": {"classes": DETOXIFY_CLASSES}}},
                "state_dict": model.state_dict(), **(extra or {})}, path)
    return path


def test_detoxify_scores_as_the_package_does_and_identity_classes_never_decide(tmp_path):
    from detoxify import Detoxify

    ckpt = detoxify_checkpoint(tmp_path)
    texts = ["you are an idiot", "muslim men and women", "have a lovely day"]
    det = build_detector(DetectorConfig(name="dtx", kind="detoxify", model="unbiased", checkpoint=str(ckpt)))
    probs, score, toxic = det.detect(texts)
    theirs = Detoxify(checkpoint=str(ckpt)).predict(texts)  # the package, as its users call it
    assert list(det.rule.labels) == list(theirs)  # Detoxify's renamed classes: toxicity, identity_attack, ...
    assert np.allclose(probs, np.array([theirs[c] for c in det.rule.labels]).T, atol=1e-5)
    assert probs[:, det.rule.labels.index("male")].min() > 0.9  # sure about identity ...
    assert not toxic.any() and score.max() < 0.2  # ... which is not toxicity
    by_identity = build_detector(DetectorConfig(name="d", kind="detoxify", checkpoint=str(ckpt), toxic_labels=["male"]))
    assert by_identity.detect(texts)[2].all()


def test_detoxify_checkpoints_that_need_code_to_load_are_refused(tmp_path):
    ckpt = detoxify_checkpoint(tmp_path, {"callback": NotAWeight()})
    with pytest.raises(RedlineError, match="cannot load the detoxify checkpoint"):
        build_detector(DetectorConfig(name="d", kind="detoxify", checkpoint=str(ckpt)))
    from redline.actors.detectors import preflight_detector

    with pytest.raises(RedlineError, match="detoxify checkpoint not found"):
        preflight_detector(DetectorConfig(name="d", kind="detoxify", checkpoint=str(tmp_path / "nope.ckpt")))


def test_a_tiny_model_sees_every_text_once_per_epoch_in_batches_of_one_length():
    import random

    from redline.actors.tiny_models import length_batches

    lengths = [random.Random(i).randint(3, 64) for i in range(1000)]
    random.seed(0)
    first = length_batches(lengths, 32)
    second = length_batches(lengths, 32)
    for epoch in (first, second):
        assert sorted(i for batch in epoch for i in batch) == list(range(1000))  # each text once
        assert all(0 < len(batch) <= 32 for batch in epoch)
        # padding: a batch pads to its longest; sorted within windows it pads far less than shuffled rows
        padded = sum(len(b) * max(lengths[i] for i in b) for b in epoch)
        assert padded < 1.25 * sum(lengths)
    assert first != second  # the epochs differ (both shuffled), and the same seed gives the same batches
    random.seed(0)
    assert length_batches(lengths, 32) == first
