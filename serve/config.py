"""The `redline serve` config: detectors, generators and the two-step dialogue-safety detector as
HTTP services, with their replicas, batching, host, port and per-request limits."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from redline.actors.detectors import DetectorConfig
from redline.actors.generators import GeneratorConfig
from redline.cluster.config import Execution, Input, Result, Strict, unique_names

HostName = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=r"^(\*|[A-Za-z0-9.\-:\[\]]+)$")]


class Autoscaling(Strict):
    min_replicas: int = Execution(1, ge=0)
    max_replicas: int = Execution(2, gt=0)
    target_ongoing_requests: float = Execution(8.0, gt=0)


class BatchSettings(Strict):
    """How `@serve.batch` merges concurrent requests into one model call."""

    enabled: bool = Execution(True, description="false: every request is its own model call.")
    max_batch_size: int = Execution(32, gt=0, le=4096, description="Requests merged into one model call.")
    wait_timeout_s: float = Execution(0.005, ge=0, le=10, description="How long a batch waits to fill.")


class DeploymentSettings(Strict):
    """Replicas (fixed or autoscaled), request concurrency and batching of one served model."""

    replicas: int = Execution(1, gt=0)
    autoscaling: Autoscaling | None = None
    max_ongoing_requests: int = Execution(128, gt=0)
    batch: BatchSettings = Field(default_factory=BatchSettings)


class ServedDetectorConfig(DetectorConfig):
    """A detector plus how it is served."""

    serve: DeploymentSettings = Field(default_factory=DeploymentSettings)


class ServedGeneratorConfig(GeneratorConfig):
    serve: DeploymentSettings = Field(default_factory=lambda: DeploymentSettings(batch=BatchSettings(max_batch_size=8)))
    backend: Literal["hf", "vllm"] = Result("hf", description="vllm serves the model through ray.serve.llm (needs "
                                                              "vLLM and a GPU).")

    @model_validator(mode="after")
    def _servable(self) -> "ServedGeneratorConfig":
        if self.provider != "hf":
            raise ValueError(f"generator '{self.name}': Serve hosts Hugging Face models (provider hf), not "
                             f"{self.provider}")
        return self


class ServedDialogueSafety(Strict):
    """The two-step dialogue-safety detector behind POST /v1/dialogue-safety."""

    utterance: DetectorConfig = Field(description="Step 1: judges the response alone.")
    classifiers: str = Input(description="Step 2: a directory from `redline train dialogue-safety`.")
    num_cpus: float = Execution(1.0, ge=0)
    num_gpus: float = Execution(0.0, ge=0)
    serve: DeploymentSettings = Field(default_factory=DeploymentSettings)


class ServeLimits(Strict):
    """What one request may ask for; more is refused with a 4xx naming the limit."""

    max_texts: int = Execution(256, gt=0, description="Texts per /v1/detect or /v1/moderations request (pairs per "
                                                   "/v1/dialogue-safety request, prompts per /v1/completions request).")
    max_detections: int = Execution(4096, gt=0, description="Texts x detectors per /v1/detect request.")
    max_text_chars: int = Execution(20_000, gt=0)
    max_request_bytes: int = Execution(8_000_000, gt=0, description="Largest request body.")
    max_concurrent_requests: int = Execution(64, gt=0, description="Requests an ingress replica handles at once; more "
                                                               "get 503 + Retry-After at once (/healthz is exempt).")
    max_inflight_bytes: int = Execution(64_000_000, gt=0, description="Request bodies an ingress replica holds at once "
                                                                  "(declared or at most max_request_bytes each); "
                                                                  "more get 503 + Retry-After.")
    max_queued_requests: int = Execution(256, gt=0, description="Requests the HTTP proxy holds for the ingress beyond "
                                                              "those in progress; more get 503 from the proxy itself.")
    body_timeout_s: float = Execution(30.0, gt=0, description="The whole request body must arrive within this time "
                                                          "(a slow client gets 408).")
    max_n: int = Execution(16, gt=0, description="Completions per prompt.")
    max_tokens: int = Execution(1024, gt=0, description="Largest max_tokens a request may ask for.")
    max_generated_tokens: int = Execution(32_768, gt=0, description="n x prompts x max_tokens per generation request.")
    default_max_tokens: int = Execution(64, gt=0)
    request_timeout_s: float = Execution(120.0, gt=0)


class ServeConfig(Strict):
    """`redline serve`: detectors and generation models as HTTP services on Ray Serve."""

    proxy_location: Literal["EveryNode", "HeadOnly"] = Execution(
        "EveryNode", description="Where Serve runs HTTP proxies: on every node (Ray's default), or on the head only "
                                 "(several nodes sharing one machine, as in tests, need HeadOnly).")
    host: str = Execution(
        "127.0.0.1", description="Address the HTTP proxy binds to; 0.0.0.0 exposes it to the network.")
    port: int = Execution(8000, gt=0, lt=65536)
    app_name: str = Execution("redline", pattern=r"^[A-Za-z0-9_\-]+$")
    route_prefix: str = Execution(
        "/", pattern=r"^/[A-Za-z0-9_\-/]*$", description="Where the API lives under the server.")
    api_key_env: str | None = Execution("REDLINE_API_KEY", description="When this environment variable is set at "
                                                                   "start-up, every request but /healthz must carry "
                                                                   "its value.")
    insecure: bool = Execution(False, description="Allow serving on a non-loopback host without an API key (anyone who "
                                              "can reach the port can use the models).")
    allowed_hosts: list[HostName] = Execution(default_factory=list, description=(
        "Other names the server answers to in the Host header (localhost names and the bound address always work; "
        "on host 0.0.0.0 also IP addresses and this machine's names). '*' answers any name: only behind a proxy "
        "that checks Host itself."), max_length=64)
    detectors: list[ServedDetectorConfig] = Field(default_factory=list)
    generators: list[ServedGeneratorConfig] = Field(default_factory=list)
    dialogue_safety: ServedDialogueSafety | None = None
    limits: ServeLimits = Field(default_factory=ServeLimits)
    ingress: DeploymentSettings = Field(default_factory=lambda: DeploymentSettings(max_ongoing_requests=512))
    start_timeout_s: float = Execution(600.0, gt=0, description="Give up if the models are not serving by then.")

    @model_validator(mode="after")
    def _check(self) -> "ServeConfig":
        if not self.detectors and not self.generators and self.dialogue_safety is None:
            raise ValueError("serve needs at least one detector or generator")
        unique_names(self.detectors, "detector")
        unique_names(self.generators, "generator")
        return self
