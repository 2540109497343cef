"""bench_fla.py: times the peer, fla's Triton KDA kernels, at the shapes bench_kda times (96 heads,
K = V = 128, bf16 q/k/v/g/beta, fp32 state), and measures chunk_kda's accuracy against an fp64 recurrence on
a few heads of the 8192-token case. Same input laws as bench_kda.cu. Writes a JSON object of
{metric: [value, unit]} to argv[1].

    python3 bench_fla.py out.json
"""
import json
import sys
import time

import torch
import torch.nn.functional as F
import triton

from fla.ops.kda import chunk_kda, fused_recurrent_kda

H, D = 96, 128
dev = "cuda"
res = {}


def emit(name, value, unit):
    print(f"  {name:<40} {value:12.5g} {unit}", flush=True)
    res[name] = [value, unit]
    with open(sys.argv[1], "w") as f:  # after every number, so a later failure loses nothing
        json.dump(res, f)


def inputs(T, seed):
    g = torch.Generator(device=dev).manual_seed(seed)
    q = (F.normalize(torch.randn(1, T, H, D, device=dev, generator=g), dim=-1) * D**-0.5).bfloat16()
    k = F.normalize(torch.randn(1, T, H, D, device=dev, generator=g), dim=-1).bfloat16()
    v = torch.randn(1, T, H, D, device=dev, generator=g).bfloat16()
    gate = (-5 * torch.sigmoid(1.5 * torch.randn(1, T, H, D, device=dev, generator=g) - 3.5)).bfloat16()
    beta = (0.02 + 0.96 * torch.rand(1, T, H, device=dev, generator=g)).bfloat16()
    return q, k, v, gate, beta


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def prefill(name, lens, variants):
    T = sum(lens)
    q, k, v, gate, beta = inputs(T, 1)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device=dev, dtype=torch.long)
    h0 = 0.05 * torch.randn(len(lens), H, D, D, device=dev)
    for tag, kw in variants:
        try:
            fn = lambda: chunk_kda(q, k, v, gate, beta, scale=1.0, initial_state=h0, output_final_state=True,
                                   cu_seqlens=cu if len(lens) > 1 else None, **kw)
            t0 = time.time()
            fn()
            torch.cuda.synchronize()
            print(f"  ({name} {tag}: first call {time.time() - t0:.1f} s)", flush=True)
            emit(f"fla_prefill_{name}_{tag}_ms", bench(fn), "ms")
        except Exception as e:  # a variant this fla version lacks is reported, not fatal
            print(f"  fla chunk_kda {tag} failed at {name}: {type(e).__name__}: {e}", flush=True)


def accuracy(T=8192, heads=(0, 31, 95)):
    q, k, v, gate, beta = inputs(T, 2)
    h0 = 0.05 * torch.randn(1, H, D, D, device=dev)
    o, ht = chunk_kda(q, k, v, gate, beta, scale=1.0, initial_state=h0, output_final_state=True,
                      safe_gate=True, lower_bound=-5.0)
    hs = list(heads)
    qd, kd, vd, gd = (x[0, :, hs].double() for x in (q, k, v, gate))
    bd = beta[0, :, hs].double()
    S = h0[0, hs].double()
    oref = torch.empty(T, len(hs), D, device=dev, dtype=torch.float64)
    for t in range(T):  # MODEL.md §4 step 6 in fp64
        S = S * gd[t].exp()[:, :, None]
        u = bd[t][:, None] * (vd[t] - torch.einsum("hkv,hk->hv", S, kd[t]))
        S = S + kd[t][:, :, None] * u[:, None, :]
        oref[t] = torch.einsum("hkv,hk->hv", S, qd[t])
    oref = oref.bfloat16().double()
    ob = o[0, :, hs].double()
    emit("fla_prefill_T8192_relrms_o", ((ob - oref).norm() / oref.norm()).item(), "rel")
    emit("fla_prefill_T8192_relrms_state", ((ht[0, hs].double() - S).norm() / S.norm()).item(), "rel")


def decode(B, sets):
    q, k, v, gate, beta = inputs(B, 3)
    q, k, v, gate, beta = (x.view(B, 1, *x.shape[2:]) for x in (q, k, v, gate, beta))
    states = [0.05 * torch.randn(B, H, D, D, device=dev) for _ in range(sets)]
    i = [0]

    def fn():
        i[0] += 1
        fused_recurrent_kda(q, k, v, gate, beta, scale=1.0, initial_state=states[i[0] % sets],
                            output_final_state=True)

    fn()
    torch.cuda.synchronize()
    us = bench(fn) * 1000
    emit(f"fla_decode_b{B}_us", us, "us")
    emit(f"fla_decode_b{B}_state_GBps", 2 * B * H * D * D * 4 / us * 1e-3, "GB/s")


def main():
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}", flush=True)
    safe = [("safegate", {"safe_gate": True, "lower_bound": -5.0})]
    default = [("default", {})]
    # Most important first: every number is saved as it comes, and the caller may cut the run short
    # (the first chunk_kda call compiles and autotunes for ~70 s; the varlen path compiles again).
    prefill("T8192", [8192], safe)
    prefill("T2048", [2048], safe)
    decode(1, 32)
    decode(64, 2)
    prefill("varlen8x1024", [1024] * 8, safe)
    prefill("T131072", [131072], safe)
    accuracy()
    prefill("T8192", [8192], default)

if __name__ == "__main__":
    main()
