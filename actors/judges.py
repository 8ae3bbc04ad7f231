"""LLM judges: ask a chat model whether a text is toxic, robustly and cheaply.

A judge fills a few-shot prompt template (the TaeBench paper's passage/question Yes/No/Unsure format
by default, with demonstrations written for this project) and asks any provider (an OpenAI-compatible
API, redline's own Serve app, AWS Bedrock, a local Hugging Face model) through a `ChatClient`:
requests in flight under one rate limit, retries with back-off never sooner than `Retry-After`, a
cache of every answer that parsed, token and cost accounting. A text whose request failed gets the
verdict `error` with its cause (never a Yes/No/Unsure it did not say); a request the endpoint refuses
outright (auth, unknown model) stops the run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar

import numpy as np
import pyarrow as pa
from pydantic import ConfigDict

from redline.actors.providers import ChatModel, Failed, Refused, SamplingParams
from redline.cluster.artifacts import local_path
from redline.cluster.config import ActorPoolSize, Execution, Input, Result
from redline.errors import RedlineError

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


class ChatJudgeOptions(ChatModel):
    """How to ask a chat model about a text (judges and LLM-based detectors)."""

    what: ClassVar[str] = "judge"
    timeout_s: float = Execution(30.0, gt=0, description="Remote providers: seconds one request may take.")
    max_retries: int = Execution(4, ge=0, description="Retries on 429, 5xx, timeouts and connection errors.")

    template: str | None = Result(None, description="Prompt with a {text} placeholder; default: the kind's own.")
    template_file: str | None = Input(None, description="Read the template from this file instead.")
    system_prompt: str | None = Result(None)
    max_tokens: int = Result(8, gt=0)
    temperature: float = Result(0.0, ge=0)
    cache_dir: str | None = Execution("auto", description="Answer cache (SQLite) directory; auto: this user's cache "
                                                      "($REDLINE_CACHE or ~/.cache/redline)/judge; null turns it off.")
    price_per_1k_prompt_tokens: float = Result(0.0, ge=0)
    price_per_1k_completion_tokens: float = Result(0.0, ge=0)

    def prompt_template(self, default: str) -> str:
        if self.template_file:
            path = Path(local_path(self.template_file)).expanduser()
            if not path.is_file():
                raise RedlineError(f"template_file not found: {path}")
            return path.read_text(encoding="utf-8")
        return self.template or default


class JudgeConfig(ChatJudgeOptions, ActorPoolSize):
    """The TaeBench label filter's LLM judge (default template: the paper's 5-shot Yes/No/Unsure format)."""

    model_config = ConfigDict(extra="allow")  # the provider's own settings (ActorPoolSize alone forbids extras)

    name: str = Result("llm-judge")
    num_cpus: float = Execution(0.25, ge=0)
    num_gpus: float = Execution(0.0, ge=0, description="provider hf: the GPU the local model runs on.")
    batch_size: int = Execution(64, gt=0)


@dataclass
class Judgement:
    verdict: str  # yes | no | unsure (the model's own answer) | unparseable | error (no answer: the call failed)
    reason: str | None
    answer: str | None
    cached: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retries: int = 0


Parser = Callable[[str], tuple[str, str | None]]


class LLMJudge:
    """Asks a chat model about texts with `template` and reads its answer with `parse`."""

    def __init__(self, config: ChatJudgeOptions, default_template: str = DEFAULT_TEMPLATE,
                 parse: Parser = parse_answer, num_gpus: float = 0.0) -> None:
        self.config = config
        self.parse = parse
        self.template = config.prompt_template(default_template)
        if "{text}" not in self.template:
            raise RedlineError("judge template needs a {text} placeholder")
        self.client = config.client(config.build_provider(num_gpus), cache_dir=config.cache_dir)
        self.params = SamplingParams(n=1, temperature=config.temperature, top_p=1.0, max_tokens=config.max_tokens)

    def prompt(self, text: str) -> str:
        return self.template.replace("{text}", text)

    def messages(self, text: str) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.config.system_prompt}] if self.config.system_prompt else []
        return [*system, {"role": "user", "content": self.prompt(text)}]

    def judge(self, texts: list[str]) -> list[Judgement]:
        try:
            answers = self.client.ask_many([self.messages(t) for t in texts], self.params,
                                           usable=lambda a: self.parse(a)[0] in USABLE)
        except Refused as err:
            raise RedlineError(f"judge endpoint {err}") from None
        out = []
        for a in answers:
            if isinstance(a, Failed):
                out.append(Judgement(ERROR, f"judge request failed after {a.retries} retries: {a.cause}", None,
                                     retries=a.retries))
                continue
            first = a.result.completions[0] if a.result.completions else None
            text = first.text if first else ""
            verdict, reason = self.parse(text)
            tokens = (a.result.prompt_tokens, first.tokens if first else 0) if not a.cached else (0, 0)
            out.append(Judgement(verdict, reason, text, cached=a.cached, prompt_tokens=tokens[0],
                                 completion_tokens=tokens[1], retries=a.retries))
        return out


JUDGE_SCHEMA = pa.schema([
    pa.field("id", pa.string()), pa.field("judge_verdict", pa.string()), pa.field("judge_reason", pa.string()),
    pa.field("judge_answer", pa.string()), pa.field("judge_cached", pa.bool_()),
    pa.field("judge_prompt_tokens", pa.int64()), pa.field("judge_completion_tokens", pa.int64()),
    pa.field("judge_retries", pa.int64()),
])


class JudgeWorker:
    """A batch worker (an actor of the pipelines' pools): one judge (client, rate limiter, cache) per
    actor; a batch in, verdicts out."""

    input_columns: ClassVar[list[str]] = ["id", "text"]
    output_schema: ClassVar[pa.Schema] = JUDGE_SCHEMA

    def __init__(self, config: JudgeConfig) -> None:
        self.judge = LLMJudge(config, num_gpus=config.num_gpus)

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


def usage_summary(sums: dict[str, Any], config: JudgeConfig) -> dict[str, Any]:
    """Token, request and cost accounting (for the manifest) from the judged texts' sums: `texts`,
    `cache_hits`, `retries`, `prompt_tokens`, `completion_tokens` and `by_verdict` (answers counted
    per verdict)."""
    pt, ct, verdicts = sums["prompt_tokens"], sums["completion_tokens"], sums["by_verdict"]
    return {
        "texts": sums["texts"], "cache_hits": sums["cache_hits"], "requests": sums["texts"] - sums["cache_hits"],
        "retries": sums["retries"], "failed_requests": verdicts.get(ERROR, 0),
        "unparseable": verdicts.get(UNPARSEABLE, 0), "prompt_tokens": pt, "completion_tokens": ct,
        "cost": round(pt / 1000 * config.price_per_1k_prompt_tokens + ct / 1000 * config.price_per_1k_completion_tokens, 6),
        "by_verdict": dict(sorted(verdicts.items())),
    }
