"""The TaeBench quality filters: LLM judge, LanguageTool grammar check, and the whole pipeline."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.compute as pc
import pytest

from redline.errors import RedlineError

from conftest import status_and_report
from standins import languagetool, openai_judge


def judge_config(url: str, tmp_path, **kw):
    from redline.actors.judges import JudgeConfig

    return JudgeConfig(base_url=url + "/v1", model="judge", cache_dir=str(tmp_path / "cache"), backoff_s=0.05,
                       **kw)


def test_judge_parses_retries_and_caches(tmp_path):
    from redline.actors.judges import LLMJudge, parse_answer

    assert parse_answer("Yes, clearly.") == ("yes", None)
    assert parse_answer("no") == ("no", None)
    assert parse_answer("I'm not sure")[0] == "unsure"
    assert parse_answer("") == ("unparseable", "empty answer")
    with openai_judge(slow_s=2.0) as server:
        judge = LLMJudge(judge_config(server.url, tmp_path, timeout_s=0.5, max_retries=2))
        texts = ["you stupid idiot", "lovely weather", "FLAKY you moron", "GARBLE text", "SLOW idiot", "DOWN x",
                 "NOTJSON x", "NOCHOICES x"]
        got = judge.judge(texts)
        verdicts = [g.verdict for g in got]
        # a failed call is an error with its cause, never a verdict the model did not give
        assert verdicts == ["yes", "no", "yes", "unparseable", "error", "error", "error", "error"]
        assert got[2].retries == 2 and got[3].reason.startswith("unparseable answer")
        assert got[4].reason == "judge request failed after 2 retries: APITimeoutError: Request timed out."
        assert got[5].reason.endswith("HTTP 500") and got[5].retries == 2
        assert "the answer's body is not JSON" in got[6].reason
        assert got[7].reason.endswith("the response has no choices")
        assert got[0].prompt_tokens > 0 and not got[0].cached
        before = server.httpd.requests
        again = judge.judge(texts[:3])  # answered ones come from the cache: no requests
        assert [g.verdict for g in again] == verdicts[:3] and all(g.cached for g in again)
        assert server.httpd.requests == before
        # an unparseable answer is never cached: asked again, and the second answer counts
        once = judge.judge(["ONCEGARBLE you idiot"])[0]
        assert once.verdict == "unparseable"
        assert judge.judge(["ONCEGARBLE you idiot"])[0].verdict == "yes"
        assert judge.judge(["ONCEGARBLE you idiot"])[0].cached


def test_judge_refusals_stop_at_once_and_retry_after_is_a_minimum(tmp_path, monkeypatch):
    """401/404 name the endpoint and status without retrying; an HTTP-date Retry-After is waited
    out by every thread (the backoff alone would retry after 50 ms)."""
    from redline.actors.judges import LLMJudge
    from redline.errors import RedlineError

    monkeypatch.setenv("JUDGE_KEY", "right")
    with openai_judge(api_key="right") as server:
        for model, env, status in (("judge", "NO_SUCH_VAR", 401), ("missing", "JUDGE_KEY", 404)):
            judge = LLMJudge(judge_config(server.url, tmp_path, api_key_env=env, max_retries=4).model_copy(
                update={"model": model}))
            before = server.httpd.requests
            with pytest.raises(RedlineError, match=rf"judge endpoint {server.url}/v1 answered HTTP {status}"):
                judge.judge(["you idiot"])
            assert server.httpd.requests == before  # no retries against a refusal
        judge = LLMJudge(judge_config(server.url, tmp_path, api_key_env="JUDGE_KEY", concurrency=4, max_retries=3))
        got = judge.judge(["DATED you idiot", "lovely day"])
        assert [g.verdict for g in got] == ["yes", "no"]
        dated = [t for p, t in server.httpd.log if "DATED" in p]
        assert len(dated) == 2 and dated[1] - dated[0] >= 1.0, dated


def test_judges_reach_any_provider_bedrock_included(tmp_path, monkeypatch):
    """The provider registry: the same judge asks AWS Bedrock (Converse via boto3) or an OpenAI-compatible
    API; retries, cache and accounting wrap either."""
    from redline.actors.judges import JudgeConfig, LLMJudge
    from redline.actors.providers import providers

    from standins import bedrock

    assert set(providers()) >= {"openai", "redline", "bedrock", "hf"}
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with bedrock() as aws:
        judge = LLMJudge(JudgeConfig(provider="bedrock", model="anthropic.claude-3-haiku", region="us-east-1",
                                     endpoint_url=aws.url, cache_dir=str(tmp_path / "cache")))
        got = judge.judge(["you stupid idiot", "lovely weather today"])
        assert [g.verdict for g in got] == ["yes", "no"] and got[0].completion_tokens == 1
        assert all(g.cached for g in judge.judge(["you stupid idiot", "lovely weather today"]))
        request = aws.httpd.converse_bodies[0]
        assert request["inferenceConfig"]["maxTokens"] == 8 and request["inferenceConfig"]["temperature"] == 0.0
        missing = LLMJudge(JudgeConfig(provider="bedrock", model="missing", region="us-east-1", endpoint_url=aws.url,
                                       cache_dir=None))
        with pytest.raises(RedlineError, match="judge endpoint Bedrock answered ValidationException"):
            missing.judge(["x"])
    with pytest.raises(Exception, match="provider openai: base_url: Field required"):
        JudgeConfig(model="m")


def test_key_never_travels_over_plain_http_to_another_host(tmp_path, monkeypatch):
    from redline.actors.judges import LLMJudge
    from redline.cluster.net import check_key_transport
    from redline.errors import RedlineError

    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    with pytest.raises(RedlineError, match="refusing to send an API key over plain http to 10.1.2.3"):
        LLMJudge(judge_config("http://10.1.2.3:8000", tmp_path, api_key_env="OPENAI_API_KEY"))
    LLMJudge(judge_config("http://10.1.2.3:8000", tmp_path, api_key_env="OPENAI_API_KEY", allow_insecure_http=True))
    check_key_transport("http://127.0.0.1:9/v1", True, False, "x")  # loopback is fine
    check_key_transport("https://api.example.com/v1", True, False, "x")
    check_key_transport("http://10.1.2.3/v1", False, False, "x")  # no key, nothing to leak


def test_judge_template_needs_placeholder(tmp_path):
    from redline.actors.judges import LLMJudge
    from redline.errors import RedlineError

    with pytest.raises(RedlineError, match="placeholder"):
        LLMJudge(judge_config("http://127.0.0.1:9", tmp_path, template="no slot here"))


def test_grammar_counts_only_the_configured_categories():
    from redline.actors.quality.grammar import LanguageToolClient, count_errors

    with languagetool() as server:
        client = LanguageToolClient(server.url + "/v2/check")
        matches = client.check("he ate a apple and teh the the cake")
        assert count_errors(matches, ["GRAMMAR"]) == 2 and count_errors(matches, ["GRAMMAR", "TYPOS"]) == 3
    assert not LanguageToolClient(server.url).available()


@pytest.fixture(scope="module")
def attack_run(ray_session, tmp_path_factory):
    from redline.cluster.config import validate_config
    from redline.pipelines.attack import AttackConfig, run_attack
    from redline.pipelines.quickstart import sample_path

    out = tmp_path_factory.mktemp("attack")
    cfg = validate_config(AttackConfig, {
        "corpus": {"path": str(sample_path("toxic_sample_test.csv")), "text_column": "text", "label_column": "label",
                   "toxic_values": ["toxic"], "dataset": "sample"},
        "victim": {"name": "profanity-check", "kind": "profanity-check"},
        "recipes": ["deepwordbug", "textbugger"], "goals": ["tae", "bae"], "max_seeds": 20,
        "num_cpus": 0.5, "output": str(out), "run_name": "atk"})
    return run_attack(cfg).run_uri


def taebench_config(attack_uri, tmp_path, lt_url, judge_url, tiny_binary_model, **over):
    from redline.cluster.config import validate_config
    from redline.pipelines.taebench import TaebenchConfig

    data = {"attacks": attack_uri,
            "grammar": {"url": lt_url, "max_new_errors": 0, "num_cpus": 0.2},
            "naturalness": {"model": str(tiny_binary_model), "threshold": 0.0, "num_cpus": 0.2},
            "judge": {"base_url": judge_url + "/v1", "model": "judge", "cache_dir": str(tmp_path / "cache"),
                      "num_cpus": 0.2},
            "classifier": {"name": "tiny-bert", "kind": "hf", "model": str(tiny_binary_model), "num_cpus": 0.2},
            "output": str(tmp_path / "runs"), "run_name": "tb", **over}
    return validate_config(TaebenchConfig, data)


def test_taebench_pipeline_end_to_end(attack_run, tmp_path, tiny_binary_model):
    from redline.pipelines.taebench import read_bench, run_taebench

    with languagetool() as lt, openai_judge() as judge:
        cfg = taebench_config(attack_run, tmp_path, lt.url, judge.url, tiny_binary_model)
        result = run_taebench(cfg)
    m = result.manifest
    stages = m["stages"]
    assert list(stages) == ["dedupe", "grammar", "naturalness", "label"]
    previous = m["counts"]["raw"]
    for name, info in stages.items():  # every stage's rows add up and feed the next
        assert info["in"] == previous and info["kept"] + info["rejected"] == info["in"], name
        previous = info["kept"]
    assert m["counts"]["taebench_plus"] == stages["label"]["kept"]
    tae, plus = read_bench(result.run_uri, "taebench"), read_bench(result.run_uri)
    assert tae.num_rows == m["counts"]["taebench"] > 0
    assert set(plus.column("goal").to_pylist()) <= {"tae", "bae"} and plus.num_rows >= tae.num_rows
    for row in tae.to_pylist():  # both the judge and the classifier still call every TAE toxic
        assert row["judge_verdict"] == "yes" and row["classifier_toxic"] and row["label"] == 1
        assert row["recipe"] in row["recipes"].split(",") and row["bench_split"] in ("train", "test")
    for row in plus.filter(pc.equal(plus.column("goal"), "bae")).to_pylist():
        assert row["judge_verdict"] == "no" and not row["classifier_toxic"] and row["label"] == 0
    overall = [r for r in result.summary if r["dataset"] == "all" and r["goal"] == "tae"][0]
    assert overall["label"] == tae.num_rows and overall["raw"] >= overall["dedupe"] >= overall["grammar"]
    assert m["judge_usage"]["requests"] + m["judge_usage"]["cache_hits"] == stages["naturalness"]["kept"]
    grammar_rows = read_bench(result.run_uri, "stages/2-grammar")
    rejected = grammar_rows.filter(pc.invert(grammar_rows.column("kept")))
    assert all("more grammar errors than the seed" in r for r in rejected.column("reject_reason").to_pylist())
    html = (tmp_path / "runs" / "tb" / "report.html").read_text()
    assert "Rows remaining after each stage" in html and "data:image/png;base64" in html
    status_and_report(result.run_uri, "after label")

def test_taebench_without_grammar_server_is_an_error_unless_allowed(attack_run, tmp_path, tiny_binary_model):
    from redline.errors import RedlineError
    from redline.pipelines.taebench import run_taebench

    with openai_judge() as judge:
        cfg = taebench_config(attack_run, tmp_path, "http://127.0.0.1:9", judge.url, tiny_binary_model)
        with pytest.raises(RedlineError, match="no LanguageTool server at http://127.0.0.1:9"):
            run_taebench(cfg)
        cfg = taebench_config(attack_run, tmp_path, "http://127.0.0.1:9", judge.url, tiny_binary_model,
                              grammar={"url": "http://127.0.0.1:9", "skip_if_unavailable": True}, run_name="tb2",
                              naturalness=None)
        result = run_taebench(cfg)
    assert result.manifest["stages"]["grammar"].startswith("skipped: no LanguageTool server")
    assert result.manifest["stages"]["naturalness"].startswith("off")
    assert "grammar" not in result.summary[0]
    assert json.loads((tmp_path / "runs" / "tb2" / "manifest.json").read_text())["state"] == "complete"


def test_a_judge_that_fails_or_says_nothing_usable_fails_the_stage(attack_run, tmp_path, tiny_binary_model):
    """Auth/not-found errors stop the run naming the endpoint and status; a judge whose every answer
    is unparseable does not complete an empty benchmark (the same judge answering usably completes one:
    test_taebench_pipeline_end_to_end)."""
    from redline.errors import RedlineError
    from redline.pipelines.taebench import run_taebench

    with openai_judge() as judge:
        missing = {"base_url": judge.url + "/v1", "model": "missing", "cache_dir": str(tmp_path / "cache"),
                   "num_cpus": 0.2}
        cfg = taebench_config(attack_run, tmp_path, "", judge.url, tiny_binary_model, grammar=None, naturalness=None,
                              judge=missing, run_name="fails")
        with pytest.raises(RedlineError, match=rf"judge endpoint {judge.url}/v1 answered HTTP 404"):
            run_taebench(cfg)
        manifest = json.loads((tmp_path / "runs" / "fails" / "manifest.json").read_text())
        assert manifest["state"] == "failed" and "HTTP 404" in manifest["error"]
        garbled = {**missing, "model": "judge", "template": "Passage: GARBLE {text}\nAnswer:"}
        cfg = cfg.model_copy(update={"run_name": "garbled", "judge": cfg.judge.model_copy(
            update={"model": "judge", "template": garbled["template"]})})
        # unusable answers count as failures in a row: the client stops before the stage grinds through every row
        with pytest.raises(RedlineError, match=r"failed 10 requests in a row \(last: an answer it could not use"):
            run_taebench(cfg)
        assert json.loads((tmp_path / "runs" / "garbled" / "manifest.json").read_text())["state"] == "failed"


def test_api_detector_kinds_against_local_servers(tmp_path, monkeypatch):
    from redline.actors.detectors import DetectorConfig, build_detector
    from redline.errors import RedlineError

    from standins import bedrock

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    texts = ["you stupid idoit", "see you at lunch", "GARBLE nice"]
    with openai_judge() as chat, bedrock() as aws:
        common = {"base_url": chat.url + "/v1", "cache_dir": str(tmp_path / "cache")}
        kinds = {
            "openai-moderation": {"base_url": chat.url + "/v1"},
            "llm-judge": {**common, "model": "judge"},
            "self-check": {**common, "model": "judge"},
            "llama-guard": {**common, "model": "llama-guard"},
            "bedrock-guardrail": {"guardrail_id": "g1", "region": "us-east-1", "endpoint_url": aws.url},
        }
        for kind, opts in kinds.items():
            det = build_detector(DetectorConfig.model_validate({"name": kind, "kind": kind, **opts}))
            probs, score, toxic = det.detect(texts[:2])
            assert toxic.tolist() == [True, False], kind
            assert probs.shape == (2, 1) and score[0] > score[1], kind
        with pytest.raises(RedlineError, match="could not judge text 0: unparseable answer"):
            build_detector(DetectorConfig.model_validate({"name": "j", "kind": "llm-judge", **common,
                                                          "model": "judge"})).detect(texts[2:])
        with pytest.raises(RedlineError, match="Guardrail missing not found"):
            build_detector(DetectorConfig.model_validate({"name": "b", "kind": "bedrock-guardrail", "region": "us-east-1",
                                                          "guardrail_id": "missing", "endpoint_url": aws.url})).detect(["x"])


def test_missing_api_results_are_row_errors_never_scores(tmp_path):
    """A server that answers fewer results than texts, or a result without its fields, gives `error`
    rows: no score, no decision (a zero would read as benign)."""
    from redline.actors.detectors import DetectorConfig
    from redline.actors.detectors.worker import DetectionWorker

    from standins import short_detect_server

    texts = ["you idiot", "SHORT hello", "nice day", "you moron"]
    batch = {"id": np.array([f"r{i}" for i in range(4)]), "text": np.array(texts), "shard": np.zeros(4, np.int32)}
    with openai_judge() as chat:
        worker = DetectionWorker(DetectorConfig.model_validate({
            "name": "m", "kind": "openai-moderation", "base_url": chat.url + "/v1", "max_texts": 3}))
        rows = worker(batch).to_pylist()
    assert [r["det_status"] for r in rows] == ["error", "error", "error", "ok"]
    assert rows[0]["det_reason"] == "the moderation API returned 2 results for 3 texts"
    assert all(r["toxic_score"] is None or r["toxic_score"] != r["toxic_score"] for r in rows[:3])
    assert rows[3]["pred_toxic"] is True
    with short_detect_server() as server:
        worker = DetectionWorker(DetectorConfig.model_validate({"name": "served", "url": server.url + "/v1/detect"}))
        rows = worker(batch).to_pylist()
    assert [r["det_status"] for r in rows] == ["ok", "error", "error", "error"]
    assert rows[1]["det_reason"] == "the server's result lacks a label's probability"
    assert rows[2]["det_reason"].startswith("served detector error: boom")
    assert rows[3]["det_reason"] == "the server returned no result for this text"


def test_a_remote_detectors_failed_batch_is_not_retried_text_by_text(monkeypatch):
    """Row-by-row retry isolates a bad row of a local model; against an API that just failed it would
    multiply the requests by the batch size."""
    from redline.actors.detectors import DetectorConfig, register_detector
    from redline.actors.detectors.local import ProfanityCheckDetector
    from redline.actors.detectors.registry import DETECTORS
    from redline.actors.detectors.worker import DetectionWorker

    class Flaky(ProfanityCheckDetector):
        kind, remote, calls = "flaky-remote", True, 0

        def detect_rows(self, texts):
            type(self).calls += 1
            raise ConnectionError("503 from upstream")

    monkeypatch.setattr(DETECTORS, "_plugins", DETECTORS.all())  # the kind registered here goes after
    register_detector(Flaky)
    worker = DetectionWorker(DetectorConfig.model_validate({"name": "f", "kind": "flaky-remote"}))
    probs, score, toxic, status, reason = worker.score(["a", "b", "c", "d"])
    assert Flaky.calls == 1 and list(status) == ["error"] * 4 and "503 from upstream" in reason[0]


@pytest.fixture(scope="module")
def taebench_run(attack_run, tmp_path_factory, tiny_binary_model):
    from redline.pipelines.taebench import run_taebench

    tmp = tmp_path_factory.mktemp("tb")
    with languagetool() as lt, openai_judge() as judge:
        return run_taebench(taebench_config(attack_run, tmp, lt.url, judge.url, tiny_binary_model, naturalness=None,
                                            test_fraction=0.5)).run_uri


def test_transfer_benchmark_over_several_victim_kinds(taebench_run, tmp_path, tiny_binary_model,
                                                      tiny_other_binary_model):
    from redline.cluster.config import validate_config
    from redline.pipelines.taebench import read_bench
    from redline.pipelines.transfer import TransferConfig, run_transfer

    plus = read_bench(taebench_run).to_pylist()
    # the label filter's own classifier (tiny-bert) kept only what it agrees with: as a victim (by name,
    # or by its model under another name) its figures would be 0 by construction, so the run is refused
    for victim in ({"name": "tiny-bert", "kind": "profanity-check"},
                   {"name": "b", "kind": "hf", "model": str(tiny_binary_model)}):
        with pytest.raises(RedlineError, match=f"{victim['name']} is the label filter's classifier"):
            run_transfer(validate_config(TransferConfig, {"taebench": taebench_run, "output": str(tmp_path / "runs"),
                                                          "victims": [victim]}))
    assert not (tmp_path / "runs").exists()
    with openai_judge() as chat:
        cfg = validate_config(TransferConfig, {
            "taebench": taebench_run, "split": "all", "output": str(tmp_path / "runs"), "run_name": "tr",
            "victims": [{"name": "profanity-check", "kind": "profanity-check", "num_cpus": 0.2},
                        {"name": "tiny-bert-b", "kind": "hf", "model": str(tiny_other_binary_model), "num_cpus": 0.2},
                        {"name": "slurs", "kind": "keywords", "patterns": ["idiot", "stupid", "moron"], "num_cpus": 0.2},
                        {"name": "moderation", "kind": "openai-moderation", "base_url": chat.url + "/v1",
                         "num_cpus": 0.2}]})
        result = run_transfer(cfg)
    rows = {r["victim"]: r for r in result.summary if r["dataset"] == "all"}
    assert set(rows) == {"profanity-check", "tiny-bert-b", "slurs", "moderation"}
    n_tae = sum(r["goal"] == "tae" for r in plus)
    n_bae = len(plus) - n_tae
    n_seeds = len({r["seed_id"] for r in plus if r["goal"] == "tae"})
    assert {r["victim"] for r in plus} == {"profanity-check"}
    for name, r in rows.items():
        if name != "profanity-check":
            assert (r["tae_n"], r["bae_n"], r["seed_n"], r["own_n"]) == (n_tae, n_bae, n_seeds, 0)
        assert r["not_scored"] == 0
    # profanity-check was the attack's victim: its own examples fool it by construction, so they are left
    # out of its transfer rates (counted apart), which it then has none of
    pc_row = rows["profanity-check"]
    assert (pc_row["tae_n"], pc_row["bae_n"], pc_row["own_n"], pc_row["seed_n"]) == (0, 0, n_tae + n_bae, n_seeds)
    assert pc_row["tae_rate"] is None and pc_row["bae_rate"] is None
    # the moderation stand-in sees through typos: the examples kept are those it still calls toxic
    assert rows["moderation"]["tae_rate"] == 0.0
    html = (tmp_path / "runs" / "tr" / "report.html").read_text()
    assert "ASR TAE (FNR)" in html and "data:image/png;base64" in html
    status_and_report(result.run_uri, "ASR TAE (FNR)")

def test_train_naturalness_and_judge_classifier_commands(tmp_path, sample_rows, tiny_binary_model, capsys):
    import random

    from redline.cli import main
    from redline.pipelines.quickstart import sample_path

    rng = random.Random(0)
    lines = ["text,natural"]
    rows = rng.sample(sample_rows, len(sample_rows))  # toxic and benign rows on both sides of the split

    def scramble(text: str) -> str:
        return " ".join("".join(rng.sample(w, len(w))) for w in text.split())

    for r in rows[:-20]:
        for _ in range(3):  # three scrambles of each: enough rows for a tiny model to learn from
            lines += [f'"{r["text"]}",yes', f'"{scramble(r["text"])}",no']
    corpus = tmp_path / "natural.csv"
    corpus.write_text("\n".join(lines) + "\n")
    out = tmp_path / "natural-model"
    assert main(["train", "naturalness", "--corpus", str(corpus), "--out", str(out), "--base-model",
                 str(tiny_binary_model), "--epochs", "5", "--learning-rate", "2e-3"]) == 0
    printed = capsys.readouterr().out
    assert "roc_auc" in printed and "held-out split" in printed
    info = json.loads((out / "redline_training.json").read_text())
    assert info["held_out_rows"] == round(0.2 * info["rows"]) and info["held_out"]["roc_auc"] > 0.8
    assert json.loads((out / "config.json").read_text())["id2label"] == {"0": "unnatural", "1": "natural"}

    from redline.actors.detectors import build_detector
    from redline.pipelines.taebench import NaturalnessConfig

    det = build_detector(NaturalnessConfig(model=str(out), natural_label="natural").detector())
    unseen = [r["text"] for r in rows[-20:]]  # texts the classifier never saw, whole and scrambled
    _, p_natural, _ = det.detect(unseen + [scramble(t) for t in unseen])
    assert p_natural[:len(unseen)].mean() > p_natural[len(unseen):].mean() + 0.2

    judge_out = tmp_path / "judge-clf"
    assert main(["train", "judge-classifier", "--corpus", str(sample_path("toxic_sample_train.csv")),
                 "--text-column", "text", "--label-column", "label", "--toxic-values", "toxic",
                 "--out", str(judge_out), "--base-model", str(tiny_binary_model), "--epochs", "1"]) == 0
    assert (judge_out / "model.safetensors").exists()
    assert main(["train", "judge-classifier", "--corpus", str(corpus), "--text-column", "text",
                 "--label-column", "natural", "--toxic-values", "maybe", "--out", str(tmp_path / "x"),
                 "--base-model", str(tiny_binary_model)]) == 2
    assert "both classes" in capsys.readouterr().err


def test_dedupe_keeps_every_recipe_and_grammar_rejects_new_errors(ray_session, tmp_path):
    import pyarrow as pa

    from redline.cluster import storage
    from redline.cluster.runs import Run, RunDir
    from redline.pipelines.plane.steps import run_step
    from redline.pipelines.taebench import DEDUPE_DIR, TaebenchConfig, dedupe, quality_steps, read_bench

    table = pa.table({
        "id": ["1", "2", "3", "4"], "goal": ["tae", "tae", "tae", "bae"],
        "text": ["he ate a apple you idiot", "He  ate a APPLE you idiot", "he ate an apple, idoit", "he ate a apple you idiot"],
        "seed_text": ["he ate an apple you idiot"] * 3 + ["he ate a apple you idiot"],
        "recipe": ["deepwordbug", "pwws", "textbugger", "deepwordbug"], "dataset": ["d"] * 4})
    with languagetool() as lt:
        cfg = TaebenchConfig(attacks="x", grammar={"url": lt.url, "num_cpus": 0.2}, classifier={"name": "k", "kind": "keywords", "patterns": ["x"]})
        d = dedupe(table, cfg)
        assert d.column("kept").to_pylist() == [True, False, True, True]  # normalised duplicate; other goal kept
        assert d.column("recipes").to_pylist()[0] == "deepwordbug,pwws"
        assert d.column("reject_kind").to_pylist() == [None, "duplicate text", None, None]
        run = RunDir(str(tmp_path / "run"))
        run.write_manifest({"state": "running"})
        for i in range(2):  # two shards: the grammar step reads each one's kept rows, writes a part per shard
            storage.write_parquet(d.slice(2 * i, 2), run.path(DEDUPE_DIR, f"part-{i:05d}.parquet"))
        stage, folder, step = quality_steps(cfg)[0]
        result = run_step(Run(run, {"state": "running"}, reused=False), step, DEDUPE_DIR, folder, 2)
    assert stage == "grammar" and result.failed == 0
    g = read_bench(run.uri, folder)
    assert g.column("id").to_pylist() == ["1", "3", "4"]  # the duplicate never reached the stage
    assert g.column("kept").to_pylist() == [False, True, True]  # row 4's seed has the same error
    assert g.column("reject_reason")[0].as_py() == "1 more grammar errors than the seed (1 vs 0)"
    assert g.column("recipes")[0].as_py() == "deepwordbug,pwws"  # the dedupe stage's columns carried on
    [tae] = [r for r in result.partials["grammar"].items() if r[0][0] == "tae"]
    assert tae[1]["sum rows"] == 2 and tae[1]["tally reject_kind"] == {"more grammar errors than the seed": 1}


def advtrain_data(taebench_run, tmp_path, tiny_binary_model, **over) -> dict:
    from redline.pipelines.quickstart import sample_path

    corpus = {"text_column": "text", "label_column": "label", "toxic_values": ["toxic"], "dataset": "sample"}
    return {"taebench": taebench_run, "base_model": str(tiny_binary_model),
            "train_corpus": {**corpus, "path": str(sample_path("toxic_sample_train.csv")), "split": "train"},
            "test_corpus": {**corpus, "path": str(sample_path("toxic_sample_test.csv")), "split": "test"},
            "holdout_recipes": ["textbugger"], "scheduler": "asha", "grace_period": 1,
            "search": {"learning_rate": [1e-3], "epochs": [2], "batch_size": [16]},
            "num_cpus": 0.5, "output": str(tmp_path / "runs"), "run_name": "adv", **over}


@pytest.mark.slow
def test_advtrain_sweep_produces_table5(taebench_run, tmp_path, tiny_binary_model):
    from redline.cluster.config import validate_config
    from redline.pipelines.advtrain import AdvTrainConfig, run_advtrain

    cfg = validate_config(AdvTrainConfig, advtrain_data(taebench_run, tmp_path, tiny_binary_model))
    result = run_advtrain(cfg)
    table = result.summary
    assert [r["variant"] for r in table] == ["no_tae", "unfiltered_tae", "taebench", "taebench_plus",
                                             "balanced_taebench_plus"]
    data = result.manifest["data"]
    assert data["adv_no_tae"] == 0 and data["adv_unfiltered_tae"] == data["adv_taebench"] > 0
    assert data["adv_balanced_taebench_plus"] >= data["adv_taebench_plus"] >= data["adv_taebench"]
    for row in table:
        for key in ("seed_f1", "seed_roc_auc", "tae_asr", "val_f1"):
            assert row[key] is not None and 0 <= row[key] <= 1, (row["variant"], key)
        assert row["checkpoint"] and (tmp_path / "runs" / "adv").as_posix() in row["checkpoint"]
    # more training rows for the adversarial variants: base + their adversarial rows
    assert table[2]["train_rows"] > table[0]["train_rows"]
    # every variant trains on its own data (balanced TaeBench+: BAE rows oversampled), and is measured on
    # every Table-5 column
    import pyarrow.parquet as pq

    by = {r["variant"]: r for r in table}
    assert by["no_tae"]["train_adv_rows"] == 0 and by["taebench"]["train_bae_rows"] == 0
    for variant, row in by.items():  # ~90% of the variant's own adversarial rows (10% validate), BAE included
        adv = pq.read_table(tmp_path / "runs" / "adv" / "data" / f"adv_{variant}.parquet").column("label").to_pylist()
        held = lambda n: max(2, 0.2 * n)  # noqa: E731 - a few rows land in the validation split
        assert 0 <= len(adv) - row["train_adv_rows"] <= held(len(adv)), variant
        assert 0 <= adv.count(0) - row["train_bae_rows"] <= held(adv.count(0)), variant
    assert by["taebench"]["train_adv_rows"] > 0
    for row in table:
        for key in ("bae_asr", "plus_balanced_accuracy", "unseen_tae_asr"):
            assert row[key] is not None and 0 <= row[key] <= 1, (row["variant"], key)
    from redline.actors.detectors import DetectorConfig, build_detector

    det = build_detector(DetectorConfig(name="adv", kind="hf", model=table[3]["checkpoint"]))
    assert det.detect(["you are an idiot"])[0].shape == (1, 2)  # a checkpoint is a usable detector
    # models trained on different data are different models, even where (as here, a saturated tiny model)
    # no decision flips and so ASR and balanced accuracy come out the same
    probe = ["you are an idiot", "have a lovely day", "shut up you moron", "what a nice idea"]
    plain = build_detector(DetectorConfig(name="a", kind="hf", model=by["no_tae"]["checkpoint"])).detect(probe)[0]
    balanced = build_detector(DetectorConfig(name="b", kind="hf", model=by["balanced_taebench_plus"]["checkpoint"]))
    assert not np.array_equal(plain, balanced.detect(probe)[0])
    html = (tmp_path / "runs" / "adv" / "report.html").read_text()
    assert "TaeBench ASR (FNR)" in html and "data:image/png;base64" in html
    status_and_report(result.run_uri, "TaeBench ASR")

@pytest.mark.slow
def test_advtrain_resumes_an_interrupted_sweep(taebench_run, tmp_path, tiny_binary_model, ray_session):
    import os
    import subprocess
    import sys

    import yaml

    data = advtrain_data(taebench_run, tmp_path, tiny_binary_model, scheduler="fifo", max_concurrent_trials=1,
                         variants=["no_tae", "taebench", "taebench_plus"])
    cfg = tmp_path / "adv.yaml"
    cfg.write_text(yaml.safe_dump(data))
    # both drivers join the session's Ray (as `redline run` on a cluster does): the killed one's trial
    # actors die with it, and the rerun starts no Ray of its own
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    cmd = [sys.executable, "-m", "redline", "run", "advtrain", "--config", str(cfg)]
    sweep = tmp_path / "runs" / "adv" / "sweep"
    done = _kill_after_first_trial(cmd, env, sweep)
    assert done >= 1
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads((tmp_path / "runs" / "adv" / "manifest.json").read_text())
    assert manifest["state"] == "complete" and manifest["resumed_sweep"] is True
    assert sorted(t["variant"] for t in manifest["trials"]) == ["no_tae", "taebench", "taebench_plus"]
    assert all(t["status"] == "done" and t["epochs_run"] == 2 for t in manifest["trials"])


def _kill_after_first_trial(cmd, env, sweep, timeout=300) -> int:
    import os
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + timeout
    finished = 0
    while time.time() < deadline and proc.poll() is None:
        finished = sum(1 for p in sweep.glob("*/result.json") if p.read_text().count("\n") >= 2)
        if finished:
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return finished


def test_bfloat16_precision_trains_with_float32_master_weights(tiny_binary_model):
    import numpy as np
    import torch

    from redline.actors.trainer import (
        ClassifierTrainer,
        SequenceClassifier,
        TrainSettings,
    )
    from redline.errors import RedlineError

    texts = ["you are an idiot", "have a nice day", "shut up loser", "thanks for the help"] * 4
    labels = [1, 0, 1, 0] * 4
    from redline.cluster.devices import cpu_native_bf16

    trainer = ClassifierTrainer(str(tiny_binary_model), ("benign", "toxic"),
                                TrainSettings(precision="bfloat16", batch_size=8, learning_rate=1e-3), len(texts))
    # bf16 on a CPU only where it is native; elsewhere float32 (tens of times faster there)
    assert trainer.autocast_dtype == (torch.bfloat16 if cpu_native_bf16() else None)
    before = trainer.model.classifier.weight.detach().clone()
    loss = trainer.train_epoch(texts, labels)
    assert np.isfinite(loss) and trainer.model.classifier.weight.dtype == torch.float32
    assert not torch.equal(before, trainer.model.classifier.weight)  # the step reached the float32 weights
    probs = trainer.predict_proba(texts)
    assert probs.shape == (16, 2) and np.allclose(probs.sum(1), 1, atol=1e-3)
    assert SequenceClassifier(str(tiny_binary_model), TrainSettings()).autocast_dtype is None  # float32 on CPU
    with pytest.raises(RedlineError, match="unknown precision 'fp8'"):
        SequenceClassifier(str(tiny_binary_model), TrainSettings(precision="fp8"))
