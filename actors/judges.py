"""LLM judges: ask an OpenAI-compatible chat model whether a text is toxic, robustly and cheaply.

A judge fills a few-shot prompt template (the TaeBench paper's passage/question Yes/No/Unsure format
by default, with demonstrations written for this project), sends requests concurrently under a
shared rate limit, retries 429/5xx/timeouts with exponential backoff (honouring Retry-After), caches
every answer by (model, prompt, settings) so a rerun costs nothing, and counts tokens and cost.
Whatever goes wrong with one text — an unparseable answer, retries exhausted — gives that text the
verdict `unsure` with a reason; it never sinks the batch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
from redline.cluster.config import ChatJudgeOptions, JudgeConfig
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


def parse_answer(answer: str) -> tuple[str, str | None]:
    """The first Yes/No/Unsure word of an answer -> (verdict, reason when unsure)."""
    m = _ANSWER.search(answer or "")
    if m is None:
        shown = " ".join((answer or "").split())[:80]
        return UNSURE, f"unparseable answer: {shown!r}" if shown else "empty answer"
    word = m.group(1).lower()
    if word == YES:
        return YES, None
    if word == NO:
        return NO, None
    return UNSURE, "the judge answered unsure"


class RateLimiter:
    """At most `rate` acquisitions per second across threads (evenly spaced)."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate
        self.next_at = time.monotonic()
        self.lock = threading.Lock()

    def acquire(self) -> None:
        with self.lock:
            now = time.monotonic()
            wait = self.next_at - now
            self.next_at = max(now, self.next_at) + self.interval
        if wait > 0:
            time.sleep(wait)


class AnswerCache:
    """(key -> answer, tokens) in SQLite, shared by every process on the machine (WAL mode)."""

    def __init__(self, directory: str | None) -> None:
        self.path = None if directory is None else Path(directory).expanduser() / "answers.sqlite"
        self.local = threading.local()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
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


@dataclass
class Judgement:
    verdict: str
    reason: str | None
    answer: str | None
    cached: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retries: int = 0


RETRYABLE_STATUS = {408, 409, 429, 500, 502, 503, 504}


Parser = Callable[[str], tuple[str, str | None]]


class LLMJudge:
    """Asks a chat model about texts with `template` and reads its answer with `parse`."""

    def __init__(self, config: ChatJudgeOptions, default_template: str = DEFAULT_TEMPLATE,
                 parse: Parser = parse_answer) -> None:
        from openai import OpenAI

        self.config = config
        self.parse = parse
        self.template = config.prompt_template(default_template)
        if "{text}" not in self.template:
            raise RedlineError("judge template needs a {text} placeholder")
        key = os.environ.get(config.api_key_env or "", "") or "not-needed"
        # Retries are ours: they share the rate limiter and are counted.
        self.client = OpenAI(base_url=config.base_url, api_key=key, timeout=config.timeout_s, max_retries=0)
        self.limiter = RateLimiter(config.requests_per_second)
        self.cache = AnswerCache(config.cache_dir)

    def prompt(self, text: str) -> str:
        return self.template.replace("{text}", text)

    def _key(self, prompt: str) -> str:
        c = self.config
        raw = json.dumps([c.base_url, c.model, c.system_prompt, prompt, c.max_tokens, c.temperature])
        return hashlib.sha256(raw.encode()).hexdigest()

    def _ask(self, prompt: str) -> tuple[str, int, int, int]:
        """(answer, prompt tokens, completion tokens, retries); raises after the last retry."""
        import openai

        messages = ([{"role": "system", "content": self.config.system_prompt}] if self.config.system_prompt else [])
        messages.append({"role": "user", "content": prompt})
        delay = self.config.backoff_s
        for attempt in range(self.config.max_retries + 1):
            self.limiter.acquire()
            try:
                resp = self.client.chat.completions.create(model=self.config.model, messages=messages,
                                                           max_tokens=self.config.max_tokens,
                                                           temperature=self.config.temperature)
                usage = resp.usage
                return (resp.choices[0].message.content or "", usage.prompt_tokens if usage else 0,
                        usage.completion_tokens if usage else 0, attempt)
            except (openai.APIConnectionError, openai.APITimeoutError) as err:
                last: Exception = err
            except openai.APIStatusError as err:
                if err.status_code not in RETRYABLE_STATUS:
                    raise
                last = err
                after = err.response.headers.get("retry-after") if err.response is not None else None
                if after and after.replace(".", "", 1).isdigit():
                    delay = max(delay, min(float(after), 60.0))
            if attempt < self.config.max_retries:
                time.sleep(delay * (0.5 + np.random.random()))
                delay *= 2
        raise last

    def judge_one(self, text: str) -> Judgement:
        prompt = self.prompt(text)
        key = self._key(prompt)
        hit = self.cache.get(key)
        if hit is not None:
            verdict, reason = self.parse(hit[0])
            return Judgement(verdict, reason, hit[0], cached=True)
        try:
            answer, pt, ct, retries = self._ask(prompt)
        except Exception as err:  # noqa: BLE001 - one text's failure is that text's `unsure`
            status = getattr(err, "status_code", None)
            what = f"HTTP {status}" if status else type(err).__name__
            return Judgement(UNSURE, f"judge request failed ({what}) after {self.config.max_retries} retries",
                             None, retries=self.config.max_retries)
        self.cache.put(key, answer, pt, ct)
        verdict, reason = self.parse(answer)
        return Judgement(verdict, reason, answer, prompt_tokens=pt, completion_tokens=ct, retries=retries)

    def judge(self, texts: list[str]) -> list[Judgement]:
        if not texts:
            return []
        with ThreadPoolExecutor(max_workers=min(self.config.concurrency, len(texts))) as pool:
            return list(pool.map(self.judge_one, texts))


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
        "failed_requests": sum(1 for r in reasons if r and r.startswith("judge request failed")),
        "prompt_tokens": pt, "completion_tokens": ct,
        "cost": round(pt / 1000 * config.price_per_1k_prompt_tokens + ct / 1000 * config.price_per_1k_completion_tokens, 6),
        "by_verdict": {v: verdicts.count(v) for v in sorted(set(verdicts))},
    }
