"""Dialogue response generators behind one interface: prompts (or chat messages) in, n completions out.

`HFGenerator` runs any Hugging Face causal or seq2seq model (DialoGPT-, GPT-2-, Blenderbot-, T5-
style) in batches; `OpenAIGenerator` calls any OpenAI-compatible server (including redline's own
Serve app); `BedrockGenerator` calls a model on AWS Bedrock through boto3's Converse API.
Pipelines build them with `build_generator`; the Serve generation deployment wraps the same
`HFGenerator`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from redline.actors.hf_loading import device_and_dtype, first_line
from redline.cluster.config import GeneratorConfig
from redline.cluster.net import check_key_transport
from redline.errors import RedlineError

log = logging.getLogger(__name__)


class SamplingParams(BaseModel):
    """Sampling settings shared by every request merged into one `generate` call."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    n: int = Field(1, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    max_tokens: int = Field(64, ge=1)
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass
class Completion:
    text: str
    finish_reason: str  # stop | length
    tokens: int


@dataclass
class PromptResult:
    prompt_tokens: int
    completions: list[Completion]


def truncate_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """Cut `text` at the earliest stop sequence; True if one was found."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


class Generator:
    """What every generator offers: batched generation from prompts and from chat messages."""

    name: str

    def generate(self, prompts: list[str], params: SamplingParams) -> list[PromptResult]:
        raise NotImplementedError

    def chat(self, conversations: list[list[dict[str, str]]], params: SamplingParams) -> list[PromptResult]:
        raise NotImplementedError


# --------------------------------------------------------------------------------------------
# Hugging Face models


class HFGenerator(Generator):
    """A Hugging Face causal or seq2seq model, loaded once; prompts are generated in padded batches."""

    def __init__(self, config: GeneratorConfig) -> None:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

        self.config = config
        self.name = config.name
        model = config.model or ""
        path = Path(model).expanduser()
        if (model.startswith(("/", "./", "../", "~")) or model.count("/") > 1) and not (path / "config.json").is_file():
            raise RedlineError(f"generator '{config.name}': no model saved with save_pretrained at {model}")
        try:
            hf_config = AutoConfig.from_pretrained(model, revision=config.revision)
        except (OSError, ValueError) as err:
            raise RedlineError(f"generator '{config.name}': cannot load model '{model}': {first_line(err)}") from None
        arch = config.architecture
        if arch == "auto":
            arch = "seq2seq" if getattr(hf_config, "is_encoder_decoder", False) else "causal"
        self.seq2seq = arch == "seq2seq"
        self.device, dtype = device_and_dtype(config.device, config.dtype, config.num_gpus)
        self.tokenizer = AutoTokenizer.from_pretrained(model, revision=config.revision)
        if config.chat_template:
            self.tokenizer.chat_template = config.chat_template
        loader = AutoModelForSeq2SeqLM if self.seq2seq else AutoModelForCausalLM
        self.model = loader.from_pretrained(model, revision=config.revision, dtype=dtype).to(self.device).eval()
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if not self.seq2seq:
            self.tokenizer.padding_side = "left"  # generation continues from the right edge
        self.eos_id = self.model.generation_config.eos_token_id or self.tokenizer.eos_token_id
        mc = self.model.config
        self.max_positions = int(getattr(mc, "max_position_embeddings", None) or getattr(mc, "n_positions", None)
                                 or 1_000_000)
        self.max_positions = min(self.max_positions, config.max_input_tokens + 4096)
        self._torch = torch

    # -- prompts -----------------------------------------------------------------------------

    def prompt_from_messages(self, messages: list[dict[str, str]]) -> str:
        """The model's chat template when its tokenizer has one; otherwise the DialoGPT convention
        (turns separated by the EOS token) for causal models and newlines for seq2seq models."""
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        turns = [m["content"] for m in messages]
        if self.seq2seq:
            return "\n".join(turns)
        eos = self.tokenizer.eos_token or ""
        return "".join(t + eos for t in turns)

    def chat(self, conversations: list[list[dict[str, str]]], params: SamplingParams) -> list[PromptResult]:
        return self.generate([self.prompt_from_messages(m) for m in conversations], params)

    # -- generation --------------------------------------------------------------------------

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(ids) for ids in self.tokenizer(texts, add_special_tokens=True)["input_ids"]]

    def check_prompts(self, prompts: list[str]) -> list[int]:
        """Token counts of `prompts`; a prompt over `max_input_tokens` is a user error."""
        lengths = self.count_tokens(prompts)
        limit = self.config.max_input_tokens
        too_long = [i for i, n in enumerate(lengths) if n > limit]
        if too_long:
            raise RedlineError(f"prompt {too_long[0]} has {lengths[too_long[0]]} tokens; "
                               f"generator '{self.name}' accepts at most {limit}")
        return lengths

    def generate(self, prompts: list[str], params: SamplingParams) -> list[PromptResult]:
        torch = self._torch
        if not prompts:
            return []
        lengths = self.check_prompts(prompts)
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True).to(self.device)
        sample = params.temperature > 0
        # Never past the model's positions: the completion stops there with finish_reason "length".
        room = self.max_positions - (0 if self.seq2seq else enc["input_ids"].shape[1])
        if room < 1:
            raise RedlineError(f"prompt fills the {self.max_positions}-token context of generator '{self.name}'")
        kwargs: dict[str, Any] = {"max_new_tokens": min(params.max_tokens, room), "num_return_sequences": params.n,
                                  "do_sample": sample, "pad_token_id": self.tokenizer.pad_token_id}
        if sample:
            kwargs.update(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k or 0)
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        if params.seed is not None:
            torch.manual_seed(params.seed)
        with torch.inference_mode():
            out = self.model.generate(**enc, **kwargs)
        new = out if self.seq2seq else out[:, enc["input_ids"].shape[1]:]
        eos = set(self.eos_id if isinstance(self.eos_id, list) else [self.eos_id]) - {None}
        results = []
        for i, n_prompt in enumerate(lengths):
            completions = []
            for row in new[i * params.n:(i + 1) * params.n].tolist():
                if self.seq2seq and row and row[0] == self.model.config.decoder_start_token_id:
                    row = row[1:]
                ended = next((k for k, t in enumerate(row) if t in eos), None)
                tokens = row[:ended] if ended is not None else [t for t in row if t != self.tokenizer.pad_token_id]
                text = self.tokenizer.decode(tokens, skip_special_tokens=True)
                text, stopped = truncate_at_stop(text, params.stop)
                finish = "stop" if stopped or ended is not None else "length"
                completions.append(Completion(text, finish, len(tokens)))
            results.append(PromptResult(n_prompt, completions))
        return results


# --------------------------------------------------------------------------------------------
# OpenAI-compatible servers


class OpenAIGenerator(Generator):
    """Any OpenAI-compatible chat server, through the official `openai` client (key from the env)."""

    def __init__(self, config: GeneratorConfig) -> None:
        from openai import OpenAI

        self.config = config
        self.name = config.name
        key = os.environ.get(config.api_key_env or "", "")
        check_key_transport(config.base_url or "", bool(key), config.allow_insecure_http, f"generator '{config.name}'")
        self.client = OpenAI(base_url=config.base_url, api_key=key or "not-needed", timeout=config.timeout_s,
                             max_retries=config.max_retries)

    def _call(self, create: Any, **kwargs: Any) -> Any:
        import openai

        try:
            return create(**kwargs)
        except openai.APIConnectionError:
            raise RedlineError(f"generator '{self.name}': cannot reach {self.config.base_url}") from None
        except openai.APIStatusError as err:
            raise RedlineError(f"generator '{self.name}': {self.config.base_url} answered {err.status_code}: "
                               f"{_api_message(err)}") from None

    def _sampling(self, params: SamplingParams) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model": self.config.model, "n": params.n, "temperature": params.temperature,
                                  "top_p": params.top_p, "max_tokens": params.max_tokens}
        if params.stop:
            kwargs["stop"] = list(params.stop)
        if params.seed is not None:
            kwargs["seed"] = params.seed
        if params.top_k is not None:
            kwargs["extra_body"] = {"top_k": params.top_k}
        return kwargs

    def chat(self, conversations: list[list[dict[str, str]]], params: SamplingParams) -> list[PromptResult]:
        """One request per conversation, `config.concurrency` of them in flight at once."""
        from concurrent.futures import ThreadPoolExecutor

        def one(messages: list[dict[str, str]]) -> PromptResult:
            resp = self._call(self.client.chat.completions.create, messages=messages, **self._sampling(params))
            completions = [Completion(c.message.content or "", c.finish_reason or "stop", 0) for c in resp.choices]
            usage = resp.usage
            for c in completions:
                c.tokens = usage.completion_tokens // len(completions) if usage else 0
            return PromptResult(usage.prompt_tokens if usage else 0, completions)

        with ThreadPoolExecutor(max_workers=max(1, min(self.config.concurrency, len(conversations)))) as pool:
            return list(pool.map(one, conversations))

    def generate(self, prompts: list[str], params: SamplingParams) -> list[PromptResult]:
        resp = self._call(self.client.completions.create, prompt=list(prompts), **self._sampling(params))
        by_prompt: list[list[Completion]] = [[] for _ in prompts]
        for c in resp.choices:
            by_prompt[c.index // params.n].append(Completion(c.text, c.finish_reason or "stop", 0))
        prompt_tokens = (resp.usage.prompt_tokens // max(len(prompts), 1)) if resp.usage else 0
        return [PromptResult(prompt_tokens, comps) for comps in by_prompt]


def _api_message(err: Any) -> str:
    body = getattr(err, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return str(getattr(err, "message", err))


# --------------------------------------------------------------------------------------------
# AWS Bedrock


_BEDROCK_FINISH = {"max_tokens": "length", "stop_sequence": "stop", "end_turn": "stop"}


class BedrockGenerator(Generator):
    """A model on AWS Bedrock through boto3's Converse API (credentials from boto3's usual chain).
    Converse returns one completion per request, so each of the n samples is its own request;
    `config.concurrency` of them are in flight at once, and botocore retries throttling (adaptive)."""

    def __init__(self, config: GeneratorConfig) -> None:
        import boto3
        from botocore.config import Config

        self.config = config
        self.name = config.name
        retries = Config(retries={"max_attempts": config.max_retries + 1, "mode": "adaptive"},
                         connect_timeout=config.timeout_s, read_timeout=config.timeout_s)
        try:
            self.client = boto3.client("bedrock-runtime", region_name=config.region, endpoint_url=config.endpoint_url,
                                       config=retries)
        except Exception as err:  # noqa: BLE001 - botocore raises several types for a bad region/endpoint
            raise RedlineError(f"generator '{self.name}': cannot create a Bedrock client: {first_line(err)}") from None

    def _request(self, messages: list[dict[str, str]], params: SamplingParams) -> dict[str, Any]:
        inference: dict[str, Any] = {"maxTokens": params.max_tokens, "temperature": params.temperature,
                                     "topP": params.top_p}
        if params.stop:
            inference["stopSequences"] = list(params.stop)
        extra = dict(self.config.additional_fields)
        if params.top_k is not None:
            extra.setdefault("top_k", params.top_k)
        system = [{"text": m["content"]} for m in messages if m["role"] == "system"]
        request: dict[str, Any] = {
            "modelId": self.config.model, "inferenceConfig": inference,
            "messages": [{"role": m["role"], "content": [{"text": m["content"]}]} for m in messages
                         if m["role"] != "system"]}
        if system:
            request["system"] = system
        if extra:
            request["additionalModelRequestFields"] = extra
        return request

    def _converse(self, request: dict[str, Any]) -> Completion:
        from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError

        try:
            resp = self.client.converse(**request)
        except EndpointConnectionError:
            raise RedlineError(f"generator '{self.name}': cannot reach Bedrock "
                               f"({self.config.endpoint_url or self.client.meta.endpoint_url})") from None
        except ClientError as err:
            error = err.response.get("Error", {})
            raise RedlineError(f"generator '{self.name}': Bedrock answered {error.get('Code', 'an error')}: "
                               f"{error.get('Message', err)}") from None
        except BotoCoreError as err:
            raise RedlineError(f"generator '{self.name}': {first_line(err)}") from None
        text = "".join(part.get("text", "") for part in resp.get("output", {}).get("message", {}).get("content", []))
        return Completion(text, _BEDROCK_FINISH.get(resp.get("stopReason", ""), "stop"),
                          int(resp.get("usage", {}).get("outputTokens", 0)))

    def chat(self, conversations: list[list[dict[str, str]]], params: SamplingParams) -> list[PromptResult]:
        from concurrent.futures import ThreadPoolExecutor

        requests = [self._request(m, params) for m in conversations for _ in range(params.n)]
        with ThreadPoolExecutor(max_workers=max(1, min(self.config.concurrency, len(requests)))) as pool:
            completions = list(pool.map(self._converse, requests))
        return [PromptResult(0, completions[i * params.n:(i + 1) * params.n]) for i in range(len(conversations))]

    def generate(self, prompts: list[str], params: SamplingParams) -> list[PromptResult]:
        return self.chat([[{"role": "user", "content": p}] for p in prompts], params)


GENERATORS: dict[str, type[Generator]] = {"hf": HFGenerator, "openai": OpenAIGenerator, "bedrock": BedrockGenerator}


def build_generator(config: GeneratorConfig) -> Generator:
    return GENERATORS[config.kind](config)


class GenerationWorker:
    """Ray Data actor: one generator loaded once; each context of a batch gets `n` responses (a
    context given as a single user turn). Failures become an `error` per row, never a lost batch."""

    def __init__(self, config: dict[str, Any], sampling: dict[str, Any]) -> None:
        self.generator = build_generator(GeneratorConfig.model_validate(config))
        self.params = SamplingParams.model_validate(sampling)

    def __call__(self, batch: dict[str, Any]) -> Any:
        import pyarrow as pa

        contexts = [str(c) for c in batch["context"]]
        convs = [[{"role": "user", "content": c}] for c in contexts]
        try:
            results: list[Any] = self.generator.chat(convs, self.params)
            errors: list[str | None] = [None] * len(contexts)
        except Exception as err:  # noqa: BLE001 - retry one by one to isolate the failing contexts
            results, errors = [], []
            for conv in convs:
                try:
                    results.append(self.generator.chat([conv], self.params)[0])
                    errors.append(None)
                except Exception as one:  # noqa: BLE001
                    results.append(None)
                    errors.append(f"{type(one).__name__}: {one}"[:300])
            log.warning("generator %s failed on a batch (%s); retried per context", self.generator.name, err)
        return pa.table({
            "id": pa.array([str(i) for i in batch["id"]], pa.string()),
            "responses": pa.array([[c.text for c in r.completions] if r else [] for r in results],
                                  pa.list_(pa.string())),
            "gen_error": pa.array(errors, pa.string()),
        })
