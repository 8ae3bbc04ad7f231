"""Pydantic models of every pipeline config: YAML in, validated once at the edge, clear errors out."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
import re
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from redline.errors import RedlineError

LabelValue = str | int | float | bool


class Strict(BaseModel):
    """Unknown keys are mistakes (a typo would otherwise be silently ignored)."""

    model_config = ConfigDict(extra="forbid")


SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")


def check_safe_name(value: str | None) -> str | None:
    """A name that becomes one path component: no separators, no `..`, not hidden, not absolute."""
    if value is not None and (not SAFE_NAME.fullmatch(value) or ".." in value):
        raise ValueError(f"{value!r} is not a safe name: use 1-128 letters, digits, '.', '_' or '-', starting with a "
                         "letter or digit (no '/', no '..')")
    return value


# Run directory names (`run_name`, `--run-name`) and model directory names: joined onto an output
# directory, so they must never climb out of it.
SafeName = Annotated[str | None, AfterValidator(check_safe_name)]


def unique_names(items: list[Any], what: str) -> list[Any]:
    names = [i.name for i in items]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"{what} names must be unique; repeated: {', '.join(dupes)}")
    return items


# --------------------------------------------------------------------------------------------
# Corpora


class CorpusConfig(Strict):
    """Where a labelled text corpus lives and how its columns map onto redline's corpus schema."""

    path: str = Field(description="Local path or s3:// URI of a CSV, JSONL/JSON or Parquet file.")
    format: Literal["auto", "csv", "jsonl", "json", "parquet"] = "auto"
    preset: Literal["davidson", "jigsaw", "diasafety"] | None = Field(
        None, description="Built-in column mapping for a known dataset format."
    )
    text_column: str | None = None
    label_column: str | list[str] | None = Field(
        None, description="One label column, or several 0/1 columns (toxic if any is positive)."
    )
    context_column: str | None = None
    toxic_values: list[LabelValue] | None = Field(
        None, description="Values of the label column that mean toxic."
    )
    benign_values: list[LabelValue] | None = Field(
        None, description="Values that mean benign; when unset, every other value is benign."
    )
    label_names: dict[str, str] | None = Field(
        None, description="Readable names of raw label values, e.g. {0: hate, 1: offensive}."
    )
    dataset: str | None = Field(None, description="Dataset name in provenance; default: preset or file stem.")
    split: str = "test"
    limit: int | None = Field(None, gt=0, description="Score at most this many rows.")
    sample: Literal["random", "first"] = "random"
    seed: int = 0
    encoding: str = "utf-8"
    encoding_errors: Literal["strict", "replace"] = Field(
        "strict", description="strict: stop at the first undecodable byte; replace: substitute U+FFFD."
    )
    max_chars: int = Field(20_000, gt=0, description="Longer texts are kept but rejected with a reason.")

    @field_validator("label_names", mode="before")
    @classmethod
    def _stringify_keys(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): str(v) for k, v in value.items()}
        return value


# --------------------------------------------------------------------------------------------
# Detectors


class DetectorConfig(BaseModel):
    """One detector: its kind (a registry name), decision rule, resources, and kind-specific options.

    Kind-specific fields (e.g. `model` for `hf`, `patterns` for `keywords`) sit beside the common
    ones and are validated against the detector class's own `Options` model.
    """

    model_config = ConfigDict(extra="allow")

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$", description="Unique name used in outputs.")
    kind: str
    threshold: float | dict[str, float] = Field(
        0.5, description="Toxic if the toxic score reaches it; per-label thresholds for multi-label models."
    )
    rule: Literal["auto", "score", "argmax"] = Field(
        "auto", description="score: toxic score >= threshold; argmax: the top class is a toxic one."
    )
    batch_size: int = Field(64, gt=0, le=65_536)
    actors: int = Field(1, gt=0, description="Size of this detector's actor pool.")
    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _endpoint_shorthand(cls, data: Any) -> Any:
        """A detector given only as a served endpoint (`url: http://.../v1/detect`) is kind `http`."""
        if isinstance(data, dict) and "kind" not in data and str(data.get("url", "")).startswith(("http://", "https://")):
            return {**data, "kind": "http"}
        return data

    @model_validator(mode="after")
    def _check_kind_options(self) -> "DetectorConfig":
        from redline.actors.registry import detector_class

        try:
            cls = detector_class(self.kind)
        except RedlineError as err:
            raise ValueError(str(err)) from None
        extra = dict(self.model_extra or {})
        try:
            cls.Options.model_validate(extra)
        except ValidationError as err:
            raise ValueError(f"detector '{self.name}' ({self.kind}): {_first_error(err)}") from None
        return self

    def options(self) -> BaseModel:
        from redline.actors.registry import detector_class

        return detector_class(self.kind).Options.model_validate(dict(self.model_extra or {}))


# --------------------------------------------------------------------------------------------
# Generators


