"""kda.py: Kimi Delta Attention (MODEL.md §4), recurrent form (normative) and chunkwise form (check).

x [T, D] is the input_layernorm output; H heads, K = V = d_head.
  q~,k~,v~ = q_proj x, k_proj x, v_proj x                         [T, H*K]
  q,k,v    = bf16(SiLU(causal depthwise conv_W(.)))                y_t[c] = sum_j w[c,0,j] x_{t-W+1+j}[c]
  q^ = l2norm(q) * K^-1/2,  k^ = l2norm(k)   (eps 1e-6, fp32)
  beta = sigmoid(b_proj x)                                          [T, H] fp32, never rounded
  z = f_b_proj(f_a_proj x) + dt_bias                                [T, H, K] fp32
  g = -exp(A_log[h]) softplus(z)       (KL)     |     g = lb * sigmoid(exp(A_log[h]) z)   (K3, lb = -5)
  per token:  S <- diag(e^g) S;  u = v - S^T k^;  S <- S + k^ (beta u)^T;  o = S^T q^   (read AFTER write)
  y_h = bf16(o_h) * rsqrt(mean(o_h^2) + eps) * o_norm * sigmoid(gate_h),
        gate = g_proj x (full rank) or g_b_proj(g_a_proj x)
  out = o_proj concat_h y_h
State per sequence: S [H, K, V] and the last W-1 pre-conv inputs of q, k, v ([3, W-1, H*K]).
The chunkwise form (chunk size C, short tail chunk) is an alternative path for self-checks.
"""
from __future__ import annotations

import numpy as np

from .numerics import l2norm, sigmoid, silu, softplus


class KdaState:
    def __init__(self, n_head: int, d_head: int, conv: int):
        self.S = np.zeros((n_head, d_head, d_head))            # [H, K, V]
        self.conv = np.zeros((3, conv - 1, n_head * d_head))   # q, k, v windows [3, W-1, H*K]


def short_conv(n, x: np.ndarray, w: np.ndarray, window: np.ndarray):
    """x [T, C], w [C, 1, W], window [W-1, C] -> (bf16(SiLU(conv)) [T, C], new window [W-1, C])."""
    n_tap = w.shape[2]
    xx = np.concatenate([window, x], axis=0)                   # [W-1+T, C]
    T = x.shape[0]
    y = sum(w[:, 0, j] * xx[j:j + T] for j in range(n_tap))   # w[:, 0, W-1] multiplies token t
    return n.bf16(silu(y)), xx[xx.shape[0] - (n_tap - 1):].copy()


def head_a_log(A_log: np.ndarray, n_head: int) -> np.ndarray:
    """KL [1,1,H,1] -> [H]; K3 [d_head] -> first H entries, the tail must be zero (§13 #4)."""
    a = A_log.reshape(-1)
    if a.size < n_head:
        raise ValueError(f"A_log has {a.size} entries for {n_head} heads")
    if np.any(a[n_head:] != 0):
        raise ValueError("A_log: entries past the head count must be zero")
    return a[:n_head]


def kda_decay(cfg, f: np.ndarray, dt_bias: np.ndarray, A_log: np.ndarray) -> np.ndarray:
    """f [T, H*K] -> g [T, H, K] (log-decay per key channel)."""
    H, K = cfg.kda_n_head, cfg.kda_d_head
    z = (f + dt_bias.reshape(-1)).reshape(-1, H, K)
    a = head_a_log(A_log, H)[None, :, None]
    if cfg.kda_gate_lower_bound is None:
        return -np.exp(a) * softplus(z)
    return cfg.kda_gate_lower_bound * sigmoid(np.exp(a) * z)


def kda_recurrent(q, k, v, g, beta, S):
    """q,k [T,H,K], v [T,H,V], g [T,H,K], beta [T,H], S [H,K,V] -> (o [T,H,V], S)."""
    o = np.empty_like(v)
    for t in range(q.shape[0]):
        S = np.exp(g[t])[:, :, None] * S                                # decay rows
        u = v[t] - np.einsum("hkv,hk->hv", S, k[t])                     # prediction error
        S = S + k[t][:, :, None] * (beta[t][:, None] * u)[:, None, :]   # delta-rule write
        o[t] = np.einsum("hkv,hk->hv", S, q[t])                         # read after write
    return o, S


