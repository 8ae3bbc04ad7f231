"""Who may talk to a redline HTTP service (`redline serve`, `redline view`): the rules both share.

- **Key**: when a key is set, every request but the public paths carries it, as `Authorization:
  Bearer <key>` or `X-API-Key: <key>`; it is compared in constant time with an HMAC of the key under
  a per-process secret, so nothing a process keeps or sends out can be used to test guesses offline.
- **Host**: a request is answered only when its `Host` header names the server as it was bound
  (localhost names and loopback addresses; the bound address; on a wildcard bind any IP literal and
  this machine's own names) or a name the user listed. A web page that rebinds its own domain to
  127.0.0.1 sends its domain as the Host, so it is refused (DNS rebinding).
- **Exposure**: a server other machines can reach needs a key, unless the user says `insecure`.
- **Sessions** (the viewer's browser cookie): a signed token that expires, never the key or a hash
  of it.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import socket
import time
from collections.abc import Iterable, Mapping

from redline.cluster.net import LOOPBACK_NAMES, is_loopback
from redline.errors import RedlineError

WILDCARD_HOSTS = {"0.0.0.0", "::", ""}
MAX_HOST_CHARS = 255


def given_key(headers: Mapping[str, str]) -> str:
    """The key a request carries (lower-case header names): a Bearer token, else X-API-Key."""
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return headers.get("x-api-key", "").strip()


class KeyCheck:
    """Constant-time comparison with a key that is kept only as an HMAC under a per-process secret."""

    def __init__(self, key: str | None) -> None:
        self._secret = secrets.token_bytes(32)
        self._digest = self._mac(_sha256(key)) if key else None

    @classmethod
    def from_sha256(cls, hexdigest: str) -> "KeyCheck":
        """From the SHA-256 of the key (what a driver hands a Serve replica, so the key itself never
        travels in a deployment's arguments)."""
        check = cls(None)
        check._digest = check._mac(bytes.fromhex(hexdigest))
        return check

    @property
    def required(self) -> bool:
        return self._digest is not None

    def _mac(self, value: bytes) -> bytes:
        return hmac.new(self._secret, value, hashlib.sha256).digest()

    def matches(self, given: str | None) -> bool:
        if self._digest is None:
            return True
        return bool(given) and hmac.compare_digest(self._mac(_sha256(given)), self._digest)  # type: ignore[arg-type]

    def session_token(self, ttl_s: float) -> str:
        """A token that proves its holder gave the key, valid for `ttl_s` seconds in this process only."""
        expires = str(int(time.time() + ttl_s))
        return f"{expires}.{hmac.new(self._secret, b'session|' + expires.encode(), hashlib.sha256).hexdigest()}"

    def session_ok(self, token: str | None) -> bool:
        if self._digest is None:
            return True
        expires, _, mac = (token or "").partition(".")
        if not expires.isdigit() or int(expires) < time.time():
            return False
        expected = hmac.new(self._secret, b"session|" + expires.encode(), hashlib.sha256).hexdigest()
        return hmac.compare_digest(mac, expected)


def _sha256(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()


def key_sha256(key: str | None) -> str | None:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest() if key else None


def _strip_port(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):  # [v6]:port
        return host[1:host.find("]")] if "]" in host else host
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


class HostRule:
    """Which `Host` headers a server bound to `bind` answers (see the module's docstring)."""

    def __init__(self, bind: str, extra: Iterable[str] = ()) -> None:
        self.bind = _strip_port(bind) if bind not in WILDCARD_HOSTS else ""
        self.wildcard = bind in WILDCARD_HOSTS
        self.any = "*" in set(extra)
        self.names = {*LOOPBACK_NAMES, *(_strip_port(e) for e in extra if e != "*")}
        if self.bind:
            self.names.add(self.bind)
        if self.wildcard:
            for name in (socket.gethostname(), socket.getfqdn()):
                if name:
                    self.names.add(name.lower().rstrip("."))

    def allows(self, host_header: str | None) -> bool:
        if self.any or host_header is None:  # HTTP/1.0 clients send none; browsers always do
            return True
        if len(host_header) > MAX_HOST_CHARS:
            return False
        host = _strip_port(host_header)
        if host in self.names:
            return True
        if _is_ip(host):
            return self.wildcard or is_loopback(host) or host == self.bind
        return False

    def refusal(self, host_header: str | None) -> str:
        shown = (host_header or "")[:80]
        return (f"Host {shown!r} is not a name this server answers to (bound to {self.bind or 'all interfaces'}); "
                "list it with --allow-host (allowed_hosts in a serve config)")


def check_exposure(host: str, has_key: bool, insecure: bool, how_to_key: str, what: str,
                   exposed: str = "the models") -> None:
    """A server other machines can reach needs a key, unless the user says insecure."""
    if not is_loopback(host) and not has_key and not insecure:
        raise RedlineError(f"{what}: host {host} exposes {exposed} to the network without an API key; set {how_to_key} "
                           "to a secret, or pass --insecure (insecure: true) to serve without one")
