"""Scaling across Ray nodes: the score and attack pipelines on one node vs two nodes.

Setups (all on this machine, each node its own `ray start` process with its own ports and temp dir):
  baseline  1 node  x N CPUs
  split     2 nodes x N/2 CPUs   (the same cores, split across nodes: the cost of going multi-node)
  double    2 nodes x N CPUs     (twice the cores: on a machine with N cores this oversubscribes it,
                                  so the honest figure here is parallel efficiency, not speed-up)
The driver runs on a head node with no CPUs of its own, so all work runs on the worker nodes.
Prints one JSON object per (pipeline, setup): rows or attempts per second, against the baseline.

    .venv/bin/python bench/cluster_scaling.py --rows 8000 --seeds 600
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VENV_BIN = Path(sys.executable).parent
DAVIDSON = Path(__file__).resolve().parents[2] / "shared" / "data" / "offensive_tweet" / "labeled_data.csv"


def port() -> int:
    while True:
        p = random.randint(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
                return p
            except OSError:
                continue


class Nodes:
    def __init__(self, workers: list[int], root: Path) -> None:
        self.workers, self.root, self.procs = workers, root, []
        self.gcs = port()
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", "REDLINE_PROGRESS": "0",
                    "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}"}
        self.env.pop("RAY_ADDRESS", None)

    def start(self, args: list[str], name: str) -> None:
        ports = [f"--{k}={port()}" for k in ("dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                              "metrics-export-port", "runtime-env-agent-port", "node-manager-port",
                                              "object-manager-port")]
        log = open(self.root / f"{name}.log", "wb")
        self.procs.append(subprocess.Popen([str(VENV_BIN / "ray"), "start", "--block", "--node-ip-address=127.0.0.1",
                                            "--disable-usage-stats", "--object-store-memory=300000000", *ports, *args],
                                           env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def __enter__(self) -> "Nodes":
        self.start(["--head", f"--port={self.gcs}", "--num-cpus=0", "--include-dashboard=false"], "head")
        time.sleep(4)
        for i, cpus in enumerate(self.workers):
            self.start([f"--address=127.0.0.1:{self.gcs}", f"--num-cpus={cpus}",
                        f"--temp-dir={self.root / f'worker{i}'}"], f"worker{i}")
        deadline = time.time() + 120
        while time.time() < deadline:
            out = subprocess.run([str(VENV_BIN / "ray"), "status", f"--address=127.0.0.1:{self.gcs}"], env=self.env,
                                 capture_output=True, text=True).stdout
            if f"0.0/{float(sum(self.workers))} CPU" in out:
                return self
            time.sleep(1)
        raise TimeoutError("the worker nodes did not join")

    def __exit__(self, *_: object) -> None:
        for p in self.procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()

    def run(self, pipeline: str, config: Path) -> dict:
        env = {**self.env, "RAY_ADDRESS": f"127.0.0.1:{self.gcs}"}
        proc = subprocess.run([str(VENV_BIN / "redline"), "run", pipeline, "--config", str(config), "--force"],
                              env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
        run = next(Path(json.loads(config.read_text())["output"]).glob(f"{pipeline}-*"))
        return json.loads((run / "manifest.json").read_text())


def configs(root: Path, rows: int, seeds: int, actors: int, model: Path) -> dict[str, Path]:
    corpus = {"path": str(DAVIDSON), "preset": "davidson", "limit": rows}
    score = {"corpus": corpus, "shard_size": max(200, rows // 16), "output": str(root / "score-runs"),
             "detectors": [{"name": "tiny-bert", "kind": "hf", "model": str(model), "batch_size": 256,
                            "actors": actors, "num_cpus": 1}]}
    attack = {"corpus": {**corpus, "limit": None}, "victim": {"name": "p", "kind": "profanity-check"},
              "recipes": ["deepwordbug"], "max_seeds": seeds, "actors": actors, "num_cpus": 1, "batch_size": 32,
              "shard_size": max(50, seeds // 8), "output": str(root / "attack-runs")}
    out = {}
    for name, cfg in (("score", score), ("attack", attack)):
        out[name] = root / f"{name}.json"
        out[name].write_text(json.dumps(cfg))  # JSON is YAML
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8000, help="Davidson rows scored by a tiny BERT")
    parser.add_argument("--seeds", type=int, default=600, help="DeepWordBug seeds against profanity-check")
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 2, help="N: the baseline node's CPUs")
    args = parser.parse_args()
    if not DAVIDSON.is_file():
        sys.exit(f"needs {DAVIDSON}")
    from redline.actors.tiny_models import TinyBert, build_tiny_classifier
    from redline.pipelines.plane.corpora import CorpusConfig, read_corpus

    root = Path(tempfile.mkdtemp(prefix="redline-scaling-"))
    try:
        rows = [r for r in read_corpus(CorpusConfig(path=str(DAVIDSON), preset="davidson", limit=2000)).to_pylist()
                if r["status"] == "ok"]
        model = build_tiny_classifier([r["text"] for r in rows], [r["label"] for r in rows], root / "tiny-bert",
                                      spec=TinyBert(epochs=2, hidden_size=64, num_layers=2))
        n = args.cpus
        setups = [("baseline: 1 node x %d CPUs" % n, [n]), ("split: 2 nodes x %d CPUs" % max(1, n // 2), [max(1, n // 2)] * 2),
                  ("double: 2 nodes x %d CPUs" % n, [n, n])]
        base: dict[str, float] = {}
        for label, workers in setups:
            with Nodes(workers, root) as nodes:
                cfgs = configs(root, args.rows, args.seeds, sum(workers), model)
                for pipeline, unit in (("score", "rows"), ("attack", "attempts")):
                    m = nodes.run(pipeline, cfgs[pipeline])
                    seconds = m["timings"]["score_s" if pipeline == "score" else "attack_s"]
                    done = m["counts"]["rows_out"] if pipeline == "score" else m["counts"]["attempts_out"]
                    rate = done / seconds
                    base.setdefault(pipeline, rate)
                    ideal = sum(workers) / setups[0][1][0]
                    print(json.dumps({"what": f"{pipeline} {unit}/s", "setup": label, "cores": sum(workers),
                                      "ours": round(rate, 1), "baseline": round(base[pipeline], 1),
                                      "ratio": round(rate / base[pipeline], 3),
                                      "parallel_efficiency": round(rate / base[pipeline] / ideal, 3)}), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