class GeneratorConfig(Strict):
    """A dialogue response generator: a Hugging Face model (`hf`), an OpenAI-compatible server
    (`openai`) or a model on AWS Bedrock through the Converse API (`bedrock`)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$", description="Name used in outputs and as the served model id.")
    kind: Literal["hf", "openai", "bedrock"] = "hf"
    model: str | None = Field(None, description="hf: hub id or local directory; openai: the model name to request; "
                                                "bedrock: the model id or inference-profile ARN.")
    # hf
    architecture: Literal["auto", "causal", "seq2seq"] = "auto"
    revision: str | None = None
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    device: str = "auto"
    chat_template: str | None = Field(None, description="A Jinja chat template overriding the tokenizer's own.")
    max_input_tokens: int = Field(1024, gt=0, description="Longer prompts are refused with a clear error.")
    backend: Literal["hf", "vllm"] = Field("hf", description="Serve only: vllm serves the model through "
                                                              "ray.serve.llm (needs vLLM and a GPU).")
    # openai
    base_url: str | None = Field(None, description="openai: the server's base URL, e.g. http://127.0.0.1:8000/v1.")
    api_key_env: str | None = Field("OPENAI_API_KEY", description="openai: environment variable holding the key.")
    allow_insecure_http: bool = Field(False, description="openai: allow sending the key over plain http:// to a "
                                                         "non-loopback host.")
    timeout_s: float = Field(60.0, gt=0)
    max_retries: int = Field(2, ge=0)
    concurrency: int = Field(8, gt=0, description="openai, bedrock: requests in flight at once.")
    # bedrock (credentials: boto3's usual chain: environment, profile, SSO, instance role)
    region: str | None = Field(None, description="bedrock: AWS region; default: the AWS configuration's.")
    endpoint_url: str | None = Field(None, description="bedrock: a VPC endpoint or a compatible stand-in.")
    additional_fields: dict[str, Any] = Field(
        default_factory=dict, description="bedrock: model-specific request fields (additionalModelRequestFields); "
                                          "top_k is sent as {top_k: K} here, the name Anthropic and Mistral models use.")
    # resources
    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _check_kind(self) -> "GeneratorConfig":
        if self.kind == "openai":
            if not self.base_url or not self.base_url.startswith(("http://", "https://")):
                raise ValueError(f"generator '{self.name}': kind openai needs base_url (http://... or https://...)")
            if not self.model:
                raise ValueError(f"generator '{self.name}': kind openai needs model (the name the server knows)")
        elif self.kind == "bedrock":
            if not self.model:
                raise ValueError(f"generator '{self.name}': kind bedrock needs model (a Bedrock model id or ARN)")
        elif not self.model:
            raise ValueError(f"generator '{self.name}': kind hf needs model (a hub id or a local directory)")
        return self


# --------------------------------------------------------------------------------------------
# Serve


class Autoscaling(Strict):
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(2, gt=0)
    target_ongoing_requests: float = Field(8.0, gt=0)


class BatchSettings(Strict):
    """How `@serve.batch` merges concurrent requests into one model call."""

    enabled: bool = Field(True, description="false: every request is its own model call.")
    max_batch_size: int = Field(32, gt=0, le=4096, description="Requests merged into one model call.")
    wait_timeout_s: float = Field(0.005, ge=0, le=10, description="How long a batch waits to fill.")


class DeploymentSettings(Strict):
    """Replicas (fixed or autoscaled), request concurrency and batching of one served model."""

    replicas: int = Field(1, gt=0)
    autoscaling: Autoscaling | None = None
    max_ongoing_requests: int = Field(128, gt=0)
    batch: BatchSettings = Field(default_factory=BatchSettings)


class ServedDetectorConfig(DetectorConfig):
    """A detector plus how it is served."""

    serve: DeploymentSettings = Field(default_factory=DeploymentSettings)


class ServedGeneratorConfig(GeneratorConfig):
    serve: DeploymentSettings = Field(default_factory=lambda: DeploymentSettings(batch=BatchSettings(max_batch_size=8)))

    @model_validator(mode="after")
    def _servable(self) -> "ServedGeneratorConfig":
        if self.kind != "hf":
            raise ValueError(f"generator '{self.name}': Serve hosts Hugging Face models (kind hf), not {self.kind}")
        return self


class ServedDialogueSafety(Strict):
    """The two-step dialogue-safety detector behind POST /v1/dialogue-safety."""

    utterance: DetectorConfig = Field(description="Step 1: judges the response alone.")
    classifiers: str = Field(description="Step 2: a directory from `redline train dialogue-safety`.")
    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0)
    serve: DeploymentSettings = Field(default_factory=DeploymentSettings)


class ServeLimits(Strict):
    """What one request may ask for; more is refused with a 4xx naming the limit."""

    max_texts: int = Field(256, gt=0, description="Texts per /v1/detect or /v1/moderations request (pairs per "
                                                   "/v1/dialogue-safety request, prompts per /v1/completions request).")
    max_detections: int = Field(4096, gt=0, description="Texts x detectors per /v1/detect request.")
    max_text_chars: int = Field(20_000, gt=0)
    max_request_bytes: int = Field(8_000_000, gt=0)
    max_n: int = Field(16, gt=0, description="Completions per prompt.")
    max_tokens: int = Field(1024, gt=0, description="Largest max_tokens a request may ask for.")
    max_generated_tokens: int = Field(32_768, gt=0, description="n x prompts x max_tokens per generation request.")
    default_max_tokens: int = Field(64, gt=0)
    request_timeout_s: float = Field(120.0, gt=0)


class ServeConfig(Strict):
    """`redline serve`: detectors and generation models as HTTP services on Ray Serve."""

    host: str = Field("127.0.0.1", description="Address the HTTP proxy binds to; 0.0.0.0 exposes it to the network.")
    port: int = Field(8000, gt=0, lt=65536)
    app_name: str = Field("redline", pattern=r"^[A-Za-z0-9_\-]+$")
    route_prefix: str = Field("/", pattern=r"^/[A-Za-z0-9_\-/]*$", description="Where the API lives under the server.")
    api_key_env: str | None = Field("REDLINE_API_KEY", description="When this environment variable is set at "
                                                                   "start-up, every request but /healthz must carry "
                                                                   "its value.")
    insecure: bool = Field(False, description="Allow serving on a non-loopback host without an API key (anyone who "
                                              "can reach the port can use the models).")
    detectors: list[ServedDetectorConfig] = Field(default_factory=list)
    generators: list[ServedGeneratorConfig] = Field(default_factory=list)
    dialogue_safety: ServedDialogueSafety | None = None
    limits: ServeLimits = Field(default_factory=ServeLimits)
    ingress: DeploymentSettings = Field(default_factory=lambda: DeploymentSettings(max_ongoing_requests=512))
    start_timeout_s: float = Field(600.0, gt=0, description="Give up if the models are not serving by then.")

    @model_validator(mode="after")
    def _check(self) -> "ServeConfig":
        if not self.detectors and not self.generators and self.dialogue_safety is None:
            raise ValueError("serve needs at least one detector or generator")
        unique_names(self.detectors, "detector")
        unique_names(self.generators, "generator")
        return self


# --------------------------------------------------------------------------------------------
# Quality filters and judges (TaeBench)


class ChatJudgeOptions(Strict):
    """How to ask a chat model about a text over an OpenAI-compatible API (judges and LLM-based detectors)."""

    base_url: str = Field(description="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1.")
    model: str = Field(description="Model name the server knows.")
    api_key_env: str | None = Field("OPENAI_API_KEY", description="Environment variable holding the key.")
    template: str | None = Field(None, description="Prompt with a {text} placeholder; default: the kind's own.")
    template_file: str | None = Field(None, description="Read the template from this file instead.")
    system_prompt: str | None = None
    max_tokens: int = Field(8, gt=0)
    temperature: float = Field(0.0, ge=0)
    concurrency: int = Field(8, gt=0, description="Requests in flight per actor.")
    requests_per_second: float = Field(20.0, gt=0, description="Rate limit per actor.")
    max_retries: int = Field(4, ge=0, description="Retries on 429, 5xx, timeouts and connection errors.")
    backoff_s: float = Field(0.5, gt=0, description="First retry delay; doubles each retry.")
    timeout_s: float = Field(30.0, gt=0)
    cache_dir: str | None = Field("auto", description="Answer cache (SQLite) directory; auto: this user's cache "
                                                      "($REDLINE_CACHE or ~/.cache/redline)/judge; null turns it off.")
    allow_insecure_http: bool = Field(False, description="Allow sending the API key over plain http:// to a "
                                                         "non-loopback host.")
    price_per_1k_prompt_tokens: float = Field(0.0, ge=0)
    price_per_1k_completion_tokens: float = Field(0.0, ge=0)

    def prompt_template(self, default: str) -> str:
        if self.template_file:
            path = Path(self.template_file).expanduser()
            if not path.is_file():
                raise RedlineError(f"template_file not found: {path}")
            return path.read_text(encoding="utf-8")
        return self.template or default


class JudgeConfig(ChatJudgeOptions):
    """The TaeBench label filter's LLM judge (default template: the paper's 5-shot Yes/No/Unsure format)."""

    name: str = "llm-judge"
    actors: int = Field(1, gt=0)
    num_cpus: float = Field(0.25, ge=0)
    batch_size: int = Field(64, gt=0)


class GrammarConfig(Strict):
    url: str | None = Field(None, description="LanguageTool server root, e.g. http://127.0.0.1:8010.")
    language: str = "en-US"
    categories: list[str] = Field(["GRAMMAR"], description="Rule category ids counted as grammar errors.")
    max_new_errors: int = Field(0, ge=0, description="Reject when errors(example) - errors(seed) exceeds this.")
    skip_if_unavailable: bool = Field(False, description="true: with no server, skip this stage (and say so).")
    concurrency: int = Field(8, gt=0)
    timeout_s: float = Field(30.0, gt=0)
    actors: int = Field(1, gt=0)
    num_cpus: float = Field(0.25, ge=0)
    batch_size: int = Field(64, gt=0)


class NaturalnessConfig(Strict):
    """A text-acceptability classifier (any HF sequence classifier, e.g. CoLA-style)."""

    model: str = Field(description="Hub id or local directory (see `redline train naturalness`).")
    natural_label: str | None = Field(None, description="The label meaning natural/acceptable; default label 1.")
    threshold: float = Field(0.5, ge=0, le=1, description="Reject below this probability of natural.")
    max_length: int = Field(128, gt=0)
    batch_size: int = Field(64, gt=0)
    actors: int = Field(1, gt=0)
    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0)

    def detector(self) -> "DetectorConfig":
        """The same HF loading and batching as detectors, with `natural` in the role of the scored label."""
        extra: dict[str, Any] = {"model": self.model, "max_length": self.max_length}
        if self.natural_label:
            extra["toxic_labels"] = [self.natural_label]
        return DetectorConfig.model_validate({"name": "naturalness", "kind": "hf", "threshold": self.threshold,
                                              "rule": "score", "batch_size": self.batch_size, "actors": self.actors,
                                              "num_cpus": self.num_cpus, "num_gpus": self.num_gpus, **extra})


class TransferConfig(Strict):
    """`redline run transfer`: how often TaeBench's examples fool other detectors (ASR = FNR / FPR)."""

    taebench: str = Field(description="A finished `redline run taebench` run directory (local or s3://).")
    victims: list[DetectorConfig] = Field(min_length=1, description="Detectors to attack by transfer (any kind).")
    split: Literal["test", "train", "all"] = Field("test", description="Which TaeBench split to evaluate.")
    include_seeds: bool = Field(True, description="Also score the original seeds (FNR before the attack).")
    output: str = "redline-runs"
    run_name: SafeName = None
    shard_size: int = Field(2_000, gt=0)

    @field_validator("victims")
    @classmethod
    def _unique(cls, victims: list[DetectorConfig]) -> list[DetectorConfig]:
        return unique_names(victims, "victim")

    @property
    def detectors(self) -> list[DetectorConfig]:
        return self.victims


