"""moe.py: SiTU-GLU MLPs and Stable LatentMoE with MXFP4 QAT and Quantile Balancing (MODEL.md §8, §9).

SiTU-GLU: h = [b1 tanh(g/b1) sigmoid(g)] * [b2 tanh(u/b2)], b1 = 4, b2 = 25, fp32, |h| <= 100.
Stable LatentMoE, x [N,D] (post_attention_layernorm output):
  s = sigmoid(x W_gate^T) (fp32)          sel = top-k of (s + e_score_correction_bias)   (bias: selection only;
                                          ties -> lower expert id, top_k_lower)
  w_j = s_sel_j / (sum s_sel + 1e-20) * routed_scaling_factor
  z = routed_expert_down_proj x  [N,D/2];  y = sum_j w_j E_j(z),  E_e(z) = w2_e SiTU(w1_e z, w3_e z)
  out = routed_expert_up_proj RMSNorm(y; routed_expert_norm) + shared_experts(x)
Training computes every expert for every token as two wide matmuls ([N,Dl] x [Dl,E*F]) and masks by the
(mostly zero) routing weights: exact same math as the sparse dispatch, no dispatch overhead at this size.
MXFP4 QAT (straight-through): per 32 consecutive inputs, scale = 2^(floor(log2 amax) - 2) (E8M0), elements
rounded to the nearest E2M1 value {0,.5,1,1.5,2,3,4,6} (clamped at 6); forward uses the dequantized weight,
backward passes the gradient to the fp32 master weight unchanged. export.py packs with the same quantizer.
Quantile Balancing (our reading of the K3 report, docs/training.md): per step, each token's cutoff alpha_i =
the (k+1)-th largest biased score; margins m_ij = s_ij - alpha_i go into a fixed-bin histogram per expert
(summed over data-parallel ranks); between steps the bias is set so that each expert's margin quantile at
level 1 - k/E sits on the threshold: b_j <- -Q_{1-k/E}(m_.j), damped and re-centred.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from mla import RMSNorm

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
E2M1_EDGES = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


def situ(g, u, b1: float, b2: float):
    gf, uf = g.float(), u.float()
    return (b1 * torch.tanh(gf / b1) * torch.sigmoid(gf) * (b2 * torch.tanh(uf / b2))).to(g.dtype)


def mxfp4_quantize(w: torch.Tensor):
    """w [..., out, in] (in % 32 == 0) -> (nibbles u8 [..., out, in], scale byte u8 [..., out, in/32])."""
    shape = w.shape
    blocks = w.detach().float().reshape(*shape[:-1], shape[-1] // 32, 32)
    amax = blocks.abs().amax(-1).clamp_min(2.0 ** -100)
    e = torch.floor(torch.log2(amax)) - 2
    scaled = blocks.abs() / torch.exp2(e)[..., None]
    idx = torch.bucketize(scaled, E2M1_EDGES.to(w.device))                  # nearest magnitude, clamps at 6
    nib = (idx | torch.where(blocks < 0, 8, 0)).to(torch.uint8).reshape(shape)
    return nib, (e + 127).to(torch.uint8)


def mxfp4_dequantize(nib: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    mag = E2M1.to(nib.device)[(nib & 7).long()]
    val = torch.where(nib & 8 > 0, -mag, mag)
    s = torch.exp2(scale.float() - 127)
    return (val.reshape(*val.shape[:-1], -1, 32) * s[..., None]).reshape(val.shape)


def fake_mxfp4(w: torch.Tensor) -> torch.Tensor:
    q = mxfp4_dequantize(*mxfp4_quantize(w)).to(w.dtype)
    return w + (q - w).detach()


def top_k_lower(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest scores per row, ties -> lower expert id (MODEL.md §13 #3, as the engine).
    torch.topk leaves the order of equal values unspecified: on the CPU it has picked the higher id of an
    exact fp32 tie at the k-th place (held-out window 12, layer 3, token 587: experts 12 and 20 both 0.61568266),
    which sent the whole rest of the window down another path than the engine's (docs/training.md)."""
    return scores.sort(dim=-1, descending=True, stable=True).indices[..., :k]


class MLP(nn.Module):
    """Dense SiTU-GLU MLP (layer 0 `mlp.` and the merged `shared_experts.`)."""

    def __init__(self, d, d_ff, a):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(d, d_ff, bias=False), nn.Linear(d, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d, bias=False)
        self.b1, self.b2 = a.situ_beta, a.situ_linear_beta

    def forward(self, x):
        return self.down_proj(situ(self.gate_proj(x), self.up_proj(x), self.b1, self.b2))


class Router(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(a.n_expert, a.d_model))
        self.register_buffer("e_score_correction_bias", torch.zeros(a.n_expert))
        nn.init.normal_(self.weight, 0.0, a.d_model ** -0.5)


