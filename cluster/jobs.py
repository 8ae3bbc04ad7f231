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
# hub mirrors; anything else, credentials above all, travels only when asked for by name (--env).
FORWARDED_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION", "HF_ENDPOINT",
                 "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "REDLINE_PROGRESS")


def job_env(names: list[str]) -> dict[str, str]:
    """The environment a job gets: the non-secret settings above plus the variables named by the user."""
    for name in names:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise RedlineError(f"--env expects an environment variable name, got {name!r}")
        if name not in os.environ:
            raise RedlineError(f"--env {name}: no such variable in this environment")
    return {k: os.environ[k] for k in (*FORWARDED_ENV, *names) if k in os.environ}


def entrypoint(command: str) -> str:
    """The job's command line (`command` as in "run score"), every argument quoted: the job supervisor
    runs it through a shell. Overrides travel in config.yaml, never on this line."""
    return shlex.join(["redline", *command.split(), "--config", "config.yaml"])


def submit(pipeline: str, command: str, model: type[BaseModel], config_path: Path, address: str, sets: list[str],
           env_names: list[str] | None = None) -> str:
    """Validate the config (with its overrides) here, so that a mistake fails here and not on the
    cluster, then send `redline <command>` as a Ray job that carries the validated config, overrides
    applied and local paths pinned, in its working directory; returns the job id."""
    from redline.cluster.config import load_config, parse_overrides

    config = _pinned(load_config(model, config_path, parse_overrides(sets)))
    env = job_env(env_names or [])
    jobs = client(address)
    workdir = Path(tempfile.mkdtemp(prefix="redline-job-"))
    try:
        # what the user set, not the defaults of this install: the cluster's own defaults apply
        settings = config.model_dump(mode="json", exclude_unset=True)
        (workdir / "config.yaml").write_text(yaml.safe_dump(settings, sort_keys=False))
        line = entrypoint(command)
        job_id = f"redline-{pipeline}-{os.urandom(6).hex()}"
        deadline = time.monotonic() + AGENT_WAIT_S
        while True:
            try:
                return jobs.submit_job(entrypoint=line, submission_id=job_id,
                                       runtime_env={"working_dir": str(workdir), "env_vars": env},
                                       metadata={"redline_pipeline": pipeline, "config": str(config_path)})
            except (ConnectionError, RuntimeError) as err:
                # A head that has just started answers 500 until its job agent is up.
                if "No available agent" in str(err) and time.monotonic() < deadline:
                    time.sleep(2)
                    continue
                raise RedlineError(f"job submission to {address} failed: {first_line(err)}") from None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


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