VARIANTS = ("no_tae", "unfiltered_tae", "taebench", "taebench_plus", "balanced_taebench_plus")


class SearchSpace(Strict):
    """Hyper-parameters swept by Ray Tune: every combination of the lists, `num_samples` times each."""

    learning_rate: list[float] = Field([5e-5], min_length=1)
    batch_size: list[int] = Field([16], min_length=1)
    epochs: list[int] = Field([3], min_length=1)
    augment_ratio: list[float] = Field([1.0], min_length=1,
                                       description="Adversarial rows added per base training row, at most (1.0: up to "
                                                   "as many as the base set has).")


class AdvTrainConfig(Strict):
    """`redline run advtrain`: adversarial-training variants (the paper's Table 5) as a Ray Tune sweep."""

    taebench: str = Field(description="A finished `redline run taebench` run directory.")
    train_corpus: CorpusConfig = Field(description="The seed training set every variant starts from.")
    test_corpus: CorpusConfig = Field(description="The seed test split (F1 / ROC-AUC column).")
    base_model: str = Field(description="Hub id or local directory of the model to fine-tune.")
    variants: list[Literal["no_tae", "unfiltered_tae", "taebench", "taebench_plus", "balanced_taebench_plus"]] = Field(
        list(VARIANTS), min_length=1)
    holdout_recipes: list[str] = Field(default_factory=list,
                                       description="Recipes left out of training TAE, to measure robustness to unseen attacks.")
    search: SearchSpace = Field(default_factory=SearchSpace)
    num_samples: int = Field(1, gt=0, description="Trials per grid point (different seeds).")
    scheduler: Literal["fifo", "asha"] = "fifo"
    grace_period: int = Field(1, gt=0, description="ASHA: epochs before a trial can be stopped.")
    reduction_factor: float = Field(2.0, gt=1)
    metric: Literal["val_f1", "val_balanced_accuracy"] = Field("val_f1", description="Chooses the best trial per variant.")
    schedule: Literal["linear", "cosine_with_restarts"] = "linear"
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    patience: int | None = Field(None, gt=0, description="Early stopping: epochs without a better validation metric.")
    max_length: int = Field(128, gt=0)
    max_train_rows: int | None = Field(None, gt=0, description="Cap on base training rows (a seeded sample).")
    max_concurrent_trials: int | None = Field(None, gt=0)
    num_cpus: float = Field(1.0, gt=0, description="CPUs per trial.")
    num_gpus: float = Field(0.0, ge=0, description="GPUs per trial.")
    seed: int = 0
    output: str = "redline-runs"
    run_name: SafeName = None


