#!/usr/bin/env python3
"""bench_memory.py: resident memory of `k3 run -n N` against the weight bytes and the per-sequence state.

    python3 bench/bench_memory.py [MODEL_DIR] [-n 400] [--k3 build/k3] [--jsonl bench/results/memory.jsonl]

Samples /proc/<pid>/status during the run (bench/memory_probe.py) and reports, as JSON lines:
  rss_file   the largest file-backed resident set (the mmapped weights touched), ratio to the weight bytes
  rss_anon   the largest anonymous resident set, ratio to the per-sequence state `k3 info` computes for
             the generated length (KDA state + cache per token x tokens) -- the rest is the process's
             fixed cost (tokenizer, thread stacks, activations, logits)
  anon_growth  the largest RssAnon after the first quarter of the samples minus RssAnon then, ratio to
             the cache growth over the same tokens (about 1 or less when nothing but the cache grows)
"""
import argparse
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from memory_probe import info_sizes, run_sampled  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default=str(ROOT / "models" / "k3-tiny"))
    ap.add_argument("-n", type=int, default=400)
    ap.add_argument("--k3", default=os.environ.get("K3_BIN", str(ROOT / "build" / "k3")))
    ap.add_argument("--jsonl", default=str(ROOT / "bench" / "results" / "memory.jsonl"))
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args()
    per_tok, kda, weights = info_sizes(a.k3, a.model)
    with tempfile.TemporaryDirectory() as tmp:
        ids = pathlib.Path(tmp) / "ids.npy"
        cmd = [a.k3, "run", "-m", a.model, "-p", "It was a bright morning when", "-n", str(a.n), "--temp", "1",
               "--seed", "7", "-c", "4096", "-t", str(a.threads), "--tokens-out", str(ids)]
        rc, _, err, samples, peak = run_sampled(cmd)
        if rc != 0:
            sys.exit(err)
        n_gen = int(np.load(ids).size)
    rss_file = max(s["RssFile"] for _, s in samples)
    rss_anon = max(s["RssAnon"] for _, s in samples)
    q = len(samples) // 4
    anon = [s["RssAnon"] for _, s in samples]
    growth = max(anon[q:]) - anon[q]
    cache_growth = per_tok * n_gen * (len(samples) - 1 - q) / max(len(samples) - 1, 1)
    state = kda + per_tok * n_gen
    c = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    machine = os.environ.get("K3_MACHINE", f"{socket.gethostname()} ({cpu}, {os.cpu_count()} cpus)")
    name = pathlib.Path(a.model).name
    rows = [
        ("rss_file", rss_file, "weight bytes (k3 info)", weights),
        ("rss_anon", rss_anon, "per-sequence state bytes (k3 info, generated length)", state),
        ("anon_growth", growth, "cache growth over the same tokens (k3 info)", cache_growth),
        ("peak_rss", peak, "weight bytes (k3 info)", weights),
    ]
    with open(a.jsonl, "a") as f:
        for metric, value, peer, peer_value in rows:
            j = {"bench": "memory", "commit": c.stdout.strip() or "unknown", "machine": machine,
                 "metric": f"{metric} k3 run -n {a.n} ({n_gen} generated) {name} t{a.threads}", "value": value,
                 "unit": "bytes", "peer": peer, "peer_value": peer_value,
                 "ratio": value / peer_value if peer_value else None, "goal": None, "met": None}
            print(json.dumps(j))
            f.write(json.dumps(j) + "\n")
    print(f"{len(samples)} samples; weights {weights} B, state {state} B", file=sys.stderr)


if __name__ == "__main__":
    main()
