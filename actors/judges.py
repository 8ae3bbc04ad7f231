"""LLM judges: ask an OpenAI-compatible chat model whether a text is toxic, robustly and cheaply.

A judge fills a few-shot prompt template (the TaeBench paper's passage/question Yes/No/Unsure format
by default, with demonstrations written for this project), sends requests concurrently under a
shared rate limit, retries 429/5xx/timeouts with exponential backoff (never before Retry-After),
caches every answer that parsed by (endpoint, model, prompt, settings) so a rerun costs nothing, and
counts tokens and cost. A text whose request failed gets the verdict `error` with its cause (never a
Yes/No/Unsure it did not say); a request the endpoint refuses outright (auth, unknown model) stops the run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
from redline.actors.hf_loading import first_line
from redline.cluster.config import ChatJudgeOptions, JudgeConfig
from redline.cluster.net import RateLimiter, check_key_transport, retry_after_s
from redline.cluster.storage import user_cache_dir
from redline.errors import RedlineError

log = logging.getLogger(__name__)

YES, NO, UNSURE = "yes", "no", "unsure"

# The paper's 5-shot passage/question format; the demonstrations are our own texts.
DEFAULT_TEMPLATE = """Answer the question about the passage with Yes, No or Unsure.

Passage: you are a worthless idiot and everyone hates you
Question: Is the passage toxic (rude, disrespectful, hateful or abusive)?
Answer: Yes

Passage: thanks so much for helping me move the couch yesterday
Question: Is the passage toxic (rude, disrespectful, hateful or abusive)?
Answer: No

Passage: shut your stupid mouth, nobody asked you
Question: Is the passage toxic (rude, disrespectful, hateful or abusive)?
Answer: Yes

Passage: the meeting moved to thursday at three
Question: Is the passage toxic (rude, disrespectful, hateful or abusive)?
Answer: No

Passage: that referee call was a joke, what a clown show
Question: Is the passage toxic (rude, disrespectful, hateful or abusive)?
Answer: Unsure