Precision = Literal["auto", "float32", "bfloat16"]
PRECISION_HELP = "auto: bfloat16 autocast on GPU, float32 on CPU; bfloat16 also on CPUs with native bf16 (1.65x training there)."


class HyperGrid(Strict):
    """Values to try for training settings; every combination is a Ray Tune trial per classifier."""

    learning_rate: list[float] | None = Field(None, min_length=1)
    batch_size: list[int] | None = Field(None, min_length=1)
    epochs: list[int] | None = Field(None, min_length=1)
    weight_decay: list[float] | None = Field(None, min_length=1)
    warmup_ratio: list[float] | None = Field(None, min_length=1)

    def combinations(self) -> list[dict[str, Any]]:
        import itertools

        axes = {k: v for k, v in self.model_dump().items() if v}
        return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]


class DialogueSafetyTrainConfig(Strict):
    """`redline train dialogue-safety`: DiaSafety context classifiers and the paper's comparisons."""

    train: str = Field(description="DiaSafety train JSON (rows of context, response, category, label).")
    val: str = Field(description="DiaSafety validation JSON (the metrics are computed on it).")
    base_model: str = Field(description="Hub id or local directory (RoBERTa-base in the paper; MiniLM offline).")
    categories: list[str] | None = Field(None, description="Default: every category with training rows.")
    add_categories: list[dict[str, Any]] = Field(default_factory=list,
                                                 description="Extra taxonomy entries: {name, definition, personal}.")
    variants: list[Literal["one_vs_all", "single", "one_vs_all_no_context"]] = Field(
        ["one_vs_all", "single", "one_vs_all_no_context"], min_length=1)
    utterance_detectors: list[DetectorConfig] = Field(
        default_factory=list, description="Coarse-grain baselines, given the response only and context+response.")
    epochs: int = Field(10, gt=0)
    learning_rate: float = Field(2e-5, gt=0)
    batch_size: int = Field(16, gt=0)
    max_length: int = Field(128, gt=0)
    patience: int | None = Field(2, gt=0, description="Early stopping on validation macro-F1.")
    precision: Precision = Field("auto", description=PRECISION_HELP)
    tune_trials: bool = Field(False, description="Train the one-vs-all categories in parallel as Ray Tune trials.")
    search: HyperGrid | None = Field(None, description="A hyper-parameter grid, e.g. {learning_rate: [1e-5, 2e-5], "
                                                       "batch_size: [16, 32]}: every combination a Tune trial per "
                                                       "classifier (implies tune_trials); the best by validation "
                                                       "macro-F1 is kept.")
    trial_cpus: float = Field(1.0, gt=0, description="CPUs per trial (with tune_trials).")
    trial_gpus: float = Field(0.0, ge=0, description="GPUs per trial (with tune_trials).")
    limit_train: int | None = Field(None, gt=0, description="Train on a seeded sample of this many rows.")
    limit_val: int | None = Field(None, gt=0)
    seed: int = 0
    output: str = "redline-runs"
    run_name: SafeName = None


