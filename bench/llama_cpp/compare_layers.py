#!/usr/bin/env python3
"""compare_layers.py: per-layer NMSE of k3 traces against a llama.cpp dump (dump_llama.py), and MoE routing.

    python3 compare_layers.py LLAMA_DIR K3_TRACE_DIR [K3_TRACE_DIR2] --tokens 16 --layers 4

For each layer: attn_norm, ffn_norm, ffn_out NMSE (all tokens) and the worst token; for MoE layers the
largest |weight difference| per token (k3 moe_weights vs llama.cpp ffn_moe_weights_norm, sorted per token,
so a routing flip shows up as a large value) next to llama.cpp's top-k margin (k-th minus (k+1)-th biased
score: the smaller, the easier a tiny input change flips the choice). The k3 traces come from
`k3 logits ... --trace-out DIR --dump attn_norm --dump ffn_norm --dump ffn_out --dump moe_weights`;
K3_LINEAR_X_BF16=1 in k3's environment rounds its linear inputs to bf16 as ggml does (docs/decisions.md cpu.1).
"""
import argparse
import pathlib

import numpy as np


def nmse(a, r):
    a, r = a.astype(np.float64), r.astype(np.float64)
    return float(((a - r) ** 2).sum() / (r ** 2).sum()), ((a - r) ** 2).sum(-1) / (r ** 2).sum(-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("llama")
    ap.add_argument("k3", nargs="+")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--layers", type=int, default=4)
    a = ap.parse_args()
    T = a.tokens
    ll = lambda n: np.load(pathlib.Path(a.llama) / f"{n}.npy")
    for L in range(a.layers):
        for name in ("attn_norm", "ffn_norm", "ffn_out"):
            r = ll(f"{name}-{L}").reshape(T, -1)
            for d in a.k3:
                tot, per = nmse(np.load(pathlib.Path(d) / f"{name}-L{L}.npy").reshape(T, -1), r)
                print(f"L{L} {name:10s} {d}: nmse {tot:.2e}, worst token {per.argmax()} {per.max():.1e}")
        f = pathlib.Path(a.llama) / f"ffn_moe_topk-{L}.npy"
        if not f.exists():
            continue
        k = ll(f"ffn_moe_topk-{L}").reshape(T, -1).shape[1]
        wl = ll(f"ffn_moe_weights_norm-{L}").reshape(T, -1)
        srt = np.sort(ll(f"ffn_moe_probs_biased-{L}").reshape(T, -1), -1)[:, ::-1]
        for d in a.k3:
            wk = np.load(pathlib.Path(d) / f"moe_weights-L{L}.npy").reshape(T, -1)
            dw = np.abs(np.sort(wk, -1) - np.sort(wl, -1)).max(-1)
            print(f"L{L} moe |dw| {d}: " + " ".join(f"{x:.0e}" for x in dw))
        print(f"L{L} llama.cpp top-{k} margin: " + " ".join(f"{x:.0e}" for x in srt[:, k - 1] - srt[:, k]))


if __name__ == "__main__":
    main()
