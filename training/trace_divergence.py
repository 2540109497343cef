#!/usr/bin/env python3
"""trace_divergence.py: where the engine's forward pass first departs from PyTorch's on one held-out window.

    python3 training/trace_divergence.py --model models/k3.1-tiny --k3 build/k3 --window 12 [--tol 1e-3]

The window is acceptance.py's window W of --text (tokens [W ctx, (W + 1) ctx - 1)). The engine runs
`k3 logits --trace-out DIR --dump attn_norm --dump attn_out --dump ffn_norm --dump ffn_out` (fp32, CPU);
PyTorch (fp32) records the same four tensors per layer with hooks (attn_norm = the attention's input after
input_layernorm, ffn_norm = the FFN input after post_attention_layernorm, the MoE router's input). Per layer
it prints the largest |engine - PyTorch| of each and the first token where it exceeds --tol; for every MoE
layer it compares the engine's traced routing weights (`moe_weights`, k per token) with PyTorch's: tokens where
they differ are tokens where the engine routed differently; it also recomputes the router on BOTH sides' inputs (s = sigmoid(x W^T) fp32, top-k of s + bias) and lists
the tokens whose selected expert sets differ, with PyTorch's gap between its k-th and (k+1)-th biased score.
A router flip on near-identical inputs (ffn_norm equal to ~1e-6, gap ~1e-7) is fp32 summation order, not a
bug; a large difference that appears inside a block with equal inputs would be a real one.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from acceptance import windows  # noqa: E402
from load import load  # noqa: E402
from moe import LatentMoE  # noqa: E402
from tokenize_corpus import load_tokenizer  # noqa: E402

NAMES = ("attn_norm", "attn_out", "ffn_norm", "ffn_out")
ENGINE_NAMES = NAMES + ("moe_weights",)


def engine_trace(k3, model_dir, tokens, threads, names=ENGINE_NAMES):
    with tempfile.TemporaryDirectory() as d:
        np.save(os.path.join(d, "t.npy"), tokens.astype(np.int64))
        cmd = [k3, "logits", "-m", model_dir, "--tokens-file", os.path.join(d, "t.npy"), "-o",
               os.path.join(d, "z.npy"), "--precision", "fp32", "-t", str(threads), "--trace-out",
               os.path.join(d, "trace")]
        for n in names:
            cmd += ["--dump", n]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"{' '.join(cmd)}: exit {out.returncode}\n{out.stderr}")
        res = {}
        for f in os.listdir(os.path.join(d, "trace")):
            name, layer = f[:-4].rsplit("-L", 1)
            res[(name, int(layer))] = np.load(os.path.join(d, "trace", f))
        return res


@torch.no_grad()
def pytorch_trace(model, tokens):
    rec, hooks = {}, []
    moes = {m: l for l, m in enumerate(model.layers) if hasattr(m, "block_sparse_moe")}
    moes = {m.block_sparse_moe: l for m, l in moes.items()}
    orig = LatentMoE.route

    def route(self, x):                       # the routing PyTorch's forward really used: weights [T, E]
        w = orig(self, x)
        rec[("route", moes[self])] = w.float().clone()
        return w
    for l, layer in enumerate(model.layers):
        def attn(mod, inp, out, l=l):
            rec[("attn_norm", l)] = inp[0][0].float().numpy().copy()
            rec[("attn_out", l)] = out[0].float().numpy().copy()

        def ffn_in(mod, inp, out, l=l):
            rec[("ffn_norm", l)] = out[0].float().numpy().copy()

        def ffn_out(mod, inp, out, l=l):
            rec[("ffn_out", l)] = out[0].float().numpy().copy()
        hooks.append(layer.self_attn.register_forward_hook(attn))
        hooks.append(layer.post_attention_layernorm.register_forward_hook(ffn_in))
        ffn = layer.block_sparse_moe if hasattr(layer, "block_sparse_moe") else layer.mlp
        hooks.append(ffn.register_forward_hook(ffn_out))
    LatentMoE.route = route
    try:
        model(torch.from_numpy(tokens.astype(np.int64))[None])
    finally:
        LatentMoE.route = orig
        for h in hooks:
            h.remove()
    return rec


def route(x, moe):
    """Router recomputed on x [T, D] -> (selected ids sorted [T, k], k-th minus (k+1)-th biased score [T])."""
    s = torch.sigmoid(torch.from_numpy(x).float() @ moe.gate.weight.float().t())
    v, i = (s + moe.gate.e_score_correction_bias).sort(dim=-1, descending=True, stable=True)
    return i[:, :moe.k].sort(-1).values, (v[:, moe.k - 1] - v[:, moe.k])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--k3", required=True)
    ap.add_argument("--text", default="models/heldout.txt")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--window", type=int, required=True, help="0-based, as acceptance.py's per_window_layer")
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    enc, _, _ = load_tokenizer(args.model)
    ids = np.asarray(enc.encode_ordinary(open(args.text, encoding="utf-8").read()), dtype=np.int64)
    b = windows(len(ids), args.ctx, args.window + 1)[args.window]
    tokens = ids[b:min(b + args.ctx, len(ids)) - 1]
    model = load(args.model).eval()
    eng = engine_trace(args.k3, args.model, tokens, args.threads)
    py = pytorch_trace(model, tokens)
    report = {"model": args.model, "window": args.window, "tokens": len(tokens), "layers": []}
    for l, layer in enumerate(model.layers):
        row = {"layer": l + 1}
        for n in NAMES:
            d = np.abs(eng[(n, l)].reshape(py[(n, l)].shape) - py[(n, l)]).max(-1)   # per token
            over = np.nonzero(d > args.tol)[0]
            row[n] = {"max": float(d.max()), "first_token_over_tol": int(over[0]) if len(over) else None}
        if hasattr(layer, "block_sparse_moe"):
            moe = layer.block_sparse_moe
            sel_p, gap = route(py[("ffn_norm", l)], moe)
            sel_e, _ = route(eng[("ffn_norm", l)].reshape(py[("ffn_norm", l)].shape), moe)
            # the engine's own choice: its traced routing weights (k per token, selection order) against the
            # weights PyTorch's forward used; a different expert set shows as different weights
            w_p = py[("route", l)]
            w_p = w_p[w_p != 0].reshape(len(tokens), -1).sort(-1).values
            w_e = torch.from_numpy(eng[("moe_weights", l)].reshape(len(tokens), -1)).sort(-1).values
            own = ((w_e - w_p).abs().max(-1).values > 1e-4).nonzero()[:, 0].tolist()
            row["engine_router_differs"] = [{"token": t, "pytorch_gap": float(gap[t]),
                                             "ffn_norm_maxdiff": float(np.abs(eng[("ffn_norm", l)].reshape(
                                                 len(tokens), -1)[t] - py[("ffn_norm", l)][t]).max())}
                                            for t in own[:8]]
            row["engine_router_differs_count"] = len(own)
            flips = (sel_p != sel_e).any(-1).nonzero()[:, 0].tolist()
            row["router_flips"] = [{"token": t, "pytorch_gap": float(gap[t]),
                                    "ffn_norm_maxdiff": float(np.abs(eng[("ffn_norm", l)].reshape(len(tokens), -1)[t]
                                                                     - py[("ffn_norm", l)][t]).max()),
                                    "only_pytorch": sorted(set(sel_p[t].tolist()) - set(sel_e[t].tolist())),
                                    "only_engine": sorted(set(sel_e[t].tolist()) - set(sel_p[t].tolist()))}
                                   for t in flips[:8]]
            row["router_flip_count"] = len(flips)
        report["layers"].append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