class PairCorpusConfig(Strict):
    """Dialogue pairs (input -> response) for the egregious-output models."""

    path: str = Field(description="CSV, JSONL/JSON or Parquet with an input and a response column, or a text file "
                                  "with one utterance per line (consecutive lines form pairs; blank lines end a dialogue).")
    format: Literal["auto", "csv", "jsonl", "json", "parquet", "dialogue"] = "auto"
    input_column: str = "context"
    output_column: str = "response"
    encoding: str = "utf-8"
    encoding_errors: Literal["strict", "replace"] = "strict"
    limit: int | None = Field(None, gt=0, description="Use at most this many pairs (seeded sample).")


class TriggerModelTrainConfig(Strict):
    """`redline train seq2seq` / `redline train lm`: the paper's LSTM dialogue models."""

    pairs: PairCorpusConfig
    test_pairs: PairCorpusConfig | None = Field(None, description="Held-out pairs; default: a seeded 10% of `pairs`.")
    vocab_size: int = Field(10_000, gt=4, description="The N most frequent words (plus <pad> <unk> <s> </s>).")
    max_input_len: int = Field(15, gt=0)
    max_output_len: int = Field(20, gt=0)
    context: Literal["last-h", "attention"] = Field("attention", description="seq2seq only: the decoder's context vector.")
    embedding_dim: int = Field(300, gt=0)
    hidden_dim: int = Field(600, gt=0)
    layers: int = Field(1, gt=0)
    dropout: float = Field(0.3, ge=0, lt=1)
    optimizer: Literal["sgd", "adam"] = Field("sgd", description="sgd: the paper's schedule (lr 1, halved when "
                                                                 "validation loss stops improving, gradient clipping).")
    learning_rate: float = Field(1.0, gt=0)
    lr_decay: float = Field(0.5, gt=0, le=1)
    clip: float = Field(5.0, gt=0)
    epochs: int = Field(10, gt=0)
    batch_size: int = Field(64, gt=0)
    seed: int = 0
    device: str = Field("auto", description="auto (cuda when available), cpu or cuda.")
    output: str = Field("redline-runs/models", description="Directory the model directory is written under.")
    name: SafeName = Field(None, description="Model directory name; default seq2seq-<context> or lm.")


