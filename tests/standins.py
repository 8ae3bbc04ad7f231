"""Small real HTTP servers speaking third-party APIs, for tests: LanguageTool's /v2/check, an
OpenAI-compatible chat endpoint with scripted answers and failures, and Bedrock's ApplyGuardrail
and Converse, Perspective's comments:analyze.
The client code under test is the code used against the real services."""

from __future__ import annotations

import json
import re
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

TOXIC_WORDS = ("idiot", "moron", "stupid", "dumb", "loser", "hate", "shut", "trash", "pathetic", "ugly", "fool")


def looks_toxic(text: str) -> bool:
    """Like an LLM judge that sees through typos: a word within edit distance of a toxic word."""
    from rapidfuzz.distance import Levenshtein

    words = re.findall(r"[\w']+", text.lower())
    return any(Levenshtein.distance(w, t) <= max(1, len(t) // 3) for w in words for t in TOXIC_WORDS)


class _Server:
    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "_Server":
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _reply(handler: BaseHTTPRequestHandler, status: int, body: dict, headers: dict | None = None) -> None:
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    for k, v in (headers or {}).items():
        handler.send_header(k, v)
    handler.end_headers()
    handler.wfile.write(data)


def languagetool() -> _Server:
    """Flags `a apple`-style article errors and doubled words as GRAMMAR, `teh` as TYPOS."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/v2/check":
                return _reply(self, 404, {"error": "not found"})
            form = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
            text = form.get("text", [""])[0]
            matches = []
            for m in re.finditer(r"\ba [aeiou]\w*|\b(\w+) \1\b", text, re.IGNORECASE):
                matches.append({"message": "grammar", "offset": m.start(), "length": len(m.group(0)),
                                "rule": {"id": "EN_A_VS_AN", "category": {"id": "GRAMMAR", "name": "Grammar"}}})
            for m in re.finditer(r"\bteh\b", text):
                matches.append({"message": "typo", "offset": m.start(), "length": 3,
                                "rule": {"id": "MORFOLOGIK_RULE_EN_US", "category": {"id": "TYPOS", "name": "Typos"}}})
            _reply(self, 200, {"software": {"name": "LanguageTool"}, "matches": matches})

    return _Server(Handler)


def openai_judge(slow_s: float = 3.0, api_key: str | None = None) -> _Server:
    """Chat completions that judge the passage by a word list. Texts containing FLAKY fail with 429
    then 500 before succeeding; SLOW answers after `slow_s`; GARBLE answers nonsense; ONCEGARBLE
    answers nonsense the first time only; DOWN always 500; NOTJSON answers an HTML page; NOCHOICES a
    completion without choices; DATED a 429 whose Retry-After is an HTTP date 1.5 s ahead, then Yes.
    Model `missing` is a 404; with `api_key` a request without it is a 401. A moderation request
    with SHORT in a text gets one result too few, with SLOW it answers after `slow_s`; with GATE it
    answers after `slow_s` once two GATE requests have been open at the same time (two clients: a
    detector's calls are one at a time), holding every GATE request until then (at most a minute),
    so a pool that grows goes on however slow the machine and one that does not waits a minute.
    Every chat request's passage and time is kept in `server.httpd.log`."""
    calls: dict[str, int] = defaultdict(int)
    gate, gate_lock, gate_open = threading.Event(), threading.Lock(), [0]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if api_key is not None and self.headers.get("Authorization") != f"Bearer {api_key}":
                return _reply(self, 401, {"error": {"message": "Incorrect API key provided"}})
            if body.get("model") == "missing":
                return _reply(self, 404, {"error": {"message": "The model `missing` does not exist"}})
            if self.path.endswith("/moderations"):
                texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
                results = [{"flagged": looks_toxic(t), "categories": {"harassment": looks_toxic(t)},
                            "category_scores": {"harassment": 0.9 if looks_toxic(t) else 0.1}} for t in texts]
                if any("SHORT" in t for t in texts):
                    results = results[:-1]
                if any("SLOW" in t for t in texts):
                    time.sleep(slow_s)
                if any("GATE" in t for t in texts):
                    with gate_lock:
                        gate_open[0] += 1
                        if gate_open[0] >= 2:
                            gate.set()
                    if not gate.wait(60):
                        gate.set()  # a minute alone: the pool did not grow; the rest answer at once
                    time.sleep(slow_s)
                    with gate_lock:
                        gate_open[0] -= 1
                return _reply(self, 200, {"id": "modr-1", "model": body.get("model"), "results": results})
            prompt = body["messages"][-1]["content"]
            if "Passage:" in prompt:
                passage = prompt.rsplit("Passage:", 1)[-1].split("\n")[0]
            elif 'User message: "' in prompt:
                passage = prompt.split('User message: "', 1)[1].rsplit('"', 1)[0]
            else:
                passage = prompt
            self.server.requests += 1  # type: ignore[attr-defined]
            self.server.log.append((passage, time.monotonic()))  # type: ignore[attr-defined]
            calls[passage] += 1
            if "NOTJSON" in passage:
                page = b"<html><body>502 Bad Gateway</body></html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)
                return None
            if "NOCHOICES" in passage:
                return _reply(self, 200, {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                                          "choices": []})
            if "DATED" in passage and calls[passage] == 1:
                from email.utils import formatdate

                return _reply(self, 429, {"error": {"message": "slow down"}},
                              {"Retry-After": formatdate(time.time() + 2.5, usegmt=True)})
            if "FLAKY" in passage and calls[passage] == 1:
                return _reply(self, 429, {"error": {"message": "rate limited"}}, {"Retry-After": "0.1"})
            if "FLAKY" in passage and calls[passage] == 2:
                return _reply(self, 500, {"error": {"message": "boom"}})
            if "DOWN" in passage:
                return _reply(self, 500, {"error": {"message": "down"}})
            if "SLOW" in passage:
                time.sleep(slow_s)
            if "GARBLE" in passage and ("ONCEGARBLE" not in passage or calls[passage] == 1):
                answer = "The passage is interesting."
            elif body["model"] == "llama-guard":
                answer = "unsafe\nS10" if looks_toxic(passage) else "safe"
            else:
                answer = " Yes" if looks_toxic(passage) else " No"
            _reply(self, 200, {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                               "choices": [{"index": 0, "message": {"role": "assistant", "content": answer},
                                            "finish_reason": "stop"}],
                               "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": 1,
                                         "total_tokens": len(prompt.split()) + 1}})

    server = _Server(Handler)
    server.httpd.requests = 0  # type: ignore[attr-defined]
    server.httpd.log = []  # type: ignore[attr-defined]
    return server


def bedrock() -> _Server:
    """Bedrock Runtime. ApplyGuardrail intervenes on toxic-looking text; guardrail `missing` is a 404.
    Converse answers "you said: <last user turn>" (truncated to maxTokens words, then
    stopReason max_tokens), model `missing` is a ValidationException, `ANGRY` in the turn an insult.
    Every Converse body is kept in `server.httpd.converse_bodies` (the client's signed request too)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            converse = re.fullmatch(r"/model/([^/]+)/converse", self.path)
            if converse:
                return self._converse(converse.group(1), body)
            m = re.fullmatch(r"/guardrail/([^/]+)/version/([^/]+)/apply", self.path)
            if not m:
                return _reply(self, 404, {"message": "unknown operation"})
            if m.group(1) == "missing":
                return _reply(self, 404, {"message": "Guardrail missing not found"},
                              {"x-amzn-ErrorType": "ResourceNotFoundException"})
            text = " ".join(c["text"]["text"] for c in body.get("content", []))
            action = "GUARDRAIL_INTERVENED" if looks_toxic(text) else "NONE"
            _reply(self, 200, {"usage": {"topicPolicyUnits": 1}, "action": action,
                               "outputs": [{"text": "blocked"}] if action != "NONE" else [], "assessments": []})

        def _converse(self, model: str, body: dict) -> None:
            self.server.converse_bodies.append({**body, "authorization": self.headers.get("Authorization", "")})  # type: ignore[attr-defined]
            if model == "missing":
                return _reply(self, 400, {"message": "The provided model identifier is invalid."},
                              {"x-amzn-ErrorType": "ValidationException"})
            turn = body["messages"][-1]["content"][0]["text"]
            words = (["you", "are", "an", "idiot"] if "ANGRY" in turn else ["you", "said:", *turn.split()])
            if "Passage:" in turn:  # a judge's question: answered like a judge
                passage = turn.rsplit("Passage:", 1)[-1].split("\n")[0]
                words = ["Yes"] if looks_toxic(passage) else ["No"]
            limit = body.get("inferenceConfig", {}).get("maxTokens", 100)
            reason = "max_tokens" if len(words) > limit else "end_turn"
            words = words[:limit]
            _reply(self, 200, {"output": {"message": {"role": "assistant", "content": [{"text": " ".join(words)}]}},
                               "stopReason": reason, "metrics": {"latencyMs": 1},
                               "usage": {"inputTokens": len(turn.split()), "outputTokens": len(words),
                                         "totalTokens": len(turn.split()) + len(words)}})

    server = _Server(Handler)
    server.httpd.converse_bodies = []  # type: ignore[attr-defined]
    return server


def short_detect_server() -> _Server:
    """A /v1/detect server that answers badly: text 0 fine, text 1 without probabilities, text 2 with
    an error, text 3 not at all."""

    info = {"name": "served", "kind": "keywords", "labels": ["toxic"], "toxic_labels": ["toxic"],
            "multi_label": False, "threshold": 0.5, "rule": "score"}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            _reply(self, 200, {"object": "list", "data": [info]})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            n = len(body["texts"])
            results = [{"index": 0, "detections": {"served": {"toxic": True, "toxic_score": 1.0,
                                                              "probs": {"toxic": 1.0}}}}]
            if n > 1:
                results.append({"index": 1, "detections": {"served": {"toxic": True, "toxic_score": 1.0}}})
            if n > 2:
                results.append({"index": 2, "detections": {"served": {"error": "boom"}}})
            _reply(self, 200, {"object": "detection", "detectors": ["served"], "results": results})

    return _Server(Handler)


def perspective(api_key: str = "test-key", throttle_first: int = 1) -> _Server:
    """Perspective's `comments:analyze`: TOXICITY / INSULT scores from `looks_toxic`; the first
    `throttle_first` requests answer 429; a text containing `klingon` is an unsupported language (400,
    with the API's own message); a wrong key is 403 PERMISSION_DENIED. Records every request's
    arrival time (`server.httpd.arrivals`) and each scored request's body (`server.httpd.bodies`)."""
    state = {"seen": 0}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            server.httpd.arrivals.append(time.monotonic())  # type: ignore[attr-defined]
            if self.path != "/v1alpha1/comments:analyze" or "key=" in self.path:
                return _reply(self, 404, {"error": {"code": 404, "message": "not found"}})
            if self.headers.get("X-Goog-Api-Key") != api_key:
                return _reply(self, 403, {"error": {"code": 403, "message": "The caller does not have permission",
                                                    "status": "PERMISSION_DENIED"}})
            state["seen"] += 1
            if state["seen"] <= throttle_first:
                return _reply(self, 429, {"error": {"code": 429, "message": "Quota exceeded",
                                                    "status": "RESOURCE_EXHAUSTED"}}, {"Retry-After": "0"})
            text = body["comment"]["text"]
            if "klingon" in text:
                return _reply(self, 400, {"error": {"code": 400, "status": "INVALID_ARGUMENT", "message":
                                                    "Attribute TOXICITY does not support request languages: tlh"}})
            score = 0.93 if looks_toxic(text) else 0.04
            attrs = {a: {"summaryScore": {"value": score if a != "INSULT" else score / 2, "type": "PROBABILITY"},
                         "spanScores": []} for a in body["requestedAttributes"]}
            server.httpd.bodies.append(body)  # type: ignore[attr-defined]
            _reply(self, 200, {"attributeScores": attrs, "languages": body.get("languages", ["en"]),
                               "detectedLanguages": ["en"]})

    server = _Server(Handler)
    server.httpd.arrivals, server.httpd.bodies = [], []  # type: ignore[attr-defined]
    return server
