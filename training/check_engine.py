#!/usr/bin/env python3
"""check_engine.py: held-out perplexity of an exported model by PyTorch and by the engine, side by side.

    python3 training/check_engine.py --model DIR --k3 build-x/k3 [--ctx 256 --windows 4 --text .carry/data/val_eval.txt]

PyTorch side: load.load(DIR) (the exported tensors, MXFP4 experts dequantized), fp32 on the CPU, the text
encoded with DIR's tokenizer as ordinary text (no BOS), windows and scoring exactly as `k3 perplexity`
(train.evaluate_text). Engine side: `k3 perplexity -m DIR -f TEXT -c CTX --max-windows N` (fp32), its last
stdout line "perplexity: X". Both numbers and their relative difference are printed; the exit status is 1
when the difference exceeds --tol (default 1e-3). Both run fp32 and agree to ~1e-6 relative, except where a
router top-k has a near-tie (gap ~1e-6 between the k-th and (k+1)-th biased score): there fp32 summation
order can pick another expert and move that one position's logits (seen once in 255 tokens of a random model).
This checks, end to end, the tokenizer, every module, the checkpoint layout and the MXFP4 decode.
"""
import argparse
import os
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from load import load  # noqa: E402
from tokenize_corpus import load_tokenizer  # noqa: E402
from train import evaluate_text  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--k3", required=True, help="path of the built k3 CLI")
    ap.add_argument("--text", default=".carry/data/val_eval.txt")
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--tol", type=float, default=1e-3)
    args = ap.parse_args(argv)

    enc, _, _ = load_tokenizer(args.model)
    with open(args.text, encoding="utf-8") as f:
        ids = np.asarray(enc.encode_ordinary(f.read()), dtype=np.int64)
    model = load(args.model)
    torch_ev = evaluate_text(model, ids, args.ctx, 4, torch.device("cpu"), False, args.windows)
    cmd = [args.k3, "perplexity", "-m", args.model, "-f", args.text, "-c", str(args.ctx),
           "--max-windows", str(args.windows)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        print(out.stderr, file=sys.stderr)
        sys.exit(f"{' '.join(cmd)}: exit {out.returncode}")
    engine_ppl = float(out.stdout.strip().splitlines()[-1].split(":")[1])
    rel = abs(engine_ppl - torch_ev["ppl"]) / torch_ev["ppl"]
    print(f"tokens {len(ids)}, {torch_ev['windows']} windows of {args.ctx}, {torch_ev['tokens_scored']} scored")
    print(f"pytorch perplexity {torch_ev['ppl']:.6f}")
    print(f"engine  perplexity {engine_ppl:.6f}")
    print(f"relative difference {rel:.2e} ({'ok' if rel <= args.tol else 'MISMATCH'}, tol {args.tol:g})")
    sys.exit(0 if rel <= args.tol else 1)


if __name__ == "__main__":
    main()