class EgregiousModelConfig(Strict):
    """A generation model searched for triggers, with what its hit types need."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")
    path: str = Field(description="A redline LSTM seq2seq directory, or an HF causal / seq2seq LM (hub id or directory).")
    lm: str | None = Field(None, description="A redline LSTM LM directory for the io hit types (same vocabulary); "
                                             "an HF causal LM is its own LM.")
    t_out: float | None = Field(None, description="Override T_out (default: stored with the LSTM model, or estimated "
                                                  "on threshold_pairs).")
    t_in: float | None = None
    threshold_pairs: PairCorpusConfig | None = Field(None, description="Held-out pairs to estimate T_out / T_in of an HF model.")
    device: str = Field("auto", description="auto (cuda when the actor has a GPU), cpu or cuda.")
    dtype: Literal["float32", "float64"] = "float32"


class TargetListConfig(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$", description="mal, normal and random are built in; any other name needs path.")
    path: str | None = Field(None, description="One target per line (replaces the built-in list of that name).")
    limit: int | None = Field(None, gt=0, description="Search at most this many targets (a seeded sample).")


class EgregiousConfig(Strict):
    """`redline run egregious`: gibbs-enum trigger search over target lists, hit rates by hit type."""

    models: list[EgregiousModelConfig] = Field(min_length=1)
    lists: list[TargetListConfig] = Field(default_factory=lambda: [TargetListConfig(name=n) for n in ("normal", "mal", "random")])
    normal_inputs: PairCorpusConfig | None = Field(None, description="Test pairs whose inputs give the normal list "
                                                                     "(LSTM models; HF models need a normal list file).")
    searches: list[Literal["o-greedy", "o-sample-avg", "o-sample-min", "io-sample-avg", "io-sample-min"]] = Field(
        ["o-greedy", "o-sample-avg", "o-sample-min", "io-sample-avg", "io-sample-min"], min_length=1,
        description="Hit types to search for (each reports k = 1 and 2); io needs an LM.")
    method: Literal["gibbs-enum", "continuous"] = Field("gibbs-enum", description="continuous: the paper's relaxation baseline.")
    trigger_length: int = Field(5, gt=0)
    top_g: int = Field(100, gt=0, description="Candidate tokens per position (G).")
    max_sweeps: int = Field(50, gt=0, description="At most T sweeps over the positions.")
    restarts: int = Field(10, gt=0, description="R random restarts per target.")
    lm_weight: float = Field(1.0, ge=0)
    relaxation_steps: int = Field(200, gt=0)
    seed: int = 0
    actors: int = Field(1, gt=0)
    num_cpus: float = Field(1.0, gt=0)
    num_gpus: float = Field(0.0, ge=0)
    batch_size: int = Field(64, gt=0, description="Targets per actor call (searched together in one batch).")
    shard_size: int = Field(256, gt=0)
    output: str = "redline-runs"
    run_name: SafeName = None

    @model_validator(mode="after")
    def _unique(self) -> EgregiousConfig:
        unique_names(self.models, "model")
        unique_names(self.lists, "target list")
        for t in self.lists:
            if t.path is None and t.name not in ("mal", "normal", "random"):
                raise ValueError(f"target list '{t.name}' is not built in (mal, normal, random): give its path")
        return self


class PregeneratedResponses(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$", description="The model's name on the leaderboard.")
    path: str = Field(description="JSON or JSONL rows: {context, category?, responses: [...]}.")


class ScoringActors(Strict):
    """Actors that each load the two-step detector once and judge responses in batches."""

    actors: int = Field(1, gt=0)
    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0, description="1 puts the context classifiers on a GPU.")
    batch_size: int = Field(256, gt=0, description="Responses per batch.")
    precision: Precision = Field("auto", description=PRECISION_HELP)


class DiaSafetyEvalConfig(Strict):
    """`redline run diasafety`: evaluate chatbots on DiaSafety contexts with the two-step detector."""

    contexts: str = Field(description="DiaSafety JSON (validation or test split); its contexts are the prompts.")
    categories: list[str] | None = Field(None, description="Default: every category in the file.")
    max_contexts_per_category: int | None = Field(None, gt=0, description="A seeded sample per category.")
    generators: list[GeneratorConfig] = Field(default_factory=list, description="Models that generate responses.")
    pregenerated: list[PregeneratedResponses] = Field(default_factory=list,
                                                      description="Responses generated elsewhere, scored as they are.")
    responses_per_context: int = Field(10, gt=0)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    max_tokens: int = Field(32, gt=0)
    seed: int = 0
    utterance_detector: DetectorConfig = Field(description="Step 1: judges the response alone.")
    classifiers: str = Field(description="Step 2: a one-vs-all directory from `redline train dialogue-safety`.")
    batch_size: int = Field(16, gt=0, description="Contexts per generation batch.")
    actors: int = Field(1, gt=0)
    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0)
    scoring: ScoringActors = Field(default_factory=ScoringActors,
                                   description="The Ray Data actors that run the two-step detector.")
    output: str = "redline-runs"
    run_name: SafeName = None

    @model_validator(mode="after")
    def _models(self) -> "DiaSafetyEvalConfig":
        if not self.generators and not self.pregenerated:
            raise ValueError("give generators, pregenerated responses, or both")
        unique_names([*self.generators, *self.pregenerated], "model")
        return self


class TaebenchConfig(Strict):
    """`redline run taebench`: filter raw attack output into TaeBench (TAE) and TaeBench+ (+ BAE)."""

    attacks: str | list[str] = Field(description="Attack run directories (local or s3://) whose successes are filtered.")
    normalise: bool = Field(True, description="Deduplicate case- and whitespace-insensitively.")
    grammar: GrammarConfig | None = Field(default_factory=GrammarConfig,
                                          description="null turns the grammar stage off (recorded in the manifest).")
    naturalness: NaturalnessConfig | None = None
    judge: JudgeConfig | None = Field(None, description="LLM judge; a TAE needs its Yes, a BAE its No.")
    classifier: DetectorConfig | None = Field(None, description="Toxicity classifier; must agree with the judge.")
    test_fraction: float = Field(0.2, ge=0, le=1, description="Share of seeds whose examples form the test split.")
    seed: int = 0
    output: str = "redline-runs"
    run_name: SafeName = None

    @property
    def attack_runs(self) -> list[str]:
        return self.attacks if isinstance(self.attacks, list) else [self.attacks]

    @model_validator(mode="after")
    def _label_filter(self) -> "TaebenchConfig":
        if self.judge is None and self.classifier is None:
            raise ValueError("the label filter needs a judge, a classifier or both")
        return self


# --------------------------------------------------------------------------------------------
# Pipelines


class ScoreConfig(Strict):
    """`redline run score`: score labelled corpora with several detectors and report how each does."""

    corpus: CorpusConfig | list[CorpusConfig]
    detectors: list[DetectorConfig] = Field(min_length=1)
    output: str = Field("redline-runs", description="Local directory or s3:// URI holding run directories.")
    run_name: SafeName = Field(None, description="Run directory name; default: score-<config hash>.")
    shard_size: int = Field(2_000, gt=0, description="Rows per output shard (the unit of resume).")

    @field_validator("detectors")
    @classmethod
    def _unique_names(cls, detectors: list[DetectorConfig]) -> list[DetectorConfig]:
        return unique_names(detectors, "detector")

    @property
    def corpora(self) -> list[CorpusConfig]:
        return self.corpus if isinstance(self.corpus, list) else [self.corpus]


# Fields that change where or how fast work runs but not what it computes: left out of the run key
# so that, e.g., a rerun with more actors resumes the same run directory.
EXECUTION_FIELDS = {"output", "run_name", "batch_size", "actors", "num_cpus", "num_gpus", "tune_trials", "trial_cpus",
                    "trial_gpus",
                    # where and how politely an API is called, not what it answers (a failed call fails the
                    # run, so a run finished against a wrong endpoint cannot exist to be reused)
                    "base_url", "api_key_env", "concurrency", "requests_per_second", "timeout_s", "max_retries",
                    "backoff_s", "cache_dir", "allow_insecure_http"}


def config_hash(config: BaseModel) -> str:
    """A short stable hash of the result-affecting part of a config: the run directory key."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in EXECUTION_FIELDS}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    canonical = json.dumps(strip(config.model_dump(mode="json")), sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


