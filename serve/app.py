"""The redline Serve application: one FastAPI ingress in front of detector and generator deployments.

`build_app(config)` turns a `ServeConfig` into a Serve application; it is also the import path a
generated `serve deploy` file points at. Every mistake a client can make gets a 4xx with an
OpenAI-style error body naming the problem; a replica that dies mid-request gives a 503.
"""


import asyncio
import hashlib
import hmac
import logging
import os
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
from redline.serve.config import DeploymentSettings, ServeConfig, ServeLimits
from redline.serve.deployments import (
    DetectorDeployment,
    DialogueSafetyDeployment,
    GeneratorDeployment,
)

log = logging.getLogger(__name__)

PUBLIC_PATHS = {"/healthz"}  # exact paths below the route prefix; /docs and /openapi.json need the key too

api = FastAPI(title="redline", description="Toxicity detectors and dialogue models of redline, over HTTP.",
              version="1")


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.param = status, message, kind, code, param


@api.exception_handler(ApiError)
async def _api_error(_: Request, err: ApiError) -> JSONResponse:
    return JSONResponse(error_body(err.message, err.kind, err.code, err.param), status_code=err.status)


@api.exception_handler(RequestValidationError)
async def _invalid_body(_: Request, err: RequestValidationError) -> JSONResponse:
    first = err.errors()[0] if err.errors() else {"msg": "invalid request", "loc": ()}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        message = f"request body is not valid JSON ({first.get('ctx', {}).get('error', first['msg'])})"
    elif first.get("type") == "missing" and loc:
        message = f"missing field '{'.'.join(loc)}'"
    else:
        message = f"{'.'.join(loc) + ': ' if loc else ''}{first['msg']}"
    param = None if first.get("type") == "json_invalid" else (".".join(loc) or None)
    return JSONResponse(error_body(message, param=param), status_code=400)


@api.exception_handler(StarletteHTTPException)
async def _http_error(_: Request, err: StarletteHTTPException) -> JSONResponse:
    return JSONResponse(error_body(str(err.detail), "not_found_error" if err.status_code == 404 else
                                   "invalid_request_error"), status_code=err.status_code)


