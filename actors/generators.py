"""Dialogue response generators: prompts (or chat messages) in, n completions out.

`HFGenerator` runs any Hugging Face causal or seq2seq model (DialoGPT-, GPT-2-, Blenderbot-, T5-style)
in padded batches on the worker's device; every other kind is a chat-model provider (an
OpenAI-compatible server, redline's own Serve app, AWS Bedrock) reached through a `ChatClient`.
`GenerationWorker` is the one worker both Ray Data (chatbot evaluation) and Ray Serve (the
OpenAI-compatible generation service) host.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import pyarrow as pa
from pydantic import AliasChoices, model_validator

from redline.actors.providers import (
    ChatClient,
    Completion,
    Failed,
    PromptResult,
    ProviderName,
    ProviderSettings,
    SamplingParams,
    build_provider,
    providers,
)
from redline.cluster.artifacts import local_path
from redline.cluster.config import Execution, Input, RemoteApi, Result
from redline.cluster.devices import PRECISION_HELP, Precision, placement
from redline.errors import RedlineError, first_line

log = logging.getLogger(__name__)

__all__ = ["Completion", "GenerationWorker", "GeneratorConfig", "HFGenerator", "PromptResult", "SamplingParams",
           "build_generator"]


class GeneratorConfig(RemoteApi):
    """A dialogue response generator: a Hugging Face model (`hf`), an OpenAI-compatible server
    (`openai`), a generator served by redline (`redline`) or a model on AWS Bedrock (`bedrock`)."""

    name: str = Result(pattern=r"^[A-Za-z0-9_.\-]+$", description="Name used in outputs and as the served model id.")
    kind: ProviderName = Result("hf", description="The provider, a name of the registry (`redline list providers`): "
                                                 "a local HF model, an OpenAI-compatible API, redline Serve, or AWS "
                                                 "Bedrock.")
    model: str | None = Input(None, description="hf: hub id or local directory; openai/redline: the model name to "
                                                "request; bedrock: the model id or inference-profile ARN.")
    # hf
    architecture: Literal["auto", "causal", "seq2seq"] = Result("auto")
    revision: str | None = Result(None)
    precision: Precision = Result(
        "auto", validation_alias=AliasChoices("precision", "dtype"), description=PRECISION_HELP)
    chat_template: str | None = Result(None, description="A Jinja chat template overriding the tokenizer's own.")
    max_input_tokens: int = Result(1024, gt=0, description="Longer prompts are refused with a clear error.")
    backend: Literal["hf", "vllm"] = Result("hf", description="Serve only: vllm serves the model through "
                                                              "ray.serve.llm (needs vLLM and a GPU).")
    # remote providers
    base_url: str | None = Execution(None, description="openai, redline: the server's base URL, e.g. "
                                                   "http://127.0.0.1:8000/v1.")
    api_key_env: str | None = Execution(None, description="openai, redline: environment variable holding the key "
                                                      "(default OPENAI_API_KEY / REDLINE_API_KEY).")
    timeout_s: float = Execution(60.0, gt=0)
    max_retries: int = Execution(2, ge=0, description="Retries of a request on 429, 5xx and timeouts.")
    backoff_s: float = Execution(0.5, gt=0, description="First retry delay; doubles each retry.")
    concurrency: int = Execution(8, gt=0, description="Remote providers: requests in flight at once.")
    requests_per_second: float = Execution(20.0, gt=0, description="Remote providers: rate limit per actor.")
    # bedrock (credentials: boto3's usual chain: environment, profile, SSO, instance role)
    region: str | None = Result(None, description="bedrock: AWS region; default: the AWS configuration's.")
    endpoint_url: str | None = Result(None, description="bedrock: a VPC endpoint or a compatible stand-in.")
    additional_fields: dict[str, Any] = Result(
        default_factory=dict, description="bedrock: model-specific request fields (additionalModelRequestFields); "
                                          "top_k is sent as {top_k: K} here, the name Anthropic and Mistral models use.")
    # resources
    num_cpus: float = Execution(1.0, ge=0)
    num_gpus: float = Execution(0.0, ge=0, description="hf: the GPU the model runs on (the actor's).")

    @model_validator(mode="after")
    def _check_kind(self) -> "GeneratorConfig":
        try:
            providers()[self.kind].check_config({"model": self.model, "base_url": self.base_url})
        except ValueError as err:
            raise ValueError(f"generator '{self.name}': {str(err).replace('provider', 'kind', 1)}") from None
        return self

    def provider_settings(self) -> ProviderSettings:
        return ProviderSettings(provider=self.kind, model=self.model or "", base_url=self.base_url,
                                api_key_env=self.api_key_env, allow_insecure_http=self.allow_insecure_http,
                                timeout_s=self.timeout_s, region=self.region, endpoint_url=self.endpoint_url,
                                max_answer_bytes=self.max_answer_bytes,
                                additional_fields=dict(self.additional_fields))


def truncate_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """Cut `text` at the earliest stop sequence; True if one was found."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


