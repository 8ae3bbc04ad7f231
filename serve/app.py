"""The redline Serve application: one FastAPI ingress in front of detector and generator deployments.

`build_app(config)` turns a `ServeConfig` into a Serve application; it is also the import path a
generated `serve deploy` file points at. Every mistake a client can make gets a 4xx with an
OpenAI-style error body naming the problem; a replica that dies mid-request gives a 503.
"""


import asyncio
import logging
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import (
    BackPressureError,
    DeploymentUnavailableError,
    ReplicaUnavailableError,
    RequestCancelledError,
)
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException as StarletteHTTPException

from redline.actors.generators import PromptResult, SamplingParams
from redline.cluster import access
from redline.cluster.config import telling_errors, type_tag
from redline.cluster.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetectRequest,
    DetectResponse,
    DialogueSafetyRequest,
    ModerationRequest,
    Sampling,
    error_body,
    usage,
)
from redline.errors import first_line, unwrap_user_error
from redline.serve import budgets
from redline.serve.budgets import ApiError
from redline.serve.config import DeploymentSettings, ServeConfig
from redline.serve.deployments import (
    DetectorDeployment,
    DialogueSafetyDeployment,
    GeneratorDeployment,
)
from redline.serve.gate import Guard, access_rules

log = logging.getLogger(__name__)

api = FastAPI(title="redline", description="Toxicity detectors and dialogue models of redline, over HTTP.",
              version="1")


@api.exception_handler(ApiError)
async def _api_error(_: Request, err: ApiError) -> JSONResponse:
    return JSONResponse(error_body(err.message, err.kind, err.code, err.param), status_code=err.status)


@api.exception_handler(RequestValidationError)
async def _invalid_body(_: Request, err: RequestValidationError) -> JSONResponse:
    errors = telling_errors(list(err.errors()))
    first = errors[0] if errors else {"msg": "invalid request", "loc": (), "type": ""}
    loc = [str(p) for p in first.get("loc", ()) if p != "body" and not type_tag(p)]
    msg = str(first["msg"]).removeprefix("Value error, ")
    if first.get("type") == "json_invalid":
        message = f"request body is not valid JSON ({first.get('ctx', {}).get('error', msg)})"
    elif first.get("type") == "missing" and loc:
        message = f"missing field '{'.'.join(loc)}'"
    else:
        message = f"{'.'.join(loc) + ': ' if loc else ''}{msg}"
    param = None if first.get("type") == "json_invalid" else (".".join(loc) or None)
    return JSONResponse(error_body(message, param=param), status_code=400)


@api.exception_handler(StarletteHTTPException)
async def _http_error(_: Request, err: StarletteHTTPException) -> JSONResponse:
    return JSONResponse(error_body(str(err.detail), "not_found_error" if err.status_code == 404 else
                                   "invalid_request_error"), status_code=err.status_code)


api.add_middleware(Guard)  # the Host rule, the key and the budgets, before any route (serve/gate.py)


def _model_failure(err: BaseException) -> ApiError:
    user = unwrap_user_error(err)
    if user is not None:
        return ApiError(400, first_line(user))
    if isinstance(err, BackPressureError):
        return ApiError(503, "the model is at capacity; retry shortly", "service_unavailable", "overloaded")
    if isinstance(err, (RayActorError, DeploymentUnavailableError, ReplicaUnavailableError, RequestCancelledError)):
        return ApiError(503, "the model replica serving this request failed; it is being replaced, retry shortly",
                        "service_unavailable", "replica_failed")
    log.error("model call failed: %s", err)
    return ApiError(500, f"model call failed ({type(err).__name__})", "server_error")


