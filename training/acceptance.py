#!/usr/bin/env python3
"""acceptance.py: issue 4's checks of a shipped tiny model, PyTorch (fp32, CPU) against the engine (fp32, CPU).

    python3 training/acceptance.py --model models/k3-tiny   --k3 build/k3 [--windows 0] --json out.json
    python3 training/acceptance.py --model models/k3.1-tiny --k3 build/k3 [--windows 0] --json out.json

Text: --text (default models/heldout.txt) encoded with the model's tokenizer as ordinary text (no BOS);
windows [b, b + ctx) with b = k ctx, exactly `k3 perplexity -c ctx` (train.evaluate_text); --windows N keeps
the first N windows on both sides (0 = all). Checks, each printed and stored in the JSON:
  ppl           PyTorch (load.load: the exported tensors, MXFP4 experts decoded) vs `k3 perplexity -t T`;
                passes when |engine - pytorch| / pytorch <= 0.5%
  top1          per scored position, argmax of the PyTorch logits == argmax of `k3 logits` (fp32, the same
                window as --tokens-file); passes at >= 99%
  router_load   per MoE layer, tokens routed to each expert over the scored text (PyTorch, the checkpoint's
                biased top-k) / mean; passes when every expert is within [25%, 400%] of the mean
  dsa (K3.1)    PyTorch perplexity with the main attention dense (MLA.dense) vs sparse; passes within 3%;
                the selected index sets of every DSA layer and window are saved to --index-out (.npz,
                [T, topk] positions per layer and window, -1 padded, rows t < topk all -1)
  index_sets (K3.1) per window and DSA layer, PyTorch's selected set (Indexer.select: stable descending sort,
                ties -> lower position) against the engine's (`k3 logits --trace-out DIR --dump dsa_sel`, the
                same window; ties -> lower position); passes when every row of every window and layer is the
                same set. Mismatched rows are reported with PyTorch's gap between its topk-th and
                (topk+1)-th index score (a near-tie that fp32 summation order can flip shows as a tiny gap)
Exit status 1 when a check fails.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k31_stages  # noqa: E402
from load import load  # noqa: E402
from mla import Indexer  # noqa: E402
from tokenize_corpus import load_tokenizer  # noqa: E402


def windows(n, ctx, limit):
    starts, b = [], 0
    while True:
        starts.append(b)
        if b + ctx >= n or (limit and len(starts) >= limit):
            return starts
        b += ctx


def nll_top1(logits, ids):
    lp = torch.log_softmax(logits.double(), -1)
    return float(-lp.gather(-1, ids[:, None]).sum()), logits.argmax(-1)


@torch.no_grad()
def pytorch_side(model, ids, starts, ctx, dsa):
    """-> nll sum, count, argmax per window, router counts [layers, E], per window a list over DSA layers of
    (keep [T, T] bool, gap [T]: topk-th minus (topk+1)-th index score, nan for rows t < topk)."""
    loads = {}
    hooks = []
    for i, m in enumerate(model.moe_layers()):
        def pre(mod, inp, i=i):
            x = inp[0].reshape(-1, inp[0].shape[-1]).float()
            s = torch.sigmoid(x @ mod.gate.weight.float().t())
            sel = (s + mod.gate.e_score_correction_bias).topk(mod.k, dim=-1).indices
            loads[i] = loads.get(i, 0) + torch.bincount(sel.reshape(-1), minlength=mod.E)
        hooks.append(m.register_forward_pre_hook(pre))
    cur = []
    if dsa:
        orig = Indexer.select

        def select(self, scores):
            keep = orig(self, scores)
            T = scores.shape[-1]
            gap = torch.full((T,), float("nan"), dtype=torch.float64)
            if T > self.topk:
                v = scores[0].topk(self.topk + 1, dim=-1).values.double()
                gap[self.topk:] = (v[:, self.topk - 1] - v[:, self.topk])[self.topk:]
            cur.append((keep[0].clone(), gap))
            return keep
        Indexer.select = select
    nll, count, argmax, sets = 0.0, 0, [], []
    for b in starts:
        w = torch.from_numpy(ids[b:min(b + ctx, len(ids))].astype(np.int64))
        cur.clear()
        logits = model(w[None, :-1])[0].float()
        s, a = nll_top1(logits, w[1:])
        nll, count = nll + s, count + len(w) - 1
        argmax.append(a)
        sets.append(list(cur))
    for h in hooks:
        h.remove()
    if dsa:
        Indexer.select = orig
    return nll, count, argmax, torch.stack([loads[i] for i in sorted(loads)]), sets


def engine_ppl(k3, model_dir, text, ctx, n_windows, threads):
    cmd = [k3, "perplexity", "-m", model_dir, "-f", text, "-c", str(ctx), "-t", str(threads),
           "--max-windows", str(n_windows), "--precision", "fp32"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {out.returncode}\n{out.stderr}")
    return float(out.stdout.strip().splitlines()[-1].split(":")[1]), " ".join(cmd)


def engine_logits(k3, model_dir, tokens, threads, trace_sel=False):
    """-> argmax [T] of `k3 logits` (fp32), and with trace_sel the engine's DSA sets: a list over the DSA
    layers (ascending layer index) of [T, topk] int positions, -1 for unused (`--dump dsa_sel`)."""
    with tempfile.TemporaryDirectory() as d:
        np.save(os.path.join(d, "t.npy"), tokens.astype(np.int64))
        cmd = [k3, "logits", "-m", model_dir, "--tokens-file", os.path.join(d, "t.npy"), "-o",
               os.path.join(d, "z.npy"), "--precision", "fp32", "-t", str(threads)]
        if trace_sel:
            cmd += ["--trace-out", os.path.join(d, "trace"), "--dump", "dsa_sel"]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"{' '.join(cmd)}: exit {out.returncode}\n{out.stderr}")
        argmax = torch.from_numpy(np.load(os.path.join(d, "z.npy"))).argmax(-1)
        sel = []
        if trace_sel:
            files = [f for f in os.listdir(os.path.join(d, "trace")) if f.startswith("dsa_sel-L")]
            for f in sorted(files, key=lambda f: int(f[len("dsa_sel-L"):-len(".npy")])):
                sel.append(np.load(os.path.join(d, "trace", f)).astype(np.int64))
        return argmax, sel


def compare_sets(py_layers, eng_layers, T):
    """PyTorch (keep [T, T], gap [T]) vs engine [T, topk] positions, per DSA layer -> list of dicts."""
    out = []
    for l, ((keep, gap), e) in enumerate(zip(py_layers, eng_layers)):
        if e.shape[0] != T:
            out.append({"layer": l, "rows": T, "rows_equal": 0, "error": f"engine rows {e.shape[0]}"})
            continue
        mask = torch.zeros(T, T + 1, dtype=torch.bool)                 # column T absorbs the -1 padding
        mask.scatter_(1, torch.from_numpy(np.where(e < 0, T, e)), True)
        eq = (mask[:, :T] == keep).all(-1)
        bad = (~eq).nonzero()[:, 0]
        out.append({"layer": l, "rows": T, "rows_equal": int(eq.sum()),
                    "mismatched_rows": [int(t) for t in bad[:20]],
                    "mismatch_gaps": [float(gap[t]) for t in bad[:20]],
                    "min_gap_all_rows": float(np.nanmin(gap.numpy())) if T > e.shape[1] else None})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--k3", required=True, help="the built k3 CLI")
    ap.add_argument("--text", default="models/heldout.txt")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--windows", type=int, default=0, help="first N windows on both sides (0 = all)")
    ap.add_argument("--top1-windows", type=int, default=4, help="windows compared by argmax (k3 logits)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--index-out", help="K3.1: save PyTorch's selected index sets (.npz)")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    enc, _, _ = load_tokenizer(args.model)
    ids = np.asarray(enc.encode_ordinary(open(args.text, encoding="utf-8").read()), dtype=np.int64)
    starts = windows(len(ids), args.ctx, args.windows)
    model = load(args.model).eval()
    dsa = model.args.dsa
    nll, count, argmax, loads, sets = pytorch_side(model, ids, starts, args.ctx, dsa)
    res = {"model": args.model, "text": args.text, "tokens": len(ids), "windows": len(starts), "ctx": args.ctx,
           "scored": count, "pytorch_ppl": math.exp(nll / count)}
    res["engine_ppl"], res["engine_command"] = engine_ppl(args.k3, args.model, args.text, args.ctx, len(starts),
                                                          args.threads)
    res["ppl_rel_diff"] = abs(res["engine_ppl"] - res["pytorch_ppl"]) / res["pytorch_ppl"]
    agree = total = 0
    set_rows = []
    n_runs = len(starts) if dsa else min(args.top1_windows, len(starts))
    for w in range(n_runs):
        b, a = starts[w], argmax[w]
        tokens = ids[b:min(b + args.ctx, len(ids)) - 1]
        e, sel = engine_logits(args.k3, args.model, tokens, args.threads, trace_sel=dsa)
        if w < args.top1_windows:
            agree, total = agree + int((e == a).sum()), total + len(a)
        if dsa:
            if len(sel) != len(sets[w]):
                sys.exit(f"engine traced {len(sel)} DSA layers, PyTorch {len(sets[w])}")
            for r in compare_sets(sets[w], sel, len(tokens)):
                set_rows.append({"window": w, **r})
    res["top1_agreement"], res["top1_positions"] = agree / total, total
    rel = loads.double() / loads.double().mean(-1, keepdim=True)
    res["router_load_min"], res["router_load_max"] = float(rel.min()), float(rel.max())
    res["router_load_per_layer"] = [[round(float(v), 3) for v in (r.min(), r.max())] for r in rel]
    ok = {"ppl": res["ppl_rel_diff"] <= 0.005, "top1": res["top1_agreement"] >= 0.99,
          "router_load": 0.25 <= res["router_load_min"] and res["router_load_max"] <= 4.0}
    if dsa:
        k31_stages.set_dense(model, True)
        dnll, dcount, _, _, _ = pytorch_side(model, ids, starts, args.ctx, False)
        k31_stages.set_dense(model, False)
        res["pytorch_ppl_dense"] = math.exp(dnll / dcount)
        res["dsa_vs_dense"] = res["pytorch_ppl"] / res["pytorch_ppl_dense"] - 1
        ok["dsa_vs_dense"] = abs(res["dsa_vs_dense"]) <= 0.03
        eq, rows = sum(r["rows_equal"] for r in set_rows), sum(r["rows"] for r in set_rows)
        topk = model.args.index_topk
        sel_rows = sum(max(r["rows"] - topk, 0) for r in set_rows)      # rows where the indexer selects
        res["index_sets"] = {"windows": n_runs, "dsa_layers": len(sets[0]), "rows": rows,
                             "rows_selecting": sel_rows, "rows_equal": eq,
                             "windows_layers_all_equal": sum(r["rows_equal"] == r["rows"] for r in set_rows),
                             "windows_layers": len(set_rows), "per_window_layer": set_rows}
        ok["index_sets_equal"] = eq == rows
        if args.index_out:
            topk = model.args.index_topk
            arr = {}
            for w, layers in enumerate(sets):
                for l, (keep, _) in enumerate(layers):
                    pos = torch.full((keep.shape[0], topk), -1, dtype=torch.int32)
                    for t in range(topk, keep.shape[0]):
                        pos[t] = keep[t].nonzero()[:, 0].to(torch.int32)
                    arr[f"w{w}_dsa{l}"] = pos.numpy()
            np.savez_compressed(args.index_out, **arr)
            res["index_sets_npz"] = args.index_out
    res["checks"] = ok
    print(json.dumps(res, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    sys.exit(0 if all(ok.values()) else 1)


if __name__ == "__main__":
    main()
