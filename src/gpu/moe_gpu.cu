// moe_gpu.cu: the routed MoE layers on the GPU (model/moe.cpp, MODEL.md §8.2 Stable LatentMoE, §8.3 KL MoE).
//
//   s = sigmoid(x W_gate^T) fp32;  sel = top-k of (s + bias), biased score desc, ties -> lower id
//   w_j = s[sel_j] / (sum_j s[sel_j] + 1e-20) * routed_scaling_factor           (unbiased weights)
//   K3: z = bf16(latent_down x);  y = bf16(sum_j w_j E_j(z)) in slot order;  y = latent_up RMSNorm(y)
//   KL: y = bf16(sum_j w_j E_j(x))
//   out = bf16(y + shared(x))
// Fused path, the default for bf16 mode with MXFP4 experts (K3) since session 4 (weights_gpu.cu builds
// gate_down and expert_table at load unless K3_MOE_FAST=0): all on the device, no host round trip:
//   [logits | z] = x [W_gate ; routed_expert_down_proj]^T   one GEMM over the concatenated bf16 weight
//                                                           (weights_gpu.h gate_down), fp32 out, unrounded
//   sel, w = moe_route(logits)                              ops/moe_route.h, a warp per token
//   y = moe_experts(bf16(z), sel, w)                        ops/moe_experts.h: device counting sort,
//                                                           MXFP4 tensor-core kernels, slot-order sum
// First GPU version (K3_MOE_FAST=0), fp32 mode and bf16 experts (KL): routing on the device (one thread per
// token, k passes of an argmax below the previous pick); the dispatch reads the selection on the host (one
// sync per MoE layer), groups the (token, slot) rows by expert, runs each expert's GLU on its contiguous rows
// and scatters the results back to (token, slot) rows; the weighted sum then runs per token in slot order.
#include <algorithm>
#include <vector>

#include "core/env.h"
#include "gpu/blocks_gpu.cuh"
#include "ops/cuda_util.cuh"
#include "ops/moe_experts.h"
#include "ops/moe_route.h"
#include "ops/sigmoid.h"

namespace k3::gpu {

namespace {

// (c, e) ranks before (c', e') iff c > c' or (c == c' and e < e'): a strict total order.
__global__ void route_kernel(const float* s, const float* bias, int64_t n_tok, int E, int k, bool renorm,
                             float scaling, int32_t* sel, float* wt) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n_tok) return;
  const float* st = s + t * E;
  int prev = -1;
  float prev_c = 0.f, sum = 0.f;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    float best_c = 0.f;
    for (int e = 0; e < E; ++e) {
      const float ce = st[e] + bias[e];
      const bool below_prev = prev < 0 || ce < prev_c || (ce == prev_c && e > prev);
      if (below_prev && (best < 0 || ce > best_c)) best = e, best_c = ce;
    }
    sel[t * k + j] = best;
    sum += st[best];
    prev = best, prev_c = best_c;
  }
  for (int j = 0; j < k; ++j) {
    const float sj = st[sel[t * k + j]];
    wt[t * k + j] = (renorm ? sj / (sum + 1e-20f) : sj) * scaling;
  }
}

__global__ void scatter_rows_kernel(float* dst, const float* src, const int64_t* rows, int64_t n, int64_t d) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * d) return;
  dst[rows[i / d] * d + i % d] = src[i];
}

// y[t, i] = sum_j wt[t, j] slot_out[t*k + j, i], slot order; then the bf16 rounding point.
__global__ void combine_kernel(float* y, const float* slot_out, const float* wt, int64_t n_tok, int k,
                               int64_t dz, bool bf16) {
  k3::cuda_ops::pdl_launch_dependents();  // the next kernel (a GEMV) may start fetching weights
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_tok * dz) return;
  const int64_t t = idx / dz, i = idx % dz;
  float acc = 0.f;
  for (int j = 0; j < k; ++j) acc += wt[t * k + j] * slot_out[(t * k + j) * dz + i];
  y[idx] = bf16 ? round_bf16_dev(acc) : acc;
}

