"""Who may talk to redline's HTTP services (cluster/access.py), and the Serve ingress's gate that
applies it with every request's budget, exercised in-process on a plain ASGI app."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time

import pytest

from redline.cluster import access
from redline.errors import RedlineError


@pytest.mark.parametrize("headers,key", [
    ({"authorization": "Bearer abc"}, "abc"),
    ({"authorization": "bearer   abc  "}, "abc"),
    ({"authorization": "BEARER abc"}, "abc"),
    ({"x-api-key": " abc "}, "abc"),
    ({"authorization": "Basic abc", "x-api-key": "xyz"}, "xyz"),
    ({"authorization": "Bearer"}, ""),
    ({"authorization": "Bearerabc"}, ""),
    ({}, ""),
])
def test_the_key_a_request_carries(headers, key):
    assert access.given_key(headers) == key


def test_keys_are_compared_as_hmacs_under_a_secret_of_each_process():
    check = access.KeyCheck("s3cret")
    assert check.required and check.matches("s3cret")
    for wrong in ("", None, "s3cre", "s3cret ", "S3CRET", hashlib.sha256(b"s3cret").hexdigest()):
        assert not check.matches(wrong), wrong
    assert not access.KeyCheck(None).required and access.KeyCheck(None).matches(None)
    assert not access.KeyCheck("").required
    from_digest = access.KeyCheck.from_sha256(access.key_sha256("s3cret"))
    assert from_digest.required and from_digest.matches("s3cret") and not from_digest.matches("other")
    assert access.key_sha256(None) is None and access.key_sha256("") is None
    assert access.key_sha256("k") == hashlib.sha256(b"k").hexdigest()
    assert "s3cret" not in repr(vars(check)) and hashlib.sha256(b"s3cret").digest() not in vars(check).values()


def test_session_tokens_are_signed_expire_and_belong_to_one_process(monkeypatch):
    check = access.KeyCheck("s3cret")
    token = check.session_token(60)
    expires, mac = token.split(".")
    assert abs(int(expires) - (time.time() + 60)) < 2 and len(mac) == 64
    assert check.session_ok(token)
    assert not check.session_ok(f"{int(expires) + 1}.{mac}")  # a life it was not signed for
    assert not check.session_ok(f"{expires}.{mac[:-1]}0" if mac[-1] != "0" else f"{expires}.{mac[:-1]}1")
    assert not check.session_ok(None) and not check.session_ok("") and not check.session_ok("abc.def")
    assert not access.KeyCheck("s3cret").session_ok(token)  # another process's secret
    assert not check.session_ok(check.session_token(-1))  # already expired
    assert access.KeyCheck(None).session_ok(None)  # no key: no session needed
    monkeypatch.setattr(access.time, "time", lambda: int(expires) + 0.5)
    assert not check.session_ok(token)  # past its expiry
    monkeypatch.setattr(access.time, "time", lambda: int(expires) - 0.5)
    assert check.session_ok(token)


@pytest.mark.parametrize("bind,extra,allowed,refused", [
    ("127.0.0.1", (), ["127.0.0.1", "127.0.0.1:8000", "localhost", "LOCALHOST:1", "localhost.", "[::1]:80", "::1",
                      "127.3.4.5", "localhost.localdomain", "ip6-localhost"],
     ["evil.example", "evil.example:8000", "10.0.0.1", "0.0.0.0", "127.0.0.1.evil", "[fe80::1]", "x" * 300, ""]),
    ("10.1.2.3", ("api.internal",), ["10.1.2.3:80", "localhost", "api.internal", "API.internal:443"],
     ["10.1.2.4", "other.internal", "internal"]),
    ("0.0.0.0", (), ["10.9.9.9", "192.168.0.1:80", "[2001:db8::1]:8000", "localhost"], ["evil.example"]),
    ("::", ("a.b",), ["[::1]", "8.8.8.8", "a.b"], ["b.a"]),
    ("127.0.0.1", ("*",), ["anything.at.all", "x" * 300], []),
])
def test_the_host_rule(bind, extra, allowed, refused):
    rule = access.HostRule(bind, extra)
    for host in allowed:
        assert rule.allows(host), (bind, host)
    for host in refused:
        assert not rule.allows(host), (bind, host)
    assert rule.allows(None)  # HTTP/1.0 clients send no Host; browsers always do


def test_a_wildcard_bind_answers_this_machines_own_names(monkeypatch):
    monkeypatch.setattr(access.socket, "gethostname", lambda: "node-7")
    monkeypatch.setattr(access.socket, "getfqdn", lambda: "node-7.cluster.local.")
    rule = access.HostRule("0.0.0.0")
    assert rule.allows("node-7:8000") and rule.allows("NODE-7.cluster.local")
    assert not access.HostRule("127.0.0.1").allows("node-7")
    assert "bound to all interfaces" in rule.refusal("evil") and "--allow-host" in rule.refusal("evil")
    assert "bound to 127.0.0.1" in access.HostRule("127.0.0.1").refusal("x" * 500)
    assert len(access.HostRule("127.0.0.1").refusal("x" * 500)) < 300


@pytest.mark.parametrize("host,has_key,insecure,ok", [
    ("127.0.0.1", False, False, True), ("localhost", False, False, True), ("::1", False, False, True),
    ("0.0.0.0", False, False, False), ("10.0.0.1", False, False, False), ("0.0.0.0", True, False, True),
    ("0.0.0.0", False, True, True),
])
def test_exposure_needs_a_key_or_an_explicit_insecure(host, has_key, insecure, ok):
    from redline.errors import RedlineError

    if ok:
        access.check_exposure(host, has_key, insecure, "$K", "serve")
        return
    with pytest.raises(RedlineError, match=f"serve: host {host} exposes the runs to the network without an API key; "
                                           r"set \$K to a secret"):
        access.check_exposure(host, has_key, insecure, "$K", "serve", "the runs")


# --------------------------------------------------------------------------------------------
# The ingress gate (serve/app.py Guard) on a plain ASGI app: same code, no Serve needed


class _State:
    pass


def _gate(limits: dict | None = None, key: str | None = None, hosts: tuple[str, ...] = ()):
    """The Guard around an app that echoes the body it was given (after the gate read it)."""
    from redline.serve.config import ServeLimits
    from redline.serve.gate import Guard

    async def echo(scope, receive, send):
        message = await receive()
        body = message.get("body", b"")
        await asyncio.sleep(scope.get("hold", 0))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"echo:" + body})

    guard = Guard(echo)
    state = _State()
    state.limits = ServeLimits(**(limits or {}))
    state.keys = access.KeyCheck(key)
    state.hosts = access.HostRule("127.0.0.1", hosts)
    return guard, state


def _call(guard, state, path="/v1/detect", headers=None, chunks=(b"{}",), delay=0.0, hold=0.0, root_path="",
          messages=None):
    """Run one request through the gate; returns (status, headers, body). `messages`: the exact ASGI
    messages the client sends (instead of `chunks`)."""
    class App:
        pass

    app = App()
    app.state = state
    headers = {"host": "127.0.0.1:8000", **(headers or {})}
    scope = {"type": "http", "path": path, "root_path": root_path, "app": app, "hold": hold,
             "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}
    pending = list(messages) if messages is not None else [
        {"type": "http.request", "body": c, "more_body": k < len(chunks) - 1} for k, c in enumerate(chunks)]
    sent: list[dict] = []

    async def receive():
        if delay:
            await asyncio.sleep(delay)
        if not pending:
            return {"type": "http.disconnect"}
        return pending.pop(0)

    async def send(message):
        sent.append(message)

    async def run():
        await guard(scope, receive, send)

    return run, sent


def _result(sent):
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body


def _one(guard, state, **kwargs):
    run, sent = _call(guard, state, **kwargs)
    asyncio.run(run())
    return _result(sent)


def test_the_gate_checks_host_then_key_and_leaves_health_public():
    guard, state = _gate(key="k")
    assert _one(guard, state, headers={"host": "evil.example"})[0] == 421
    assert _one(guard, state, path="/healthz", headers={"host": "evil.example"})[0] == 421
    assert _one(guard, state, path="/healthz")[0] == 200
    assert _one(guard, state)[0] == 401
    assert _one(guard, state, headers={"authorization": "Bearer nope"})[0] == 401
    status, _, body = _one(guard, state, headers={"authorization": "Bearer k"}, chunks=(b"ab", b"cd"))
    assert status == 200 and body == b"echo:abcd"  # the body read by the gate reaches the app whole
    assert _one(guard, state, path="/healthz/", headers={})[0] == 401  # public means exactly /healthz
    open_guard, open_state = _gate()
    assert _one(open_guard, open_state)[0] == 200


def test_the_gate_bounds_body_size_declared_or_streamed():
    guard, state = _gate({"max_request_bytes": 10})
    status, _, body = _one(guard, state, headers={"content-length": "11"}, chunks=(b"x" * 11,))
    assert status == 413 and b"request body of 11 bytes exceeds the limit of 10" in body
    status, _, body = _one(guard, state, chunks=(b"x" * 6, b"y" * 5))  # chunked, no length
    assert status == 413 and b"exceeds the limit of 10 bytes" in body
    assert _one(guard, state, headers={"content-length": "1"}, chunks=(b"x" * 6, b"y" * 5))[0] == 413  # a lie
    assert _one(guard, state, chunks=(b"x" * 5, b"y" * 5))[0] == 200  # exactly the limit
    assert _one(guard, state, headers={"content-length": "9" * 30}, chunks=(b"x",))[0] == 200  # absurd: ignored


def test_a_slow_body_is_cut_off_and_its_budget_released():
    guard, state = _gate({"body_timeout_s": 0.2})
    started = time.monotonic()
    status, _, body = _one(guard, state, chunks=(b"a", b"b", b"c"), delay=0.15)
    assert status == 408 and b"did not arrive within 0.2s" in body
    assert time.monotonic() - started < 1.0
    assert guard.active == 0 and guard.held_bytes == 0
    assert _one(guard, state, chunks=(b"a", b"b"), delay=0.05)[0] == 200


def test_concurrency_and_held_bytes_are_budgeted_and_released():
    guard, state = _gate({"max_concurrent_requests": 2, "max_request_bytes": 100, "max_inflight_bytes": 150})

    async def scenario():
        holders = [_call(guard, state, headers={"content-length": "10"}, chunks=(b"x" * 10,), hold=0.3)
                   for _ in range(2)]
        tasks = [asyncio.create_task(run()) for run, _ in holders]
        await asyncio.sleep(0.1)
        busy_run, busy_sent = _call(guard, state, headers={"content-length": "1"}, chunks=(b"x",))
        await busy_run()
        health_run, health_sent = _call(guard, state, path="/healthz")
        await health_run()
        await asyncio.gather(*tasks)
        return [_result(s) for _, s in holders], _result(busy_sent), _result(health_sent)

    holders, busy, health = asyncio.run(scenario())
    assert all(h[0] == 200 for h in holders)
    assert busy[0] == 503 and busy[1]["retry-after"] == "1"
    assert b"2 requests are in progress (the limit is 2)" in busy[2]
    assert health[0] == 200  # outside the budget
    assert guard.active == 0 and guard.held_bytes == 0

    async def bytes_scenario():
        holder = _call(guard, state, chunks=(b"x" * 10,), hold=0.3)  # no length: counts as 100 bytes
        task = asyncio.create_task(holder[0]())
        await asyncio.sleep(0.1)
        over = _call(guard, state, headers={"content-length": "60"}, chunks=(b"y" * 60,))
        await over[0]()
        fits = _call(guard, state, headers={"content-length": "50"}, chunks=(b"y" * 50,))
        await fits[0]()
        await task
        return _result(over[1]), _result(fits[1])

    over, fits = asyncio.run(bytes_scenario())
    assert over[0] == 503 and b"request bodies in progress hold 100 bytes (the limit is 150)" in over[2]
    assert fits[0] == 200
    assert guard.active == 0 and guard.held_bytes == 0


def _error(body: bytes) -> tuple[str, str, str]:
    error = json.loads(body)["error"]
    return error["type"], error["code"], error["message"]


def test_each_refusal_is_an_api_error_with_its_type_code_and_cause():
    guard, state = _gate({"max_request_bytes": 10, "body_timeout_s": 0.2}, key="k")
    auth = {"authorization": "Bearer k"}
    cases = [
        ({"headers": {"host": "evil.example"}}, 421, "invalid_request_error", "misdirected_request", "evil.example"),
        ({}, 401, "authentication_error", "invalid_api_key",
         "missing or invalid API key (send `Authorization: Bearer <key>`)"),
        ({"headers": {**auth, "content-length": "11"}, "chunks": (b"x" * 11,)}, 413, "invalid_request_error",
         "request_too_large", "request body of 11 bytes exceeds the limit of 10"),
        ({"headers": auth, "chunks": (b"x" * 6, b"y" * 5)}, 413, "invalid_request_error", "request_too_large",
         "request body exceeds the limit of 10 bytes"),
        ({"headers": auth, "chunks": (b"a", b"b", b"c"), "delay": 0.15}, 408, "invalid_request_error",
         "request_timeout", "the request body did not arrive within 0.2s"),
    ]
    for kwargs, status, kind, code, text in cases:
        got, _, body = _one(guard, state, **kwargs)
        message = _error(body)[2]
        assert got == status and _error(body)[:2] == (kind, code), (status, body)
        assert (text in message) if status == 421 else (message == text), message


def test_a_busy_refusal_says_overloaded():
    guard, state = _gate({"max_concurrent_requests": 1})
    guard.active = 1  # one request in flight
    status, headers, body = _one(guard, state)
    assert status == 503 and headers["retry-after"] == "1"
    assert _error(body)[:2] == ("service_unavailable", "overloaded")
    assert _error(body)[2] == "the server is at capacity: 1 requests are in progress (the limit is 1); retry shortly"


def test_the_declared_length_is_trusted_up_to_the_limit_and_19_digits():
    guard, state = _gate({"max_request_bytes": 10})
    assert _one(guard, state, headers={"content-length": "10"}, chunks=(b"x" * 10,))[0] == 200  # exactly the limit
    assert _one(guard, state, headers={"content-length": "9" * 19}, chunks=(b"x",))[0] == 413  # a number: refused
    # 20 digits is not a length anyone sends: ignored, and the body is measured as it streams in
    assert _one(guard, state, headers={"content-length": "1" + "0" * 19}, chunks=(b"x",))[0] == 200


def test_the_public_path_is_matched_below_the_route_prefix():
    guard, state = _gate(key="k")
    assert _one(guard, state, path="/api/healthz", root_path="/api")[0] == 200
    assert _one(guard, state, path="/api/v1/detect", root_path="/api")[0] == 401
    assert _one(guard, state, path="/api/healthz", root_path="")[0] == 401  # /api/healthz is not /healthz
    assert _one(guard, state, path="/healthz", root_path="/api")[0] == 200  # a path outside the prefix: as given


def test_the_app_reads_the_body_once_and_then_the_clients_next_message():
    from redline.serve.gate import Guard

    got = []

    async def twice(scope, receive, send):
        got.append(await receive())
        got.append(await receive())
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    _, state = _gate()
    guard = Guard(twice)
    assert _one(guard, state, chunks=(b"ab", b"cd"))[0] == 204
    assert got == [{"type": "http.request", "body": b"abcd", "more_body": False}, {"type": "http.disconnect"}]
    got.clear()  # a message may leave out its body and more_body (ASGI's defaults: b"" and False)
    assert _one(guard, state, messages=[{"type": "http.request"}])[0] == 204
    assert got[0] == {"type": "http.request", "body": b"", "more_body": False}
    sent_nothing = _call(guard, state, messages=[{"type": "http.disconnect"}])  # the client went away
    asyncio.run(sent_nothing[0]())
    assert sent_nothing[1] == [] and guard.active == 0 and guard.held_bytes == 0


def test_other_scopes_and_apps_without_limits_pass_untouched():
    from redline.serve.gate import Guard

    seen = []

    async def app(scope, receive, send):
        seen.append((scope["type"], await receive()))
        await send({"type": "done"})

    _, state = _gate(key="k")
    guard = Guard(app)
    sent = []

    async def receive():
        return {"type": "lifespan.startup"}

    async def send(message):
        sent.append(message)

    class WithState:
        pass

    configured = WithState()
    configured.state = state
    asyncio.run(guard({"type": "lifespan", "app": configured}, receive, send))
    asyncio.run(guard({"type": "http", "path": "/v1/detect", "headers": []}, receive, send))  # no app: no rules
    assert seen == [("lifespan", {"type": "lifespan.startup"}), ("http", {"type": "lifespan.startup"})]
    assert sent == [{"type": "done"}, {"type": "done"}]


def test_access_rules_take_the_key_from_the_driver_or_the_environment(monkeypatch):
    from redline.serve.config import ServeConfig
    from redline.serve.gate import access_rules

    def serve_config(**fields):
        return ServeConfig(detectors=[{"name": "p", "kind": "profanity-check"}], **fields)

    monkeypatch.setenv("K", "from-env")
    keys, hosts = access_rules(serve_config(api_key_env="K"))
    assert keys.required and keys.matches("from-env") and not keys.matches("other")
    keys, _ = access_rules(serve_config(api_key_env="K"), hashlib.sha256(b"from-driver").hexdigest())
    assert keys.matches("from-driver") and not keys.matches("from-env")
    assert not access_rules(serve_config(api_key_env=None))[0].required
    monkeypatch.delenv("K")
    with pytest.raises(RedlineError, match=r"^serve: host 0.0.0.0 exposes the models to the network without an API "
                                           r"key; set \$K to a secret"):
        access_rules(serve_config(host="0.0.0.0", api_key_env="K"))
    with pytest.raises(RedlineError, match="set api_key_env to a secret"):
        access_rules(serve_config(host="0.0.0.0", api_key_env=None))
    assert not access_rules(serve_config(host="0.0.0.0", api_key_env=None, insecure=True))[0].required
    monkeypatch.setenv("K", "from-env")
    assert access_rules(serve_config(host="0.0.0.0", api_key_env="K"))[0].matches("from-env")  # exposed with a key
    _, hosts = access_rules(serve_config(host="127.0.0.2", allowed_hosts=["redline.internal"]))
    assert hosts.allows("redline.internal") and hosts.allows("127.0.0.2:8000") and not hosts.allows("evil.example")


def test_a_key_that_is_not_valid_unicode_still_works():
    """An environment variable with bytes that are not UTF-8 reaches Python as lone surrogates."""
    key = "k\udcff"
    assert access.key_sha256(key) == hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    check = access.KeyCheck.from_sha256(access.key_sha256(key))
    assert check.matches(key) and not check.matches("k") and access.key_sha256(None) is None
