#!/usr/bin/env python3
"""size.py: parameter counts and exported checkpoint bytes of a K3 / K3.1 config, before any training.

    python3 training/size.py                     # the ModelArgs defaults, K3 and K3.1
    python3 training/size.py d_model=320 n_expert=48 moe_intermediate_size=64   # try another shape

Bytes follow export.py exactly (it builds the model and asks export.canonical_tensors for every tensor's
checkpoint dtype): bf16 (2 B) for most tensors, fp32 (4 B) for A_log, dt_bias, conv, o_norm, router bias
and the indexer LayerNorm, MXFP4 routed experts at 4.25 bits per weight (a nibble plus one E8M0 byte per 32).
The limit of issue 4 is 40 MB per model in git; we aim at <= 38 MB (decimal) so the shipped folder, with its
tokenizer (0.3 MB) and config, stays under it. Also prints the K3.1 delta: the tensors the staged K3.1
training changes (every tensor of the MLA/DSA layers' self_attn, indexer included), which is what the device
run hands back for K3.1 (docs/training.md).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export import canonical_tensors  # noqa: E402
from k3_config import ModelArgs  # noqa: E402
from model import K3Model  # noqa: E402

LIMIT_MB = 38.0


def k31_delta_names(names, a: ModelArgs):
    """Canonical names the K3.1 stages change: model.layers.{mla}.self_attn.* (indexer included)."""
    prefixes = tuple(f"model.layers.{i}.self_attn." for i in range(a.n_layer) if a.is_mla(i))
    return [n for n in names if n.startswith(prefixes)]


def report(a: ModelArgs) -> dict:
    torch.manual_seed(0)
    m = K3Model(a)
    t = canonical_tensors(m)
    nbytes = sum(v.numel() * v.element_size() for v in t.values())
    delta = k31_delta_names(t, a)
    dbytes = sum(t[n].numel() * t[n].element_size() for n in delta)
    c = m.param_counts()
    c.update(checkpoint_MB=round(nbytes / 1e6, 2), checkpoint_MiB=round(nbytes / 2**20, 2),
             k31_delta_MB=round(dbytes / 1e6, 2), embedding_and_head=2 * a.vocab_size * a.d_model)
    return c


def main(argv):
    kw = {}
    for item in argv:
        k, v = item.split("=")
        kw[k] = type(getattr(ModelArgs, k))(v) if not isinstance(getattr(ModelArgs, k), bool) else v == "1"
    ok = True
    for dsa in (False, True):
        a = ModelArgs(**{**kw, "dsa": dsa})
        r = report(a)
        fits = r["checkpoint_MB"] <= LIMIT_MB
        ok &= fits
        print(f"{'K3.1' if dsa else 'K3  '}: " + ", ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}"
                                                          for k, v in r.items()) + ("" if fits else "  OVER LIMIT"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
