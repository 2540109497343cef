"""attn_res.py: Block Attention Residuals (MODEL.md §7), per token, no state across positions.

Pseudo-query per site, folded once in fp32 and never rounded: q = norm.weight * proj.weight   [D]
AR(B, p, q):  V = [B_0 .. B_{n-1}, p]            raw sources, no norm on V
              s_i = (q . V_i) * rsqrt(mean_d V_i^2 + eps)      (no 1/sqrt(D))
              alpha = softmax_i(s)  (fp32, over depth)
              return bf16(sum_i alpha_i V_i)
Block bookkeeping lives in model.py (the layer loop of §7).
"""
from __future__ import annotations

import numpy as np

from .numerics import softmax


def pseudo_query(norm_weight: np.ndarray, proj_weight: np.ndarray) -> np.ndarray:
    """[D] x [1, D] -> q [D]; the product of two bf16 values is exact in fp32 (and here in float64)."""
    return norm_weight.reshape(-1) * proj_weight.reshape(-1)


def attn_res(n, blocks: list, p: np.ndarray, q: np.ndarray, eps: float) -> np.ndarray:
    """blocks: list of [T, D] stored block reps, p [T, D] partial sum -> mix [T, D]."""
    V = np.stack(list(blocks) + [p])                                   # [n+1, T, D]
    s = (V @ q) / np.sqrt(np.mean(V * V, axis=-1) + eps)               # [n+1, T]
    alpha = softmax(s, axis=0)
    return n.bf16(np.einsum("nt,ntd->td", alpha, V))
