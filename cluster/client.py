"""A small Python client for a redline server (`redline serve`): detection, moderation, health.

    from redline.cluster.client import RedlineClient
    client = RedlineClient("http://127.0.0.1:8000")          # key from $REDLINE_API_KEY when set
    client.detect(["you are an idiot"], detectors=["profanity-check"])

Generation uses the official `openai` client against `<url>/v1`. Every failure raises RedlineError
with one line naming the server and the problem.
"""

from __future__ import annotations

import os
import time
from typing import Any

import httpx

from redline.cluster.net import check_key_transport
from redline.cluster.protocol import DetectorInfo, DetectResponse
from redline.errors import RedlineError

DETECT_PATH = "/v1/detect"


def base_url(url: str) -> str:
    """The server root for a URL given as the root, `.../v1` or `.../v1/detect`."""
    if not url.startswith(("http://", "https://")):
        raise RedlineError(f"not an http(s) URL: {url!r}")
    url = url.rstrip("/")
    for suffix in (DETECT_PATH, "/v1/moderations", "/v1"):
        if url.endswith(suffix):
            return url[: -len(suffix)]
    return url


class RedlineClient:
    def __init__(self, url: str, api_key: str | None = None, *, api_key_env: str = "REDLINE_API_KEY",
                 timeout: float = 60.0, retries: int = 2, allow_insecure_http: bool = False) -> None:
        self.url = base_url(url)
        key = api_key if api_key is not None else os.environ.get(api_key_env)
        check_key_transport(self.url, bool(key), allow_insecure_http, f"redline server {self.url}")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.retries = retries
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "RedlineClient":
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        """One call; connection failures and 503s (a replica being replaced) are retried with backoff."""
        for attempt in range(self.retries + 1):
            try:
                resp = self._http.request(method, path, **kwargs)
            except httpx.TransportError as err:
                if attempt < self.retries:
                    time.sleep(0.5 * 2**attempt)
                    continue
                raise RedlineError(f"cannot reach redline server at {self.url} ({type(err).__name__}: {err})") from None
            if resp.status_code == 503 and attempt < self.retries:
                time.sleep(0.5 * 2**attempt)
                continue
            if resp.status_code >= 400:
                raise RedlineError(f"{self.url}{path} answered {resp.status_code}: {_message(resp)}")
            return resp.json()
        raise AssertionError("unreachable")

    def health(self) -> dict[str, Any]:
        return self._request("GET", "/healthz")

    def detectors(self) -> list[DetectorInfo]:
        return [DetectorInfo.model_validate(d) for d in self._request("GET", "/v1/detectors")["data"]]

    def detect(self, texts: list[str], detectors: list[str] | None = None) -> DetectResponse:
        body: dict[str, Any] = {"texts": list(texts)}
        if detectors:
            body["detectors"] = list(detectors)
        return DetectResponse.model_validate(self._request("POST", DETECT_PATH, json=body))


def _message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:200] or resp.reason_phrase
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict) and err.get("message"):
        return str(err["message"])
    return str(body)[:200]
