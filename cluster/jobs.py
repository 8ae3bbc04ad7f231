"""`redline submit` / `status JOB` / `logs JOB`: pipelines on a running cluster via the Ray Jobs API."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml
from pydantic import BaseModel

from redline.cluster import storage
from redline.errors import RedlineError, first_line

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
AGENT_WAIT_S = 60.0


def jobs_address(address: str | None) -> str:
    if address:
        return address
    env = os.environ.get("RAY_JOBS_ADDRESS") or os.environ.get("RAY_ADDRESS", "")
    return env if env.startswith(("http://", "https://")) else DEFAULT_ADDRESS


def looks_like_job_id(target: str) -> bool:
    return bool(re.fullmatch(r"(raysubmit_[A-Za-z0-9]+|redline-[a-z]+-[0-9a-f]{8,})", target))


def client(address: str) -> Any:
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(address)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise RedlineError(f"cannot reach the Ray Jobs API at {address}: {first_line(err)}") from None


def _pinned(config: BaseModel) -> BaseModel:
    """Relative local paths would resolve inside the job's temporary working directory: every input
    that names an existing local path, and the output directory, become absolute paths."""
    from redline.cluster.config import map_inputs

    def absolute(value: str) -> str:
        path = Path(value).expanduser()
        return str(path.absolute()) if not storage.is_s3(value) and path.exists() else value

    config = map_inputs(config, absolute)
    output = getattr(config, "output", None)
    if isinstance(output, str) and not storage.is_s3(output):
        config = config.model_copy(update={"output": str(Path(output).expanduser().absolute())})
    return config


# Settings (never secrets) a job inherits from the submitting shell so that it reaches the same S3 and
# hub mirrors; anything else travels only when asked for by name (--env), and never a secret.
FORWARDED_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION", "HF_ENDPOINT",
                 "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "REDLINE_PROGRESS")
# A name is secret-like when one of its words (split at "_") is, or ends in, a secret's word: GITHUB_PAT,
# DB_PASS, SSH_PRIVATE_KEY, MYAPIKEY; but not TOKENIZERS_PARALLELISM (the word is "TOKENIZERS").
SECRET_WORDS = ("KEY", "KEYS", "SECRET", "SECRETS", "TOKEN", "TOKENS", "PASS", "PASSWORD", "PASSWD", "PASSPHRASE",
                "PWD", "PAT", "PIN", "CERT", "CERTS", "CERTIFICATE", "PRIVATE", "SESSION", "SESSIONID", "COOKIE",
                "CREDENTIAL", "CREDENTIALS", "CREDS", "AUTH", "AUTHORIZATION", "BEARER", "JWT", "SIGNATURE", "SALT",
                "DSN", "OTP", "KEYFILE", "KEYSTORE")
_SECRET_PART = re.compile(r"(?:SECRET|PASSW|CREDENTIAL|PRIVATE|APIKEY|ACCESSKEY|PASSPHRASE)", re.IGNORECASE)
SECRETS_CHECK_S = 120.0


def variable_name(name: str, flag: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", name):
        raise RedlineError(f"{flag} expects an environment variable name, got {name[:80]!r}")
    return name


def secret_like(name: str) -> bool:
    """Whether an environment variable's name says it holds a secret (see SECRET_WORDS)."""
    words = [w for w in name.upper().split("_") if w]
    return bool(_SECRET_PART.search(name)) or any(
        w in SECRET_WORDS or any(w.endswith(s) for s in ("KEY", "TOKEN", "PASS", "PWD", "SECRET")) for w in words)


_KEY_SHAPED = re.compile(
    r"(?:sk-[A-Za-z0-9_\-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|hf_[A-Za-z0-9]{20,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,}|AIza[0-9A-Za-z_\-]{30,}|glpat-[A-Za-z0-9_\-]{16,}"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----|eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,})")
_LONG_TOKEN = re.compile(r"[A-Za-z0-9+/=_\-]{32,}")


