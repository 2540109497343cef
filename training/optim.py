"""optim.py: per-head Muon for matrix parameters, AdamW for the rest (K3 report; Moonlight's Muon scaling).

Muon, per matrix block X [r,c] (momentum mu, Nesterov):
  M <- mu M + G;  U = NS5(G + mu M)  (quintic Newton-Schulz to the nearest semi-orthogonal matrix)
  W <- W (1 - lr wd) - lr * 0.2 sqrt(max(r,c)) U     (0.2 sqrt(max) matches AdamW's update RMS, so one lr)
Per-head: the Q/K/V projections are orthogonalised head by head, i.e. the rows of each head form their own
block (KDA q/k/v_proj: H blocks of K rows; MLA q_b_proj: n_h blocks of d_nope + d_rope rows; kv_b_proj: n_h
blocks of d_nope + d_v rows). Routed experts [E, out, in] are E separate blocks. Every other 2-D weight is
one block. AdamW: embedding, lm_head, norms, AttnRes queries, conv weights, A_log, dt_bias, indexer LayerNorm.
"""
import torch

from kda import KDA
from mla import MLA
from moe import LatentMoE


def newton_schulz(G: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Batched [..., r, c] -> approx U V^T of the SVD, bf16 on GPU (Muon's quintic iteration)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    X = G.to(torch.bfloat16 if G.is_cuda else torch.float32)
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    tall = X.shape[-2] > X.shape[-1]
    if tall:
        X = X.transpose(-2, -1)
    for _ in range(steps):
        A = X @ X.transpose(-2, -1)
        B = b * A + c * A @ A
        X = a * X + B @ X
    if tall:
        X = X.transpose(-2, -1)
    return X.to(G.dtype)


def muon_blocks(model):
    """{parameter: rows per head block (0 = whole matrix; 'expert' = batched over dim 0)}."""
    spec = {}
    for mod in model.modules():
        if isinstance(mod, KDA):
            for lin in (mod.q_proj, mod.k_proj, mod.v_proj):
                spec[lin.weight] = mod.K
        if isinstance(mod, MLA):
            spec[mod.q_b_proj.weight] = mod.dn + mod.dr
            spec[mod.kv_b_proj.weight] = mod.dn + mod.dv
        if isinstance(mod, LatentMoE):
            for w in (mod.w1, mod.w2, mod.w3):
                spec[w] = "expert"
    skip = {id(model.embed_tokens.weight), id(model.lm_head.weight)} | {id(p) for p in spec}
    for name, p in model.named_parameters():
        if p.ndim == 2 and id(p) not in skip and min(p.shape) > 1:
            spec[p] = 0
    return spec


class Muon(torch.optim.Optimizer):
    def __init__(self, spec: dict, lr, momentum=0.95, weight_decay=0.1):
        self.spec = spec
        super().__init__(list(spec.keys()), dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, mu, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "m" not in state:
                    state["m"] = torch.zeros_like(p)
                m = state["m"]
                m.mul_(mu).add_(p.grad)
                g = p.grad + mu * m
                rows = self.spec[p]
                if rows == "expert":
                    u = newton_schulz(g)
                    r, c = g.shape[-2:]
                elif rows:
                    blocks = g.reshape(-1, rows, g.shape[-1])           # [heads, rows, in]
                    u = newton_schulz(blocks).reshape_as(g)
                    r, c = rows, g.shape[-1]
                else:
                    u = newton_schulz(g)
                    r, c = g.shape
                p.mul_(1 - lr * wd).add_(u, alpha=-lr * 0.2 * max(r, c) ** 0.5)


def make_optimizers(model, lr: float, weight_decay: float = 0.1, betas=(0.9, 0.95)):
    spec = muon_blocks(model)
    muon_ids = {id(p) for p in spec}
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if id(p) in muon_ids:
            continue
        (decay if name.endswith(("embed_tokens.weight", "lm_head.weight")) else no_decay).append(p)
    adamw = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                               {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=betas, eps=1e-8)
    return [Muon(spec, lr=lr, weight_decay=weight_decay), adamw]
