#!/usr/bin/env python3
"""router_load.py: expert load per MoE layer of a shipped model over a whole text, from the engine's router inputs.

    python3 training/router_load.py --model models/k3-tiny --k3 build/k3 [--text models/heldout.txt]
        [--windows 0] [--tokens-npy .carry/data/train.npy --sample 32 --seed 1] [--json out.json]

Windows are those of `k3 perplexity -c ctx` (acceptance.windows: [b, b + ctx), b = k ctx; the last token of a
window is only a target, so each window feeds ctx - 1 tokens). Per window the engine runs
`k3 logits --trace-out DIR --dump ffn_norm` (fp32, CPU): ffn_norm-L{l}.npy is the MoE input of layer l
(post_attention_layernorm output). Routing is recomputed here from the checkpoint exactly as MODEL.md §8.2:
s = sigmoid(x W_gate^T) in fp32, the top-k of s + e_score_correction_bias. The load of expert j in a layer is
the number of (token, slot) picks of j / the mean over experts. PyTorch is ~20x slower on this CPU (the training
code computes every expert for every token), so the whole held-out text is measured this way; acceptance.py
measures the same quantity with PyTorch on the windows it runs (the two agree: see docs/training.md).
--tokens-npy samples --sample random windows of ctx tokens from a token stream instead (e.g. the training data,
to check that a calibrated bias balances the data it was calibrated on).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from load import read_safetensors  # noqa: E402


def router_tensors(model_dir):
    """-> {layer (0-based): (W_gate [E, D] fp32, bias [E] fp32)}, k (experts per token)."""
    cfg = json.load(open(os.path.join(model_dir, "config.json")))["text_config"]
    index = json.load(open(os.path.join(model_dir, "model.safetensors.index.json")))["weight_map"]
    want = {n: f for n, f in index.items() if ".block_sparse_moe.gate." in n}
    t = {}
    for f in sorted(set(want.values())):
        t.update({n: v for n, v in read_safetensors(os.path.join(model_dir, f)).items() if n in want})
    out = {}
    for n in want:
        if n.endswith("gate.weight"):
            layer = int(n.split(".layers.")[1].split(".")[0])
            bias = t[n.replace("gate.weight", "gate.e_score_correction_bias")]
            out[layer] = (t[n].float().numpy(), bias.float().numpy())
    return out, cfg["num_experts_per_token"]


def route_counts(x, w, bias, k):
    """x [N, D] -> picks per expert [E] (top-k of sigmoid(x W^T) + bias, ties to the lower index)."""
    s = 1.0 / (1.0 + np.exp(-(x.astype(np.float32) @ w.T)))
    biased = s + bias[None, :]
    sel = np.argsort(-biased, axis=-1, kind="stable")[:, :k]
    return np.bincount(sel.reshape(-1), minlength=w.shape[0])


def engine_ffn_norm(k3, model_dir, tokens, threads):
    with tempfile.TemporaryDirectory() as d:
        np.save(os.path.join(d, "t.npy"), tokens.astype(np.int64))
        cmd = [k3, "logits", "-m", model_dir, "--tokens-file", os.path.join(d, "t.npy"), "-o",
               os.path.join(d, "z.npy"), "--precision", "fp32", "-t", str(threads), "--trace-out",
               os.path.join(d, "trace"), "--dump", "ffn_norm"]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"{' '.join(cmd)}: exit {out.returncode}\n{out.stderr}")
        return {int(f[len("ffn_norm-L"):-4]): np.load(os.path.join(d, "trace", f))
                for f in os.listdir(os.path.join(d, "trace")) if f.startswith("ffn_norm-L")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--k3", required=True)
    ap.add_argument("--text", default="models/heldout.txt")
    ap.add_argument("--tokens-npy", help="sample windows from this token stream instead of --text")
    ap.add_argument("--sample", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--windows", type=int, default=0, help="first N windows of --text (0 = all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--range", help="A:B: only windows A..B-1 (to split a long run; --merge adds the parts)")
    ap.add_argument("--merge", nargs="+", help="JSON files of --range parts to add up (nothing is run)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    routers, k = router_tensors(args.model)
    if args.merge:
        parts = [json.load(open(f)) for f in args.merge]
        counts = {int(l) - 1: sum(np.asarray(p["counts"][l]) for p in parts) for l in parts[0]["counts"]}
        n_tok = sum(p["tokens_routed"] for p in parts)
        source = parts[0]["source"].split(" [")[0]
        report(args, counts, n_tok, source)
        return
    if args.tokens_npy:
        stream = np.load(args.tokens_npy).astype(np.int64)
        rng = np.random.default_rng(args.seed)
        chunks = [stream[b:b + args.ctx - 1] for b in rng.integers(0, len(stream) - args.ctx, args.sample)]
        source = f"{args.tokens_npy}: {args.sample} random windows, seed {args.seed}"
    else:
        from acceptance import windows
        from tokenize_corpus import load_tokenizer
        enc, _, _ = load_tokenizer(args.model)
        ids = np.asarray(enc.encode_ordinary(open(args.text, encoding="utf-8").read()), dtype=np.int64)
        chunks = [ids[b:min(b + args.ctx, len(ids)) - 1] for b in windows(len(ids), args.ctx, args.windows)]
        source = f"{args.text}: {len(chunks)} windows of {args.ctx}"
    if args.range:
        a, b = map(int, args.range.split(":"))
        chunks = chunks[a:b]
        source += f" [windows {a}:{min(b, a + len(chunks))}]"
    counts = {l: 0 for l in routers}
    n_tok = 0
    for i, c in enumerate(chunks):
        x = engine_ffn_norm(args.k3, args.model, c, args.threads)
        for l, (w, b) in routers.items():
            counts[l] = counts[l] + route_counts(x[l], w, b, k)
        n_tok += len(c)
        print(f"window {i + 1}/{len(chunks)}", file=sys.stderr, flush=True)
    report(args, counts, n_tok, source)


def report(args, counts, n_tok, source):
    per_layer = []
    for l in sorted(counts):
        rel = counts[l] / counts[l].mean()
        per_layer.append({"layer": l + 1, "min": round(float(rel.min()), 4), "max": round(float(rel.max()), 4),
                          "argmin": int(rel.argmin()), "argmax": int(rel.argmax())})
    res = {"model": args.model, "source": source, "tokens_routed": n_tok,
           "router_load_min": min(p["min"] for p in per_layer), "router_load_max": max(p["max"] for p in per_layer),
           "per_layer": per_layer, "counts": {str(l + 1): counts[l].tolist() for l in sorted(counts)}}
    res["pass"] = res["router_load_min"] >= 0.25 and res["router_load_max"] <= 4.0
    print(json.dumps({k_: v for k_, v in res.items() if k_ != "counts"}, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
