"""The gate in front of the Serve ingress: the Host rule, the API key, and every request's budget
(concurrency, bytes held, body size and time), applied before any route parses a byte.

Pure ASGI, so it is tested in-process on any ASGI app; the ingress installs it as middleware and
puts its rules (`access_rules`) and `ServeLimits` on the app's state.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from fastapi.responses import JSONResponse

from redline.cluster import access
from redline.cluster.protocol import error_body
from redline.serve.config import ServeConfig, ServeLimits

PUBLIC_PATHS = {"/healthz"}  # exact paths below the route prefix; /docs and /openapi.json need the key too


class Guard:
    """Pure ASGI middleware, before any route, with every request's budget:

    1. the Host rule (a DNS-rebinding page names its own domain: 421);
    2. the API key on every path but /healthz (matched exactly, below the route prefix);
    3. at most `max_concurrent_requests` requests at once in this replica and at most
       `max_inflight_bytes` of request bodies held: beyond either, 503 with Retry-After at once, so a
       flood is refused in microseconds instead of queueing (and /healthz, outside the budget, stays
       fast);
    4. the body size, enforced while the body streams in (a false Content-Length or a chunked upload
       gets no byte past the limit read), and the whole body within `body_timeout_s` (a slow client
       is cut off with 408, not waited on).
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.active = 0
        self.held_bytes = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        app = scope.get("app")  # the FastAPI app this replica serves (Starlette sets it before middleware)
        state = getattr(app, "state", None)
        limits: ServeLimits | None = getattr(state, "limits", None)
        if scope["type"] != "http" or limits is None:
            await self.app(scope, receive, send)
            return
        path, root = scope.get("path", ""), scope.get("root_path", "")
        relative = path[len(root):] if root and path.startswith(root) else path
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        hosts: access.HostRule = state.hosts
        if not hosts.allows(headers.get("host")):
            await _reply(scope, receive, send, 421, hosts.refusal(headers.get("host")), code="misdirected_request")
            return
        if relative in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        keys: access.KeyCheck = state.keys
        if keys.required and not keys.matches(access.given_key(headers)):
            await _reply(scope, receive, send, 401, "missing or invalid API key (send `Authorization: Bearer <key>`)",
                         "authentication_error", "invalid_api_key")
            return
        limit = limits.max_request_bytes
        length = headers.get("content-length", "")
        declared = int(length) if length.isdigit() and len(length) < 20 else None
        if declared is not None and declared > limit:
            await _reply(scope, receive, send, 413, f"request body of {length} bytes exceeds the limit of {limit}",
                         code="request_too_large")
            return
        if self.active >= limits.max_concurrent_requests:
            await _busy(scope, receive, send, f"{self.active} requests are in progress (the limit is "
                                               f"{limits.max_concurrent_requests})")
            return
        claimed = min(declared if declared is not None else limit, limit)
        if self.held_bytes + claimed > limits.max_inflight_bytes:
            await _busy(scope, receive, send, f"request bodies in progress hold {self.held_bytes:,} bytes (the limit "
                                               f"is {limits.max_inflight_bytes:,})")
            return
        self.active += 1
        self.held_bytes += claimed
        try:
            try:
                body = await asyncio.wait_for(_read_body(receive, limit), timeout=limits.body_timeout_s)
            except asyncio.TimeoutError:
                await _reply(scope, receive, send, 408, f"the request body did not arrive within "
                                                        f"{limits.body_timeout_s:g}s", code="request_timeout")
                return
            except _TooLarge:
                await _reply(scope, receive, send, 413, f"request body exceeds the limit of {limit} bytes",
                             code="request_too_large")
                return
            if body is None:
                return  # the client went away
            repeated = repeated_key(body)
            if repeated:
                await _reply(scope, receive, send, 400, f"the request body names {repeated!r} twice; name each field "
                                                        "once", code="duplicate_field")
                return
            delivered = False

            async def replay() -> dict[str, Any]:
                nonlocal delivered
                if not delivered:
                    delivered = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            await self.app(scope, replay, send)
        finally:
            self.active -= 1
            self.held_bytes -= claimed


class _TooLarge(Exception):
    pass


class _Repeated(Exception):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Repeated(key[:80])
        out[key] = value
    return out


def repeated_key(body: bytes) -> str | None:
    """A key that a JSON object of the body names twice (json keeps the last one silently, so a
    request could say one thing to a proxy that checks the first and another to the model), else
    None; a body that is not JSON is left to the route, which refuses it."""
    import json

    if not body.lstrip()[:1] in (b"{", b"["):
        return None
    try:
        json.loads(body, object_pairs_hook=_unique_pairs)
    except _Repeated as err:
        return str(err)
    except (ValueError, RecursionError):
        return None
    return None


async def _read_body(receive: Any, limit: int) -> bytes | None:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _reply(scope: dict[str, Any], receive: Any, send: Any, status: int, message: str,
                 kind: str = "invalid_request_error", code: str | None = None) -> None:
    await JSONResponse(error_body(message, kind, code), status_code=status)(scope, receive, send)


async def _busy(scope: dict[str, Any], receive: Any, send: Any, why: str) -> None:
    body = error_body(f"the server is at capacity: {why}; retry shortly", "service_unavailable", "overloaded")
    await JSONResponse(body, status_code=503, headers={"Retry-After": "1"})(scope, receive, send)



def access_rules(config: ServeConfig, api_key_sha256: str | None = None,
                 key_from_driver: bool = False) -> tuple[access.KeyCheck, access.HostRule]:
    """The key and Host rules of an ingress, however the app was started (`redline serve`, a `serve
    deploy` file, the dashboard): the key from the driver (its SHA-256) or, unless the driver's word
    is final (`key_from_driver`), from this replica's environment; a non-loopback host without one is
    refused unless the config says insecure."""
    env_key = os.environ.get(config.api_key_env) if config.api_key_env and not key_from_driver else None
    keys = access.KeyCheck.from_sha256(api_key_sha256) if api_key_sha256 else access.KeyCheck(env_key)
    access.check_exposure(config.host, keys.required, config.insecure,
                          f"${config.api_key_env}" if config.api_key_env else "api_key_env", "serve")
    return keys, access.HostRule(config.host, config.allowed_hosts)
