// moe_gpu.cu: the routed MoE layers on the GPU (model/moe.cpp, MODEL.md §8.2 Stable LatentMoE, §8.3 KL MoE).
//
//   s = sigmoid(x W_gate^T) fp32;  sel = top-k of (s + bias), biased score desc, ties -> lower id
//   w_j = s[sel_j] / (sum_j s[sel_j] + 1e-20) * routed_scaling_factor           (unbiased weights)
//   K3: z = bf16(latent_down x);  y = bf16(sum_j w_j E_j(z)) in slot order;  y = latent_up RMSNorm(y)
//   KL: y = bf16(sum_j w_j E_j(x))
//   out = bf16(y + shared(x))
// Routing runs on the device (one thread per token, k passes of an argmax below the previous pick: no sort,
// no scratch). The dispatch reads the selection on the host (one sync per MoE layer), groups the (token,
// slot) rows by expert, gathers them once, runs each expert's GLU on its contiguous rows and scatters the
// results back to (token, slot) rows; the weighted sum then runs per token in slot order, as on the CPU.
#include <vector>

#include "gpu/blocks_gpu.cuh"
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
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_tok * dz) return;
  const int64_t t = idx / dz, i = idx % dz;
  float acc = 0.f;
  for (int j = 0; j < k; ++j) acc += wt[t * k + j] * slot_out[(t * k + j) * dz + i];
  y[idx] = bf16 ? round_bf16_dev(acc) : acc;
}

}  // namespace

Status moe_forward_gpu(const GpuCtx& c, const ModelConfig& cfg, const MoeWeightsGpu& w, const float* x,
                       int64_t n_tok, float* out, int layer) {
  const MoeConfig& m = cfg.moe;
  const int64_t D = cfg.d_model, E = m.n_expert, k = m.n_expert_used;
  const int64_t dz = m.d_latent > 0 ? m.d_latent : D;
  DevBuf s, wt, sel;
  K3_RETURN_IF_ERROR(s.alloc(c, n_tok * E));
  K3_RETURN_IF_ERROR(wt.alloc(c, n_tok * k));
  K3_RETURN_IF_ERROR(sel.alloc_bytes(c, size_t(n_tok * k) * 4));
  linear(c, w.gate, x, n_tok, s.f(), /*round=*/false);
  SigmoidParams sp;
  sp.n_row = n_tok, sp.d = E, sp.x = s.f(), sp.y = s.f();
  sigmoid_cuda(sp, *c.g);
  route_kernel<<<blocks_for(n_tok, 128), 128, 0, c.stream()>>>(s.f(), w.bias, n_tok, int(E), int(k),
                                                               m.renormalize, m.routed_scaling_factor,
                                                               sel.as<int32_t>(), wt.f());
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
    cudaMemsetAsync(out, 0, size_t(n_tok * D) * 4, c.stream());
  }
  add_inplace(c, out, routed_p, n_tok * D);
  c.rnd(out, n_tok * D);
  return launch_status("moe layer");
}

}  // namespace k3::gpu