@serve.deployment
@serve.ingress(api)
class Ingress:
    def __init__(self, config: ServeConfig, detectors: dict[str, DeploymentHandle],
                 generators: dict[str, DeploymentHandle], api_key_sha256: str | None = None,
                 dialogue_safety: DeploymentHandle | None = None,
                 vllm: dict[str, DeploymentHandle] | None = None, key_from_driver: bool = False) -> None:
        self.config = config
        self.dialogue_safety = dialogue_safety
        self.limits = self.config.limits
        self.detectors = detectors
        # vLLM servers (ray.serve.llm) sit behind this ingress like every other model: same key, Host
        # rule and budgets; they have no HTTP route of their own.
        self.vllm = vllm or {}
        self.generators = {**generators, **self.vllm}
        self.created = int(time.time())
        api.state.keys, api.state.hosts = access_rules(self.config, api_key_sha256, key_from_driver)
        api.state.limits = self.limits
        self._infos: dict[str, dict[str, Any]] = {}

    async def _call(self, call: Any) -> Any:
        try:
            return await asyncio.wait_for(call, timeout=self.limits.request_timeout_s)
        except asyncio.TimeoutError:
            raise ApiError(504, f"the model did not answer within {self.limits.request_timeout_s:g}s",
                           "timeout_error") from None
        except ApiError:
            raise
        except Exception as err:  # noqa: BLE001 - every failure becomes a clear HTTP error
            raise _model_failure(err) from None

    async def _info(self, name: str) -> dict[str, Any]:
        if name not in self._infos:
            self._infos[name] = await self._call(self.detectors[name].info.remote())
        return self._infos[name]

    def _check_texts(self, texts: list[str], field: str) -> None:
        budgets.check_texts(texts, field, self.limits)

    def _detector_names(self, names: list[str] | None, texts: int) -> list[str]:
        return budgets.detector_names(names, list(self.detectors), texts, self.limits)

    async def _detect(self, texts: list[str], names: list[str]) -> dict[str, list[dict[str, Any]]]:
        calls = [self._call(self.detectors[n].detect.remote(texts)) for n in names]
        return dict(zip(names, await asyncio.gather(*calls)))

    # -- routes ------------------------------------------------------------------------------

    @api.get("/healthz")
    async def healthz(self) -> dict[str, Any]:
        return {"status": "ok", "detectors": list(self.detectors), "generators": list(self.generators)}

    @api.get("/v1/detectors")
    async def list_detectors(self) -> dict[str, Any]:
        return {"object": "list", "data": [await self._info(n) for n in self.detectors]}

    @api.post("/v1/detect")
    async def detect(self, body: DetectRequest) -> dict[str, Any]:
        self._check_texts(body.texts, "texts")
        names = self._detector_names(body.detectors, len(body.texts))
        rows = await self._detect(body.texts, names)
        infos = {n: await self._info(n) for n in names}
        results = []
        for i in range(len(body.texts)):
            detections = {}
            for n in names:
                row = rows[n][i]
                if "error" in row:
                    detections[n] = {"error": row["error"]}
                else:
                    detections[n] = {"toxic": row["toxic"], "label": "toxic" if row["toxic"] else "benign",
                                     "toxic_score": row["toxic_score"],
                                     "probs": dict(zip(infos[n]["labels"], row["probs"]))}
            results.append({"index": i, "detections": detections})
        return DetectResponse(detectors=names, results=results).model_dump(exclude_none=True)

    @api.post("/v1/moderations")
    async def moderations(self, body: ModerationRequest) -> dict[str, Any]:
        texts = [body.input] if isinstance(body.input, str) else body.input
        self._check_texts(texts, "input")
        name = self._detector_names([body.model] if body.model else None, len(texts))[0]
        rows = (await self._detect(texts, [name]))[name]
        info = await self._info(name)
        results = []
        for row in rows:
            if "error" in row:
                raise ApiError(500, f"detector '{name}' failed on a text: {row['error']}", "server_error")
            probs = dict(zip(info["labels"], row["probs"]))
            thresholds = info["label_thresholds"]
            flags = {lab: lab in info["toxic_labels"] and p >= thresholds[lab] for lab, p in probs.items()}
            results.append({"flagged": row["toxic"], "categories": flags, "category_scores": probs,
                            "toxic_score": row["toxic_score"]})
        return {"id": f"modr-{uuid.uuid4().hex}", "model": name, "results": results}

    @api.post("/v1/dialogue-safety")
    async def dialogue_safety_check(self, body: DialogueSafetyRequest) -> dict[str, Any]:
        if self.dialogue_safety is None:
            raise ApiError(404, "this server hosts no dialogue-safety detector", "not_found_error")
        self._check_texts([p.response for p in body.pairs], "pairs")
        self._check_texts([p.context for p in body.pairs], "pairs")
        pairs = [(p.context, p.response, p.category) for p in body.pairs]
        results = await self._call(self.dialogue_safety.check.remote(pairs))
        return {"object": "dialogue-safety", "results": [{"index": i, **r} for i, r in enumerate(results)]}

    @api.get("/v1/stats")
    async def stats(self) -> dict[str, Any]:
        """Counters of the replica that answers for each model: requests, model calls, items."""
        out = {}
        for kind, handles in (("detectors", self.detectors), ("generators", self.generators)):
            names = list(handles)
            values = await asyncio.gather(*(self._call(handles[n].stats.remote()) for n in names))
            out[kind] = dict(zip(names, values))
        return out

    @api.get("/v1/models")
    async def models(self) -> dict[str, Any]:
        data = [{"id": n, "object": "model", "created": self.created, "owned_by": "redline", "type": "generator"}
                for n in self.generators]
        data += [{"id": n, "object": "model", "created": self.created, "owned_by": "redline", "type": "detector"}
                 for n in self.detectors]
        return {"object": "list", "data": data}

    def _sampling(self, body: Sampling, prompts: int = 1) -> tuple[DeploymentHandle, SamplingParams]:
        return self.generators[budgets.generator(body, list(self.generators))], \
            budgets.sampling_params(body, prompts, self.limits)

    async def _vllm(self, method: str, body: Sampling, params: SamplingParams, **fields: Any) -> dict[str, Any]:
        """A request to a vLLM server with the sampling settings this ingress validated and bounded."""
        from ray.serve.llm import openai_api_models as oai

        request_type = oai.ChatCompletionRequest if method == "chat" else oai.CompletionRequest
        request = request_type(model=body.model, n=params.n, temperature=params.temperature, top_p=params.top_p,
                               max_tokens=params.max_tokens, stop=list(params.stop) or None, seed=params.seed,
                               stream=False, **fields)
        handle = self.vllm[body.model].options(stream=True)

        async def collect() -> Any:
            last = None
            async for part in getattr(handle, method).remote(request):
                last = part
            return last

        out = await self._call(collect())
        if out is None or getattr(out, "error", None) is not None or not hasattr(out, "model_dump"):
            cause = getattr(getattr(out, "error", None), "message", None) or "no response"
            raise ApiError(502, f"the vLLM server for '{body.model}' failed: {cause}", "server_error")
        return out.model_dump(exclude_none=True)

    @api.post("/v1/chat/completions")
    async def chat_completions(self, body: ChatCompletionRequest) -> dict[str, Any]:
        handle, params = self._sampling(body)
        for i, m in enumerate(body.messages):
            if len(m.content) > self.limits.max_text_chars:
                raise ApiError(413, f"messages[{i}] has {len(m.content)} characters; the limit is "
                                    f"{self.limits.max_text_chars}", code="text_too_long", param="messages")
        messages = [{"role": m.role, "content": m.content} for m in body.messages]
        if body.model in self.vllm:
            return await self._vllm("chat", body, params, messages=messages)
        result: PromptResult = (await self._call(handle.chat.remote(messages, params)))[0]
        choices = [{"index": j, "message": {"role": "assistant", "content": c.text}, "finish_reason": c.finish_reason,
                    "logprobs": None} for j, c in enumerate(result.completions)]
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": body.model, "choices": choices,
                "usage": usage(result.prompt_tokens, sum(c.tokens for c in result.completions))}

    @api.post("/v1/completions")
    async def completions(self, body: CompletionRequest) -> dict[str, Any]:
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        self._check_texts(prompts, "prompt")
        handle, params = self._sampling(body, len(prompts))
        if body.model in self.vllm:
            return await self._vllm("completions", body, params, prompt=prompts)
        results: list[PromptResult] = await self._call(handle.generate.remote(prompts, params))
        choices, prompt_tokens, completion_tokens = [], 0, 0
        for i, r in enumerate(results):
            prompt_tokens += r.prompt_tokens
            for j, c in enumerate(r.completions):
                completion_tokens += c.tokens
                choices.append({"index": i * params.n + j, "text": c.text, "finish_reason": c.finish_reason,
                                "logprobs": None})
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": body.model, "choices": choices, "usage": usage(prompt_tokens, completion_tokens)}


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=10_000)
class Health:
    """`GET {route_prefix}/healthz` as an application of its own: the proxy routes it to this replica,
    so a health check never waits behind the requests queued for the ingress (a flood of detections
    keeps it answering in milliseconds). It follows the same Host rule; it is public, like every
    health check."""

    def __init__(self, config: ServeConfig) -> None:
        self.hosts = access.HostRule(config.host, config.allowed_hosts)
        self.body = {"status": "ok", "detectors": [d.name for d in config.detectors],
                     "generators": [g.name for g in config.generators]}

    async def __call__(self, request: Request) -> JSONResponse:
        host = request.headers.get("host")
        if not self.hosts.allows(host):
            return JSONResponse(error_body(self.hosts.refusal(host), code="misdirected_request"), status_code=421)
        if request.url.path != request.scope.get("root_path", ""):  # exact: "/healthz/" is not public
            return JSONResponse(error_body("Not Found", "not_found_error"), status_code=404)
        return JSONResponse(self.body)


