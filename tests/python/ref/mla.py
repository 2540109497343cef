"""mla.py: Gated MLA without RoPE (MODEL.md §5) and the K3.1 Gated DSA indexer (§6).

x [T, D] is the input_layernorm output; n_h heads, d_qk = d_nope + d_rope.
  q   = q_proj x  (KL)   |   c^Q = RMSNorm(q_a_proj x; q_a_layernorm, 1e-6),  q = q_b_proj c^Q   (K3)
  [c~ | r] = kv_a_proj_with_mqa x;   c = RMSNorm(c~; kv_a_layernorm, 1e-6)      cache: [c | r] per token
  kv_b_proj c -> per head h rows [h(d_nope+d_v), +d_nope) = k_nope_h, next d_v rows = v_h
  k_h = [k_nope_h | r] (r shared by all heads, never rotated)
  p = softmax_{s in S_t}(q_h . k_h * d_qk^-1/2) (fp32);  z_h = sum_s p v_h;  o = bf16(concat_h z_h)
  o <- bf16(o * sigmoid(g_proj x)) (K3: gate from the layer input);  out = o_proj o
Absorbed form (alternative path): q~_h = [W_UK_h^T q_nope_h | q_r_h], score = q~_h . [c_s | r_s] * scale,
  z_h = W_UV_h sum_s p c_s.
DSA (§6): S_t = all s <= t when t <= topk, else the topk largest of
  I[t,s] = (n_I d_I)^-1/2 sum_h a_{t,h} relu(q^I_{t,h} . k^I_s), ties -> lower s, where
  q^I = wq_b c^Q, k^I = bf16(LayerNorm(wk x; k_norm w, b, eps 1e-6)), a = weights_proj x.
State per sequence: c [S, kv_lora], r [S, d_rope], and k^I [S, d_I] for DSA layers.
"""
from __future__ import annotations

import numpy as np

from .numerics import sigmoid, softmax, top_k

NORM_EPS = 1e-6   # q_a_layernorm, kv_a_layernorm, indexer k_norm (MODEL.md §3, §13 #5)


class MlaState:
    def __init__(self, cfg):
        self.c = np.zeros((0, cfg.kv_lora_rank))       # [S, kv_lora] post-norm latent
        self.r = np.zeros((0, cfg.d_rope))             # [S, d_rope]
        self.k_index = np.zeros((0, cfg.dsa_d_head))   # [S, d_I] (DSA only)


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = np.mean(x, axis=-1, keepdims=True)
    var = np.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def dsa_select(n, cfg, W, x, cQ, state: MlaState, n_past: int, trace=None, tag=""):
    """Returns the selection mask [T, S] (True = s in S_t); appends k^I to the state."""
    T, nI, dI = x.shape[0], cfg.dsa_n_head, cfg.dsa_d_head
    qI = n.linear(cQ, W("indexer.wq_b.weight")).reshape(T, nI, dI)                       # [T, nI, dI]
    kI = n.bf16(layer_norm(n.linear(x, W("indexer.wk.weight")), W("indexer.k_norm.weight"),
                           W("indexer.k_norm.bias"), NORM_EPS))                             # [T, dI]
    state.k_index = np.concatenate([state.k_index, kI], axis=0)                           # [S, dI]
    a = n.linear(x, W("indexer.weights_proj.weight"))                                     # [T, nI]
    dots = np.maximum(np.einsum("thd,sd->ths", qI, state.k_index), 0.0)
    I = (nI * dI) ** -0.5 * np.einsum("th,ths->ts", a, dots)                              # [T, S]
    S = state.k_index.shape[0]
    sel = np.zeros((T, S), dtype=bool)
    for t in range(T):
        visible = n_past + t + 1
        if visible <= cfg.dsa_topk:
            sel[t, :visible] = True
        else:
            sel[t, top_k(I[t, :visible], cfg.dsa_topk)] = True
    if trace is not None:
        trace[tag + "dsa_index_scores"] = I
        trace[tag + "dsa_selected"] = sel
    return sel


def mla_forward(n, cfg, W, x, state: MlaState, absorbed=False, dsa=False, trace=None, tag=""):
    """W(name) -> weight of self_attn.<name>; x [T, D] -> out [T, D]; appends to the cache in `state`."""
    T, nh, dn, dr, dv, kv = x.shape[0], cfg.mla_n_head, cfg.d_nope, cfg.d_rope, cfg.d_v, cfg.kv_lora_rank
    cQ = None
    if cfg.q_lora_rank:
        cQ = n.rms_norm(n.linear(x, W("q_a_proj.weight")), W("q_a_layernorm.weight"), NORM_EPS)
        q = n.linear(cQ, W("q_b_proj.weight"))
    else:
        q = n.linear(x, W("q_proj.weight"))
    q = q.reshape(T, nh, dn + dr)
    ckv = n.linear(x, W("kv_a_proj_with_mqa.weight"))                                     # [T, kv + dr]
    n_past = state.c.shape[0]
    state.c = np.concatenate([state.c, n.rms_norm(ckv[:, :kv], W("kv_a_layernorm.weight"), NORM_EPS)])
    state.r = np.concatenate([state.r, ckv[:, kv:]])
    S = state.c.shape[0]

    mask = np.arange(S)[None, :] <= n_past + np.arange(T)[:, None]                        # causal [T, S]
    if dsa:
        if cQ is None:
            raise ValueError("DSA needs q_lora_rank > 0 (the indexer reads c^Q)")
        mask &= dsa_select(n, cfg, W, x, cQ, state, n_past, trace, tag)
    scale = (dn + dr) ** -0.5
    kv_b = W("kv_b_proj.weight").reshape(nh, dn + dv, kv)                                 # [nh, dn+dv, kv]
    if absorbed:
        W_UK, W_UV = kv_b[:, :dn, :], kv_b[:, dn:, :]
        q_lat = n.bf16(np.einsum("thd,hdc->thc", q[:, :, :dn], W_UK))                     # [T, nh, kv]
        # q^ = [q_lat | q_r] is a bf16 rounding point (docs/decisions.md gpu.1); q_r is bf16 already
        s = (np.einsum("thc,sc->hts", q_lat, state.c) + np.einsum("thr,sr->hts", q[:, :, dn:], state.r)) * scale
        p = softmax(np.where(mask[None], s, -np.inf))
        z = np.einsum("thc,hvc->thv", np.einsum("hts,sc->thc", p, state.c), W_UV)         # [T, nh, dv]
    else:
        kvh = n.linear(state.c, W("kv_b_proj.weight")).reshape(S, nh, dn + dv)
        k = np.concatenate([kvh[:, :, :dn], np.broadcast_to(state.r[:, None, :], (S, nh, dr))], axis=-1)
        s = np.einsum("thd,shd->hts", q, k) * scale
        p = softmax(np.where(mask[None], s, -np.inf))
        z = np.einsum("hts,shd->thd", p, kvh[:, :, dn:])                                  # [T, nh, dv]
    o = n.bf16(z.reshape(T, nh * dv))
    if cfg.mla_output_gate:
        o = n.bf16(o * sigmoid(n.linear(x, W("g_proj.weight"))))
    if trace is not None:
        trace[tag + "mla_o"] = o
    return n.linear(o, W("o_proj.weight"))
