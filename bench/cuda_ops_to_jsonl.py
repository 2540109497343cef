#!/usr/bin/env python3
"""bench/cuda_ops_to_jsonl.py: turns a `test-ops perf -b cuda` log (scripts/device/cuda_ops_check.sh writes
cuda_ops_perf.log) into JSON lines for bench/results/cuda_ops.jsonl: one line per cuda row, value = device
time per op in us (back-to-back runs between two synchronizations, copies excluded), with the harness's
GB/s and GFLOP/s beside it. No peer: the ops are compared with the fp64 host reference only for speed-up.

usage: python3 bench/cuda_ops_to_jsonl.py LOG COMMIT [--machine "NVIDIA H200"] >> bench/results/cuda_ops.jsonl
"""
import argparse
import json
import re

ROW = re.compile(r"^\s+(\S+)\s+cuda\s+(.+?)\s+([\d.]+) us\s+([\d.]+) GB/s\s+([\d.]+) GFLOP/s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("commit")
    ap.add_argument("--machine", default="NVIDIA H200")
    a = ap.parse_args()
    with open(a.log) as f:
        for line in f:
            m = ROW.match(line)
            if not m:
                continue
            op, shape, us, gbs, gflops = m.groups()
            print(json.dumps({"bench": f"cuda_ops/{op}", "commit": a.commit, "machine": a.machine,
                              "metric": f"device time {shape.strip()}", "value": float(us), "unit": "us",
                              "gb_per_s": float(gbs), "gflop_per_s": float(gflops), "peer": None,
                              "peer_value": None, "ratio": None, "goal": None, "met": None}))


if __name__ == "__main__":
    main()