class HFGenerator:
    """A Hugging Face causal or seq2seq model, loaded once; prompts are generated in padded batches."""

    def __init__(self, config: GeneratorConfig) -> None:
        import torch
        from transformers import (
            AutoConfig,
            AutoModelForCausalLM,
            AutoModelForSeq2SeqLM,
            AutoTokenizer,
        )

        self.config = config
        self.name = config.name
        model = local_path(config.model or "")
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
        self.placement = placement(config.num_gpus, config.precision)
        self.device, dtype = self.placement.torch_device, self.placement.torch_dtype
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


class RemoteGenerator:
    """A generator behind a provider's API: conversations go out concurrently under the rate limit,
    each retried on its own; a conversation whose retries ran out is that conversation's error."""

    def __init__(self, config: GeneratorConfig) -> None:
        self.config, self.name = config, config.name
        try:
            provider = build_provider(config.provider_settings())
        except RedlineError as err:
            raise RedlineError(f"generator '{config.name}': {err}") from None
        self.client = ChatClient(provider, requests_per_second=config.requests_per_second,
                                 max_retries=config.max_retries, backoff_s=config.backoff_s,
                                 concurrency=config.concurrency, max_retry_after_s=config.max_retry_after_s,
                                 max_failed_in_row=config.max_failed_in_row)

    def chat_results(self, conversations: Sequence[list[dict[str, str]]],
                     params: SamplingParams) -> list[PromptResult | str]:
        """Per conversation: its result, or why it has none."""
        try:
            answers = self.client.ask_many(list(conversations), params)
        except RedlineError as err:
            raise RedlineError(f"generator '{self.name}': {err}") from None
        return [f"request failed after {a.retries} retries: {a.cause}" if isinstance(a, Failed) else a.result
                for a in answers]

    def chat(self, conversations: Sequence[list[dict[str, str]]], params: SamplingParams) -> list[PromptResult]:
        results = self.chat_results(conversations, params)
        failed = next((r for r in results if isinstance(r, str)), None)
        if failed is not None:
            raise RedlineError(f"generator '{self.name}': {failed}")
        return results  # type: ignore[return-value]

    def generate(self, prompts: list[str], params: SamplingParams) -> list[PromptResult]:
        return self.chat([[{"role": "user", "content": p}] for p in prompts], params)


def build_generator(config: GeneratorConfig) -> HFGenerator | RemoteGenerator:
    return HFGenerator(config) if config.kind == "hf" else RemoteGenerator(config)


class GenerationWorker:
    """One generator loaded once. As a batch worker (an actor of the pipelines' pools): each context of a batch gets `n` responses (a
    context given as a single user turn); failures become an `error` per row, never a lost batch. As
    a Serve replica's model: `generate` / `chat` with per-request sampling settings."""

    input_columns: ClassVar[list[str]] = ["id", "context"]
    output_schema: ClassVar[pa.Schema] = pa.schema([("id", pa.string()), ("responses", pa.list_(pa.string())),
                                                    ("gen_error", pa.string())])

    def __init__(self, config: GeneratorConfig, sampling: SamplingParams | None = None) -> None:
        self.config = config
        self.generator = build_generator(config)
        self.params = sampling or SamplingParams()

    def generate(self, prompts: list[str], params: SamplingParams) -> list[PromptResult]:
        return self.generator.generate(prompts, params)

    def chat(self, conversations: list[list[dict[str, str]]], params: SamplingParams) -> list[PromptResult]:
        return self.generator.chat(conversations, params)

    def _contexts(self, convs: list[list[dict[str, str]]]) -> tuple[list[Any], list[str | None]]:
        if isinstance(self.generator, RemoteGenerator):  # per-request errors already; no second round of calls
            results = self.generator.chat_results(convs, self.params)
            return [None if isinstance(r, str) else r for r in results], \
                [r if isinstance(r, str) else None for r in results]
        try:
            return list(self.generator.chat(convs, self.params)), [None] * len(convs)
        except RedlineError:
            raise
        except Exception as err:  # noqa: BLE001 - a local model: retry one by one to isolate the failing contexts
            log.warning("generator %s failed on a batch (%s); retried per context", self.config.name, err)
        results: list[Any] = []
        errors: list[str | None] = []
        for conv in convs:
            try:
                results.append(self.generator.chat([conv], self.params)[0])
                errors.append(None)
            except Exception as one:  # noqa: BLE001
                results.append(None)
                errors.append(f"{type(one).__name__}: {one}"[:300])
        return results, errors

    def __call__(self, batch: dict[str, Any]) -> pa.Table:
        contexts = [str(c) for c in batch["context"]]
        results, errors = self._contexts([[{"role": "user", "content": c}] for c in contexts])
        return pa.table({
            "id": pa.array([str(i) for i in batch["id"]], pa.string()),
            "responses": pa.array([[c.text for c in r.completions] if r else [] for r in results],
                                  pa.list_(pa.string())),
            "gen_error": pa.array(errors, pa.string()),
        }, schema=self.output_schema)
