"""Notices from workers to the driver's progress line: "waiting 120 s: api.example.com asked for it
(Retry-After)". A worker posts a notice; the driver's progress line shows the live ones beside its
figures, so a run that waits says that it waits and why instead of looking hung. One small actor per
job (its name carries the job id, so concurrent runs do not see each other's notices); outside Ray,
or before the driver made the board, a notice is only logged."""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)


class _Board:
    def __init__(self) -> None:
        self.items: dict[str, tuple[str, float]] = {}

    def post(self, key: str, text: str, until: float) -> None:
        self.items[key] = (text, until)

    def current(self) -> str:
        now = time.time()
        self.items = {k: v for k, v in self.items.items() if v[1] > now}
        return "; ".join(text for text, _ in sorted(self.items.values(), key=lambda v: v[1])[-2:])


def _name() -> str | None:
    import ray

    if not ray.is_initialized():
        return None
    return f"redline-notices-{ray.get_runtime_context().get_job_id()}"


_BOARDS: dict[str, object] = {}  # the driver's handle keeps its board alive (an unreferenced actor is collected)


def open_board() -> None:
    """Made by the driver before work starts (idempotent)."""
    import ray

    name = _name()
    if name is not None and name not in _BOARDS:
        _BOARDS[name] = ray.remote(num_cpus=0)(_Board).options(name=name, namespace="redline",
                                                                get_if_exists=True).remote()


def post(key: str, text: str, seconds: float) -> None:
    """Show `text` on the driver's progress line for `seconds` (a later notice with the same key replaces it)."""
    log.warning(text)
    try:
        import ray

        name = _name()
        if name is None:
            return
        ray.get_actor(name, namespace="redline").post.remote(key, text, time.time() + seconds)
    except (ImportError, ValueError):  # no board: the log line is all there is
        pass


def current(timeout: float = 1.0) -> str:
    """The live notices, joined (empty when none, or when the board cannot be read in time)."""
    try:
        import ray

        name = _name()
        if name is None:
            return ""
        return ray.get(ray.get_actor(name, namespace="redline").current.remote(), timeout=timeout)
    except Exception:  # noqa: BLE001 - a progress line never fails the run
        return ""
