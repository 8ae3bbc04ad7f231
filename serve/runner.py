"""`redline serve`: start, inspect and stop the Serve applications of a ServeConfig.

Locally (no RAY_ADDRESS) `start` runs an embedded Ray in the foreground until it is stopped (Ctrl-C,
SIGTERM or `redline serve stop`). With RAY_ADDRESS the applications are deployed on that cluster
and keep running after the command returns. Either way a small state file per port records where
the server is, so `status` and `stop` find it from another shell.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

from redline.cluster import access, storage
from redline.cluster.net import is_loopback
from redline.cluster.runtime import ensure_ray
from redline.errors import RedlineError
from redline.serve.config import ServeConfig

log = logging.getLogger(__name__)

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
    return access.key_sha256(os.environ.get(config.api_key_env) if config.api_key_env else None)


def process_identity(pid: int | None) -> str | None:
    """What tells a process apart from a later one that reuses its PID: its start time and command
    line (from /proc on Linux, else `ps`); None when no such process runs."""
    if not pid or pid <= 0:
        return None
    proc = Path(f"/proc/{pid}")
    try:
        if proc.is_dir():
            stat_fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            return f"{stat_fields[19]} {cmdline}"  # field 22 of stat: start time in clock ticks after boot
        import subprocess

        out = subprocess.run(["ps", "-o", "lstart=,command=", "-p", str(int(pid))], capture_output=True, text=True,
                             timeout=5)
        return out.stdout.strip() or None
    except (OSError, IndexError, ValueError):
        return None
    except Exception:  # noqa: BLE001 - `ps` missing or too slow: unknown, so never ours
        return None


def _ours(state: dict[str, Any]) -> bool:
    """Whether the server process a state file names still runs: the same PID *and* the same
    process (a PID reused after a crash belongs to someone else and is never signalled)."""
    identity = process_identity(state.get("pid"))
    return identity is not None and identity == state.get("process")


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
    access.check_exposure(config.host, api_key_sha256(config) is not None, config.insecure,
                          f"${config.api_key_env}" if config.api_key_env else "an api_key_env variable", "serve")


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
            AutoConfig.from_pretrained(g.model, revision=g.options().revision)  # type: ignore[attr-defined]
        except (OSError, ValueError) as err:
            raise RedlineError(f"generator '{g.name}': cannot load model '{g.model}': {first_line(err)}") from None


def start(config: ServeConfig, *, config_file: str | None = None, verbose: bool = False,
          announce: Any = print) -> dict[str, Any]:
    """Deploy the applications; returns the state written for `status`/`stop`."""
    from ray import serve

    from redline.serve.app import build_app, health_app

    preflight(config)
    local = not os.environ.get("RAY_ADDRESS")
    if _STARTED_HERE and config.port not in _STARTED_HERE:
        raise RedlineError(f"this process already serves on port {min(_STARTED_HERE)}; Serve has one HTTP port per "
                           f"cluster (use that port with another route_prefix, or runner.shutdown() first)")
    if local and config.port not in _STARTED_HERE:
        for st in read_states(config.port):
            if _ours(st):
                raise RedlineError(f"a redline server already runs on port {config.port} "
                                   f"(`redline serve stop --port {config.port}`)")
        _check_port_free(config.host, config.port)
    ensure_ray(verbose=verbose)
    import ray
    from ray.exceptions import RayActorError

    # the driver's own Serve logger ("Started Serve in namespace ...") speaks at INFO, logging_config
    # below sets only the replicas' and the controller's
    logging.getLogger("ray.serve").setLevel(logging.INFO if verbose else logging.WARNING)
    _start_serve(config, verbose)
    check_resources(config, strict=local)
    # Locally, the workers' environment is this process's as it was when Ray started: only ours now counts.
    apps = [(config.app_name, build_app(config, api_key_sha256(config), key_from_driver=local), config.route_prefix),
            health_app(config)]
    state = {"port": config.port, "host": config.host, "url": url_of(config), "app_name": config.app_name,
             "pid": os.getpid() if local else None, "process": process_identity(os.getpid()) if local else None,
             "mode": "local" if local else "cluster",
             "ray_address": ray.get_runtime_context().gcs_address, "config_file": config_file,
             "detectors": [d.name for d in config.detectors], "generators": [g.name for g in config.generators],
             "dialogue_safety": config.dialogue_safety is not None,
             "api_key_required": api_key_sha256(config) is not None, "started_at": storage.now_iso()}
    # Written before any application can answer: a client that reaches the server can always stop it.
    state_dir().mkdir(parents=True, exist_ok=True)
    written = state_path(config.port, config.app_name)
    storage.write_json(str(written), state)
    try:
        for name, app, prefix in apps:
            # Deploy without Serve's own wait, which never gives up; ours names the failure or the timeout.
            serve.api._run(app, name=name, route_prefix=prefix, _blocking=False)
        wait_running([name for name, _, _ in apps], config.start_timeout_s)
    except RayActorError as err:
        written.unlink(missing_ok=True)
        raise RedlineError(f"serve: a Ray Serve actor died while the applications deployed ({type(err).__name__}); "
                           "the machine is short of CPU or memory: free some and start again") from None
    except BaseException:
        written.unlink(missing_ok=True)
        raise
    _STARTED_HERE.add(config.port)
    announce(state)
    return state


SERVE_START_TRIES = 3


def _start_serve(config: ServeConfig, verbose: bool) -> None:
    """Serve's controller and proxies, started again (within `start_timeout_s` and SERVE_START_TRIES)
    when one of their actors dies while starting, as it can on a loaded machine; else one line."""
    from ray import serve
    from ray.exceptions import GetTimeoutError, RayActorError

    deadline = time.time() + config.start_timeout_s
    for attempt in range(1, SERVE_START_TRIES + 1):
        try:
            serve.start(proxy_location=config.proxy_location, http_options=http_options(config),
                        logging_config={"enable_access_log": verbose, "log_level": "INFO" if verbose else "WARNING"})
            return
        except Exception as err:  # noqa: BLE001 - Ray reports a taken port from inside the proxy actor
            serve.shutdown()  # no half-started Serve left behind for the next try
            if "Failed to bind" in str(err):
                raise PortTaken(f"cannot serve on {config.host}:{config.port}: the port was taken") from None
            if not isinstance(err, (RayActorError, GetTimeoutError)):
                raise
            if attempt == SERVE_START_TRIES or time.time() > deadline:
                raise RedlineError(f"serve: Ray Serve's controller or HTTP proxy died while starting, {attempt} times "
                                   f"({type(err).__name__}); the machine is short of CPU or memory: free some, or "
                                   "start again with more start_timeout_s") from None
            log.warning("serve: Ray Serve's %s while starting; trying again (%d of %d)", type(err).__name__,
                        attempt + 1, SERVE_START_TRIES)
            time.sleep(min(2.0 * attempt, max(0.0, deadline - time.time())))


def http_options(config: ServeConfig) -> dict[str, Any]:
    """The proxies' settings: where they listen, and an end-to-end bound on every request (a client
    that never finishes is cut off there as well as by the ingress's body timeout)."""
    return {"host": config.host, "port": config.port,
            "request_timeout_s": config.limits.request_timeout_s + config.limits.body_timeout_s,
            "keep_alive_timeout_s": 5}


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


