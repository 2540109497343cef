"""ffn.py: dense GLU MLP (MODEL.md §8.1), Stable LatentMoE (§8.2, K3) and the KL MoE (§8.3).

GLU: g = gate x, u = up x (bf16), h = bf16(act(g, u)), out = down h
  silu (KL): act = silu(g) u
  situ (K3): act = b1 tanh(g/b1) sigmoid(g) * b2 tanh(u/b2)    (b2 absent -> u)
Router (both MoEs), per token: s = sigmoid(x W_gate^T) (fp32, full-width x);
  sel = top-k of s + e_score_correction_bias, slots ordered by biased score descending, ties -> lower id;
  w_j = s[sel_j] / (sum_j s[sel_j] + 1e-20) * routed_scaling_factor   (unbiased scores)
LatentMoE: z = routed_expert_down_proj x;  y = bf16(sum_j w_j E_sel_j(z)) (slot order);
  y = RMSNorm(y; routed_expert_norm, eps) if latent_moe_use_norm;  y = routed_expert_up_proj y
  out = bf16(y + shared_experts(x))
KL MoE: out = bf16(bf16(sum_j w_j E_sel_j(x)) + shared_experts(x))
Experts E_e(z) = w2 act(w1 z, w3 z); w1 = gate, w3 = up, w2 = down (MXFP4 or bf16, see checkpoint.py).
"""
from __future__ import annotations

import numpy as np

from .numerics import sigmoid, silu, top_k


def glu_act(n, cfg, g: np.ndarray, u: np.ndarray) -> np.ndarray:
    if cfg.act == "silu":
        return n.bf16(silu(g) * u)
    b1 = cfg.situ_beta
    a = b1 * np.tanh(g / b1) * sigmoid(g)      # sigmoid takes the uncapped g
    b = u if cfg.situ_linear_beta is None else cfg.situ_linear_beta * np.tanh(u / cfg.situ_linear_beta)
    return n.bf16(a * b)


def dense_mlp(n, cfg, W, x: np.ndarray) -> np.ndarray:
    """W(name) -> weight under the MLP prefix (gate_proj/up_proj/down_proj)."""
    h = glu_act(n, cfg, n.linear(x, W("gate_proj.weight")), n.linear(x, W("up_proj.weight")))
    return n.linear(h, W("down_proj.weight"))


def route(cfg, x: np.ndarray, W_gate: np.ndarray, bias: np.ndarray):
    """x [T, D] -> (sel [T, k] expert ids in slot order, w [T, k] mixture weights, c [T, E] choice scores)."""
    s = sigmoid(x @ W_gate.T)                                   # [T, E] unbiased scores
    c = s + bias                                                # choice scores (selection only)
    sel = np.stack([top_k(c[t], cfg.n_expert_used) for t in range(s.shape[0])])
    s_sel = np.take_along_axis(s, sel, axis=1)
    if cfg.renormalize:
        s_sel = s_sel / (np.sum(s_sel, axis=1, keepdims=True) + 1e-20)
    return sel, s_sel * cfg.routed_scaling_factor, c


def routed_sum(n, cfg, W, z: np.ndarray, sel: np.ndarray, w: np.ndarray) -> np.ndarray:
    """sum_j w_j E_sel_j(z), fp32 accumulation in slot order; W(name) -> weight under block_sparse_moe."""
    T, k = sel.shape
    out = np.zeros((T, k, z.shape[1]))                         # expert outputs per (token, slot)
    for e in np.unique(sel):
        tok, slot = np.nonzero(sel == e)
        pre = f"experts.{e}."
        h = glu_act(n, cfg, n.linear(z[tok], W(pre + "w1")), n.linear(z[tok], W(pre + "w3")))
        out[tok, slot] = n.linear(h, W(pre + "w2"))
    y = np.zeros((T, z.shape[1]))
    for j in range(k):
        y = y + w[:, j:j + 1] * out[:, j]
    return y


def moe(n, cfg, W, x: np.ndarray, trace=None, tag="") -> np.ndarray:
    """W(name) -> weight under block_sparse_moe. (expert weights: W('experts.{e}.w1') etc.)"""
    sel, w, c = route(cfg, x, W("gate.weight"), W("gate.e_score_correction_bias"))
    shared = dense_mlp(n, cfg, lambda name: W("shared_experts." + name), x) if cfg.n_shared_expert else 0.0
    if cfg.d_latent:
        z = n.linear(x, W("routed_expert_down_proj.weight"))
        y = n.bf16(routed_sum(n, cfg, W, z, sel, w))
        if cfg.latent_norm:
            y = n.rms_norm(y, W("routed_expert_norm.weight"), cfg.rms_norm_eps)
        y = n.linear(y, W("routed_expert_up_proj.weight"))
    else:
        y = n.bf16(routed_sum(n, cfg, W, x, sel, w))
    if trace is not None:
        trace[tag + "moe_sel"] = sel
        trace[tag + "moe_w"] = w
        trace[tag + "moe_choice"] = c
    return n.bf16(y + shared)
