"""`redline serve`: start, inspect and stop the Serve applications of a ServeConfig.

Locally (no RAY_ADDRESS) `start` runs an embedded Ray in the foreground until it is stopped (Ctrl-C,
SIGTERM or `redline serve stop`). With RAY_ADDRESS the applications are deployed on that cluster
and keep running after the command returns. Either way a small state file per port records where
the server is, so `status` and `stop` find it from another shell.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

from redline.cluster import storage
from redline.cluster.net import is_loopback
from redline.cluster.runtime import ensure_ray
from redline.errors import RedlineError
from redline.serve.config import ServeConfig

log = logging.getLogger(__name__)

VLLM_ROUTE = "/vllm"


class PortTaken(RedlineError):
    """Another process bound the port first (it was free when checked)."""


def state_dir() -> Path:
    return Path(os.environ.get("REDLINE_STATE_DIR") or storage.user_cache_dir() / "serve")


_STARTED_HERE: set[int] = set()  # ports this process runs Serve on


def state_path(port: int, app_name: str) -> Path:
    return state_dir() / f"serve-{port}-{app_name}.json"


def read_states(port: int | None = None) -> list[dict[str, Any]]:
    paths = sorted(state_dir().glob(f"serve-{port or '*'}-*.json"))
    states = []
    for p in paths:
        try:
            states.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return states


def url_of(config: ServeConfig) -> str:
    host = "127.0.0.1" if config.host in ("0.0.0.0", "::") else config.host
    return f"http://{host}:{config.port}{config.route_prefix.rstrip('/')}"


def api_key_sha256(config: ServeConfig) -> str | None:
    key = os.environ.get(config.api_key_env) if config.api_key_env else None
    return hashlib.sha256(key.encode()).hexdigest() if key else None


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _check_port_free(host: str, port: int) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as err:
            raise RedlineError(f"cannot serve on {host}:{port}: {err.strerror or err} "
                               f"(is another server running? see `redline serve status`)") from None


def check_exposure(config: ServeConfig) -> None:
    """A server other machines can reach needs an API key, unless the user says otherwise."""
    if not is_loopback(config.host) and api_key_sha256(config) is None and not config.insecure:
        where = f"${config.api_key_env}" if config.api_key_env else "an api_key_env variable"
        raise RedlineError(f"serve: host {config.host} exposes the models to the network without an API key; set "
                           f"{where} to a secret, or pass --insecure (insecure: true) to serve without one")


def preflight(config: ServeConfig) -> None:
    """Exposure, model files and detector settings checked before any replica starts."""
    from redline.actors.detectors import preflight_detector
    from redline.actors.dialogue_safety.classifiers import check_classifiers

    check_exposure(config)
    for d in config.detectors:
        preflight_detector(d)
    if config.dialogue_safety is not None:
        ds = config.dialogue_safety
        preflight_detector(ds.utterance)
        check_classifiers(ds.classifiers)
    for g in config.generators:
        if g.backend == "vllm":
            try:
                import vllm  # noqa: F401
            except ImportError:
                raise RedlineError(f"generator '{g.name}' uses backend vllm, which is not installed "
                                   f"(pip install vllm on a GPU machine, or use backend hf)") from None
            continue
        from transformers import AutoConfig

        from redline.errors import first_line

        try:
            AutoConfig.from_pretrained(g.model, revision=g.revision)
        except (OSError, ValueError) as err:
            raise RedlineError(f"generator '{g.name}': cannot load model '{g.model}': {first_line(err)}") from None


def vllm_app(config: ServeConfig) -> Any:
    """An OpenAI-compatible `ray.serve.llm` application for the generators with backend vllm."""
    if not any(g.backend == "vllm" for g in config.generators):
        return None
    from ray.serve.llm import LLMConfig, build_openai_app

    from redline.serve.app import deployment_options

    configs = []
    for g in config.generators:
        if g.backend != "vllm":
            continue
        opts = deployment_options(g.serve, g.num_cpus, g.num_gpus)
        deployment = {k: v for k, v in opts.items() if k in ("num_replicas", "autoscaling_config", "max_ongoing_requests")}
        if "num_replicas" in deployment:
            n = deployment.pop("num_replicas")
            deployment["autoscaling_config"] = {"min_replicas": n, "max_replicas": n}
        configs.append(LLMConfig(model_loading_config={"model_id": g.name, "model_source": g.model},
                                 deployment_config=deployment))
    return build_openai_app({"llm_configs": configs})


def start(config: ServeConfig, *, config_file: str | None = None, verbose: bool = False,
          announce: Any = print) -> dict[str, Any]:
    """Deploy the applications; returns the state written for `status`/`stop`."""
    from ray import serve

    from redline.serve.app import build_app

    preflight(config)
    local = not os.environ.get("RAY_ADDRESS")
    if _STARTED_HERE and config.port not in _STARTED_HERE:
        raise RedlineError(f"this process already serves on port {min(_STARTED_HERE)}; Serve has one HTTP port per "
                           f"cluster (use that port with another route_prefix, or runner.shutdown() first)")
    if local and config.port not in _STARTED_HERE:
        for st in read_states(config.port):
            if _pid_alive(st.get("pid")):
                raise RedlineError(f"a redline server already runs on port {config.port} "
                                   f"(`redline serve stop --port {config.port}`)")
        _check_port_free(config.host, config.port)
    ensure_ray(verbose=verbose)
    import ray

    try:
        serve.start(proxy_location=config.proxy_location, http_options={"host": config.host, "port": config.port},
                    logging_config={"enable_access_log": verbose, "log_level": "INFO" if verbose else "WARNING"})
    except Exception as err:  # noqa: BLE001 - Ray reports a taken port from inside the proxy actor
        if "Failed to bind" not in str(err):
            raise
        serve.shutdown()  # no half-started Serve left behind for the next start
        raise PortTaken(f"cannot serve on {config.host}:{config.port}: the port was taken") from None
    check_resources(config, strict=local)
    apps = [(config.app_name, build_app(config, api_key_sha256(config)), config.route_prefix)]
    extra = vllm_app(config)
    if extra is not None:
        apps.append((f"{config.app_name}-vllm", extra, VLLM_ROUTE))
    for name, app, prefix in apps:
        # Deploy without Serve's own wait, which never gives up; ours names the failure or the timeout.
        serve.api._run(app, name=name, route_prefix=prefix, _blocking=False)
    wait_running([name for name, _, _ in apps], config.start_timeout_s)
    _STARTED_HERE.add(config.port)
    url = url_of(config)
    state = {"port": config.port, "host": config.host, "url": url, "app_name": config.app_name,
             "pid": os.getpid() if local else None, "mode": "local" if local else "cluster",
             "ray_address": ray.get_runtime_context().gcs_address, "config_file": config_file,
             "detectors": [d.name for d in config.detectors], "generators": [g.name for g in config.generators],
             "dialogue_safety": config.dialogue_safety is not None,
             "api_key_required": api_key_sha256(config) is not None, "started_at": storage.now_iso()}
    state_dir().mkdir(parents=True, exist_ok=True)
    storage.write_json(str(state_path(config.port, config.app_name)), state)
    announce(state)
    return state


def _demand(config: ServeConfig) -> tuple[float, float]:
    cpus = gpus = 0.0
    items = [(config.ingress, 0.1, 0.0)] + [(d.serve, d.num_cpus, d.num_gpus) for d in config.detectors]
    items += [(g.serve, g.num_cpus, g.num_gpus) for g in config.generators]
    if config.dialogue_safety is not None:
        d = config.dialogue_safety
        items.append((d.serve, d.num_cpus, d.num_gpus))
    for settings, c, g in items:
        n = settings.autoscaling.min_replicas if settings.autoscaling else settings.replicas
        cpus, gpus = cpus + n * c, gpus + n * g
    return cpus, gpus


def check_resources(config: ServeConfig, strict: bool) -> None:
    """On a fixed-size (local) Ray, replicas that cannot all be placed would wait forever: refuse."""
    import ray

    cpus, gpus = _demand(config)
    have = ray.cluster_resources()
    short = [f"{need:g} {kind}s (Ray has {have.get(kind, 0):g})" for kind, need in (("CPU", cpus), ("GPU", gpus))
             if need > have.get(kind, 0) + 1e-9]
    if short and strict:
        raise RedlineError(f"serve: the replicas need {' and '.join(short)}; lower num_cpus/num_gpus or replicas")
    if short:
        log.warning("serve: replicas need %s; waiting for the autoscaler", " and ".join(short))


def failure_cause(app: Any) -> str:
    """The most telling line of a failed application: a deployment's own error (a replica's
    RedlineError says what to fix) before Serve's summary."""
    texts = [d.message or "" for d in getattr(app, "deployments", {}).values() if "FAIL" in str(d.status).upper()]
    texts.append(app.message or "")
    for text in texts:
        lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
        named = [ln for ln in lines if "RedlineError:" in ln]
        if named:
            return named[-1].split("RedlineError:", 1)[1].strip()
        errors = [ln for ln in lines if "Error" in ln.split(":", 1)[0]]
        if errors:
            return errors[-1]
    last = (app.message or "").strip().splitlines()
    return last[-1] if last else "see `redline serve status`"