def health_app(config: ServeConfig) -> tuple[str, Any, str]:
    """(application name, application, route prefix) of the health check."""
    return f"{config.app_name}-health", Health.bind(config), health_route(config)


def health_route(config: ServeConfig) -> str:
    return f"{config.route_prefix.rstrip('/')}/healthz"


def deployment_options(settings: DeploymentSettings, num_cpus: float, num_gpus: float) -> dict[str, Any]:
    """Serve options (replicas or autoscaling, concurrency, resources) from our settings."""
    opts: dict[str, Any] = {"max_ongoing_requests": settings.max_ongoing_requests,
                            "ray_actor_options": {"num_cpus": num_cpus, "num_gpus": num_gpus}}
    if settings.autoscaling is not None:
        a = settings.autoscaling
        opts["autoscaling_config"] = {"min_replicas": a.min_replicas, "max_replicas": a.max_replicas,
                                      "target_ongoing_requests": a.target_ongoing_requests}
    else:
        opts["num_replicas"] = settings.replicas
    return opts


def build_app(config: ServeConfig | dict[str, Any], api_key_sha256: str | None = None,
              key_from_driver: bool = False) -> Any:
    """The Serve application for `config`: one ingress in front of every model (vLLM ones included).
    `key_from_driver`: the driver's key (`api_key_sha256`, None: no key) decides, never the replicas'
    environment (an embedded Ray's workers inherit whatever the driver's environment held when Ray
    started, not what it holds now)."""
    cfg = config if isinstance(config, ServeConfig) else ServeConfig.model_validate(config)
    detectors = {
        d.name: DetectorDeployment.options(name=f"detector-{d.name}", **deployment_options(d.serve, d.num_cpus, d.num_gpus))
        .bind(d)
        for d in cfg.detectors
    }
    generators = {
        g.name: GeneratorDeployment.options(name=f"generator-{g.name}", **deployment_options(g.serve, g.num_cpus, g.num_gpus))
        .bind(g)
        for g in cfg.generators if g.backend == "hf"
    }
    vllm = {g.name: vllm_deployment(g) for g in cfg.generators if g.backend == "vllm"}
    dialogue = None
    if cfg.dialogue_safety is not None:
        d = cfg.dialogue_safety
        dialogue = DialogueSafetyDeployment.options(
            name="dialogue-safety", **deployment_options(d.serve, d.num_cpus, d.num_gpus)).bind(d)
    # The proxy queues at most max_queued_requests for the ingress and answers the rest 503 itself: a
    # flood is refused at the door, before any request reaches Python in a replica.
    ingress = {**deployment_options(cfg.ingress, 0.1, 0), "max_queued_requests": cfg.limits.max_queued_requests}
    return Ingress.options(name="ingress", **ingress).bind(
        cfg, detectors, generators, api_key_sha256, dialogue, vllm, key_from_driver)


