#!/usr/bin/env python3
"""export_reference.py: PyTorch's numbers for an exported model, for the engine's tests (no torch in CI).

    /usr/bin/python3 training/export_reference.py --model models/k3-tiny --text models/heldout.txt \
        --ctx 256 --windows 4 -o tests/data/k3-tiny-reference.json

Writes the perplexity of the first `windows` windows (the `k3 perplexity -c ctx --max-windows N` definition,
train.evaluate_text, fp32 on the CPU) and the top-1 next-token prediction at every position of the first
window, so the engine's perplexity and argmax agreement can be checked against PyTorch. For a K3.1 model
also PyTorch's DSA selected sets over the first window (`first_window_dsa_sel`: per DSA layer, ascending,
one hex string per query row t, bit s set when position s is read; Indexer.select, ties -> lower position),
which the test compares with `k3 logits --trace-out DIR --dump dsa_sel`.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from load import load  # noqa: E402
from mla import Indexer  # noqa: E402
from tokenize_corpus import load_tokenizer  # noqa: E402
from train import evaluate_text  # noqa: E402


def mask_hex(row):
    """bool [T] -> hex of sum(2^s for kept s) (the test rebuilds it from the engine's positions)."""
    return hex(sum(1 << int(s) for s in row.nonzero()[:, 0]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    enc, _, _ = load_tokenizer(a.model)
    with open(a.text, encoding="utf-8") as f:
        ids = np.asarray(enc.encode_ordinary(f.read()), dtype=np.int64)
    model = load(a.model)
    ev = evaluate_text(model, ids, a.ctx, 4, torch.device("cpu"), False, a.windows)
    model.eval()
    sets, orig = [], Indexer.select

    def select(self, scores):
        keep = orig(self, scores)
        sets.append([mask_hex(row) for row in keep[0]])
        return keep
    Indexer.select = select
    with torch.no_grad():
        first = torch.from_numpy(ids[:a.ctx][None])
        top1 = model(first)[0].float().argmax(-1).tolist()
    Indexer.select = orig
    out = {"model": a.model, "text": a.text, "ctx": a.ctx, "windows": a.windows,
           "tokens_scored": ev["tokens_scored"], "pytorch_ppl": ev["ppl"],
           "first_window_ids": ids[:a.ctx].tolist(), "first_window_top1": top1}
    if sets:
        out["first_window_dsa_sel"] = sets
    json.dump(out, open(a.out, "w"))
    print(f"ppl {ev['ppl']:.6f} over {ev['tokens_scored']} tokens -> {a.out}")


if __name__ == "__main__":
    main()