Passage: {text}
Question: Is the passage toxic (rude, disrespectful, hateful or abusive)?
Answer:"""

_ANSWER = re.compile(r"\b(yes|no|unsure|not sure|uncertain)\b", re.IGNORECASE)

UNPARSEABLE, ERROR = "unparseable", "error"
USABLE = (YES, NO, UNSURE)  # verdicts a model actually gave; only these are cached


def parse_answer(answer: str) -> tuple[str, str | None]:
    """The first Yes/No/Unsure word of an answer -> (verdict, reason unless yes/no)."""
    m = _ANSWER.search(answer or "")
    if m is None:
        shown = " ".join((answer or "").split())[:80]
        return UNPARSEABLE, f"unparseable answer: {shown!r}" if shown else "empty answer"
    word = m.group(1).lower()
    if word == YES:
        return YES, None
    if word == NO:
        return NO, None
    return UNSURE, "the judge answered unsure"


class AnswerCache:
    """(key -> answer, tokens) in SQLite, shared by every process of this user on the machine (WAL
    mode). Only answers that parsed into a verdict are stored: a garbled answer is asked again."""

    def __init__(self, directory: str | None) -> None:
        self.path = None if directory is None else resolve_cache_dir(directory) / "answers.sqlite"
        self.local = threading.local()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
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


@dataclass
class Judgement:
    verdict: str  # yes | no | unsure (the model's own answer) | unparseable | error (no answer: the call failed)
    reason: str | None
    answer: str | None
    cached: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retries: int = 0


RETRYABLE_STATUS = {408, 409, 429, 500, 502, 503, 504}


class CallFailed(Exception):
    """A request that still failed after its retries (the cause is worth retrying later)."""

    def __init__(self, cause: str, retries: int) -> None:
        super().__init__(cause)
        self.cause, self.retries = cause, retries


Parser = Callable[[str], tuple[str, str | None]]


class LLMJudge:
    """Asks a chat model about texts with `template` and reads its answer with `parse`.

    Retryable failures (429, 5xx, timeouts, connection errors, bodies that are not a chat completion)
    are retried with exponential back-off shared by all threads, never sooner than `Retry-After`; a
    text whose retries run out gets the verdict `error` with the cause. Answers that say the request
    itself is wrong (400, 401, 403, 404, 422) stop the run at once: retrying cannot fix them."""

    def __init__(self, config: ChatJudgeOptions, default_template: str = DEFAULT_TEMPLATE,
                 parse: Parser = parse_answer) -> None:
        from openai import OpenAI

        self.config = config
        self.parse = parse
        self.template = config.prompt_template(default_template)
        if "{text}" not in self.template:
            raise RedlineError("judge template needs a {text} placeholder")
        key = os.environ.get(config.api_key_env or "", "")
        check_key_transport(config.base_url, bool(key), config.allow_insecure_http, f"judge at {config.base_url}")
        # Retries are ours: they share the rate limiter and are counted.
        self.client = OpenAI(base_url=config.base_url, api_key=key or "not-needed", timeout=config.timeout_s,
                             max_retries=0)
        self.limiter = RateLimiter(config.requests_per_second)
        self.cache = AnswerCache(config.cache_dir)

    def prompt(self, text: str) -> str:
        return self.template.replace("{text}", text)

    def _key(self, prompt: str) -> str:
        c = self.config
        raw = json.dumps([c.base_url, c.model, c.system_prompt, prompt, c.max_tokens, c.temperature])
        return hashlib.sha256(raw.encode()).hexdigest()

    def _ask(self, prompt: str) -> tuple[str, int, int, int]:
        """(answer, prompt tokens, completion tokens, retries made); CallFailed after the last retry."""
        import openai

        messages = ([{"role": "system", "content": self.config.system_prompt}] if self.config.system_prompt else [])
        messages.append({"role": "user", "content": prompt})
        cause = "no attempt made"
        for attempt in range(self.config.max_retries + 1):
            self.limiter.acquire()
            wait: float | None = None
            try:
                resp = self.client.chat.completions.create(model=self.config.model, messages=messages,
                                                           max_tokens=self.config.max_tokens,
                                                           temperature=self.config.temperature)
            except (openai.APIConnectionError, openai.APITimeoutError) as err:
                cause = f"{type(err).__name__}: {first_line(err)}"
            except openai.APIStatusError as err:
                if err.status_code not in RETRYABLE_STATUS:
                    raise RedlineError(f"judge endpoint {self.config.base_url} answered HTTP {err.status_code} "
                                       f"({_api_message(err)}); fix the judge settings (model, key, base_url)") from None
                cause, wait = f"HTTP {err.status_code}", retry_after_s(err.response.headers if err.response else None)
            except openai.APIError as err:  # a body that is not a chat completion (HTML, invalid JSON)
                cause = f"unreadable response ({first_line(err)})"
            else:
                choices = getattr(resp, "choices", None)
                if not isinstance(choices, list):
                    cause = "the response is not a chat completion (not JSON?)"
                elif not choices:
                    cause = "the response has no choices"
                else:
                    usage = getattr(resp, "usage", None)
                    return (choices[0].message.content or "", usage.prompt_tokens if usage else 0,
                            usage.completion_tokens if usage else 0, attempt)
            if attempt < self.config.max_retries:
                backoff = self.config.backoff_s * 2 ** attempt * (0.5 + random.random())
                self.limiter.pause(max(backoff, wait or 0.0))  # every thread backs off, never before Retry-After
        raise CallFailed(cause, self.config.max_retries)

    def judge_one(self, text: str) -> Judgement:
        prompt = self.prompt(text)
        key = self._key(prompt)
        hit = self.cache.get(key)
        if hit is not None:
            verdict, reason = self.parse(hit[0])
            if verdict in USABLE:
                return Judgement(verdict, reason, hit[0], cached=True)
        try:
            answer, pt, ct, retries = self._ask(prompt)
        except CallFailed as failed:
            return Judgement(ERROR, f"judge request failed after {failed.retries} retries: {failed.cause}", None,
                             retries=failed.retries)
        verdict, reason = self.parse(answer)
        if verdict in USABLE:
            self.cache.put(key, answer, pt, ct)
        return Judgement(verdict, reason, answer, prompt_tokens=pt, completion_tokens=ct, retries=retries)

    def judge(self, texts: list[str]) -> list[Judgement]:
        if not texts:
            return []
        with ThreadPoolExecutor(max_workers=min(self.config.concurrency, len(texts))) as pool:
            return list(pool.map(self.judge_one, texts))


def _api_message(err: Any) -> str:
    body = getattr(err, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return " ".join(str(inner["message"]).split())[:200]
    return first_line(err)[:200]


JUDGE_SCHEMA = pa.schema([
    pa.field("id", pa.string()), pa.field("judge_verdict", pa.string()), pa.field("judge_reason", pa.string()),
    pa.field("judge_answer", pa.string()), pa.field("judge_cached", pa.bool_()),
    pa.field("judge_prompt_tokens", pa.int64()), pa.field("judge_completion_tokens", pa.int64()),
    pa.field("judge_retries", pa.int64()),
])


class JudgeWorker:
    """Ray Data actor: one judge (client, rate limiter, cache) per actor; a batch in, verdicts out."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.judge = LLMJudge(JudgeConfig.model_validate(config))

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        results = self.judge.judge([str(t) for t in batch["text"]])
        return pa.table({
            "id": pa.array(batch["id"].tolist(), pa.string()),
            "judge_verdict": [r.verdict for r in results], "judge_reason": [r.reason for r in results],
            "judge_answer": [r.answer for r in results], "judge_cached": [r.cached for r in results],
            "judge_prompt_tokens": [r.prompt_tokens for r in results],
            "judge_completion_tokens": [r.completion_tokens for r in results],
            "judge_retries": [r.retries for r in results],
        }, schema=JUDGE_SCHEMA)


def usage_summary(table: pa.Table, config: JudgeConfig) -> dict[str, Any]:
    """Token, request and cost accounting of a judged table (for the manifest)."""
    cached = table.column("judge_cached").to_pylist()
    pt = sum(table.column("judge_prompt_tokens").to_pylist())
    ct = sum(table.column("judge_completion_tokens").to_pylist())
    verdicts = table.column("judge_verdict").to_pylist()
    reasons = table.column("judge_reason").to_pylist()
    return {
        "texts": table.num_rows, "cache_hits": sum(cached), "requests": table.num_rows - sum(cached),
        "retries": sum(table.column("judge_retries").to_pylist()),
        "failed_requests": verdicts.count(ERROR), "unparseable": verdicts.count(UNPARSEABLE),
        "prompt_tokens": pt, "completion_tokens": ct,
        "cost": round(pt / 1000 * config.price_per_1k_prompt_tokens + ct / 1000 * config.price_per_1k_completion_tokens, 6),
        "by_verdict": {v: verdicts.count(v) for v in sorted(set(verdicts))},
    }
