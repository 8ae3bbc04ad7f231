"""Storage calls against a real S3-compatible server (moto), with this process's cached connection
against a new connection per call (the code before: a boto3 session and credential lookup each time).

    .venv/bin/python bench/s3_connections.py [--calls 300]

Prints one JSON line per path (exists, read_bytes, listing) with calls/s both ways and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    exe = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
    if exe is None:
        raise SystemExit("moto_server not installed (pip install 'moto[server]')")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        from redline.cluster import artifacts, storage

        artifacts.s3_client().create_bucket(Bucket="bench")
        storage.write_bytes("s3://bench/run/a.txt", b"x" * 1000)
        calls = {"exists": lambda: storage.exists("s3://bench/run/a.txt"),
                 "read_bytes": lambda: storage.read_bytes("s3://bench/run/a.txt"),
                 "listing": lambda: artifacts.listing("s3://bench/run")}
        for name, call in calls.items():
            rates = {}
            for mode in ("cached", "new_per_call"):
                if mode == "new_per_call":
                    original = storage.s3_cached
                    storage.s3_cached = lambda kind, make: make()  # type: ignore[assignment]
                call()
                started = time.perf_counter()
                for _ in range(args.calls):
                    call()
                rates[mode] = args.calls / (time.perf_counter() - started)
                if mode == "new_per_call":
                    storage.s3_cached = original  # type: ignore[assignment]
            print(json.dumps({"what": f"{name} on moto S3, calls/s", "calls": args.calls,
                              "cached": round(rates["cached"], 1), "new_per_call": round(rates["new_per_call"], 1),
                              "ratio": round(rates["cached"] / rates["new_per_call"], 2)}), flush=True)
    finally:
        server.terminate()
        server.wait(timeout=10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
