"""numerics.py: precision modes and the common ops of MODEL.md §3, in float64.

Two modes:
  fp32: no rounding anywhere (all math in float64, weights decoded exactly): the exact-math reference.
  bf16: the same float64 math, rounded to bf16 (round to nearest even) at MODEL.md's rounding points:
        linear outputs, RMSNorm x*r and its product with the weight, conv/SiLU out, KDA o and gated y,
        MLA z and gated o, activations h, AttnRes adds and mixes, MoE sums. fp32 quantities (router
        scores, beta, gates, softmax, states) are kept at float64, i.e. only bf16 rounding is modelled.
Ops:
  linear(x, W)        = bf16(x W^T)                          W [out, in], no bias
  rms_norm(x, w, eps) = bf16(bf16(x * rsqrt(mean(x^2) + eps)) * w)    plain weight (not 1 + w)
"""
from __future__ import annotations

import numpy as np


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float64 -> nearest-even bf16 value (via float32), returned as float64."""
    f = np.asarray(x, dtype=np.float64).astype(np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
    out = u.astype(np.uint32).view(np.float32).astype(np.float64)
    return np.where(np.isnan(f), np.nan, out)


class Numerics:
    def __init__(self, precision: str):
        if precision not in ("fp32", "bf16"):
            raise ValueError(f"precision must be 'fp32' or 'bf16', not {precision!r}")
        self.precision = precision

    def bf16(self, x: np.ndarray) -> np.ndarray:
        """A rounding point: bf16 in bf16 mode, identity in fp32 mode."""
        return round_bf16(x) if self.precision == "bf16" else np.asarray(x, dtype=np.float64)

    def linear(self, x: np.ndarray, W: np.ndarray) -> np.ndarray:
        return self.bf16(x @ W.T)

    def rms_norm(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
        return self.bf16(self.bf16(x * r) * w)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))   # overflow-free form of 1 / (1 + e^-x)


def silu(x: np.ndarray) -> np.ndarray:
    return x * sigmoid(x)


def softplus(z: np.ndarray) -> np.ndarray:
    """log(1 + e^z), and z itself above the threshold 20 (torch/FLA convention)."""
    return np.where(z > 20.0, z, np.log1p(np.exp(np.minimum(z, 20.0))))


def softmax(s: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax that tolerates -inf entries (masked positions)."""
    m = np.max(s, axis=axis, keepdims=True)
    e = np.exp(s - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def l2norm(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """x / sqrt(sum x^2 + eps) over the last axis (FLA l2norm)."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries of a 1-D array: score descending, ties -> lower index."""
    return np.lexsort((np.arange(scores.size), -scores))[:k]
