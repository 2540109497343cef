"""model.py: the small K3 / K3.1 language model with Block AttnRes (MODEL.md §2, §7, §10).

Layer i: attention = KDA if not mla(i) else Gated MLA (+ DSA indexer for K3.1); FFN = SiTU MLP for
i < first_k_dense_replace else Stable LatentMoE. Block AttnRes replaces both residual additions:
  AR(B, p, q): V = [B_0..B_{n-1}, p];  s_i = (q.V_i) rsqrt(mean(V_i^2) + eps);  return sum softmax(s)_i V_i
  q = res_norm.weight (.) res_proj.weight (the checkpoint stores the pair; the engine folds them in fp32)
  p = embed(tokens); B = []
  for l: a = p if B == [] else AR(B, p, q_attn[l]);  fresh = l % S == 0;  if fresh: B.append(p)
         o = Attn_l(RMSNorm(a));  p = o if fresh else p + o
         f = AR(B, p, q_mlp[l]);  p = p + FFN_l(RMSNorm(f))
  logits = lm_head RMSNorm(AR(B, p, q_out))
Parameter names equal the canonical checkpoint names (docs/tiny-models.md) after the `model.` prefix,
so export.py only adds the published `language_model.` prefix and packs the experts.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from kda import KDA
from mla import MLA, RMSNorm
from moe import MLP, LatentMoE


class ResQuery(nn.Module):
    """One AttnRes pseudo-query: `{name}_proj.weight` [1,D] and `{name}_norm.weight` [D]."""

    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, 1, bias=False)
        self.norm = RMSNorm(d, 1e-5)
        nn.init.zeros_(self.proj.weight)                 # zero query: uniform mix over depth at the start

    def forward(self, blocks, p, eps):
        with torch.autocast(device_type=p.device.type, enabled=False):         # depth mixing in fp32 (§7)
            V = torch.stack([b.float() for b in blocks] + [p.float()], dim=0)  # [n+1, B, T, D]
            q = self.norm.weight.float() * self.proj.weight[0].float()
            s = (V @ q) * torch.rsqrt(V.pow(2).mean(-1) + eps)
            alpha = torch.softmax(s, dim=0)
            return (alpha[..., None] * V).sum(0).to(p.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, a, i):
        super().__init__()
        D = a.d_model
        self.input_layernorm = RMSNorm(D, a.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(D, a.rms_norm_eps)
        self.self_attn = MLA(a) if a.is_mla(i) else KDA(a)
        if a.is_moe(i):
            self.block_sparse_moe = LatentMoE(a)
        else:
            self.mlp = MLP(D, a.intermediate_size, a)
        self.self_attention_res = ResQuery(D)
        self.mlp_res = ResQuery(D)

    def ffn(self, x):
        return self.block_sparse_moe(x) if hasattr(self, "block_sparse_moe") else self.mlp(x)


class K3Model(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.args = a
        self.embed_tokens = nn.Embedding(a.vocab_size, a.d_model)
        self.layers = nn.ModuleList(DecoderLayer(a, i) for i in range(a.n_layer))
        self.norm = RMSNorm(a.d_model, a.rms_norm_eps)
        self.output_attn_res = ResQuery(a.d_model)
        self.lm_head = nn.Linear(a.d_model, a.vocab_size, bias=False)
        self._init_weights()

    @torch.no_grad()
    def _init_weights(self):
        nn.init.normal_(self.embed_tokens.weight, 0.0, 1.0)
        for name, mod in self.named_modules():
            if isinstance(mod, nn.Linear) and not name.endswith("_res.proj"):
                nn.init.normal_(mod.weight, 0.0, mod.in_features ** -0.5)
                if name.endswith(("o_proj", "down_proj", "routed_expert_up_proj")):
                    mod.weight.mul_(0.5)

    def hidden(self, tokens):
        a, eps = self.args, self.args.rms_norm_eps
        p = self.embed_tokens(tokens)
        B = []
        for l, layer in enumerate(self.layers):
            x = p if not B else layer.self_attention_res(B, p, eps)
            fresh = l % a.attn_res_block_size == 0
            if fresh:
                B.append(p)
            o = layer.self_attn(layer.input_layernorm(x))
            p = o if fresh else p + o
            f = layer.mlp_res(B, p, eps)
            p = p + layer.ffn(layer.post_attention_layernorm(f))
        return self.norm(self.output_attn_res(B, p, eps))

    def forward(self, tokens, targets=None):
        h = self.hidden(tokens)
        logits = self.lm_head(h).float()
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def aux_loss(self):
        losses = [m.aux_loss for m in self.modules() if isinstance(m, MLA) and m.aux_loss is not None]
        return sum(losses) / len(losses) if losses else None

    def moe_layers(self):
        return [m for m in self.modules() if isinstance(m, LatentMoE)]

    def set_qat(self, on: bool):
        for m in self.moe_layers():
            m.qat = on

    def param_counts(self):
        a = self.args
        total = sum(p.numel() for p in self.parameters())
        routed = sum(m.w1.numel() + m.w2.numel() + m.w3.numel() for m in self.moe_layers())
        active = total - routed + routed * a.n_expert_used // a.n_expert
        emb = self.embed_tokens.weight.numel()
        return {"total": total, "active": active, "active_non_embedding": active - emb, "routed_experts": routed}