def kda_chunkwise(q, k, v, g, beta, S, chunk: int):
    """Same contract as kda_recurrent, via the WY/UT chunk form of MODEL.md §4 (tail chunk short)."""
    T = q.shape[0]
    o = np.empty_like(v)
    for c0 in range(0, T, chunk):
        sl = slice(c0, min(c0 + chunk, T))
        qc, kc, vc, bc = (a[sl].transpose(1, 0, 2) for a in (q, k, v, beta[:, :, None]))   # [H, C, *]
        bc = bc[:, :, 0]                                                  # [H, C]
        G = np.cumsum(g[sl].transpose(1, 0, 2), axis=1)                   # Gamma [H, C, K]
        C = G.shape[1]
        # exp(Gamma_i - Gamma_j) from the difference, only where j <= i (it would overflow for j > i)
        incl = np.tril(np.ones((C, C), dtype=bool))[None, :, :, None]
        D = np.where(incl, np.exp(np.where(incl, G[:, :, None, :] - G[:, None, :, :], 0.0)), 0.0)
        L = bc[:, :, None] * np.tril(np.einsum("hid,hjd,hijd->hij", kc, kc, D), -1)   # strictly lower
        A = np.einsum("hid,hjd,hijd->hij", qc, kc, D)                                # j <= i
        Tm = np.linalg.solve(np.eye(C)[None] + L, np.eye(C)[None] * bc[:, None, :])   # (I+L)^-1 diag(beta)
        W = Tm @ (np.exp(G) * kc)                                         # [H, C, K]
        U = Tm @ vc                                                       # [H, C, V]
        Vp = U - W @ S                                                    # V' [H, C, V]
        o[sl] = ((np.exp(G) * qc) @ S + A @ Vp).transpose(1, 0, 2)
        GC = G[:, -1:, :]                                                 # Gamma_C [H, 1, K]
        S = np.exp(GC[:, 0, :])[:, :, None] * S + (np.exp(GC - G) * kc).transpose(0, 2, 1) @ Vp
    return o, S


def kda_forward(n, cfg, W, x: np.ndarray, state: KdaState, chunk: int | None = None, trace=None, tag=""):
    """W(name) -> weight of self_attn.<name>; x [T, D] -> out [T, D]; updates `state`."""
    H, K = cfg.kda_n_head, cfg.kda_d_head
    T = x.shape[0]
    proj = [n.linear(x, W(p + "_proj.weight")) for p in "qkv"]            # [T, H*K] each
    conv_out = []
    for idx, p in enumerate("qkv"):
        y, state.conv[idx] = short_conv(n, proj[idx], W(p + "_conv1d.weight"), state.conv[idx])
        conv_out.append(y)
    q, k, v = conv_out
    q = l2norm(q.reshape(T, H, K)) * K ** -0.5
    k = l2norm(k.reshape(T, H, K))
    v = v.reshape(T, H, K)
    beta = sigmoid(n.linear(x, W("b_proj.weight")))                      # [T, H] fp32
    f = n.linear(n.linear(x, W("f_a_proj.weight")), W("f_b_proj.weight"))
    g = kda_decay(cfg, f, W("dt_bias"), W("A_log"))                      # [T, H, K]
    if chunk is None:
        o, state.S = kda_recurrent(q, k, v, g, beta, state.S)
    else:
        o, state.S = kda_chunkwise(q, k, v, g, beta, state.S, chunk)
    o = n.bf16(o)
    if cfg.kda_full_rank_gate:
        gate = n.linear(x, W("g_proj.weight"))
    else:
        gate = n.linear(n.linear(x, W("g_a_proj.weight")), W("g_b_proj.weight"))
    r = 1.0 / np.sqrt(np.mean(o * o, axis=-1, keepdims=True) + cfg.rms_norm_eps)
    y = n.bf16(o * r * W("o_norm.weight") * sigmoid(gate.reshape(T, H, K)))
    if trace is not None:
        trace[tag + "kda_o"] = o.reshape(T, H * K)
        trace[tag + "kda_g"] = g
        trace[tag + "kda_beta"] = beta
    return n.linear(y.reshape(T, H * K), W("o_proj.weight"))