def delete(app_name: str) -> None:
    """Remove one served config's applications (the API and its health check) from Serve."""
    from ray import serve

    for name in (app_name, f"{app_name}-health"):
        if name in serve.status().applications:
            serve.delete(name)


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
    from redline.cluster.runtime import check_reachable

    check_reachable(address, timeout=3.0)  # a dead cluster is one line in seconds, not a hung ray.init
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except (ConnectionError, TimeoutError, RuntimeError) as err:
        raise RedlineError(f"cannot connect to the Ray cluster at {address}: {err}") from None
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # "Deleting app ..." is Serve's INFO


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
        if st.get("mode") == "local" and not _ours(st):
            row["health"] = "not running (stale state file removed)"
            state_path(st["port"], st["app_name"]).unlink(missing_ok=True)
            out.append(row)
            continue
        row["health"] = probe(st["url"]) if st.get("url") else "unknown"
        if deployments and isinstance(row["health"], dict):
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


def stop(port: int | None = None, timeout: float = 60.0) -> tuple[list[str], list[str]]:
    """Stop every known server (or the one on `port`): (the URLs stopped, what could not be stopped).
    A local state file whose process no longer runs (or whose PID another process now holds) is
    stale: nothing is signalled; the file is removed when nothing answers at its URL, and kept, with
    that said, when something still does (a server no state file describes would run unknown)."""
    stopped, problems = [], []
    states = read_states(port)
    if not states:
        where = f"on port {port}" if port else "on this machine"
        raise RedlineError(f"no redline server is known to run {where} (see `redline serve status`)")
    for st in states:
        if st.get("mode") == "local":
            pid = st.get("pid")
            if not _ours(st):
                if isinstance(probe(st["url"], timeout=2.0), dict):
                    problems.append(f"the state file for {st['url']} is stale (process {pid} is not the server it "
                                    f"started), yet a server answers there: it was kept; stop that server where it "
                                    f"was started, or remove {state_path(st['port'], st['app_name'])}")
                    continue
                state_path(st["port"], st["app_name"]).unlink(missing_ok=True)
                problems.append(f"the state file for {st['url']} was stale (process {pid} no longer runs the "
                                "server) and was removed; nothing was stopped")
                continue
            os.kill(pid, signal.SIGTERM)
            deadline = time.time() + timeout
            while _ours(st) and time.time() < deadline:
                time.sleep(0.2)
            if _ours(st):
                os.kill(pid, signal.SIGKILL)
        else:
            _connect(st["ray_address"])
            delete(st["app_name"])
        state_path(st["port"], st["app_name"]).unlink(missing_ok=True)
        stopped.append(st["url"])
    return stopped, problems


def deploy_config(config: ServeConfig) -> dict[str, Any]:
    """A Serve config file for `serve deploy` / the Ray dashboard, equivalent to this config.

    The API key is not written into it: replicas read it from `api_key_env` in their own
    environment (set it in the cluster's runtime environment). A non-loopback host needs that
    variable named (the replicas refuse to start without its value) unless the config says insecure.
    """
    if not is_loopback(config.host) and not config.api_key_env and not config.insecure:
        raise RedlineError(f"serve: host {config.host} exposes the models to the network, but api_key_env is unset; "
                           "name the variable that holds the key on the cluster, or set insecure: true")
    from redline.serve.app import health_route

    args = {"config": config.model_dump(mode="json")}
    apps = [{"name": config.app_name, "route_prefix": config.route_prefix, "import_path": "redline.serve.app:app_builder",
             "args": args},
            {"name": f"{config.app_name}-health", "route_prefix": health_route(config),
             "import_path": "redline.serve.app:health_builder", "args": args}]
    return {"proxy_location": config.proxy_location, "http_options": http_options(config),
            "logging_config": {"enable_access_log": False}, "applications": apps}
