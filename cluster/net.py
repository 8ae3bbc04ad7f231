"""What every caller of a remote API shares: a rate limiter with a shared back-off, `Retry-After`
parsing, and the rule that API keys never travel in clear text to another machine."""

from __future__ import annotations

import ipaddress
import threading
import time
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlparse

from redline.errors import RedlineError

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    """A free port between Ray's worker ports (10002-19999) and the kernel's ephemeral range (32768+),
    where no Ray process or client socket can take it between this check and its use."""
    import random
    import socket

    for _ in range(200):
        port = random.randint(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind((host, port))
                return port
            except OSError:
                continue
    raise RedlineError(f"no free port between 20000 and 32000 on {host}")


def check_key_transport(url: str, has_key: bool, allow_insecure_http: bool, what: str) -> None:
    """Refuse to send an API key over plain http:// to another machine unless the user opted in."""
    parsed = urlparse(url)
    if has_key and parsed.scheme == "http" and not is_loopback(parsed.hostname) and not allow_insecure_http:
        raise RedlineError(f"{what}: refusing to send an API key over plain http to {parsed.hostname} (anyone on "
                           "the network could read it); use https://, or set allow_insecure_http: true")


def retry_after_s(headers: Any) -> float | None:
    """Seconds a server asked us to wait: `Retry-After` as seconds or an HTTP date, or `retry-after-ms`."""
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


DEFAULT_MAX_RETRY_AFTER_S = 300.0
MAX_WAITS_OVER_CAP = 3  # Retry-After over the cap this many times in a row: the service is down for us


class WaitTooLong(RedlineError):
    """A service keeps asking for longer waits than the run may take."""


class Backoff:
    """What a 429 / 503 makes every caller of one service do: wait what it asked (Retry-After), but
    never more than `max_wait_s` at a time; a service that asks for more `MAX_WAITS_OVER_CAP` times in
    a row fails the stage with one line. Each wait is posted to the driver's progress line."""

    def __init__(self, what: str, max_wait_s: float = DEFAULT_MAX_RETRY_AFTER_S) -> None:
        self.what, self.max_wait_s, self.over_cap = what, max_wait_s, 0
        self.lock = threading.Lock()

    def seconds(self, wanted: float, why: str) -> float:
        """How long to pause for a wait of `wanted` seconds that `why` asked for."""
        from redline.cluster import notices

        with self.lock:
            self.over_cap = self.over_cap + 1 if wanted > self.max_wait_s else 0
            over = self.over_cap
        if over >= MAX_WAITS_OVER_CAP:
            raise WaitTooLong(f"{self.what} asked to wait {wanted:,.0f} s ({why}) {over} times in a row, over the cap "
                              f"of {self.max_wait_s:g} s (max_retry_after_s); try again later or raise the cap")
        pause = min(wanted, self.max_wait_s)
        if pause >= 5:
            capped = f", capped from {wanted:,.0f} s" if wanted > self.max_wait_s else ""
            notices.post(self.what, f"waiting {pause:,.0f} s{capped}: {self.what} asked for it ({why})", pause)
        return pause


class RateLimiter:
    """At most `rate` calls per second across threads, evenly spaced; `pause(s)` holds every thread
    back (a 429 seen by one thread is a back-off for all of them), including threads already waiting
    for their slot when the pause arrives."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate
        self.next_at = time.monotonic()
        self.paused_until = 0.0
        self.lock = threading.Lock()

    def pause(self, seconds: float) -> None:
        with self.lock:
            self.paused_until = max(self.paused_until, time.monotonic() + seconds)

    def acquire(self) -> None:
        with self.lock:
            now = time.monotonic()
            start = max(now, self.next_at, self.paused_until)
            self.next_at = start + self.interval
        while True:
            now = time.monotonic()
            if start > now:
                time.sleep(start - now)
            with self.lock:  # a pause that came while this thread slept holds it too
                if self.paused_until <= time.monotonic():
                    return
                start = self.paused_until


class _LimiterActor:
    """The slots of one rate limit, shared by every process of a Ray cluster (a named actor)."""

    def __init__(self, rate: float) -> None:
        self.interval, self.next_at, self.paused_until = 1.0 / rate, 0.0, 0.0

    def reserve(self) -> float:
        now = time.time()
        start = max(now, self.next_at, self.paused_until)
        self.next_at = start + self.interval
        return start - now

    def pause(self, seconds: float) -> None:
        self.paused_until = max(self.paused_until, time.time() + seconds)

    def paused_for(self) -> float:
        return max(0.0, self.paused_until - time.time())


class SharedRateLimiter:
    """A `RateLimiter` shared by every actor of a Ray cluster: one named actor holds the slots, so N
    detector actors together stay within a service's quota (not N times it)."""

    def __init__(self, name: str, rate: float) -> None:
        import ray

        self.actor = ray.remote(num_cpus=0)(_LimiterActor).options(
            name=f"redline-rate-{name}", namespace="redline", get_if_exists=True, lifetime="detached",
        ).remote(rate)

    def acquire(self) -> None:
        import ray

        wait = ray.get(self.actor.reserve.remote())
        while wait > 0:
            time.sleep(wait)
            wait = ray.get(self.actor.paused_for.remote())  # a pause that came while this one slept

    def pause(self, seconds: float) -> None:
        self.actor.pause.remote(seconds)


_LOCAL_LIMITERS: dict[str, RateLimiter] = {}


def shared_rate_limiter(name: str, rate: float) -> RateLimiter | SharedRateLimiter:
    """The rate limit called `name`: cluster-wide inside Ray, else shared by this process's threads."""
    try:
        import ray

        if ray.is_initialized():
            return SharedRateLimiter(name, rate)
    except ImportError:
        pass
    return _LOCAL_LIMITERS.setdefault(name, RateLimiter(rate))
