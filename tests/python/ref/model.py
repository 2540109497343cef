"""model.py: the layer loop of the NumPy reference (MODEL.md §2, §7, §10).

KL (plain pre-norm):  h = bf16(h + Attn(RMSNorm_in(h)));  h = bf16(h + FFN(RMSNorm_post(h)))
K3/K3.1 (Block AttnRes, S = attn_res_block_size decoder layers per block):
    p = Embed(tokens); B = []
    for l: a = p if B == [] else AR(B, p, q_attn[l]);  fresh = l % S == 0;  if fresh: B.append(p)
           o = Attn_l(RMSNorm(a));  p = o if fresh else bf16(p + o)
           f = AR(B, p, q_mlp[l]);  p = bf16(p + FFN_l(RMSNorm(f)))
    h = AR(B, p, q_out)
logits = lm_head RMSNorm(h; model.norm)   (fp32 output, never rounded)
Attn_l is KDA, MLA or DSA (per layer_attn); FFN_l is the dense MLP or the MoE (per layer_moe).

Usage:
    ref = Reference("models/tiny-k3", precision="fp32")
    logits = ref.forward(tokens)                      # [T, vocab], one shot
    st = ref.new_state(); ref.forward(a, st); ref.forward(b, st)   # pieces with carried state
    trace = {}; ref.forward(tokens, trace=trace)      # named intermediates, e.g. trace["l3.attn_out"]
Trace names (arrays [T, ...]): embed; per layer l{i}.{attn_res_attn, attn_in, attn_out, attn_res_mlp, ffn_in,
ffn_out, out} and l{i}.{kda_o, kda_g, kda_beta | mla_o, dsa_index_scores, dsa_selected | moe_sel, moe_w,
moe_choice}; final_h, final_norm, logits.
Alternative paths for self-checks: kda_chunk=C (chunkwise KDA), mla_absorbed=True, dsa_topk=N (override),
dsa_as_mla=True (DSA layers run dense MLA, the indexer unused).
"""
from __future__ import annotations

import copy

import numpy as np

from .attn_res import attn_res, pseudo_query
from .checkpoint import Checkpoint
from .ffn import dense_mlp, moe
from .kda import KdaState, kda_forward
from .mla import MlaState, mla_forward
from .numerics import Numerics


class State:
    """Per-sequence state: KdaState or MlaState per layer, and the number of tokens already seen."""

    def __init__(self, cfg):
        self.layers = [KdaState(cfg.kda_n_head, cfg.kda_d_head, cfg.kda_conv) if kind == "kda" else MlaState(cfg)
                       for kind in cfg.layer_attn]
        self.n_past = 0


class Reference:
    def __init__(self, model, precision="fp32", kda_chunk=None, mla_absorbed=False, dsa_topk=None,
                 dsa_as_mla=False):
        self.ck = model if isinstance(model, Checkpoint) else Checkpoint(model)
        self.cfg = copy.deepcopy(self.ck.config)
        if dsa_topk is not None:
            self.cfg.dsa_topk = dsa_topk                     # override index_topk (self-checks)
        if dsa_as_mla:
            self.cfg.layer_attn = ["mla" if a == "dsa" else a for a in self.cfg.layer_attn]   # dense MLA
        self.n = Numerics(precision)
        self.kda_chunk, self.mla_absorbed = kda_chunk, mla_absorbed
        if self.cfg.attn_res_block_size:
            get = self.ck.get
            self.q_attn = [pseudo_query(get(f"model.layers.{i}.self_attention_res_norm.weight"),
                                        get(f"model.layers.{i}.self_attention_res_proj.weight"))
                           if i > 0 else None for i in range(self.cfg.n_layer)]
            self.q_mlp = [pseudo_query(get(f"model.layers.{i}.mlp_res_norm.weight"),
                                       get(f"model.layers.{i}.mlp_res_proj.weight")) for i in range(self.cfg.n_layer)]
            self.q_out = pseudo_query(get("model.output_attn_res_norm.weight"), get("model.output_attn_res_proj.weight"))

    def new_state(self) -> State:
        return State(self.cfg)

    def _layer_weights(self, i: int, sub: str):
        prefix = f"model.layers.{i}.{sub}."
        return lambda name: self.ck.get(prefix + name)

    def attention(self, i, x, state: State, trace):
        cfg, kind, tag = self.cfg, self.cfg.layer_attn[i], f"l{i}."
        W = self._layer_weights(i, "self_attn")
        if kind == "kda":
            return kda_forward(self.n, cfg, W, x, state.layers[i], self.kda_chunk, trace, tag)
        return mla_forward(self.n, cfg, W, x, state.layers[i], self.mla_absorbed, kind == "dsa", trace, tag)

    def ffn(self, i, x, trace):
        if self.cfg.layer_moe[i]:
            return moe(self.n, self.cfg, self._layer_weights(i, "block_sparse_moe"), x, trace, f"l{i}.")
        return dense_mlp(self.n, self.cfg, self._layer_weights(i, "mlp"), x)

    def forward(self, tokens, state: State | None = None, trace: dict | None = None) -> np.ndarray:
        """tokens: ids [T] -> logits [T, vocab] (float64). `state` is advanced in place when given."""
        cfg, n, get = self.cfg, self.n, self.ck.get
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size == 0 or tokens.min() < 0 or tokens.max() >= cfg.n_vocab:
            raise ValueError(f"token ids must be in [0, {cfg.n_vocab}) and non-empty")
        state = state if state is not None else self.new_state()
        eps = cfg.rms_norm_eps

        def record(name, value):
            if trace is not None:
                trace[name] = value

        def norm(x, name):
            return n.rms_norm(x, get(name), eps)

        x0 = n.bf16(get("model.embed_tokens.weight")[tokens])          # [T, D], no scaling
        record("embed", x0)
        S = cfg.attn_res_block_size
        p, B = x0, []
        for i in range(cfg.n_layer):
            lw = f"model.layers.{i}."
            if S:
                a = p if not B else attn_res(n, B, p, self.q_attn[i], eps)
                fresh = i % S == 0
                if fresh:
                    B.append(p)
            else:
                a = p
            x = norm(a, lw + "input_layernorm.weight")
            o = self.attention(i, x, state, trace)
            p = o if (S and fresh) else n.bf16(p + o)
            f = attn_res(n, B, p, self.q_mlp[i], eps) if S else p
            xf = norm(f, lw + "post_attention_layernorm.weight")
            y = self.ffn(i, xf, trace)
            p = n.bf16(p + y)
            if S:
                record(f"l{i}.attn_res_attn", a)        # AttnRes mix feeding the attention norm
                record(f"l{i}.attn_res_mlp", f)         # AttnRes mix feeding the FFN norm
            record(f"l{i}.attn_in", x)
            record(f"l{i}.ffn_in", xf)
            record(f"l{i}.attn_out", o)
            record(f"l{i}.ffn_out", y)
            record(f"l{i}.out", p)
        h = attn_res(n, B, p, self.q_out, eps) if S else p
        hn = norm(h, "model.norm.weight")
        logits = hn @ get("lm_head.weight").T                          # fp32 output, no rounding
        record("final_h", h)
        record("final_norm", hn)
        record("logits", logits)
        state.n_past += tokens.size
        return logits