def wait_running(apps: list[str], timeout: float) -> None:
    from ray import serve

    deadline = time.time() + timeout
    while True:
        statuses = serve.status().applications
        failed = [(n, statuses[n]) for n in apps if n in statuses and str(statuses[n].status) .endswith("DEPLOY_FAILED")]
        if failed:
            name, app = failed[0]
            cause = failure_cause(app)
            for n in apps:
                serve.delete(n)
            raise RedlineError(f"serve: application {name} failed to start: {cause}")
        if all(n in statuses and str(statuses[n].status).endswith("RUNNING") for n in apps):
            return
        if time.time() > deadline:
            for n in apps:
                serve.delete(n)
            raise RedlineError(f"serve: applications not running after {timeout:g}s (still deploying; "
                               f"models too slow to load or resources missing)")
        time.sleep(0.5)


def shutdown() -> None:
    """Stop Serve (every application and the proxy) started by this process."""
    from ray import serve

    serve.shutdown()
    _STARTED_HERE.clear()


def serve_forever(state: dict[str, Any]) -> None:
    """Block until SIGINT/SIGTERM, then shut Serve and the embedded Ray down and remove the state file."""
    import ray

    stopping = False

    def _stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        while not stopping:
            time.sleep(0.2)
    finally:
        try:
            shutdown()
        finally:
            ray.shutdown()
            state_path(state["port"], state["app_name"]).unlink(missing_ok=True)


