"""mla.py: Gated MLA without RoPE (MODEL.md §5) and the K3.1 Gated DSA indexer (MODEL.md §6).

x [B,T,D] (the input_layernorm output), n_h heads, d_nope + d_rope = d_qk, d_v:
  c^Q = RMSNorm(q_a_proj x; q_a_layernorm, 1e-6);  q = q_b_proj c^Q      head h: [q_nope_h | q_r_h]
  [c_bar | r] = kv_a_proj_with_mqa x;  c = RMSNorm(c_bar; kv_a_layernorm, 1e-6)
  kv_b_proj c -> head h: [k_nope_h | v_h];  k_h = [k_nope_h | r]  (r shared by all heads, not rotated)
  p = softmax_{s<=t}(q_t.k_s d_qk^-1/2) (fp32);  o = concat_h sum_s p v_s;  out = o_proj(o (.) sigmoid(g_proj x))
K3.1 (dsa): indexer on every MLA layer,
  q^I = wq_b c^Q [ih, id];  k^I_s = LayerNorm(wk x_s; k_norm.{weight,bias}, 1e-6) [id];  a = weights_proj x [ih]
  I[t,s] = (ih id)^-1/2 sum_h a_{t,h} relu(q^I_{t,h}.k^I_s),  s <= t
  S_t = all s <= t if t <= index_topk, else the index_topk largest I[t,s]; main softmax restricted to S_t.
Training the indexer (as DeepSeek-V3.2): the selection is not differentiable, so the indexer learns from
KL(p_main || softmax_s I[t,s]) with p_main the head-mean of the dense main attention probabilities (detached),
returned as self.aux_loss; the indexer's inputs (x, c^Q) are detached, so this loss trains the indexer alone.
self.dense = True keeps the main attention dense while the indexer still scores (k31_stages.py, stage 1:
the indexer warm-up by KL with the trunk frozen); False is the sparse attention of the shipped model.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    """y = x rsqrt(mean(x^2) + eps) * w, computed in fp32 (plain weight, not 1 + w)."""

    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(n)), eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


class Indexer(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.ih, self.id, self.topk = a.index_n_head, a.index_head_dim, a.index_topk
        self.wq_b = nn.Linear(a.q_lora_rank, self.ih * self.id, bias=False)
        self.wk = nn.Linear(a.d_model, self.id, bias=False)
        self.weights_proj = nn.Linear(a.d_model, self.ih, bias=False)
        self.k_norm = nn.LayerNorm(self.id, eps=1e-6)

    def forward(self, x, c_q):
        """-> index scores I [B,T,T] fp32 (-inf above the diagonal)."""
        B, T, _ = x.shape
        x, c_q = x.detach(), c_q.detach()                                     # the indexer trains apart
        qi = self.wq_b(c_q).float().reshape(B, T, self.ih, self.id)            # bf16-rounded under autocast
        w = self.weights_proj(x).float()                                      # [B,T,ih]
        k_lin = self.wk(x).float()
        with torch.autocast(device_type=x.device.type, enabled=False):        # scores in fp32 (§6)
            ki = F.layer_norm(k_lin, (self.id,), self.k_norm.weight.float(), self.k_norm.bias.float(), 1e-6)
            logits = torch.relu(torch.einsum("bthd,bsd->bhts", qi, ki))       # [B,ih,T,T]
            idx = torch.einsum("bth,bhts->bts", w, logits) * (self.ih * self.id) ** -0.5
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        return idx.masked_fill(~causal, float("-inf"))

    def select(self, scores):
        """Boolean mask [B,T,T] of the kept keys: all causal keys for t <= topk, else the top-k (ties -> lower s)."""
        B, T, _ = scores.shape
        causal = torch.ones(T, T, dtype=torch.bool, device=scores.device).tril()
        if T <= self.topk:
            return causal.expand(B, T, T)
        # ties -> lower s (MODEL.md §13 #13): a stable descending sort keeps equal scores in position order;
        # exact ties are common (relu zeros), so topk's unspecified order would not match the engine
        top = scores.sort(dim=-1, descending=True, stable=True).indices[..., :self.topk]
        keep = torch.zeros(B, T, T, dtype=torch.bool, device=scores.device).scatter_(-1, top, True)
        short = torch.arange(T, device=scores.device) < self.topk                # rows t <= topk (1-based)
        return torch.where(short[None, :, None], causal, keep & causal)


class MLA(nn.Module):
    def __init__(self, a):
        super().__init__()
        D, nh = a.d_model, a.n_head
        self.nh, self.dn, self.dr, self.dv, self.kvr = nh, a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim, a.kv_lora_rank
        self.q_a_proj = nn.Linear(D, a.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(a.q_lora_rank, 1e-6)
        self.q_b_proj = nn.Linear(a.q_lora_rank, nh * (self.dn + self.dr), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(D, self.kvr + self.dr, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kvr, 1e-6)
        self.kv_b_proj = nn.Linear(self.kvr, nh * (self.dn + self.dv), bias=False)
        self.o_proj = nn.Linear(nh * self.dv, D, bias=False)
        self.g_proj = nn.Linear(D, nh * self.dv, bias=False)
        self.indexer = Indexer(a) if a.dsa else None
        self.aux_loss = None
        self.dense = False                                   # K3.1 stage 1: dense main attention

    def forward(self, x):
        B, T, _ = x.shape
        nh, dn, dr, dv = self.nh, self.dn, self.dr, self.dv
        c_q = self.q_a_layernorm(self.q_a_proj(x))
        q = self.q_b_proj(c_q).reshape(B, T, nh, dn + dr).transpose(1, 2)          # [B,nh,T,dn+dr]
        c_bar, r = self.kv_a_proj_with_mqa(x).split([self.kvr, dr], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(c_bar)).reshape(B, T, nh, dn + dv).transpose(1, 2)
        k_nope, v = kv.split([dn, dv], dim=-1)
        k = torch.cat([k_nope, r[:, None].expand(B, nh, T, dr)], dim=-1)          # shared, unrotated r
        scale = (dn + dr) ** -0.5
        if self.indexer is None:
            if hasattr(F, "scaled_dot_product_attention"):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
            else:
                causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
                p = torch.softmax((q.float() @ k.float().transpose(-1, -2) * scale).masked_fill(~causal, float("-inf")), -1)
                o = (p @ v.float()).to(v.dtype)
        else:
            o = self._sparse(x, c_q, q, k, v, scale)
        o = o.transpose(1, 2).reshape(B, T, nh * dv)
        return self.o_proj(o * torch.sigmoid(self.g_proj(x)))

    def _sparse(self, x, c_q, q, k, v, scale):
        scores = self.indexer(x, c_q)                                              # [B,T,T] fp32
        keep = self.indexer.select(scores.detach())
        if self.dense:
            keep = torch.ones_like(keep[0]).tril().expand_as(keep)
        with torch.autocast(device_type=x.device.type, enabled=False):
            logits = (q.float() @ k.float().transpose(-1, -2)) * scale              # [B,nh,T,T] fp32
            p = torch.softmax(logits.masked_fill(~keep[:, None], float("-inf")), dim=-1)
            out = (p @ v.float()).to(v.dtype)
        with torch.no_grad():                                                       # dense target for the indexer
            causal = torch.ones_like(keep[0]).tril()
            target = torch.softmax(logits.detach().masked_fill(~causal, float("-inf")), -1).mean(1)
        log_i = torch.log_softmax(scores, dim=-1)
        kl = (target * (torch.log(target.clamp_min(1e-20)) - log_i.masked_fill(target == 0, 0.0))).sum(-1)
        self.aux_loss = kl.mean()
        return out
