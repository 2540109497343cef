#!/usr/bin/env python3
"""run_llama.py: llama.cpp (through llama-cpp-python) on a GGUF: prefill / decode speed and logits.

    python3 run_llama.py speed  MODEL.gguf -p 64 -n 8 -r 2 -t 2      -> one JSON object on stdout
    python3 run_llama.py logits MODEL.gguf --tokens IDS.npy -o OUT.npy -t 2

speed, as k3 bench measures it: ppP = one fresh sequence, P random ids in one decode call (logits of the
last token only), tokens/s = P / t; tgN = a fresh sequence, N calls of one id each, tokens/s = N / t.
Only the llama_decode calls are timed (not the load). The median of -r runs is reported.
logits: all positions' logits [T, n_vocab] fp32 of one prefill of the given ids.
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np
from llama_cpp import Llama


def load(path, n_ctx, n_batch, threads, logits_all):
    return Llama(model_path=path, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, n_threads=threads,
                 n_threads_batch=threads, logits_all=logits_all, use_mmap=True, verbose=False)


def speed(a):
    llm = load(a.model, a.n_prompt + a.n_gen + 16, max(a.n_prompt, 1), a.threads, False)
    n_vocab = llm.n_vocab()
    rng = np.random.default_rng(1234)
    llm.reset()
    llm.eval([int(rng.integers(n_vocab))])  # warm-up: page in the weights
    pp, tg = [], []
    for _ in range(a.reps):
        ids = [int(i) for i in rng.integers(0, n_vocab, a.n_prompt)]
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        pp.append(time.perf_counter() - t0)
    for _ in range(a.reps):
        llm.reset()
        t = 0.0
        for _ in range(a.n_gen):
            t0 = time.perf_counter()
            llm.eval([int(rng.integers(n_vocab))])
            t += time.perf_counter() - t0
        tg.append(t)
    out = {"pp": a.n_prompt, "tg": a.n_gen, "threads": a.threads,
           "prefill_tok_s": a.n_prompt / statistics.median(pp), "decode_tok_s": a.n_gen / statistics.median(tg),
           "prefill_s": pp, "decode_s": tg}
    print(json.dumps(out))


def logits(a):
    ids = [int(i) for i in np.load(a.tokens).reshape(-1)]
    llm = load(a.model, len(ids) + 16, len(ids), a.threads, True)
    llm.reset()
    llm.eval(ids)
    np.save(a.out, np.asarray(llm.scores[: len(ids)], dtype=np.float32))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["speed", "logits"])
    ap.add_argument("model")
    ap.add_argument("-p", "--n-prompt", type=int, default=64)
    ap.add_argument("-n", "--n-gen", type=int, default=8)
    ap.add_argument("-r", "--reps", type=int, default=2)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--tokens")
    ap.add_argument("-o", "--out")
    a = ap.parse_args()
    if a.mode == "speed":
        speed(a)
    else:
        if not a.tokens or not a.out:
            sys.exit("logits needs --tokens and -o")
        logits(a)


if __name__ == "__main__":
    main()