def _connect(address: str) -> None:
    import ray

    if ray.is_initialized():
        return
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except (ConnectionError, TimeoutError, RuntimeError) as err:
        raise RedlineError(f"cannot connect to the Ray cluster at {address}: {err}") from None


def probe(url: str, timeout: float = 3.0) -> dict[str, Any] | str:
    import httpx

    try:
        resp = httpx.get(f"{url}/healthz", timeout=timeout)
        return resp.json() if resp.status_code == 200 else f"HTTP {resp.status_code}"
    except (httpx.HTTPError, ValueError) as err:
        return f"unreachable ({type(err).__name__})"


def status(port: int | None = None, deployments: bool = True) -> list[dict[str, Any]]:
    """Each known server: where it is, whether it answers, and its deployments' states and replicas."""
    out = []
    states = read_states(port)
    if not states and os.environ.get("RAY_ADDRESS"):
        states = [{"mode": "cluster", "ray_address": os.environ["RAY_ADDRESS"], "url": None, "app_name": None}]
    for st in states:
        row = dict(st)
        if st.get("mode") == "local" and not _pid_alive(st.get("pid")):
            row["health"] = "not running (stale state file removed)"
            state_path(st["port"], st["app_name"]).unlink(missing_ok=True)
            out.append(row)
            continue
        row["health"] = probe(st["url"]) if st.get("url") else "unknown"
        if deployments:
            row["applications"] = _serve_status(st["ray_address"])
        out.append(row)
    return out


def _serve_status(address: str) -> dict[str, Any]:
    from ray import serve

    _connect(address)
    apps = {}
    for name, app in serve.status().applications.items():
        apps[name] = {"status": str(app.status.value if hasattr(app.status, "value") else app.status),
                      "deployments": {d: {"status": str(getattr(s.status, "value", s.status)),
                                          "replicas": {str(getattr(k, "value", k)): v for k, v in s.replica_states.items()}}
                                      for d, s in app.deployments.items()}}
    return apps


def stop(port: int | None = None, timeout: float = 60.0) -> list[str]:
    """Stop every known server (or the one on `port`); returns what was stopped."""
    stopped = []
    states = read_states(port)
    if not states:
        where = f"on port {port}" if port else "on this machine"
        raise RedlineError(f"no redline server is known to run {where} (see `redline serve status`)")
    for st in states:
        if st.get("mode") == "local":
            pid = st.get("pid")
            if _pid_alive(pid):
                os.kill(pid, signal.SIGTERM)
                deadline = time.time() + timeout
                while _pid_alive(pid) and time.time() < deadline:
                    time.sleep(0.2)
                if _pid_alive(pid):
                    os.kill(pid, signal.SIGKILL)
        else:
            from ray import serve

            _connect(st["ray_address"])
            for name in (st["app_name"], f"{st['app_name']}-vllm"):
                if name in serve.status().applications:
                    serve.delete(name)
        state_path(st["port"], st["app_name"]).unlink(missing_ok=True)
        stopped.append(st["url"])
    return stopped


def deploy_config(config: ServeConfig) -> dict[str, Any]:
    """A Serve config file for `serve deploy` / the Ray dashboard, equivalent to this config.

    The API key is not written into it: replicas read it from `api_key_env` in their own
    environment (set it in the cluster's runtime environment).
    """
    apps = [{"name": config.app_name, "route_prefix": config.route_prefix, "import_path": "redline.serve.app:app_builder",
             "args": {"config": config.model_dump(mode="json")}}]
    return {"proxy_location": config.proxy_location, "http_options": {"host": config.host, "port": config.port},
            "logging_config": {"enable_access_log": False}, "applications": apps}