class Guard:
    """Pure ASGI middleware, before any route: the API key on every path but /healthz (matched exactly,
    below the route prefix), then the body size, enforced while the body streams in, so neither a
    false Content-Length nor a chunked upload gets a byte past the limit read or parsed."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        app = scope.get("app")  # the FastAPI app this replica serves (Starlette sets it before middleware)
        state = app.state if app is not None else api.state
        limits: ServeLimits | None = getattr(state, "limits", None)
        if scope["type"] != "http" or limits is None:
            await self.app(scope, receive, send)
            return
        path, root = scope.get("path", ""), scope.get("root_path", "")
        relative = path[len(root):] if root and path.startswith(root) else path
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        key_hash = getattr(state, "api_key_sha256", None)
        if key_hash and relative not in PUBLIC_PATHS:
            auth = headers.get("authorization", "")
            given = auth[7:].strip() if auth.lower().startswith("bearer ") else headers.get("x-api-key", "")
            if not given or not hmac.compare_digest(hashlib.sha256(given.encode()).hexdigest(), key_hash):
                await _reply(scope, receive, send, 401, "missing or invalid API key (send `Authorization: Bearer <key>`)",
                             "authentication_error", "invalid_api_key")
                return
        limit = limits.max_request_bytes
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            await _reply(scope, receive, send, 413, f"request body of {length} bytes exceeds the limit of {limit}",
                         code="request_too_large")
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await _reply(scope, receive, send, 413, f"request body exceeds the limit of {limit} bytes",
                             code="request_too_large")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body, delivered = b"".join(chunks), False

        async def replay() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _reply(scope: dict[str, Any], receive: Any, send: Any, status: int, message: str,
                 kind: str = "invalid_request_error", code: str | None = None) -> None:
    await JSONResponse(error_body(message, kind, code), status_code=status)(scope, receive, send)


api.add_middleware(Guard)


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
    def __init__(self, config: dict[str, Any], detectors: dict[str, DeploymentHandle],
                 generators: dict[str, DeploymentHandle], api_key_sha256: str | None = None,
                 dialogue_safety: DeploymentHandle | None = None) -> None:
        self.config = ServeConfig.model_validate(config)
        self.dialogue_safety = dialogue_safety
        self.limits = self.config.limits
        self.detectors = detectors
        self.generators = generators
        self.created = int(time.time())
        if api_key_sha256 is None and self.config.api_key_env and os.environ.get(self.config.api_key_env):
            api_key_sha256 = hashlib.sha256(os.environ[self.config.api_key_env].encode()).hexdigest()
        api.state.limits = self.limits
        api.state.api_key_sha256 = api_key_sha256
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
        if not texts:
            raise ApiError(400, f"{field} is empty: send at least one text", param=field)
        if len(texts) > self.limits.max_texts:
            raise ApiError(413, f"{len(texts)} texts in one request; the limit is {self.limits.max_texts}",
                           code="too_many_texts", param=field)
        for i, t in enumerate(texts):
            if not t.strip():
                raise ApiError(400, f"{field}[{i}] is empty", param=field)
            if len(t) > self.limits.max_text_chars:
                raise ApiError(413, f"{field}[{i}] has {len(t)} characters; the limit is {self.limits.max_text_chars}",
                               code="text_too_long", param=field)

    def _detector_names(self, names: list[str] | None, texts: int) -> list[str]:
        """The detectors a request names (each once), or every served one when it names none; the
        request's work (texts x detectors) must fit `max_detections`."""
        if not self.detectors:
            raise ApiError(404, "this server hosts no detectors", "not_found_error")
        if names is not None and not names:
            raise ApiError(400, "detectors is empty: name at least one detector, or leave the field out for all",
                           param="detectors")
        chosen = list(dict.fromkeys(names)) if names else list(self.detectors)
        unknown = [n for n in chosen if n not in self.detectors]
        if unknown:
            raise ApiError(404, f"unknown detector '{unknown[0]}' (served: {', '.join(self.detectors)})",
                           "not_found_error", "model_not_found", "detectors")
        work = texts * len(chosen)
        if work > self.limits.max_detections:
            raise ApiError(413, f"{texts} texts x {len(chosen)} detectors = {work} detections in one request; the "
                                f"limit is {self.limits.max_detections}", code="too_much_work", param="detectors")
        return chosen

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
            threshold = info["threshold"]
            flags = {lab: (p >= (threshold.get(lab, 0.5) if isinstance(threshold, dict) else threshold)
                           if lab in info["toxic_labels"] else False) for lab, p in probs.items()}
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
        if body.stream:
            raise ApiError(400, "streaming is not supported; send stream=false", param="stream")
        if body.model not in self.generators:
            served = ", ".join(self.generators) or "none"
            raise ApiError(404, f"unknown model '{body.model}' (served generators: {served})", "not_found_error",
                           "model_not_found", "model")
        if body.n > self.limits.max_n:
            raise ApiError(400, f"n={body.n} exceeds the limit of {self.limits.max_n}", param="n")
        max_tokens = body.max_completion_tokens or body.max_tokens or self.limits.default_max_tokens
        if max_tokens > self.limits.max_tokens:
            raise ApiError(400, f"max_tokens={max_tokens} exceeds the limit of {self.limits.max_tokens}",
                           param="max_tokens")
        budget = body.n * prompts * max_tokens
        if budget > self.limits.max_generated_tokens:
            raise ApiError(413, f"n={body.n} x {prompts} prompt(s) x max_tokens={max_tokens} = {budget} tokens in one "
                                f"request; the limit is {self.limits.max_generated_tokens}", code="too_much_work")
        params = SamplingParams(n=body.n, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                                max_tokens=max_tokens, stop=body.stops(), seed=body.seed)
        return self.generators[body.model], params

    @api.post("/v1/chat/completions")
    async def chat_completions(self, body: ChatCompletionRequest) -> dict[str, Any]:
        handle, params = self._sampling(body)
        for i, m in enumerate(body.messages):
            if len(m.content) > self.limits.max_text_chars:
                raise ApiError(413, f"messages[{i}] has {len(m.content)} characters; the limit is "
                                    f"{self.limits.max_text_chars}", code="text_too_long", param="messages")
        messages = [{"role": m.role, "content": m.content} for m in body.messages]
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


def build_app(config: ServeConfig | dict[str, Any], api_key_sha256: str | None = None) -> Any:
    """The Serve application for `config` (HF generators only; vLLM ones are a separate app)."""
    cfg = config if isinstance(config, ServeConfig) else ServeConfig.model_validate(config)
    detectors = {
        d.name: DetectorDeployment.options(name=f"detector-{d.name}", **deployment_options(d.serve, d.num_cpus, d.num_gpus))
        .bind(d.model_dump(mode="json"))
        for d in cfg.detectors
    }
    generators = {
        g.name: GeneratorDeployment.options(name=f"generator-{g.name}", **deployment_options(g.serve, g.num_cpus, g.num_gpus))
        .bind(g.model_dump(mode="json"))
        for g in cfg.generators if g.backend == "hf"
    }
    dialogue = None
    if cfg.dialogue_safety is not None:
        d = cfg.dialogue_safety
        dialogue = DialogueSafetyDeployment.options(
            name="dialogue-safety", **deployment_options(d.serve, d.num_cpus, d.num_gpus)).bind(d.model_dump(mode="json"))
    return Ingress.options(name="ingress", **deployment_options(cfg.ingress, 0.1, 0)).bind(
        cfg.model_dump(mode="json"), detectors, generators, api_key_sha256, dialogue)


def app_builder(args: dict[str, Any]) -> Any:
    """Entry point of generated `serve deploy` files: `args` holds `config` (a ServeConfig)."""
    if "config" not in args:
        raise ValueError("redline.serve.app:app_builder needs args.config (a redline serve config)")
    return build_app(args["config"])