def vllm_deployment(generator: Any) -> Any:
    """A `ray.serve.llm` vLLM server for one generator, bound without an HTTP route of its own."""
    from ray.serve.llm import LLMConfig, build_llm_deployment

    opts = deployment_options(generator.serve, generator.num_cpus, generator.num_gpus)
    deployment = {k: v for k, v in opts.items() if k in ("num_replicas", "autoscaling_config", "max_ongoing_requests")}
    if "num_replicas" in deployment:
        n = deployment.pop("num_replicas")
        deployment["autoscaling_config"] = {"min_replicas": n, "max_replicas": n}
    llm = LLMConfig(model_loading_config={"model_id": generator.name, "model_source": generator.model},
                    deployment_config=deployment)
    return build_llm_deployment(llm, name_prefix=f"vllm-{generator.name}-")


def app_builder(args: dict[str, Any]) -> Any:
    """Entry point of generated `serve deploy` files: `args` holds `config` (a ServeConfig)."""
    if "config" not in args:
        raise ValueError("redline.serve.app:app_builder needs args.config (a redline serve config)")
    return build_app(args["config"])


def health_builder(args: dict[str, Any]) -> Any:
    """Entry point of the health application in generated `serve deploy` files."""
    if "config" not in args:
        raise ValueError("redline.serve.app:health_builder needs args.config (a redline serve config)")
    return Health.bind(ServeConfig.model_validate(args["config"]))