// The latent MoE in bf16 mode on the fused kernels; y [n_tok, d_latent] = bf16(sum_j w_j E_j(z)).
Status routed_fused(const GpuCtx& c, const ModelConfig& cfg, const MoeWeightsGpu& w, const float* x,
                    int64_t n_tok, float* y, int layer) {
  const MoeConfig& m = cfg.moe;
  const int64_t E = m.n_expert, k = m.n_expert_used, dz = m.d_latent;
  const bool one_gemm = w.gate_down.w != nullptr;
  const int64_t ld = one_gemm ? E + dz : E;
  DevBuf h, z, sel, wt, scratch;
  K3_RETURN_IF_ERROR(h.alloc(c, n_tok * ld));
  K3_RETURN_IF_ERROR(sel.alloc_bytes(c, size_t(n_tok * k) * 4));
  K3_RETURN_IF_ERROR(wt.alloc(c, n_tok * k));
  const float* zp = h.f() + E;
  if (one_gemm) {
    linear(c, w.gate_down, x, n_tok, h.f(), /*round=*/false);  // z is rounded to bf16 by moe_experts
  } else {
    K3_RETURN_IF_ERROR(z.alloc(c, n_tok * dz));
    linear(c, w.gate, x, n_tok, h.f(), /*round=*/false);
    linear(c, w.latent_down, x, n_tok, z.f());
    zp = z.f();
  }
  if (c.tracing()) {  // the router logits, dense (the fused GEMM's rows hold the latent after them)
    DevBuf lg;
    K3_RETURN_IF_ERROR(lg.alloc(c, n_tok * E));
    copy_rows(c, lg.f(), E, h.f(), ld, n_tok, E);
    c.cb("moe_logits", layer, lg.f(), n_tok * E);
  }
  MoeRouteParams rp;
  rp.n_tok = n_tok, rp.n_expert = int(E), rp.k = int(k), rp.logits = h.f(), rp.ld = ld, rp.bias = w.bias;
  rp.renormalize = m.renormalize, rp.scaling = m.routed_scaling_factor;
  rp.sel = sel.as<int32_t>(), rp.wt = wt.f();
  K3_RETURN_IF_ERROR(moe_route_check(rp));
  moe_route_cuda(rp, *c.g);
  c.cb_sets("moe_sel", layer, sel.as<int32_t>(), n_tok, k);
  c.cb("moe_weights", layer, wt.f(), n_tok * k);
  // token chunks bound the scratch (sorted rows x (d_ff + d_latent) bf16: 0.87 GB at K3's shapes); the
  // wgmma prefill kernel runs 0.22 / 0.30 of the cuBLAS rate at 2048 / 4096 tokens (docs/perf.md, session 12)
  constexpr int64_t kChunkTok = 4096;
  MoeExpertsParams ep;
  ep.n_expert = int(E), ep.k = int(k), ep.d_in = int(dz), ep.d_ff = int(m.d_ff_expert);
  ep.experts = w.expert_table;
  ep.act = cfg.act == Activation::silu ? MoeAct::silu : MoeAct::situ;
  ep.beta1 = cfg.situ_beta, ep.beta2 = cfg.has_situ_linear_beta ? cfg.situ_linear_beta : 0.f;
  ep.n_tok = std::min(n_tok, kChunkTok);
  K3_RETURN_IF_ERROR(moe_experts_check(ep));
  K3_RETURN_IF_ERROR(scratch.alloc_bytes(c, moe_experts_scratch_bytes(ep)));
  ep.scratch = scratch.as<void>();
  // K3_MOE_WGMMA=0: prefill on the mma.sync kernel (the default before session 12) instead of the wgmma one
  static const bool wgmma = env_switch("K3_MOE_WGMMA", true);
  for (int64_t t0 = 0; t0 < n_tok; t0 += kChunkTok) {
    ep.n_tok = std::min(kChunkTok, n_tok - t0);
    ep.path = !wgmma && ep.n_tok > kMoeDecodeMaxTok ? MoePath::prefill_mma : MoePath::automatic;
    ep.z = zp + t0 * (one_gemm ? ld : dz), ep.ldz = one_gemm ? ld : dz;
    ep.sel = sel.as<int32_t>() + t0 * k, ep.wt = wt.f() + t0 * k;
    ep.y = y + t0 * dz, ep.ldy = dz;
    moe_experts_cuda(ep, *c.g);
  }
  return launch_status("moe routed experts");
}

}  // namespace

