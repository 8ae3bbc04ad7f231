"""Ray Serve: detectors and generators over real HTTP on the session's local Ray."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from conftest import free_port

TEXTS = ["you are a complete idiot", "have a lovely day", "shut up you moron", "the weather is nice today",
         "what a stupid thing to say", "thanks for the help"]


@pytest.fixture(scope="module")
def server(ray_session, tiny_binary_model, tiny_causal_lm, tiny_seq2seq, tmp_path_factory):
    from redline.serve import runner
    from redline.serve.config import ServeConfig

    env = pytest.MonkeyPatch()  # restored after the module: later tests find their own state dir
    env.setenv("REDLINE_STATE_DIR", str(tmp_path_factory.mktemp("serve-state")))
    config = ServeConfig.model_validate({
        "port": free_port(),
        "detectors": [
            {"name": "profanity-check", "kind": "profanity-check", "num_cpus": 0.1,
             "serve": {"batch": {"max_batch_size": 64, "wait_timeout_s": 0.05}}},
            {"name": "tiny-bert", "kind": "hf", "model": str(tiny_binary_model), "num_cpus": 0.1},
            {"name": "slurs", "kind": "keywords", "patterns": ["idiot", "moron"], "num_cpus": 0.1},
        ],
        "generators": [
            {"name": "tiny-gpt2", "model": str(tiny_causal_lm), "num_cpus": 0.1, "max_input_tokens": 64},
            {"name": "tiny-bart", "model": str(tiny_seq2seq), "num_cpus": 0.1},
        ],
        "limits": {"max_texts": 50, "max_text_chars": 2000, "max_n": 4, "max_tokens": 3000,
                   "max_request_bytes": 200_000, "max_generated_tokens": 480_000, "max_detections": 100},
    })
    try:
        state = runner.start(config, announce=lambda _: None)
        yield {"url": state["url"], "config": config}
        runner.shutdown()
    finally:
        env.undo()


def post(server, path, body, timeout=60, **kwargs):
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(server["url"] + path, content=data, headers={"content-type": "application/json"},
                      timeout=timeout, **kwargs)


def test_detect_matches_the_detectors_called_directly(server, tiny_binary_model):
    from redline.actors.detectors import DetectorConfig, build_detector
    from redline.serve.client import RedlineClient

    with RedlineClient(server["url"] + "/v1/detect") as client:
        resp = client.detect(TEXTS)
        infos = {d.name: d for d in client.detectors()}
    assert resp.detectors == ["profanity-check", "tiny-bert", "slurs"]
    assert infos["tiny-bert"].labels == ["benign", "toxic"] and infos["tiny-bert"].toxic_labels == ["toxic"]
    for cfg in (DetectorConfig(name="profanity-check", kind="profanity-check"),
                DetectorConfig(name="tiny-bert", kind="hf", model=str(tiny_binary_model)),
                DetectorConfig(name="slurs", kind="keywords", patterns=["idiot", "moron"])):
        probs, score, toxic = build_detector(cfg).detect(TEXTS)
        labels = infos[cfg.name].labels
        for i, r in enumerate(resp.results):
            d = r.detections[cfg.name]
            assert r.index == i
            assert d.toxic == bool(toxic[i]) and d.label == ("toxic" if toxic[i] else "benign")
            assert d.toxic_score == pytest.approx(float(score[i]), abs=1e-5)
            assert [d.probs[lab] for lab in labels] == pytest.approx(probs[i].tolist(), abs=1e-5)
    only = post(server, "/v1/detect", {"texts": TEXTS[:2], "detectors": ["slurs"]}).json()
    assert only["detectors"] == ["slurs"] and only["results"][0]["detections"]["slurs"]["toxic"] is True


def test_moderations_work_with_the_openai_client(server):
    from openai import OpenAI

    client = OpenAI(base_url=server["url"] + "/v1", api_key="unused")
    resp = client.moderations.create(input=TEXTS, model="slurs")
    assert resp.model == "slurs"
    assert [r.flagged for r in resp.results] == [True, False, True, False, False, False]
    first = resp.results[0].model_dump()
    assert first["categories"]["toxic"] is True and first["category_scores"]["toxic"] == 1.0
    default = client.moderations.create(input="you are a complete idiot")  # first served detector
    assert default.model == "profanity-check" and default.results[0].flagged
    # a category is flagged at the detector's own threshold for that label (its decision rule's)
    info = {d["name"]: d for d in httpx.get(server["url"] + "/v1/detectors", timeout=30).json()["data"]}["tiny-bert"]
    assert set(info["label_thresholds"]) == set(info["labels"])
    for r in client.moderations.create(input=TEXTS, model="tiny-bert").results:
        flags, scores = r.model_dump()["categories"], r.model_dump()["category_scores"]
        assert {lab: flags[lab] for lab in info["labels"]} == {
            lab: lab in info["toxic_labels"] and scores[lab] >= info["label_thresholds"][lab] for lab in info["labels"]}


def test_openai_client_chat_and_completions_on_tiny_models(server):
    from openai import OpenAI

    client = OpenAI(base_url=server["url"] + "/v1", api_key="unused")
    assert {m.id for m in client.models.list().data} >= {"tiny-gpt2", "tiny-bart", "profanity-check"}
    chat = client.chat.completions.create(model="tiny-gpt2", messages=[{"role": "user", "content": "hello there"}],
                                          n=3, max_tokens=6, temperature=0.9, top_p=0.95, extra_body={"top_k": 20})
    assert len(chat.choices) == 3 and [c.index for c in chat.choices] == [0, 1, 2]
    assert all(c.message.role == "assistant" and isinstance(c.message.content, str) for c in chat.choices)
    assert all(c.finish_reason in ("stop", "length") for c in chat.choices)
    assert chat.usage.prompt_tokens > 0 and 0 < chat.usage.completion_tokens <= 18
    done = client.completions.create(model="tiny-bart", prompt=["you are nice", "go away"], n=2, max_tokens=5)
    assert [c.index for c in done.choices] == [0, 1, 2, 3]
    assert done.usage.completion_tokens <= 4 * 5
    # seeded sampling is reproducible; a stop sequence never appears in the text
    kwargs = dict(model="tiny-gpt2", prompt="you are", n=2, max_tokens=12, temperature=1.0, seed=7)
    a, b = client.completions.create(**kwargs), client.completions.create(**kwargs)
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    word = next((w for c in a.choices for w in c.text.split() if len(w) > 1), None)
    if word:
        stopped = client.completions.create(**kwargs, stop=[word])
        assert all(word not in c.text for c in stopped.choices)
        assert any(c.finish_reason == "stop" for c in stopped.choices)


def test_concurrent_requests_are_merged_into_batches(server):
    before = httpx.get(server["url"] + "/v1/stats").json()["detectors"]["profanity-check"]
    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(lambda t: post(server, "/v1/detect", {"texts": [t], "detectors": ["profanity-check"]}),
                                TEXTS * 8))
    assert all(r.status_code == 200 for r in replies)
    verdicts = {TEXTS[i % len(TEXTS)]: r.json()["results"][0]["detections"]["profanity-check"]["toxic"]
                for i, r in enumerate(replies)}
    assert verdicts["you are a complete idiot"] and not verdicts["have a lovely day"]
    after = httpx.get(server["url"] + "/v1/stats").json()["detectors"]["profanity-check"]
    requests, calls = after["requests"] - before["requests"], after["model_calls"] - before["model_calls"]
    assert requests == 48 and calls < requests / 2, (requests, calls)


@pytest.mark.parametrize("path,body,status,fragment", [
    ("/v1/detect", "{not json", 400, "not valid JSON"),
    ("/v1/detect", {}, 400, "missing field 'texts'"),
    ("/v1/detect", {"texts": "one text"}, 400, "texts"),
    ("/v1/detect", {"texts": [1, 2]}, 400, "texts.0"),
    ("/v1/detect", {"texts": []}, 400, "texts is empty"),
    ("/v1/detect", {"texts": ["ok", "   "]}, 400, "texts[1] is empty"),
    ("/v1/detect", {"texts": ["x"] * 51}, 413, "limit is 50"),
    ("/v1/detect", {"texts": ["x" * 2001]}, 413, "2001 characters"),
    ("/v1/detect", {"texts": ["x"], "detectors": ["nope"]}, 404, "unknown detector 'nope'"),
    ("/v1/moderations", {"input": ["x"], "model": "nope"}, 404, "unknown detector"),
    ("/v1/moderations", {"input": 3}, 400, "input"),
    ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}, 404, "unknown model 'nope'"),
    ("/v1/chat/completions", {"model": "tiny-gpt2", "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"model": "tiny-gpt2", "messages": [{"role": "robot", "content": "hi"}]}, 400, "role"),
    ("/v1/chat/completions", {"model": "tiny-gpt2", "messages": [{"role": "user", "content": "hi"}], "n": 5}, 400, "n=5"),
    ("/v1/chat/completions", {"model": "tiny-gpt2", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, 400, "temperature"),
    ("/v1/chat/completions", {"model": "tiny-gpt2", "messages": [{"role": "user", "content": "hi"}], "stream": True}, 400, "streaming"),
    ("/v1/completions", {"model": "tiny-gpt2", "prompt": "hi", "max_tokens": 5000}, 400, "max_tokens=5000"),
    ("/v1/completions", {"model": "tiny-gpt2", "prompt": "word " * 200}, 400, "accepts at most 64"),
    ("/v1/detect", {"texts": ["y" * 1000] * 250}, 413, "exceeds the limit"),
    ("/v1/nothing", {}, 404, "Not Found"),
    # amplification and budgets: one request has a bounded amount of work
    ("/v1/detect", {"texts": ["x"], "detectors": []}, 400, "detectors is empty"),
    ("/v1/detect", {"texts": ["x"], "detectors": "slurs"}, 400, "detectors"),
    ("/v1/detect", {"texts": ["x"] * 50, "detectors": ["slurs", "tiny-bert", "profanity-check"] * 100}, 413,
     "50 texts x 3 detectors = 150 detections in one request; the limit is 100"),
    ("/v1/completions", {"model": "tiny-gpt2", "prompt": ["hi"] * 50, "n": 4, "max_tokens": 3000}, 413,
     "n=4 x 50 prompt(s) x max_tokens=3000 = 600000 tokens in one request; the limit is 480000"),
    ("/v1/completions", {"model": "tiny-gpt2", "prompt": "hi", "seed": 2**70}, 400, "seed"),
    ("/v1/completions", {"model": "tiny-gpt2", "prompt": "hi", "seed": -1}, 400, "seed"),
    ("/v1/chat/completions", {"model": "tiny-gpt2", "messages": [{"role": "user", "content": "hi"}], "seed": 2**64},
     400, "seed"),
    ("/v1/moderations", {"input": ["x"] * 51}, 413, "limit is 50"),
    ("/v1/dialogue-safety", {"pairs": [{"context": "a", "response": "b"}]}, 404, "no dialogue-safety detector"),
    ("/v1/completions", {"model": "tiny-gpt2", "prompt": []}, 400, "prompt is empty"),
    # user mistakes that reach the model must never be a 5xx: text that is not Unicode, sampling that cannot sample
    ("/v1/completions", '{"model": "tiny-gpt2", "prompt": "hi \\ud800 there"}', 400, "lone surrogate (U+D800"),
    ("/v1/chat/completions", '{"model": "tiny-gpt2", "messages": [{"role": "user", "content": "\\udfff"}]}', 400,
     "messages.0.content: holds a lone surrogate"),
    ("/v1/detect", '{"texts": ["fine", "\\ud83d"]}', 400, "texts.1: holds a lone surrogate"),
    ("/v1/moderations", '{"input": "\\ud800"}', 400, "lone surrogate"),
    ("/v1/completions", {"model": "tiny-gpt2", "prompt": "hi", "stop": ["\ud800"]}, 400, "lone surrogate"),
    ("/v1/completions", {"model": "tiny-gpt2", "prompt": "hi", "temperature": 0, "n": 2}, 400,
     "temperature: n=2 needs temperature > 0"),
    ("/v1/chat/completions", {"model": "tiny-gpt2", "messages": [{"role": "user", "content": "hi"}], "temperature": 0,
                              "n": 4}, 400, "n=4 needs temperature > 0"),
    ("/v1/completions", {"model": "tiny-gpt2", "prompt": "hi", "temperature": 1e-300}, 400,
     "temperature 1e-300 is too small to sample with"),
    ("/v1/completions", {"model": "tiny-bart", "prompt": "hi", "temperature": 0.001}, 400, "too small"),
    ("/v1/completions", '{"model": "tiny-gpt2", "prompt": "hi", "top_p": NaN}', 400, "top_p"),
    ("/v1/completions", '{"model": "tiny-gpt2", "prompt": "hi", "temperature": Infinity}', 400, "temperature"),
    ("/v1/completions", {"model": "tiny-gpt2", "prompt": "hi", "top_p": 0}, 400, "top_p"),
    # taken silently on 0533d82: a repeated key (the last one won), 10,000 stops, a 300k-entry logit_bias
    ("/v1/completions", '{"model": "tiny-gpt2", "prompt": "hi", "prompt": "other"}', 400, "names 'prompt' twice"),
    ("/v1/detect", '{"texts": ["a"], "detectors": ["slurs"], "detectors": ["tiny-bert"]}', 400, "'detectors' twice"),
    ("/v1/completions", {"model": "tiny-gpt2", "prompt": "hi", "stop": ["x"] * 10_000}, 400, "at most 4"),
    ("/v1/chat/completions", {"model": "tiny-gpt2", "messages": [{"role": "user", "content": "hi"}],
                              "logit_bias": {str(i): 1 for i in range(300_000)}}, 413, "exceeds the limit"),
    ("/v1/chat/completions", {"model": "tiny-gpt2", "messages": [{"role": "user", "content": "hi"}],
                              "logit_bias": {"50256": -100}}, 400, "logit_bias: this server cannot honour it"),
    ("/v1/completions", {"model": "tiny-gpt2", "prompt": "hi", "presence_penalty": 1.0}, 400, "presence_penalty"),
])
def test_bad_requests_get_a_clear_4xx(server, path, body, status, fragment):
    resp = post(server, path, body)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert fragment in error["message"] and error["type"]


def test_sampling_at_the_edges_that_is_valid_still_answers(server):
    """The bounds refuse only what cannot sample: greedy with n=1 and the smallest allowed temperature work."""
    for body in ({"temperature": 0, "n": 1}, {"temperature": 0.01, "n": 2}, {"temperature": 2.0, "n": 2}):
        resp = post(server, "/v1/completions", {"model": "tiny-gpt2", "prompt": "hello", "max_tokens": 3, **body})
        assert resp.status_code == 200, (body, resp.text)
        assert len(resp.json()["choices"]) == body["n"]


@pytest.mark.parametrize("host,status", [
    ("127.0.0.1", 200), ("localhost", 200), ("LOCALHOST.", 200), ("[::1]", 200), ("127.0.0.5", 200),
    ("evil.example.com", 421), ("127.0.0.1.nip.io", 421), ("localhost.evil.example", 421), ("10.0.0.8", 421),
    ("x" * 300, 421),
])
def test_only_the_bound_host_names_are_answered(server, host, status):
    """DNS rebinding: a page on evil.example.com that rebinds its name to 127.0.0.1 sends Host: evil.example.com."""
    port = server["config"].port
    for path in ("/healthz", "/v1/models"):
        resp = httpx.get(server["url"] + path, headers={"Host": f"{host}:{port}"})
        assert resp.status_code == status, (host, path, resp.text)
    if status == 421:
        assert "is not a name this server answers to" in resp.json()["error"]["message"]


@pytest.fixture(scope="module")
def tight(server):
    """A second app on the same server with small budgets: 3 requests at once, 450 kB of bodies, 1.5 s per body,
    answering one extra Host name."""

    from redline.serve import runner
    from redline.serve.config import ServeConfig

    cfg = ServeConfig.model_validate({
        "port": server["config"].port, "app_name": "tight", "route_prefix": "/tight",
        "allowed_hosts": ["redline.internal"],
        "detectors": [{"name": "slurs", "kind": "keywords", "patterns": ["idiot"], "num_cpus": 0.05}],
        "limits": {"max_concurrent_requests": 3, "max_inflight_bytes": 450_000, "max_request_bytes": 200_000,
                   "body_timeout_s": 1.5}})
    state = runner.start(cfg, announce=lambda _: None)
    yield state["url"]
    runner.delete("tight")


def _slow_body(url: str, seconds: float, results: list, size: int = 100, chunked: bool = False) -> None:
    """A client that sends its body a few bytes at a time over `seconds` (a slowloris on the body); with
    `chunked` it declares no length, so the server must assume the largest body it accepts."""
    body = b'{"texts": ["' + b"a" * size + b'"]}'
    step = max(10, len(body) // 50)

    def trickle():
        for i in range(0, len(body), step):
            time.sleep(seconds * step / len(body))
            yield body[i:i + step]

    headers = {"content-type": "application/json"} | ({} if chunked else {"content-length": str(len(body))})
    try:
        results.append(httpx.post(url + "/v1/detect", content=trickle(), headers=headers, timeout=30))
    except httpx.HTTPError as err:
        results.append(err)


def _in_threads(n: int, *args, **kwargs) -> tuple[list, list[threading.Thread]]:
    results: list = []
    threads = [threading.Thread(target=_slow_body, args=(*args, results), kwargs=kwargs) for _ in range(n)]
    for t in threads:
        t.start()
    return results, threads


def test_slow_clients_and_floods_are_cut_off_while_health_stays_fast(tight):
    # bodies that take longer than body_timeout_s to arrive: 408, and their slots are free long before the
    # clients stop sending (three 8 s trickles would otherwise hold the whole budget of three at 3 s)
    results, threads = _in_threads(3, tight, 8)
    time.sleep(3)
    meanwhile = httpx.post(tight + "/v1/detect", json={"texts": ["idiot"]}, timeout=10)
    assert meanwhile.status_code == 200, meanwhile.text
    for t in threads:
        t.join()
    assert all(isinstance(r, httpx.Response) and r.status_code == 408 for r in results), results
    assert "did not arrive within 1.5s" in results[0].json()["error"]["message"]
    # three slow clients hold the budget of three: the next request is refused at once with Retry-After,
    # and /healthz (outside the budget) still answers at once
    holders, threads = _in_threads(3, tight, 1.2)
    time.sleep(0.4)
    busy = httpx.post(tight + "/v1/detect", json={"texts": ["idiot"]}, timeout=10)
    health = time.time()
    assert httpx.get(tight + "/healthz", timeout=10).status_code == 200
    health = time.time() - health
    for t in threads:
        t.join()
    assert busy.status_code == 503 and busy.headers.get("retry-after") == "1", busy.text
    assert "requests are in progress (the limit is 3)" in busy.json()["error"]["message"]
    assert health < 1.0
    assert all(isinstance(h, httpx.Response) and h.status_code == 200 for h in holders), holders
    # bodies held at once: two uploads of unknown length count as the largest body each (2 x 200 kB), so a
    # declared 60 kB body would pass 450 kB: 503
    held, threads = _in_threads(2, tight, 1.0, chunked=True)
    time.sleep(0.3)
    over = httpx.post(tight + "/v1/detect", content=b'{"texts": ["' + b"b" * 60_000 + b'"]}',
                      headers={"content-type": "application/json"}, timeout=10)
    for t in threads:
        t.join()
    assert over.status_code == 503 and "request bodies in progress hold 400,000 bytes" in over.json()["error"]["message"]
    # afterwards everything is released: a normal request goes through, and the listed Host name works
    ok = httpx.post(tight + "/v1/detect", json={"texts": ["idiot"]}, headers={"Host": "redline.internal"}, timeout=10)
    assert ok.status_code == 200, ok.text


def test_every_way_to_start_a_service_needs_a_key_off_loopback(monkeypatch, tmp_path, capsys):
    """A deploy file for 0.0.0.0 without a key variable is refused when written; the app it names refuses to
    start on a replica whose environment has no key."""
    from redline.cli import main
    from redline.errors import RedlineError
    from redline.serve.config import ServeConfig
    from redline.serve.gate import access_rules

    base = {"host": "0.0.0.0", "detectors": [{"name": "p", "kind": "profanity-check"}]}
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps({**base, "api_key_env": None}))
    assert main(["serve", "deploy-config", "-c", str(path)]) == 2
    assert "api_key_env is unset" in capsys.readouterr().err
    monkeypatch.delenv("REDLINE_API_KEY", raising=False)
    with pytest.raises(RedlineError, match="exposes the models to the network without an API key"):
        access_rules(ServeConfig.model_validate(base))
    assert not access_rules(ServeConfig.model_validate({**base, "insecure": True}))[0].required
    monkeypatch.setenv("REDLINE_API_KEY", "k")
    assert access_rules(ServeConfig.model_validate(base))[0].matches("k")


def test_duplicate_detector_names_are_scored_once(server):
    """300 copies of one name in a 6 KB request were 300 model calls; now one."""
    stats = lambda: httpx.get(server["url"] + "/v1/stats").json()["detectors"]["slurs"]  # noqa: E731
    before = stats()
    resp = post(server, "/v1/detect", {"texts": ["idiot"] * 20, "detectors": ["slurs"] * 300})
    assert resp.status_code == 200 and resp.json()["detectors"] == ["slurs"]
    after = stats()
    assert after["model_calls"] - before["model_calls"] == 1 and after["items"] - before["items"] == 20


def test_body_limit_holds_for_chunked_uploads_and_lying_lengths(server):
    """A chunked upload has no Content-Length: the limit is enforced while the body streams in."""
    def chunks():
        piece = b'{"texts": ["' + b"x" * 65_536
        yield piece
        for _ in range(200):  # ~13 MB in all; the server must stop reading long before
            yield b"y" * 65_536

    resp = httpx.post(server["url"] + "/v1/detect", content=chunks(), headers={"content-type": "application/json"},
                      timeout=60)
    assert resp.status_code == 413 and "exceeds the limit of 200000 bytes" in resp.json()["error"]["message"]
    small = httpx.post(server["url"] + "/v1/detect", content=iter([b'{"texts": ', b'["idiot"], "detectors": ["slurs"]}']),
                       headers={"content-type": "application/json"}, timeout=60)
    assert small.status_code == 200 and small.json()["results"][0]["detections"]["slurs"]["toxic"]


def test_api_key_is_required_on_every_request_when_set(server, monkeypatch):
    from openai import AuthenticationError, OpenAI

    from redline.serve import runner
    from redline.serve.config import ServeConfig

    monkeypatch.setenv("REDLINE_TEST_KEY", "s3cret-key")
    cfg = ServeConfig.model_validate({"port": server["config"].port, "app_name": "keyed", "route_prefix": "/keyed",
                                      "api_key_env": "REDLINE_TEST_KEY",
                                      "detectors": [{"name": "slurs", "kind": "keywords", "patterns": ["idiot"],
                                                     "num_cpus": 0.05}]})
    state = runner.start(cfg, announce=lambda _: None)
    try:
        url = state["url"]
        assert url.endswith("/keyed") and state["api_key_required"]
        assert httpx.get(url + "/healthz").status_code == 200
        for path in ("/docs", "/openapi.json", "/v1/detectors", "/v1/stats", "/v1/models", "/v1/x/healthz",
                     "/healthz/", "/healthzz"):  # only /healthz itself is public: exact match, not a suffix
            assert httpx.get(url + path).status_code in (401, 404), path
        docs = httpx.get(url + "/openapi.json", headers={"Authorization": "Bearer s3cret-key"})
        assert docs.status_code == 200 and "/v1/detect" in docs.json()["paths"]
        assert httpx.post(url + "/v1/detect", json={"texts": ["idiot"]}).status_code == 401
        wrong = httpx.post(url + "/v1/detect", json={"texts": ["idiot"]}, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and "API key" in wrong.json()["error"]["message"]
        good = httpx.post(url + "/v1/detect", json={"texts": ["idiot"]}, headers={"Authorization": "Bearer s3cret-key"})
        assert good.status_code == 200 and good.json()["results"][0]["detections"]["slurs"]["toxic"]
        with pytest.raises(AuthenticationError):
            OpenAI(base_url=url + "/v1", api_key="nope").moderations.create(input="idiot")
        assert OpenAI(base_url=url + "/v1", api_key="s3cret-key").moderations.create(input="idiot").results[0].flagged
        assert "s3cret-key" not in json.dumps(state)
    finally:
        runner.delete("keyed")


def test_pipelines_take_served_endpoints(server, tmp_path):
    from redline.actors.detectors import DetectorConfig, build_detector
    from redline.actors.generators import (
        GeneratorConfig,
        SamplingParams,
        build_generator,
    )
    from redline.cluster.config import validate_config
    from redline.pipelines.score import ScoreConfig, run_score

    remote = DetectorConfig.model_validate({"name": "profanity-check", "url": server["url"] + "/v1/detect"})
    assert remote.kind == "http"
    direct = build_detector(DetectorConfig(name="p", kind="profanity-check")).detect(TEXTS)
    served = build_detector(remote).detect(TEXTS)
    assert np.allclose(direct[0], served[0], atol=1e-5) and (direct[2] == served[2]).all()

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t, "label": int(i % 2 == 0)}) + "\n" for i, t in enumerate(TEXTS * 5)))
    cfg = validate_config(ScoreConfig, {
        "corpus": {"path": str(corpus), "text_column": "text", "label_column": "label", "toxic_values": [1]},
        "detectors": [{"name": "served-tiny", "url": server["url"], "detector": "tiny-bert", "num_cpus": 0.2}],
        "output": str(tmp_path / "runs")})
    result = run_score(cfg)
    overall = [m for m in result.summary if m["dataset"] == "all"][0]
    assert overall["n"] == 30 and overall["not_scored"] == 0

    gen = build_generator(GeneratorConfig(name="g", kind="openai", base_url=server["url"] + "/v1", model="tiny-gpt2"))
    out = gen.chat([[{"role": "user", "content": "hi"}], [{"role": "user", "content": "bye"}]],
                   SamplingParams(n=2, max_tokens=4))
    assert [len(r.completions) for r in out] == [2, 2] and out[0].prompt_tokens > 0


def test_a_killed_replica_fails_its_request_cleanly_and_is_replaced(server):
    import ray
    from ray import serve

    url = server["url"]
    result = {}

    def stats():
        return httpx.get(url + "/v1/stats").json()["generators"]["tiny-gpt2"]

    def long_generation():
        result["resp"] = post(server, "/v1/completions", {"model": "tiny-gpt2", "prompt": ["hello"] * 40, "n": 4,
                                                         "max_tokens": 3000, "temperature": 1.0})

    calls = stats()["model_calls"]
    worker = threading.Thread(target=long_generation)
    worker.start()
    deadline = time.time() + 60
    while stats()["model_calls"] == calls:  # the model is now working on it
        assert worker.is_alive() and time.time() < deadline, result
        time.sleep(0.05)
    replicas = [a for a in ray.util.list_named_actors(all_namespaces=True)
                if "SERVE_REPLICA" in a["name"] and "generator-tiny-gpt2" in a["name"]]
    assert len(replicas) == 1, replicas
    ray.kill(ray.get_actor(replicas[0]["name"], namespace=replicas[0]["namespace"]), no_restart=True)
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert result["resp"].status_code == 503, result["resp"].text
    assert "replica" in result["resp"].json()["error"]["message"]
    deadline = time.time() + 240  # the new replica loads its model: slow on a busy machine
    while True:
        try:
            resp = post(server, "/v1/completions", {"model": "tiny-gpt2", "prompt": "hello", "max_tokens": 3},
                        timeout=30)
        except httpx.TimeoutException:  # queued until the new replica is up: not an answer yet
            resp = None
        if resp is not None and resp.status_code == 200:
            break
        assert resp is None or resp.status_code == 503, resp.text
        assert time.time() < deadline, "no replica answered after the kill"
        time.sleep(1)
    app = serve.status().applications["redline"]
    assert str(app.deployments["generator-tiny-gpt2"].status).endswith("HEALTHY")


def test_deploy_config_matches_serves_schema_and_builds(server):
    from ray.serve.schema import ServeDeploySchema

    from redline.serve.app import app_builder
    from redline.serve.runner import deploy_config

    data = deploy_config(server["config"])
    ServeDeploySchema.model_validate(data) if hasattr(ServeDeploySchema, "model_validate") else ServeDeploySchema.parse_obj(data)
    assert data["http_options"]["host"] == "127.0.0.1"
    app = app_builder(data["applications"][0]["args"])
    assert type(app).__name__ == "Application"


def test_replicas_that_cannot_fit_are_refused_up_front(ray_session):
    from redline.errors import RedlineError
    from redline.serve.config import ServeConfig
    from redline.serve.runner import check_resources

    cfg = ServeConfig.model_validate({"detectors": [{"name": "p", "kind": "profanity-check", "num_cpus": 2,
                                                     "serve": {"replicas": 4}}]})
    with pytest.raises(RedlineError, match="need 8.1 CPUs"):
        check_resources(cfg, strict=True)


def test_serve_config_errors_are_one_line():
    from redline.cluster.config import validate_config
    from redline.errors import RedlineError
    from redline.serve.config import ServeConfig

    for data, fragment in [({}, "at least one detector or generator"),
                           ({"detectors": [{"name": "a", "kind": "keywords", "patterns": ["x"]}] * 2}, "repeated: a"),
                           ({"generators": [{"name": "g", "kind": "openai", "base_url": "http://x/v1", "model": "m"}]},
                            "Serve hosts Hugging Face models"),
                           ({"port": 0, "detectors": [{"name": "a", "kind": "keywords", "patterns": ["x"]}]}, "port")]:
        with pytest.raises(RedlineError, match=fragment):
            validate_config(ServeConfig, data)
