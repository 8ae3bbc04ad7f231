"""What wraps every provider: requests in flight under one rate limit, retries with exponential
back-off shared by all threads and never sooner than `Retry-After`, an answer cache, and token and
cost accounting. A request that still fails after its retries comes back as a `Failed` with its
cause, never as an answer; a refusal (`Refused`) stops the caller at once; an endpoint that cannot
be reached at all is a one-line RedlineError."""

from __future__ import annotations

import hashlib
import json
import random
import sqlite3
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from redline.actors.providers.base import (
    ChatProvider,
    Messages,
    PromptResult,
    SamplingParams,
    Transient,
)
from redline.cluster.net import DEFAULT_MAX_RETRY_AFTER_S, Backoff, RateLimiter
from redline.cluster.storage import private_dir, user_cache_dir
from redline.errors import RedlineError

FAILED_IN_ROW = 10  # requests that failed after all their retries, with no success between them


@dataclass
class Answer:
    result: PromptResult
    retries: int = 0
    cached: bool = False


@dataclass
class Failed:
    cause: str
    retries: int


class AnswerCache:
    """(key -> answer text, tokens) in SQLite, shared by every process of this user on the machine
    (WAL mode). Callers store only answers they could use: a garbled answer is asked again."""

    def __init__(self, directory: str | None) -> None:
        self.path = None if directory is None else resolve_cache_dir(directory) / "answers.sqlite"
        self.local = threading.local()
        if self.path is not None:
            folder = self.path.parent
            folder.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            if directory == "auto":
                private_dir(folder.parent, "answer cache")
            private_dir(folder, "answer cache")
            if self.path.is_symlink():
                raise RedlineError(f"refusing the answer cache {self.path}: it is a symbolic link (remove it)")
            with self._conn() as c:
                c.execute("PRAGMA journal_mode=WAL")
                c.execute("CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, answer TEXT, "
                          "prompt_tokens INTEGER, completion_tokens INTEGER)")

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30)
            self.local.conn = conn
        return conn

    def get(self, key: str) -> tuple[str, int, int] | None:
        if self.path is None:
            return None
        row = self._conn().execute("SELECT answer, prompt_tokens, completion_tokens FROM answers WHERE key=?",
                                   (key,)).fetchone()
        return None if row is None else (row[0], row[1], row[2])

    def put(self, key: str, answer: str, prompt_tokens: int, completion_tokens: int) -> None:
        if self.path is None:
            return
        with self._conn() as c:
            c.execute("INSERT OR REPLACE INTO answers VALUES (?, ?, ?, ?)", (key, answer, prompt_tokens, completion_tokens))


def resolve_cache_dir(directory: str) -> Path:
    """`auto`: the user's own cache ($REDLINE_CACHE, else $XDG_CACHE_HOME/redline, else ~/.cache/redline) / judge."""
    return user_cache_dir() / "judge" if directory == "auto" else Path(directory).expanduser()


class ChatClient:
    def __init__(self, provider: ChatProvider, *, requests_per_second: float = 20.0, max_retries: int = 4,
                 backoff_s: float = 0.5, concurrency: int = 8, cache_dir: str | None = None,
                 max_retry_after_s: float = DEFAULT_MAX_RETRY_AFTER_S, max_failed_in_row: int = FAILED_IN_ROW) -> None:
        self.provider = provider
        self.max_retries, self.backoff_s, self.concurrency = max_retries, backoff_s, concurrency
        self.limiter = RateLimiter(requests_per_second)
        self.waits = Backoff(provider.endpoint, max_retry_after_s)
        self.failed_in_row, self.max_failed_in_row, self.lock = 0, max_failed_in_row, threading.Lock()
        self.cache = AnswerCache(cache_dir)

    def key(self, messages: Messages, params: SamplingParams) -> str:
        p = self.provider
        # The server a provider names by its base_url is part of the key (a cache made before keeps its hits).
        raw = json.dumps([p.name, getattr(p.options, "base_url", None), p.config.model, messages,
                          params.model_dump(mode="json")])
        return hashlib.sha256(raw.encode()).hexdigest()

    def ask(self, messages: Messages, params: SamplingParams,
            usable: Callable[[str], bool] | None = None) -> Answer | Failed:
        """One conversation. With `usable`, single answers are cached once `usable(text)` says so."""
        key = self.key(messages, params) if usable is not None else None
        if key is not None:
            hit = self.cache.get(key)
            if hit is not None and usable(hit[0]):  # type: ignore[misc]
                from redline.actors.providers.base import Completion

                return Answer(PromptResult(hit[1], [Completion(hit[0], "stop", hit[2])]), cached=True)
        cause = "no attempt made"
        for attempt in range(self.max_retries + 1):
            self.limiter.acquire()
            try:
                result = self.provider.chat_one(messages, params)
            except Transient as err:
                if err.unreachable and attempt == self.max_retries:
                    raise RedlineError(f"cannot reach {self.provider.endpoint} after {attempt} retries "
                                       f"({err.cause})") from None
                cause = err.cause
                if attempt < self.max_retries:
                    backoff = self.backoff_s * 2 ** attempt * (0.5 + random.random())
                    asked = f"{err.cause}, Retry-After {err.retry_after:g} s" if err.retry_after else err.cause
                    # every thread backs off, never longer than the cap at a time
                    self.limiter.pause(self.waits.seconds(max(backoff, err.retry_after or 0.0), asked))
                continue
            text = result.completions[0].text if result.completions else None
            usable_answer = text is not None and (usable is None or usable(text))
            if key is not None and usable_answer:
                first = result.completions[0]
                self.cache.put(key, first.text, result.prompt_tokens, first.tokens)
            # an answer the caller cannot use counts as a failure: a service that only says nonsense is down
            self._count(usable_answer, f"an answer it could not use ({' '.join((text or '').split())[:60]!r})")
            return Answer(result, retries=attempt)
        self._count(False, f"{cause}, after {self.max_retries} retries")
        return Failed(cause, self.max_retries)

    def _count(self, usable: bool, cause: str) -> None:
        """One more answer: a usable one resets the count of failures in a row; `max_failed_in_row`
        unusable ones in a row (whatever made them unusable) stop the caller with one line."""
        with self.lock:
            self.failed_in_row = 0 if usable else self.failed_in_row + 1
            failed = self.failed_in_row
        if failed >= self.max_failed_in_row:  # the service is not answering anyone: stop, do not grind through every row
            raise RedlineError(f"{self.provider.endpoint} failed {failed} requests in a row (last: {cause}); check the "
                               "service and rerun to resume")

    def ask_many(self, conversations: Sequence[Messages], params: SamplingParams,
                 usable: Callable[[str], bool] | None = None) -> list[Answer | Failed]:
        if not conversations:
            return []
        if not self.provider.remote:  # a local model: one batched call, no threads, no retries
            return [Answer(r) for r in self.provider.chat(list(conversations), params)]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(conversations))) as pool:
            return list(pool.map(lambda m: self.ask(m, params, usable), conversations))
