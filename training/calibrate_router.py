#!/usr/bin/env python3
"""calibrate_router.py: the last training stage, Quantile Balancing of the router biases with every weight frozen.

    python3 training/calibrate_router.py --model models/k3-tiny --data .carry/data/train.npy \
        --windows 32 --seed 7 --out /tmp/k3-tiny-cal [--k31 models/k3.1-tiny --k31-out /tmp/k3.1-tiny-cal]

Why: the router bias `e_score_correction_bias` is not trained by gradient; Quantile Balancing (moe.py) sets it
between steps from the margins of the last batch. The device run ends with the bias of its last step, set
from one batch while the weights were still moving (and QAT switched on late). This stage re-runs the same QB
update (LatentMoE._qb_observe + qb_update: 512-bin histogram of the margins, level 1 - k/E, damping, re-centring)
on TRAINING data with all weights frozen, until it reaches its fixed point: every expert gets ~k/E of the picks.
Only the 11 bias vectors change (selection only; the mixture weights never see the bias). The held-out text is
never used.

Data: --windows random windows of 1024 tokens of the training stream (.carry/data/train.npy: the same
[BOS]-prefixed prose and chat mix the model trained on), drawn with --seed.
Procedure, layer-sequential (the bias of layer l changes only the inputs of layers > l): one forward pass over
all windows as one batch; a forward pre-hook on each MoE layer takes that layer's router inputs x (all tokens),
computes s = sigmoid(x W^T) once and applies --iters QB updates to the bias on them (each update sees the
current bias through the cutoffs alpha), then lets the layer route with the new bias, so the next layer sees
inputs of the calibrated model. The experts are evaluated sparsely here (only the selected experts per
token; the same function as moe.py's all-expert form, faster on a CPU) with the checkpoint's MXFP4 values.
Output: the model folder copied with only the bias tensors replaced (fp32; every other tensor byte-identical),
and calibration.json (per layer the load min/max x mean on the calibration tokens before and after).
--k31: the K3.1 folder is rebuilt from the calibrated K3 folder exactly as the device run's folder was
(assemble_k31.py): its delta (the DSA layers' self_attn tensors, the only ones that differ from K3) is
extracted from the given K3.1 folder against --model and re-applied to the calibrated K3 folder.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import assemble_k31  # noqa: E402
from load import load  # noqa: E402
from moe import LatentMoE, situ, top_k_lower  # noqa: E402

BIAS = "e_score_correction_bias"


def sparse_experts(self, z, wts):
    """LatentMoE.experts computing only the selected experts (wts is zero elsewhere; sigmoid > 0 when picked)."""
    out = torch.zeros_like(z)
    for e in range(self.E):
        rows = (wts[:, e] != 0).nonzero()[:, 0]
        if len(rows):
            ze = z[rows]
            h = situ(ze @ self.w1[e].t(), ze @ self.w3[e].t(), self.b1, self.b2) * wts[rows, e:e + 1]
            out.index_add_(0, rows, h @ self.w2[e].t())
    return out


def loads(s, bias, k):
    """picks per expert / mean, from scores s [N,E] and bias [E]."""
    sel = top_k_lower(s + bias, k)
    c = torch.bincount(sel.reshape(-1), minlength=s.shape[1]).double()
    return c / c.mean()


@torch.no_grad()
def calibrate(model, x, iters, damping):
    report = []
    hooks = []
    for i, m in enumerate(model.moe_layers()):
        def pre(mod, inp, i=i):
            h = inp[0].reshape(-1, inp[0].shape[-1]).float()
            s = torch.sigmoid(h @ mod.gate.weight.float().t())
            b = mod.gate.e_score_correction_bias
            before = loads(s, b, mod.k)
            old = b.clone()
            for _ in range(iters):
                mod.qb_hist.zero_()
                mod._qb_observe(s, s + b)
                mod.qb_update(damping)
            after = loads(s, b, mod.k)
            report.append({"moe_layer": i, "tokens": s.shape[0],
                           "before_min": round(float(before.min()), 4), "before_max": round(float(before.max()), 4),
                           "after_min": round(float(after.min()), 4), "after_max": round(float(after.max()), 4),
                           "bias_change_max": round(float((b - old).abs().max()), 5)})
            print(json.dumps(report[-1]), flush=True)
        hooks.append(m.register_forward_pre_hook(pre))
    orig = LatentMoE.experts
    LatentMoE.experts = sparse_experts
    try:
        model.hidden(x)
    finally:
        LatentMoE.experts = orig
        for h in hooks:
            h.remove()
    return report


def write_biases(src, dst, biases):
    """Copy model folder src to dst with the named fp32 bias tensors replaced; all else byte for byte."""
    os.makedirs(dst, exist_ok=True)
    index = json.load(open(os.path.join(src, "model.safetensors.index.json")))["weight_map"]
    for f in os.listdir(src):
        if not f.endswith(".safetensors"):
            shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    done = set()
    for shard in sorted(set(index.values())):
        t = assemble_k31.read_raw(os.path.join(src, shard))
        for n in t:
            if n in biases:
                dt, shape, _ = t[n]
                assert dt == "F32" and shape == [biases[n].numel()], (n, dt, shape)
                t[n] = (dt, shape, biases[n].numpy().astype("<f4").tobytes())
                done.add(n)
        assemble_k31.write_raw(os.path.join(dst, shard), t)
    assert done == set(biases), set(biases) - done


def k31_delta(k3_dir, k31_dir, path):
    """The K3.1 folder's tensors that are new or differ from the K3 folder's -> one delta file (assemble_k31)."""
    def tensors(d):
        idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"]
        out = {}
        for shard in sorted(set(idx.values())):
            out.update(assemble_k31.read_raw(os.path.join(d, shard)))
        return out
    a, b = tensors(k3_dir), tensors(k31_dir)
    delta = {n: v for n, v in b.items() if n not in a or a[n] != v}
    assemble_k31.write_raw(path, delta)
    # write_raw's metadata holds only "format"; add the K3.1 config as k31_stages.export_delta does
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header["__metadata__"]["config.json"] = open(os.path.join(k31_dir, "config.json")).read()
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + raw[8 + n:])
    return len(delta)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", default=".carry/data/train.npy", help="training token stream (never held-out)")
    ap.add_argument("--windows", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--iters", type=int, default=40, help="QB updates per layer on the calibration tokens")
    ap.add_argument("--damping", type=float, default=0.5, help="as training (train.py --qb-damping)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--k31", help="K3.1 folder built on --model; rebuilt on the calibrated K3 into --k31-out")
    ap.add_argument("--k31-out")
    args = ap.parse_args(argv)
    if "heldout" in args.data or "val" in os.path.basename(args.data):
        sys.exit(f"{args.data}: calibration uses training data only")

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    t0 = time.time()
    model = load(args.model).eval()
    model.set_qat(False)           # the loaded experts already hold the MXFP4 grid values (load.py)
    stream = np.load(args.data)
    rng = np.random.default_rng(args.seed)
    starts = rng.integers(0, len(stream) - args.ctx, args.windows)
    x = torch.from_numpy(np.stack([stream[s:s + args.ctx] for s in starts]).astype(np.int64))
    report = calibrate(model, x, args.iters, args.damping)
    biases = {}
    for name, buf in model.named_buffers():
        if name.endswith(BIAS):
            layer = name.split(".")[1]
            biases[f"language_model.model.layers.{layer}.block_sparse_moe.gate.{BIAS}"] = buf.detach().float().clone()
    write_biases(args.model, args.out, biases)
    info = {"stage": "router calibration (Quantile Balancing, weights frozen)", "model_in": args.model,
            "data": args.data, "windows": args.windows, "ctx": args.ctx, "seed": args.seed,
            "window_starts": [int(s) for s in starts], "iters": args.iters, "damping": args.damping,
            "qb_bins": LatentMoE.QB_BINS, "layers": report, "seconds": round(time.time() - t0, 1)}
    with open(os.path.join(args.out, "calibration.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(f"{args.out}: {len(biases)} bias vectors replaced ({info['seconds']} s)")
    if args.k31:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "k31-delta.safetensors")
            n = k31_delta(args.model, args.k31, path)
            print(f"K3.1 delta against {args.model}: {n} tensors")
            assemble_k31.main(["--k3", args.out, "--delta", path, "--out", args.k31_out])
        for f in os.listdir(args.k31):
            if not f.endswith(".safetensors") and f not in ("model.safetensors.index.json", "config.json") \
                    and not os.path.exists(os.path.join(args.k31_out, f)):
                shutil.copy(os.path.join(args.k31, f), os.path.join(args.k31_out, f))
        shutil.copy(os.path.join(args.out, "calibration.json"), os.path.join(args.k31_out, "calibration.json"))


if __name__ == "__main__":
    main()
