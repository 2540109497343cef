#!/usr/bin/env python3
"""Serving benchmark: a live `k3 serve` under an agent-like workload (long shared prefix, short new turn,
many sessions). Not part of CI; a few minutes on 2 cores.

  python3 bench/serve/bench_serve.py [--k3 build/k3] [--model models/k3-tiny] [--threads 2]
                                     [--prefix-tokens 768] [--sessions 4] [--out bench/results/serve.jsonl]

Measures, through the OpenAI API only:
  1. time to first token (a request with max_tokens 1) with a prefix hit vs a cold prefill of the same
     length; goal: hit / cold <= 0.10;
  2. tokens re-processed after a divergence at position p: p - usage.prompt_tokens_details.cached_tokens,
     goal <= (p mod T_h) + T_h, with the server's default checkpoint policy and with dense checkpoints;
  3. throughput (generated tokens/s over all streams) vs concurrency 1, 2, 4, 8, 16.
Appends JSON lines (bench, commit, machine, metric, value, unit, peer, peer_value, ratio, goal, met)."""
import argparse
import concurrent.futures
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "python"))
from server_live import Live  # noqa: E402


def machine():
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.node() or 'vm'} ({cpu}, {os.cpu_count()} cpus)"


def commit():
    try:
        c = subprocess.check_output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], text=True).strip()
        dirty = subprocess.call(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--", "src", "tools"])
        return c + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


class Recorder:
    def __init__(self, out, model):
        self.out, self.model, self.commit, self.machine = out, model, commit(), machine()

    def __call__(self, metric, value, unit, goal=None, met=None, peer=None, peer_value=None, ratio=None):
        row = {"bench": "serve", "commit": self.commit, "machine": self.machine,
               "metric": f"{metric} [{self.model}]", "value": value, "unit": unit, "peer": peer,
               "peer_value": peer_value, "ratio": ratio, "goal": goal, "met": met}
        print(json.dumps(row), flush=True)
        with open(self.out, "a") as f:
            f.write(json.dumps(row) + "\n")


def text_slices(n, chars):
    text = (ROOT / "models" / "heldout.txt").read_text(errors="replace")
    step = max(len(text) // (n + 1), chars)
    return [text[i * step:i * step + chars] for i in range(n)]


def ttft(client, model, msgs):
    t0 = time.perf_counter()
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=1, temperature=0)
    return time.perf_counter() - t0, r.usage


def bench_ttft(live, args, rec):
    """Agent sessions: a long system prompt of their own, then turns that each send back the whole
    conversation plus a short new user message. TTFT of turn k (k >= 1) with the prefix cache (it resumes
    at the previous turn's boundary) vs a cold prefill of a prompt of the same length (the same messages
    behind a one-character change at the start, so nothing matches)."""
    systems = text_slices(args.sessions, args.prefix_tokens * 4)
    cold, hit, cached, prompt = [], [], [], []
    for s, system in enumerate(systems):
        n = len(live.tokenize_chat([{"role": "system", "content": system}]))
        system = system[:int(len(system) * min(args.prefix_tokens / max(n, 1), 1.0))]
        msgs = [{"role": "system", "content": system}]
        for k in range(args.turns + 1):
            msgs.append({"role": "user", "content": f"Session {s}, step {k}: run the next tool and report."})
            if k > 0:
                t, u = ttft(live.client, live.model, msgs)
                hit.append(t)
                cached.append(u.prompt_tokens_details.cached_tokens / u.prompt_tokens)
                prompt.append(u.prompt_tokens)
                other = [{"role": "system", "content": f"{s}{k}" + system[2:]}] + msgs[1:]
                t, u = ttft(live.client, live.model, other)
                assert u.prompt_tokens_details.cached_tokens == 0
                cold.append(t)
            r = live.client.chat.completions.create(model=live.model, messages=msgs, max_tokens=args.gen_tokens,
                                                    temperature=0)
            m = r.choices[0].message
            turn = {"role": "assistant", "content": m.content or ""}
            if getattr(m, "reasoning_content", None):
                turn["reasoning_content"] = m.reasoning_content
            msgs.append(turn)
    c, h = statistics.median(cold), statistics.median(hit)
    rec("ttft cold prefill (median, prompt ~%d tokens)" % statistics.median(prompt), c * 1e3, "ms")
    rec("ttft prefix hit (median, follow-up turn)", h * 1e3, "ms", peer="ttft cold prefill", peer_value=c * 1e3,
        ratio=h / c, goal="hit/cold <= 0.10", met=h / c <= 0.10)
    rec("prompt share restored from the cache on follow-up turns (median)", statistics.median(cached),
        "fraction")


def bench_divergence(k3, args, rec, dense):
    extra = ["--cache-dense-checkpoints"] if dense else []
    live = Live(k3, ROOT, model=args.model, extra=extra, parallel=4, ctx=4096, threads=args.threads,
                block=args.block, hash_block=args.hash)
    try:
        th = args.hash
        base = live.post("/tokenize", {"prompt": text_slices(1, 6000)[0]})[1]["tokens"][:args.prefix_tokens]
        live.client.completions.create(model=live.model, prompt=base, max_tokens=1, temperature=0)
        worst, met_all = 0, True
        for p in [th + 3, len(base) // 3, len(base) // 2 + 5, len(base) - th - 7]:
            q = list(base)
            q[p] = (q[p] + 1) % 1000
            r = live.client.completions.create(model=live.model, prompt=q, max_tokens=1, temperature=0)
            wasted = p - r.usage.prompt_tokens_details.cached_tokens
            goal = p % th + th
            met_all = met_all and wasted <= goal
            worst = max(worst, wasted - goal)
            rec(f"re-processed before divergence at p={p} (T_h {th}, {'dense' if dense else 'turn-boundary'} "
                f"checkpoints)", wasted, "tokens", goal=f"<= {goal}", met=wasted <= goal)
            # the diverged prompt is now cached too: the next divergence starts from a fresh base
            live.client.completions.create(model=live.model, prompt=base, max_tokens=1, temperature=0)
        return met_all
    finally:
        live.stop()


def bench_throughput(live, args, rec):
    systems = text_slices(16, 400)

    def one(i):
        chunks = live.client.chat.completions.create(
            model=live.model, messages=[{"role": "system", "content": systems[i]},
                                        {"role": "user", "content": "Continue."}],
            max_tokens=args.gen_tokens, temperature=0, stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True})
        n = 0
        for c in chunks:
            if c.usage:
                n = c.usage.completion_tokens
        return n

    base = None
    for conc in (1, 2, 4, 8, 16):
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(conc) as ex:
            toks = sum(ex.map(one, range(conc)))
        tps = toks / (time.perf_counter() - t0)
        base = base or tps
        rec(f"decode throughput, {conc} concurrent streams x {args.gen_tokens} tokens", tps, "tokens/s",
            peer="1 stream", peer_value=base, ratio=tps / base)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k3", default=str(ROOT / "build" / "k3"))
    ap.add_argument("--model", default="k3-tiny")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefix-tokens", type=int, default=768)
    ap.add_argument("--sessions", type=int, default=3)
    ap.add_argument("--turns", type=int, default=3)  # follow-up turns per session
    ap.add_argument("--gen-tokens", type=int, default=24)
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--hash", type=int, default=64)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve.jsonl"))
    ap.add_argument("--skip", default="", help="comma list of ttft,divergence,throughput to skip")
    args = ap.parse_args()
    if not (ROOT / "models" / args.model).exists():
        sys.exit(f"models/{args.model} is missing (moved aside by a device call?)")
    skip = set(filter(None, args.skip.split(",")))
    rec = Recorder(args.out, args.model)
    if "divergence" not in skip:
        bench_divergence(args.k3, args, rec, dense=False)
        bench_divergence(args.k3, args, rec, dense=True)
    live = Live(args.k3, ROOT, model=args.model, parallel=16, ctx=4096, threads=args.threads, block=args.block,
                hash_block=args.hash)
    try:
        if "ttft" not in skip:
            bench_ttft(live, args, rec)
        if "throughput" not in skip:
            bench_throughput(live, args, rec)
    finally:
        live.stop()


if __name__ == "__main__":
    main()
