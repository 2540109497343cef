#!/usr/bin/env python3
"""side_by_side.py: one checkpoint, k3 and llama.cpp, same machine, same thread count (bench/llama_cpp/run.sh).

Speed: `k3 bench -p PP -n TG -b 1 --precision bf16` against run_llama.py speed (llama.cpp's bf16 GGUF):
prefill and decode tokens/s, ratio = k3 / llama.cpp, goal 1.5; --reps rounds, each one k3 run then one
llama.cpp run (interleaved), medians over the rounds. Logits: both engines over the same 16
random ids, all positions; NMSE = sum (k3 - llama)^2 / sum llama^2, for k3 --precision bf16 and fp32,
goal 1e-4. Every number is appended to --jsonl (bench, commit, machine, metric, value, unit, peer,
peer_value, ratio, goal, met) and printed. The two engines run one after the other, never at once.
"""
import argparse
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def sh(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(map(str, cmd))}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    return r.stdout


def commit():
    c = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return (c.stdout.strip() or "unknown") + ("-dirty" if dirty else "")


def machine():
    if os.environ.get("K3_MACHINE"):
        return os.environ["K3_MACHINE"]
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    return f"{socket.gethostname()} ({cpu}, {os.cpu_count()} cpus)"


def nmse(a, ref):
    a, ref = a.astype(np.float64), ref.astype(np.float64)
    return float(((a - ref) ** 2).sum() / (ref ** 2).sum())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--k3", required=True)
    ap.add_argument("--llama-python", default=sys.executable)
    ap.add_argument("--pp", type=int, default=64)
    ap.add_argument("--tg", type=int, default=8)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-logits", type=int, default=16)
    ap.add_argument("--jsonl", required=True)
    ap.add_argument("--peer", default="llama.cpp")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--skip-logits", action="store_true")
    ap.add_argument("--bw-mb", type=int, default=0, help="k3 bench's bandwidth buffer (MiB; 0: its default)")
    a = ap.parse_args()
    name = pathlib.Path(a.model).name
    t = str(a.threads)
    lines = []

    def emit(metric, value, unit, peer_value=None, goal=None, higher_is_better=True):
        ratio = value / peer_value if peer_value else None
        met = None
        if goal is not None:
            met = (ratio if ratio is not None else value) >= goal if higher_is_better else value <= goal
        j = {"bench": "llama_cpp", "commit": commit(), "machine": machine(), "metric": metric, "value": value,
             "unit": unit, "peer": a.peer if peer_value is not None or unit == "nmse" else None,
             "peer_value": peer_value, "ratio": ratio, "goal": goal, "met": met}
        lines.append(j)
        print(json.dumps(j), flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        if not a.skip_speed:
            # Interleaved rounds (k3, then llama.cpp, --reps times), each engine one repetition per round,
            # so a shared machine's load drifts over both alike; medians over the rounds.
            k3r = {"pp": [], "tg": []}
            llr = {"pp": [], "tg": []}
            for i in range(a.reps):
                jl = tmp / f"k3_{i}.jsonl"
                out = sh([a.k3, "bench", "-m", a.model, "-p", a.pp, "-n", a.tg, "-b", 1, "-r", 1,
                          "--precision", "bf16", "-t", t, "--jsonl", jl] + (["--bw-mb", a.bw_mb] if a.bw_mb else []))
                print(out, flush=True)
                k3 = {json.loads(l)["metric"].split()[1]: json.loads(l)["value"]
                      for l in jl.read_text().splitlines() if json.loads(l)["unit"] == "tokens/s"}
                k3r["pp"].append(k3[f"pp{a.pp}"])
                k3r["tg"].append(k3[f"tg{a.tg}"])
                ll = json.loads(sh([a.llama_python, HERE / "run_llama.py", "speed", a.gguf, "-p", a.pp, "-n", a.tg,
                                    "-r", 1, "-t", t]).strip().splitlines()[-1])
                print("llama.cpp:", json.dumps(ll), flush=True)
                llr["pp"].append(ll["prefill_tok_s"])
                llr["tg"].append(ll["decode_tok_s"])
                print(f"round {i}: prefill k3/llama {k3r['pp'][-1] / llr['pp'][-1]:.2f}, "
                      f"decode {k3r['tg'][-1] / llr['tg'][-1]:.2f}", flush=True)
            med = statistics.median
            emit(f"prefill pp{a.pp} {name} bf16 t{t}", med(k3r["pp"]), "tokens/s", med(llr["pp"]), 1.5)
            emit(f"decode tg{a.tg} {name} bf16 t{t}", med(k3r["tg"]), "tokens/s", med(llr["tg"]), 1.5)

        if not a.skip_logits:
            cfg = json.loads((pathlib.Path(a.model) / "config.json").read_text())
            n_vocab = cfg.get("text_config", cfg)["vocab_size"]
            ids = np.random.default_rng(7).integers(0, n_vocab - 256, a.n_logits).astype(np.int32)
            np.save(tmp / "ids.npy", ids)
            sh([a.llama_python, HERE / "run_llama.py", "logits", a.gguf, "--tokens", tmp / "ids.npy",
                "-o", tmp / "llama.npy", "-t", t])
            ref = np.load(tmp / "llama.npy")
            for prec in ("bf16", "fp32"):
                sh([a.k3, "logits", "-m", a.model, "--tokens-file", tmp / "ids.npy", "-o", tmp / f"k3_{prec}.npy",
                    "--precision", prec, "-t", t])
                got = np.load(tmp / f"k3_{prec}.npy")
                assert got.shape == ref.shape, (got.shape, ref.shape)
                agree = float((got.argmax(-1) == ref.argmax(-1)).mean())
                emit(f"logits nmse vs llama.cpp {name} k3 {prec} T{a.n_logits}", nmse(got, ref), "nmse",
                     goal=1e-4, higher_is_better=False)
                print(f"  argmax agreement {prec}: {agree:.3f}", flush=True)
    with open(a.jsonl, "a") as f:
        for j in lines:
            f.write(json.dumps(j) + "\n")


if __name__ == "__main__":
    main()