def secret_value(value: str) -> str | None:
    """Why a value looks like a secret (a provider's key format, a private key, a JWT, a URL with a
    password, a long random-looking token), or None."""
    if _KEY_SHAPED.search(value):
        return "its value has the shape of an API key or private key"
    for word in re.findall(r"[a-z][a-z0-9+.\-]*://\S+", value, re.IGNORECASE):
        try:
            if urlparse(word).password:
                return "its value is a URL with a password (user:password@host)"
        except ValueError:
            continue
    for token in _LONG_TOKEN.findall(value):
        if re.search(r"[a-z]", token) and re.search(r"[A-Z]", token) and re.search(r"[0-9]", token):
            return "its value is a long random-looking token"
    return None


def job_env(names: list[str]) -> dict[str, str]:
    """The environment a job gets: the non-secret settings above plus the variables named by the user.
    A job's environment is readable by whoever reaches the dashboard (`/api/jobs/`), so a name that
    looks like a secret is refused: secrets live on the nodes (`--secret`)."""
    for name in names:
        variable_name(name, "--env")
        if secret_like(name):
            raise RedlineError(f"--env {name} looks like a secret, and a job's environment is readable by anyone who "
                               f"reaches the dashboard (/api/jobs/): set it on the cluster's nodes and pass "
                               f"--secret {name}")
        if name not in os.environ:
            raise RedlineError(f"--env {name}: no such variable in this environment")
    env = {k: os.environ[k] for k in (*FORWARDED_ENV, *names) if k in os.environ}
    for name, value in env.items():
        why = secret_value(value)
        if why:
            given = f"--env {name}" if name in names else f"{name} (forwarded to every job)"
            raise RedlineError(f"{given} looks like a secret: {why}, and a job's environment is readable by anyone "
                               f"who reaches the dashboard (/api/jobs/); set it on the cluster's nodes and pass "
                               f"--secret {name}")
    return env