# Config fields that name files, directories or models a run reads: their fingerprints are recorded
# in the manifest, and a run refuses to be reused or resumed once one of them has changed.
INPUT_FIELDS = {"path", "model", "patterns_file", "checkpoint", "classifiers", "contexts", "train", "val", "test",
                "taebench", "attacks", "base_model", "lm", "embeddings_file", "mlm_model", "sentence_encoder",
                "embedding_model", "template_file"}


def input_uris(config: BaseModel) -> list[str]:
    """Every s3:// URI or existing local path a config names in an input field (hub ids and model
    names of remote APIs are not files and are left out)."""
    found: list[str] = []

    def walk(value: Any, key: str | None = None) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, k)
        elif isinstance(value, list):
            for v in value:
                walk(v, key)
        elif key in INPUT_FIELDS and isinstance(value, str) and value:
            if value.startswith("s3://"):
                found.append(value)
            elif Path(value).expanduser().exists():
                found.append(str(Path(value).expanduser().absolute()))

    walk(config.model_dump(mode="json"))
    return list(dict.fromkeys(found))


# --------------------------------------------------------------------------------------------
# Loading


def _type_tag(part: Any) -> bool:
    """Pydantic names the member of a union it tried (`CorpusConfig`, `list[...]`, `str`) in an
    error's location; users wrote field names, not those."""
    return isinstance(part, str) and (part[:1].isupper() or "[" in part or part in {"str", "int", "float", "bool"})


