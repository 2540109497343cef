"""python3 -m ref: run the NumPy reference and save its logits or every named intermediate.

    cd tests/python && python3 -m ref -m ../../models/tiny-k3 --tokens 1,2,3 -o ref.npy [--precision bf16]
    python3 -m ref -m DIR --tokens ... -o trace.npz --trace      # dict name -> array, e.g. l3.attn_out
Options --chunk N (chunkwise KDA), --absorbed (absorbed MLA), --decode (one token at a time).
"""
import argparse

import numpy as np

from .model import Reference


def main():
    ap = argparse.ArgumentParser(prog="python3 -m ref")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("-o", "--out", required=True, help=".npy logits [T, vocab] float32, or .npz with --trace")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--chunk", type=int, default=None)
    ap.add_argument("--absorbed", action="store_true")
    ap.add_argument("--decode", action="store_true")
    ap.add_argument("--trace", action="store_true")
    a = ap.parse_args()
    R = Reference(a.model, precision=a.precision, kda_chunk=a.chunk, mla_absorbed=a.absorbed)
    toks = [int(t) for t in a.tokens.split(",") if t.strip()]
    trace = {} if a.trace else None
    if a.decode:
        state = R.new_state()
        logits = np.concatenate([R.forward(toks[i:i + 1], state) for i in range(len(toks))])
    else:
        logits = R.forward(toks, trace=trace)
    if a.trace:
        np.savez(a.out, **{k: np.asarray(v) for k, v in (trace or {"logits": logits}).items()})
    else:
        np.save(a.out, logits.astype(np.float32))


if __name__ == "__main__":
    main()