Status moe_forward_gpu(const GpuCtx& c, const ModelConfig& cfg, const MoeWeightsGpu& w, const float* x,
                       int64_t n_tok, float* out, int layer) {
  const MoeConfig& m = cfg.moe;
  if (c.bf16() && m.d_latent > 0 && w.expert_table && n_tok > 0) {  // expert_table: unless K3_MOE_FAST=0
    const int64_t D = cfg.d_model, dz = m.d_latent;
    // The shared experts read only x: with a side stream they run beside the routed path, whose small
    // kernels and latency-bound expert kernels leave memory bandwidth unused (their scratch is taken first).
    const bool shared = m.n_shared_expert > 0, beside = shared && c.side;
    DevBuf gu, y, routed;
    if (beside) {
      K3_RETURN_IF_ERROR(gu.alloc(c, 2 * n_tok * w.shared.gate_proj.out));
      GpuCtx cs;
      K3_RETURN_IF_ERROR(fork_side(c, &cs));
      K3_RETURN_IF_ERROR(ffn_forward_gpu(cs, cfg, w.shared, x, n_tok, out, gu.f()));
    }
    K3_RETURN_IF_ERROR(y.alloc(c, n_tok * dz));
    K3_RETURN_IF_ERROR(routed_fused(c, cfg, w, x, n_tok, y.f(), layer));
    if (m.latent_norm) rms_norm(c, y.f(), w.latent_norm, cfg.rms_norm_eps, n_tok, dz, y.f());
    K3_RETURN_IF_ERROR(routed.alloc(c, n_tok * D));
    linear(c, w.latent_up, y.f(), n_tok, routed.f());
    c.cb("moe_routed", layer, routed.f(), n_tok * D);
    if (beside) {
      K3_RETURN_IF_ERROR(join_side(c));
    } else if (shared) {
      K3_RETURN_IF_ERROR(ffn_forward_gpu(c, cfg, w.shared, x, n_tok, out));
    } else {
      K3_CUDA_CHECK(cudaMemsetAsync(out, 0, size_t(n_tok * D) * 4, c.stream()));
    }
    if (shared) c.cb("moe_shared", layer, out, n_tok * D);
    add_inplace(c, out, routed.f(), n_tok * D, /*round=*/true);
    return launch_status("moe layer");
  }
  const int64_t D = cfg.d_model, E = m.n_expert, k = m.n_expert_used;
  const int64_t dz = m.d_latent > 0 ? m.d_latent : D;
  DevBuf s, wt, sel;
  K3_RETURN_IF_ERROR(s.alloc(c, n_tok * E));
  K3_RETURN_IF_ERROR(wt.alloc(c, n_tok * k));
  K3_RETURN_IF_ERROR(sel.alloc_bytes(c, size_t(n_tok * k) * 4));
  linear(c, w.gate, x, n_tok, s.f(), /*round=*/false);
  c.cb("moe_logits", layer, s.f(), n_tok * E);
  SigmoidParams sp;
  sp.n_row = n_tok, sp.d = E, sp.x = s.f(), sp.y = s.f();
  sigmoid_cuda(sp, *c.g);
  route_kernel<<<blocks_for(n_tok, 128), 128, 0, c.stream()>>>(s.f(), w.bias, n_tok, int(E), int(k),
                                                               m.renormalize, m.routed_scaling_factor,
                                                               sel.as<int32_t>(), wt.f());
  c.cb_sets("moe_sel", layer, sel.as<int32_t>(), n_tok, k);
  c.cb("moe_weights", layer, wt.f(), n_tok * k);

  DevBuf z;
  if (m.d_latent > 0) {
    K3_RETURN_IF_ERROR(z.alloc(c, n_tok * dz));
    linear(c, w.latent_down, x, n_tok, z.f());
  }
  const float* zin = m.d_latent > 0 ? z.f() : x;

  // Group (token, slot) rows by expert on the host.
  std::vector<int32_t> sel_h(size_t(n_tok * k));
  K3_RETURN_IF_ERROR(launch_status("moe routing"));
  if (cudaMemcpyAsync(sel_h.data(), sel.f(), sel_h.size() * 4, cudaMemcpyDeviceToHost, c.stream()) !=
          cudaSuccess ||
      cudaStreamSynchronize(c.stream()) != cudaSuccess)
    return launch_status("moe routing copy");
  std::vector<int64_t> count(size_t(E) + 1, 0), order(sel_h.size()), tok_of(sel_h.size());
  for (int32_t e : sel_h) {
    if (e < 0 || e >= E) return error(Code::internal, "moe routing produced expert id " + std::to_string(e));
    ++count[size_t(e) + 1];
  }
  for (int64_t e = 0; e < E; ++e) count[size_t(e) + 1] += count[size_t(e)];
  std::vector<int64_t> fill(count.begin(), count.end() - 1);
  for (int64_t r = 0; r < n_tok * k; ++r) order[size_t(fill[size_t(sel_h[size_t(r)])]++)] = r;
  for (size_t i = 0; i < order.size(); ++i) tok_of[i] = order[i] / k;
  DevBuf rows_d, tok_d, xe, ye, slot_out, y;
  const int64_t n_rows = n_tok * k;
  K3_RETURN_IF_ERROR(rows_d.alloc_bytes(c, size_t(n_rows) * 8));
  K3_RETURN_IF_ERROR(tok_d.alloc_bytes(c, size_t(n_rows) * 8));
  for (DevBuf* b : {&xe, &ye, &slot_out}) K3_RETURN_IF_ERROR(b->alloc(c, n_rows * dz));
  K3_RETURN_IF_ERROR(y.alloc(c, n_tok * dz));
  cudaMemcpyAsync(rows_d.f(), order.data(), size_t(n_rows) * 8, cudaMemcpyHostToDevice, c.stream());
  cudaMemcpyAsync(tok_d.f(), tok_of.data(), size_t(n_rows) * 8, cudaMemcpyHostToDevice, c.stream());
  gather_rows(c, xe.f(), zin, tok_d.as<int64_t>(), n_rows, dz);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = count[size_t(e)], n = count[size_t(e) + 1] - r0;
    if (n > 0)
      K3_RETURN_IF_ERROR(
          ffn_forward_gpu(c, cfg, w.experts[size_t(e)], xe.f() + r0 * dz, n, ye.f() + r0 * dz));
  }
  scatter_rows_kernel<<<blocks_for(n_rows * dz), kThreads, 0, c.stream()>>>(slot_out.f(), ye.f(),
                                                                            rows_d.as<int64_t>(), n_rows, dz);
  combine_kernel<<<blocks_for(n_tok * dz), kThreads, 0, c.stream()>>>(y.f(), slot_out.f(), wt.f(), n_tok,
                                                                      int(k), dz, c.bf16());
  DevBuf routed;
  const float* routed_p = y.f();
  if (m.d_latent > 0) {
    if (m.latent_norm) rms_norm(c, y.f(), w.latent_norm, cfg.rms_norm_eps, n_tok, dz, y.f());
    K3_RETURN_IF_ERROR(routed.alloc(c, n_tok * D));
    linear(c, w.latent_up, y.f(), n_tok, routed.f());
    routed_p = routed.f();
  }
  c.cb("moe_routed", layer, routed_p, n_tok * D);
  if (m.n_shared_expert > 0) {
    K3_RETURN_IF_ERROR(ffn_forward_gpu(c, cfg, w.shared, x, n_tok, out));
    c.cb("moe_shared", layer, out, n_tok * D);
  } else {
    K3_CUDA_CHECK(cudaMemsetAsync(out, 0, size_t(n_tok * D) * 4, c.stream()));
  }
  add_inplace(c, out, routed_p, n_tok * D, /*round=*/true);
  return launch_status("moe layer");
}

}  // namespace k3::gpu
