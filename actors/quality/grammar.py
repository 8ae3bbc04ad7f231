"""Grammar check through a LanguageTool HTTP server (`/v2/check`), as the TaeBench paper filters.

An adversarial example is rejected when it has more grammar errors than its seed by over
`max_new_errors`, counting only matches whose rule category is one of `categories` (LanguageTool's
GRAMMAR category holds agreement, plurality and similar rules). Run a server with
`docker run -p 8010:8010 erikvl87/languagetool` or LanguageTool's own `HTTPServer` class.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import httpx
import numpy as np
import pyarrow as pa

from redline.cluster.config import ActorPoolSize, Execution, Result
from redline.errors import RedlineError


class GrammarConfig(ActorPoolSize):
    url: str | None = Result(None, description="LanguageTool server root, e.g. http://127.0.0.1:8010.")
    language: str = Result("en-US")
    categories: list[str] = Result(
        ["GRAMMAR"], min_length=1, description="Rule category ids counted as grammar errors.")
    max_new_errors: int = Result(0, ge=0, description="Reject when errors(example) - errors(seed) exceeds this.")
    skip_if_unavailable: bool = Result(False, description="true: with no server, skip this stage (and say so).")
    concurrency: int = Execution(8, gt=0)
    timeout_s: float = Execution(30.0, gt=0)
    num_cpus: float = Execution(0.25, ge=0)
    batch_size: int = Execution(64, gt=0)


class LanguageToolClient:
    def __init__(self, url: str, language: str = "en-US", timeout: float = 30.0) -> None:
        self.url = url.rstrip("/").removesuffix("/v2/check").removesuffix("/v2")
        self.language = language
        self.http = httpx.Client(timeout=timeout)

    def check(self, text: str) -> list[dict[str, Any]]:
        try:
            resp = self.http.post(f"{self.url}/v2/check", data={"text": text, "language": self.language})
        except httpx.TransportError as err:
            raise RedlineError(f"cannot reach LanguageTool at {self.url} ({type(err).__name__})") from None
        if resp.status_code != 200:
            raise RedlineError(f"LanguageTool at {self.url} answered {resp.status_code}: {resp.text[:120]}")
        return resp.json().get("matches", [])

    def available(self) -> bool:
        try:
            self.check("This is a test.")
            return True
        except RedlineError:
            return False


def count_errors(matches: list[dict[str, Any]], categories: list[str]) -> int:
    wanted = set(categories)
    return sum(1 for m in matches if (m.get("rule", {}).get("category", {}) or {}).get("id") in wanted)


GRAMMAR_SCHEMA = pa.schema([pa.field("id", pa.string()), pa.field("grammar_errors", pa.int64()),
                            pa.field("seed_grammar_errors", pa.int64()), pa.field("grammar_error", pa.string())])


class GrammarWorker:
    """A batch worker (an actor of the pipelines' pools): counts grammar errors of each text and of
    its seed (each distinct text once)."""

    input_columns: ClassVar[list[str]] = ["id", "text", "seed_text"]
    output_schema: ClassVar[pa.Schema] = GRAMMAR_SCHEMA

    def __init__(self, config: GrammarConfig) -> None:
        self.config = config
        self.client = LanguageToolClient(self.config.url or "", self.config.language, self.config.timeout_s)

    def _count(self, text: str) -> int | str:
        try:
            return count_errors(self.client.check(text), self.config.categories)
        except RedlineError as err:
            return str(err)

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        texts, seeds = [str(t) for t in batch["text"]], [str(t) for t in batch["seed_text"]]
        distinct = list(dict.fromkeys(texts + seeds))
        with ThreadPoolExecutor(self.config.concurrency) as pool:
            counts = dict(zip(distinct, pool.map(self._count, distinct)))
        errors = [next((c for c in (counts[t], counts[s]) if isinstance(c, str)), None) for t, s in zip(texts, seeds)]
        return pa.table({
            "id": pa.array(batch["id"].tolist(), pa.string()),
            "grammar_errors": [None if e else counts[t] for t, e in zip(texts, errors)],
            "seed_grammar_errors": [None if e else counts[s] for s, e in zip(seeds, errors)],
            "grammar_error": errors,
        }, schema=GRAMMAR_SCHEMA)
