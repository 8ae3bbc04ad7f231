"""What abusive clients do to `redline serve`: big bodies, floods and slow clients, with a key set.

    .venv/bin/python bench/serve_abuse.py [--tree PATH] [--label after]

Starts `redline serve` (profanity-check; REDLINE_API_KEY set) from the source tree PATH (default:
this checkout; give a worktree of an older commit for the "before" figures) and measures, from
clients on 127.0.0.1:

1. big bodies: 120 concurrent authenticated requests of 7.9 MB each; the peak and final RSS of the
   Serve processes (ingress replica and HTTP proxy) and how the requests were answered;
2. a flood: 1,000 parallel /v1/detect calls while /healthz is polled; health latency p50 / max;
3. slow clients: 40 authenticated connections trickling their body and 40 trickling their headers
   for 60 s, while a normal client sends one request a second: how many of those succeed, and how
   long the slow connections are held open.

Prints one JSON object per figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from redline.cluster.net import free_port

HERE = Path(__file__).resolve().parents[1]
KEY = "bench-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def serve_rss() -> dict[str, int]:
    """RSS (MB) of the Serve processes: the ingress replica(s) and the HTTP proxy."""
    out = subprocess.run(["ps", "-eo", "rss=,args="], capture_output=True, text=True).stdout
    rss: dict[str, int] = {}
    for line in out.splitlines():
        size, _, args = line.strip().partition(" ")
        if "ServeReplica" in args and "ingress" in args:
            rss["ingress"] = rss.get("ingress", 0) + int(size) // 1024
        elif "ProxyActor" in args:
            rss["proxy"] = rss.get("proxy", 0) + int(size) // 1024
    return rss


class Peak(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak: dict[str, int] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for k, v in serve_rss().items():
                self.peak[k] = max(self.peak.get(k, 0), v)
            time.sleep(0.2)


def start_server(tree: Path, port: int, workdir: Path) -> subprocess.Popen:
    pkg = workdir / "pkg"
    pkg.mkdir()
    (pkg / "redline").symlink_to(tree)
    config = workdir / "serve.yaml"
    config.write_text(json.dumps({"port": port, "detectors": [{"name": "p", "kind": "profanity-check",
                                                                "num_cpus": 0.5}]}))
    env = {**os.environ, "PYTHONPATH": str(pkg), "REDLINE_API_KEY": KEY, "RAY_AUTH_MODE": "disabled",
           "REDLINE_STATE_DIR": str(workdir / "state")}
    proc = subprocess.Popen([sys.executable, "-m", "redline", "serve", "-c", str(config)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    import httpx

    deadline = time.time() + 240
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.kill()
    raise SystemExit("the server did not start")


async def big_bodies(url: str, label: str) -> None:
    import httpx

    body = b'{"texts": ["' + b"x" * (7_900_000 - 20) + b'"]}'
    peak = Peak()
    before = serve_rss()
    peak.start()
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=120)) as client:
        async def one() -> int | str:
            try:
                return (await client.post(url + "/v1/detect", content=body, headers={**AUTH,
                        "content-type": "application/json"})).status_code
            except httpx.HTTPError as err:
                return type(err).__name__
        started = time.perf_counter()
        codes = await asyncio.gather(*(one() for _ in range(120)))
        wall = time.perf_counter() - started
    time.sleep(3)
    peak.stop.set()
    peak.join()
    after = serve_rss()
    emit(tree=label, measured="120 concurrent 7.9 MB bodies", rss_before_mb=before, rss_peak_mb=peak.peak,
         rss_after_mb=after, answers={str(c): codes.count(c) for c in set(codes)}, wall_s=round(wall, 1))


async def flood(url: str, label: str) -> None:
    """The health poller runs in its own thread with its own client, so what it measures is the server,
    not the event loop of the 1,000 flooding clients."""
    import httpx

    health: list[float] = []
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(timeout=60) as client:
            while not done.is_set():
                t = time.perf_counter()
                try:
                    client.get(url + "/healthz")
                except httpx.HTTPError:
                    pass
                health.append(time.perf_counter() - t)
                time.sleep(0.1)

    poller = threading.Thread(target=poll, daemon=True)
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=1100)) as client:
        async def one(i: int) -> int | str:
            try:
                return (await client.post(url + "/v1/detect", json={"texts": [f"text number {i} you idiot"]},
                                          headers=AUTH)).status_code
            except httpx.HTTPError as err:
                return type(err).__name__
        poller.start()
        started = time.perf_counter()
        codes = await asyncio.gather(*(one(i) for i in range(1000)))
        wall = time.perf_counter() - started
        done.set()
    poller.join()
    lat = np.array(health) * 1000
    emit(tree=label, measured="1,000 parallel /v1/detect while /healthz is polled every 100 ms",
         health_p50_ms=round(float(np.percentile(lat, 50)), 1), health_max_ms=round(float(lat.max()), 1),
         health_polls=len(health), answers={str(c): codes.count(c) for c in set(codes)}, wall_s=round(wall, 1))


def slow_clients(port: int, url: str, label: str, seconds: float = 60.0, n: int = 40) -> None:
    """Slow clients hold a connection; what matters is whether the server answers (and lets go of) them:
    the time until the server's answer (408) reached each body-trickling client, if it did."""
    import httpx

    answered: dict[str, list[float]] = {"body": [], "headers": []}

    def trickle(kind: str) -> None:
        started = time.time()
        head = (f"POST /v1/detect HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {KEY}\r\n"
                "Content-Type: application/json\r\nContent-Length: 100000\r\n").encode()
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.settimeout(0.05)
            sent = 0
            try:
                if kind == "body":
                    s.sendall(head + b"\r\n")
                while time.time() - started < seconds:
                    if kind == "headers" and sent < len(head):
                        s.sendall(head[sent:sent + 1])
                    else:
                        s.sendall(b"x")
                    sent += 1
                    try:
                        if s.recv(4096):  # the server answered: the slot is free
                            answered[kind].append(time.time() - started)
                            return
                    except socket.timeout:
                        pass
                    time.sleep(max(0.0, seconds / 400 - 0.05))
            except OSError:  # the server closed the connection
                answered[kind].append(time.time() - started)

    threads = [threading.Thread(target=trickle, args=(k,)) for k in ("body", "headers") for _ in range(n)]
    for t in threads:
        t.start()
    ok = total = 0
    latencies = []
    end = time.time() + seconds
    while time.time() < end:
        t = time.perf_counter()
        try:
            resp = httpx.post(url + "/v1/detect", json={"texts": ["you idiot"]}, headers=AUTH, timeout=10)
            ok += resp.status_code == 200
        except httpx.HTTPError:
            pass
        latencies.append(time.perf_counter() - t)
        total += 1
        time.sleep(1)
    for t in threads:
        t.join()
    med = {k: round(float(np.median(v)), 1) if v else None for k, v in answered.items()}
    emit(tree=label, measured=f"{n} body-trickling + {n} header-trickling connections for {seconds:g} s",
         normal_requests_ok=f"{ok}/{total}", normal_p50_ms=round(float(np.median(latencies)) * 1000, 1),
         body_tricklers_answered=f"{len(answered['body'])}/{n}", body_answered_after_s_median=med["body"],
         header_tricklers_answered=f"{len(answered['headers'])}/{n}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=HERE, help="source tree to serve from")
    parser.add_argument("--label", default=None, help="name of the tree in the output (default: its path)")
    parser.add_argument("--slow-seconds", type=float, default=60.0)
    args = parser.parse_args()
    label = args.label or str(args.tree)
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        proc = start_server(args.tree.resolve(), port, Path(tmp))
        url = f"http://127.0.0.1:{port}"
        try:
            asyncio.run(big_bodies(url, label))
            asyncio.run(flood(url, label))
            slow_clients(port, url, label, args.slow_seconds)
        finally:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=120)


if __name__ == "__main__":
    main()