def missing_on_nodes(names: list[str]) -> list[str]:
    """On the cluster (run as a job): where each of `names` is unset, as "NAME on the driver" or
    "NAME on node IP"; the nodes up now are asked, each by a task pinned to it."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from redline.cluster.runtime import ensure_ray

    missing = [f"{n} on the driver" for n in names if not os.environ.get(n)]
    ensure_ray()

    def unset(wanted: list[str]) -> list[str]:
        return [n for n in wanted if not os.environ.get(n)]

    probe = ray.remote(num_cpus=0)(unset)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    answers = ray.get([probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                       .remote(names) for n in nodes])
    return missing + [f"{name} on node {node['NodeManagerAddress']}" for node, unset_there in zip(nodes, answers)
                      for name in unset_there]


def check_secrets(jobs: Any, names: list[str], address: str) -> None:
    """Fail with one line unless every secret named is set on the cluster's driver and nodes: asked by
    a short job that carries only the names (a value never travels in a job)."""
    line = shlex.join(["redline", "check-secrets", *names])
    job_id = f"redline-secrets-{os.urandom(6).hex()}"
    submit_job(jobs, address, entrypoint=line, submission_id=job_id, metadata={"redline_secrets": ",".join(names)})
    deadline = time.monotonic() + SECRETS_CHECK_S
    status = "PENDING"
    while time.monotonic() < deadline:
        state = jobs.get_job_status(job_id)
        status = str(getattr(state, "value", state))
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            break
        time.sleep(0.5)
    logs = jobs.get_job_logs(job_id) if status in ("SUCCEEDED", "FAILED") else ""
    try:
        if status not in ("SUCCEEDED", "FAILED", "STOPPED"):
            jobs.stop_job(job_id)
        jobs.delete_job(job_id)
    except (RuntimeError, ValueError):
        pass
    missing = [ln.split("missing: ", 1)[1] for ln in logs.splitlines() if ln.startswith("missing: ")]
    if missing:
        raise RedlineError(f"--secret: {', '.join(missing)} is not set; give the cluster's nodes the secret (a "
                           "Kubernetes secretKeyRef, the cloud's secret store), never the job")
    if status != "SUCCEEDED":
        raise RedlineError(f"checking --secret on {address} did not finish ({status}): "
                           f"{first_line(logs.strip().splitlines()[-1]) if logs.strip() else 'no output'}")


def entrypoint(command: str) -> str:
    """The job's command line (`command` as in "run score"), every argument quoted: the job supervisor
    runs it through a shell. Overrides travel in config.yaml, never on this line."""
    return shlex.join(["redline", *command.split(), "--config", "config.yaml"])


def submit(pipeline: str, command: str, model: type[BaseModel], config_path: Path, address: str, sets: list[str],
           env_names: list[str] | None = None, secret_names: list[str] | None = None) -> str:
    """Validate the config (with its overrides) here, so that a mistake fails here and not on the
    cluster, then send `redline <command>` as a Ray job that carries the validated config, overrides
    applied and local paths pinned, in its working directory; returns the job id."""
    from redline.cluster.config import load_config, parse_overrides

    config = _pinned(load_config(model, config_path, parse_overrides(sets)))
    env = job_env(env_names or [])
    secrets = [variable_name(n, "--secret") for n in dict.fromkeys(secret_names or [])]
    jobs = client(address)
    if secrets:
        check_secrets(jobs, secrets, address)
    workdir = Path(tempfile.mkdtemp(prefix="redline-job-"))
    try:
        # what the user set, not the defaults of this install: the cluster's own defaults apply
        settings = config.model_dump(mode="json", exclude_unset=True)
        (workdir / "config.yaml").write_text(yaml.safe_dump(settings, sort_keys=False))
        line = entrypoint(command)
        job_id = f"redline-{pipeline}-{os.urandom(6).hex()}"
        return submit_job(jobs, address, entrypoint=line, submission_id=job_id,
                          runtime_env={"working_dir": str(workdir), "env_vars": env},
                          metadata={"redline_pipeline": pipeline, "config": str(config_path),
                                    "redline_secrets": ",".join(secrets)})
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def submit_job(jobs: Any, address: str, **job: Any) -> str:
    """`jobs.submit_job(**job)`, waiting out a head that has just started: it answers 500 until its
    job agent is up."""
    deadline = time.monotonic() + AGENT_WAIT_S
    while True:
        try:
            return jobs.submit_job(**job)
        except (ConnectionError, RuntimeError) as err:
            if "No available agent" in str(err) and time.monotonic() < deadline:
                time.sleep(2)
                continue
            raise RedlineError(f"job submission to {address} failed: {first_line(err)}") from None


def job_info(job_id: str, address: str) -> dict[str, Any]:
    jobs = client(address)
    try:
        info = jobs.get_job_info(job_id)
    except RuntimeError as err:
        raise RedlineError(f"no job {job_id} at {address}: {first_line(err)}") from None
    return {"status": str(info.status.value if hasattr(info.status, "value") else info.status),
            "message": info.message, "entrypoint": info.entrypoint}


def job_logs(job_id: str, address: str) -> str:
    jobs = client(address)
    try:
        return jobs.get_job_logs(job_id)
    except RuntimeError as err:
        raise RedlineError(f"no job {job_id} at {address}: {first_line(err)}") from None


def stop(job_id: str, address: str, wait_s: float = 0.0) -> str:
    """Ask the cluster to stop a job (its driver gets SIGTERM, its run records that) and, with `wait_s`,
    wait until it has ended; returns the job's status."""
    jobs = client(address)
    try:
        jobs.stop_job(job_id)
    except RuntimeError as err:
        raise RedlineError(f"no job {job_id} at {address}: {first_line(err)}") from None
    deadline = time.monotonic() + wait_s
    while True:
        status = job_info(job_id, address)["status"]
        if status in ("SUCCEEDED", "FAILED", "STOPPED") or time.monotonic() >= deadline:
            return status
        time.sleep(0.5)


def follow(job_id: str, address: str, echo: Callable[[str], None], poll_s: float = 1.0) -> str:
    """Stream a job's logs until it ends; returns its final status."""
    jobs = client(address)

    async def tail() -> None:
        async for chunk in jobs.tail_job_logs(job_id):
            echo(chunk)

    try:
        asyncio.run(tail())
    except RuntimeError as err:
        raise RedlineError(f"cannot follow job {job_id} at {address}: {first_line(err)}") from None
    while True:
        status = job_info(job_id, address)["status"]
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            return status
        time.sleep(poll_s)
