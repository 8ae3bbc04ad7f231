"""How long `redline view`'s run list takes to load for many runs, locally and on S3 (moto).

    .venv/bin/python bench/view_runs.py [--from redline-runs] [--runs 100] [--s3]
    .venv/bin/python bench/view_runs.py --from redline-runs --runs 10000 --manifests-only

Copies the runs under --from (e.g. what `redline quickstart` wrote) round-robin into N run
directories, serves them with the viewer (uvicorn, as `redline view` does) and times over HTTP: the
first page of the run list (cold: every manifest read), then the median of 5 loads of the first page,
a deep page, the live refresh of a page's runs (`/api/runs?id=...`) and the whole `/api/runs`. The
baseline is what every page cost before the list kept finished runs' rows (every manifest read),
and that read with one thread. Target (issue 36): a page of a 10,000-run list < 300 ms. With --s3
the same on a moto S3 server on 127.0.0.1 (no row cache there: a listing carries no manifest times).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def make_runs(source: Path, n: int, out: Path, manifests_only: bool = False) -> None:
    runs = sorted(p for p in source.iterdir() if (p / "manifest.json").is_file())
    if not runs:
        raise SystemExit(f"no runs under {source}: run `redline quickstart --output {source}` first")
    for i in range(n):
        src = runs[i % len(runs)]
        dst = out / f"{src.name}-{i:05d}"
        if manifests_only:  # what the run list reads
            dst.mkdir()
            shutil.copy(src / "manifest.json", dst / "manifest.json")
        else:
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("models"))
        manifest = json.loads((dst / "manifest.json").read_text())
        manifest.update(run_name=dst.name, run_uri=str(dst))
        (dst / "manifest.json").write_text(json.dumps(manifest))


def serve(root: str) -> tuple[str, object]:
    import uvicorn

    from redline.cluster.net import free_port
    from redline.view.app import build_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(root), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", server


def timed(fn, repeat: int = 5) -> float:
    fn()  # warm: imports, connections
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(root: str, where: str, n: int) -> None:
    import httpx

    from redline.view import catalog

    url, server = serve(root)
    with httpx.Client(timeout=120) as client:
        started = time.perf_counter()
        first = client.get(url + "/")
        first.raise_for_status()
        cold_s = time.perf_counter() - started  # every manifest read
        listed = len(client.get(url + "/api/runs").json()["runs"])
        assert listed == n, f"listed {listed} of {n} runs"
        html_s = timed(lambda: client.get(url + "/").raise_for_status())
        deep_s = timed(lambda: client.get(url + "/", params={"page": str(max(1, n // 200))}).raise_for_status())
        ids = [("id", i) for i in re.findall(r'data-id="([^"]+)"', first.text)]
        refresh_s = timed(lambda: client.get(url + "/api/runs", params=ids).raise_for_status())
        api_s = timed(lambda: client.get(url + "/api/runs").raise_for_status())
    chosen_s = timed(lambda: catalog.find_runs(root), repeat=3)
    one_thread_s = timed(lambda: catalog.find_runs(root, workers=1), repeat=3)
    server.should_exit = True
    emit(where=where, runs=n, first_list_page_cold_s=round(cold_s, 3), list_page_s=round(html_s, 3),
         deep_list_page_s=round(deep_s, 3), live_refresh_of_a_page_s=round(refresh_s, 3), api_all_runs_s=round(api_s, 3),
         baseline_every_manifest_read_s=round(chosen_s, 3), baseline_one_thread_s=round(one_thread_s, 3),
         speedup_over_reading_every_manifest=round(chosen_s / html_s, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", default="redline-runs")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--s3", action="store_true", help="also on a moto S3 server (moto_server on PATH)")
    parser.add_argument("--manifests-only", action="store_true",
                        help="copy only each run's manifest (what the list reads; for --runs 10000)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="redline-view-bench-") as tmp:
        local = Path(tmp) / "runs"
        local.mkdir()
        make_runs(Path(args.source), args.runs, local, args.manifests_only)
        measure(str(local), "local", args.runs)
        if args.s3:
            s3_bench(local, args.runs)


def s3_bench(local: Path, n: int) -> None:
    import boto3

    from redline.cluster.net import free_port

    exe = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
    port = free_port()
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        endpoint = f"http://127.0.0.1:{port}"
        os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                          AWS_DEFAULT_REGION="us-east-1")
        s3 = boto3.client("s3", endpoint_url=endpoint)
        for _ in range(100):
            try:
                s3.create_bucket(Bucket="view-bench")
                break
            except Exception:  # noqa: BLE001 - the server is still starting
                time.sleep(0.1)
        for path in local.rglob("*"):
            if path.is_file():
                s3.upload_file(str(path), "view-bench", f"runs/{path.relative_to(local)}")
        measure("s3://view-bench/runs", "s3 (moto on loopback)", n)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