class LatentMoE(nn.Module):
    QB_BINS, QB_LO, QB_HI = 512, -2.0, 2.0

    def __init__(self, a):
        super().__init__()
        E, F_, Dl, D = a.n_expert, a.moe_intermediate_size, a.routed_expert_hidden_size, a.d_model
        self.E, self.F, self.k, self.scale = E, F_, a.n_expert_used, a.routed_scaling_factor
        self.b1, self.b2 = a.situ_beta, a.situ_linear_beta
        self.gate = Router(a)
        self.shared_experts = MLP(D, a.n_shared_experts * F_, a)
        self.routed_expert_down_proj = nn.Linear(D, Dl, bias=False)
        self.routed_expert_norm = RMSNorm(Dl, a.rms_norm_eps)
        self.routed_expert_up_proj = nn.Linear(Dl, D, bias=False)
        self.w1 = nn.Parameter(torch.randn(E, F_, Dl) * Dl ** -0.5)   # gate  [E, out, in]
        self.w3 = nn.Parameter(torch.randn(E, F_, Dl) * Dl ** -0.5)   # up
        self.w2 = nn.Parameter(torch.randn(E, Dl, F_) * F_ ** -0.5)   # down
        self.qat = False
        self.register_buffer("qb_hist", torch.zeros(E, self.QB_BINS), persistent=False)
        self.load = None                                               # tokens per expert, last batch
        self.qb_observed = False

    def route(self, x):
        """x [N,D] -> dense routing weights [N,E] (zero outside the selection)."""
        with torch.autocast(device_type=x.device.type, enabled=False):   # router in fp32 (MODEL.md §8.2)
            s = torch.sigmoid(F.linear(x.float(), self.gate.weight.float()))
        biased = s + self.gate.e_score_correction_bias
        sel = top_k_lower(biased, self.k)
        s_sel = s.gather(-1, sel)
        w_sel = s_sel / (s_sel.sum(-1, keepdim=True) + 1e-20) * self.scale
        if self.training:
            with torch.no_grad():
                self._qb_observe(s, biased)
                self.load = torch.zeros(self.E, device=x.device).scatter_add_(0, sel.reshape(-1), torch.ones(sel.numel(), device=x.device))
        return torch.zeros_like(s).scatter(-1, sel, w_sel)

    def _qb_observe(self, s, biased):
        alpha = biased.topk(self.k + 1, dim=-1).values[:, -1:]                   # [N,1] cutoff
        m = (s - alpha).clamp(self.QB_LO, self.QB_HI - 1e-6)
        idx = ((m - self.QB_LO) / (self.QB_HI - self.QB_LO) * self.QB_BINS).long()   # [N,E]
        flat = idx + torch.arange(self.E, device=s.device) * self.QB_BINS
        self.qb_hist.view(-1).scatter_add_(0, flat.reshape(-1), torch.ones(flat.numel(), device=s.device))
        self.qb_observed = True

    @torch.no_grad()
    def qb_update(self, damping: float = 0.5):
        """Between steps: b_j <- b_j + damping (-Q_{1-k/E}(margins_j) - b_j), then centred."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(self.qb_hist)
        if not self.qb_observed:                  # nothing seen since the last update (host flag: no GPU sync)
            return
        self.qb_observed = False
        hist = self.qb_hist
        total = hist.sum(-1, keepdim=True).clamp_min(1.0)
        cdf = hist.cumsum(-1) / total                                            # [E,bins]
        level = 1.0 - self.k / self.E
        j = torch.searchsorted(cdf, torch.full((self.E, 1), level, device=cdf.device)).clamp(max=self.QB_BINS - 1)
        lo_cdf = torch.where(j > 0, cdf.gather(-1, (j - 1).clamp_min(0)), torch.zeros_like(j, dtype=cdf.dtype))
        in_bin = hist.gather(-1, j) / total
        frac = ((level - lo_cdf) / in_bin.clamp_min(1e-12)).clamp(0, 1)
        width = (self.QB_HI - self.QB_LO) / self.QB_BINS
        quant = (self.QB_LO + (j.float() + frac) * width).squeeze(-1)            # margin quantile per expert
        b = self.gate.e_score_correction_bias
        b += damping * (-quant - b)
        b -= b.mean()
        hist.zero_()

    def experts(self, z, wts):
        """z [N,Dl], wts [N,E] -> sum_e wts_e E_e(z) [N,Dl]."""
        w1, w3, w2 = self.w1, self.w3, self.w2
        if self.qat:
            w1, w3, w2 = fake_mxfp4(w1), fake_mxfp4(w3), fake_mxfp4(w2)
        E, F_, Dl = w1.shape
        g = z @ w1.reshape(E * F_, Dl).t().to(z.dtype)
        u = z @ w3.reshape(E * F_, Dl).t().to(z.dtype)
        h = situ(g, u, self.b1, self.b2) * wts.to(z.dtype).repeat_interleave(F_, dim=-1)
        return h @ w2.permute(0, 2, 1).reshape(E * F_, Dl).to(z.dtype)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        wts = self.route(x)
        y = self.experts(self.routed_expert_down_proj(x), wts)
        y = self.routed_expert_up_proj(self.routed_expert_norm(y))
        return (y + self.shared_experts(x)).reshape(shape)