def _first_error(err: ValidationError) -> str:
    """The errors as one line: union members' type tags dropped, and where a value was of the right
    type but wrong (say `limit: -5` against `int | list`), only that complaint, not the mismatches."""
    errors = err.errors()
    specific = [e for e in errors if not str(e["type"]).endswith("_type")]
    parts: dict[str, str] = {}
    for e in specific or errors:
        loc = ".".join(str(p) for p in e["loc"] if not _type_tag(p))
        msg = e["msg"].removeprefix("Value error, ")
        parts.setdefault(loc, f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts.values())


def validate_config(model: type[BaseModel], data: Any, source: str = "config") -> BaseModel:
    """Validate a parsed config, turning pydantic's report into one readable line."""
    if not isinstance(data, dict):
        raise RedlineError(f"{source}: expected a mapping of settings, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise RedlineError(f"{source}: {_first_error(err)}") from None


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise RedlineError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise RedlineError(f"{path}: config is not valid UTF-8 text") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise RedlineError(f"{path}: invalid YAML{where}: {problem}") from None
    return data if data is not None else {}


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Apply a CLI override like `corpus.limit=100` to a parsed config."""
    keys = dotted.split(".")
    node: Any = data
    for key in keys[:-1]:
        if isinstance(node, list):
            node = node[int(key)]
        else:
            node = node.setdefault(key, {})
    if isinstance(node, list):
        node[int(keys[-1])] = value
    else:
        node[keys[-1]] = value


def parse_overrides(sets: list[str] | None) -> dict[str, Any]:
    """`--set key=value` flags -> {dotted key: YAML-parsed value}."""
    out: dict[str, Any] = {}
    for item in sets or []:
        if "=" not in item:
            raise RedlineError(f"--set expects key=value, got {item!r}")
        key, raw = item.split("=", 1)
        try:
            out[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any], source: str) -> dict[str, Any]:
    for dotted, value in overrides.items():
        if value is not None:
            try:
                set_path(data, dotted, value)
            except (ValueError, IndexError, TypeError, AttributeError):
                raise RedlineError(f"cannot apply override {dotted}={value!r} to {source}") from None
    return data


def load_config(model: type[BaseModel], path: str | Path, overrides: dict[str, Any] | None = None) -> BaseModel:
    data = apply_overrides(load_yaml(path), overrides or {}, str(path))
    return validate_config(model, data, source=str(path))


class AttackConfig(Strict):
    """`redline run attack`: perturb seeds with attack recipes until the victim flips its decision."""

    corpus: CorpusConfig | list[CorpusConfig]
    victim: DetectorConfig = Field(description="The detector under attack (any detector kind).")
    recipes: list[Any] = Field(min_length=1, description="Recipe names, or {name: ..., query_budget: ...} overrides.")
    goals: list[Literal["tae", "bae"]] = Field(["tae"], min_length=1,
                                               description="tae: toxic seeds -> benign; bae: benign seeds -> toxic.")
    only_correct: bool = Field(True, description="Skip seeds the victim already gets wrong (TextAttack's `skipped`).")
    max_seeds: int | None = Field(None, gt=0, description="At most this many seeds per goal (a seeded sample).")
    similarity: Literal["auto", "always", "never"] = Field(
        "auto", description="Sentence-encoder similarity of seed and result: auto = for recipes with a "
                            "similarity constraint (their encoder is loaded anyway); always costs a model pass.")
    seed: int = 0
    resources: Any = Field(default_factory=dict, validate_default=True,
                           description="Models and files recipes use (see README).")
    actors: int = Field(1, gt=0, description="Attacker actors; each loads the victim and recipe models once.")
    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0)
    batch_size: int = Field(64, gt=0, description="Attempts each actor runs at once (their queries are batched).")
    output: str = "redline-runs"
    run_name: SafeName = None
    shard_size: int = Field(500, gt=0, description="Attempts per output shard (the unit of resume).")

    @field_validator("recipes")
    @classmethod
    def _recipes(cls, value: list[Any]) -> list[Any]:
        from redline.actors.attack.recipes import RecipeOptions, recipe

        out = []
        for item in value:
            opts = RecipeOptions(name=item) if isinstance(item, str) else RecipeOptions.model_validate(item)
            try:
                recipe(opts.name)
            except RedlineError as err:
                raise ValueError(str(err)) from None
            out.append(opts)
        names = [o.name for o in out]
        if len(set(names)) != len(names):
            raise ValueError("each recipe may be listed once")
        return out

    @field_validator("resources", mode="before")
    @classmethod
    def _resources(cls, value: Any) -> Any:
        from redline.actors.attack.recipes import AttackResources

        return AttackResources.model_validate(value or {})

    @property
    def corpora(self) -> list[CorpusConfig]:
        return self.corpus if isinstance(self.corpus, list) else [self.corpus]
