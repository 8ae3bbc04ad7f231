"""A local Hugging Face causal or seq2seq model (DialoGPT-, GPT-2-, Blenderbot-, T5-style) as a
provider: a judge or a generator that needs no server. The model loads in this worker, on its GPU
when it has one, and answers a batch of prompts at once in padded batches."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import AliasChoices

from redline.actors.providers.base import (
    ChatProvider,
    Completion,
    Messages,
    PromptResult,
    SamplingParams,
)
from redline.cluster.artifacts import local_path
from redline.cluster.config import Result, Strict
from redline.cluster.devices import PRECISION_HELP, Precision, placement
from redline.errors import RedlineError, first_line

if TYPE_CHECKING:
    from redline.actors.providers.chat_model import ChatModel


class HFOptions(Strict):
    architecture: Literal["auto", "causal", "seq2seq"] = Result("auto", description="auto: seq2seq when the model's "
                                                                                     "config says encoder-decoder.")
    revision: str | None = Result(None, description="A hub revision (branch, tag or commit).")
    precision: Precision = Result(
        "auto", validation_alias=AliasChoices("precision", "dtype"), description=PRECISION_HELP)
    chat_template: str | None = Result(None, description="A Jinja chat template overriding the tokenizer's own.")
    max_input_tokens: int = Result(1024, gt=0, description="Longer prompts are refused with a clear error.")


def truncate_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """Cut `text` at the earliest stop sequence; True if one was found."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


class HFGenerator:
    """A Hugging Face causal or seq2seq model, loaded once; prompts are generated in padded batches."""

    def __init__(self, config: "ChatModel", num_gpus: float = 0.0) -> None:
        import torch
        from transformers import (
            AutoConfig,
            AutoModelForCausalLM,
            AutoModelForSeq2SeqLM,
            AutoTokenizer,
        )

        self.config, options = config, config.options()
        assert isinstance(options, HFOptions)
        self.options = options
        # A generator's own name in errors, else the model's (a judge's local model).
        self.name = getattr(config, "name", None) or config.model.rstrip("/").rsplit("/", 1)[-1] or "hf"
        model = local_path(config.model)
        path = Path(model).expanduser()
        if (model.startswith(("/", "./", "../", "~")) or model.count("/") > 1) and not (path / "config.json").is_file():
            raise RedlineError(f"generator '{self.name}': no model saved with save_pretrained at {model}")
        try:
            hf_config = AutoConfig.from_pretrained(model, revision=options.revision)
        except (OSError, ValueError) as err:
            raise RedlineError(f"generator '{self.name}': cannot load model '{model}': {first_line(err)}") from None
        arch = options.architecture
        if arch == "auto":
            arch = "seq2seq" if getattr(hf_config, "is_encoder_decoder", False) else "causal"
        self.seq2seq = arch == "seq2seq"
        self.placement = placement(num_gpus, options.precision)
        self.device, dtype = self.placement.torch_device, self.placement.torch_dtype
        self.tokenizer = AutoTokenizer.from_pretrained(model, revision=options.revision)
        if options.chat_template:
            self.tokenizer.chat_template = options.chat_template
        loader = AutoModelForSeq2SeqLM if self.seq2seq else AutoModelForCausalLM
        self.model = loader.from_pretrained(model, revision=options.revision, dtype=dtype).to(self.device).eval()
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if not self.seq2seq:
            self.tokenizer.padding_side = "left"  # generation continues from the right edge
        self.eos_id = self.model.generation_config.eos_token_id or self.tokenizer.eos_token_id
        mc = self.model.config
        self.max_positions = int(getattr(mc, "max_position_embeddings", None) or getattr(mc, "n_positions", None)
                                 or 1_000_000)
        self.max_positions = min(self.max_positions, options.max_input_tokens + 4096)
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
        limit = self.options.max_input_tokens
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


class HFProvider(ChatProvider):
    name = "hf"
    description = ("a local Hugging Face causal or seq2seq model (hub id or directory), run in the worker itself "
                   "(`architecture`, `revision`, `precision`, `chat_template`, `max_input_tokens`)")
    remote = False
    has_gradients = True
    Options = HFOptions

    def __init__(self, config: "ChatModel", num_gpus: float = 0.0) -> None:
        super().__init__(config)
        self.generator = HFGenerator(config, num_gpus)

    @property
    def endpoint(self) -> str:
        return self.config.model

    def chat_one(self, messages: Messages, params: SamplingParams) -> PromptResult:
        return self.generator.chat([messages], params)[0]

    def chat(self, conversations: Sequence[Messages], params: SamplingParams) -> list[PromptResult]:
        return self.generator.chat(list(conversations), params)
